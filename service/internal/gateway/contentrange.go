package gateway

import (
	"strconv"
	"strings"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/service/internal/status"
)

// contentRange is a PUT's Content-Range (RFC 9110, section 14.4): the body
// is bytes [first, last] of a representation of complete bytes, -1 where
// the client sent "*" (not known). A PUT writes the body at first; the
// complete length does not resize the file.
type contentRange struct {
	byteRange
	complete int64
}

// parseContentRange reads the Content-Range headers of a PUT: none (ok
// false), or one of "bytes first-last/complete" or "bytes first-last/*".
// Anything else is refused, naming what was sent: the unsatisfied-range
// form ("bytes */complete") is a server's answer, not a body's place.
func parseContentRange(values []string) (cr contentRange, ok bool, err error) {
	switch len(values) {
	case 0:
		return contentRange{}, false, nil
	case 1:
	default:
		return contentRange{}, false, contentRangeRefusal("%d Content-Range headers %q: a PUT takes one", len(values), values)
	}
	v := values[0]
	refuse := func(why string) (contentRange, bool, error) {
		return contentRange{}, false, contentRangeRefusal("Content-Range %q: %s; want \"bytes first-last/length\" or \"bytes first-last/*\"", v, why)
	}
	unit, rest, found := strings.Cut(v, " ")
	if !found || unit != "bytes" {
		return refuse("not a range of bytes")
	}
	span, complete, found := strings.Cut(rest, "/")
	firstS, lastS, dash := strings.Cut(span, "-")
	if !found || !dash {
		return refuse("no first-last/length")
	}
	first, ferr := parseDigits(firstS)
	last, lerr := parseDigits(lastS)
	switch {
	case ferr != nil || lerr != nil:
		return refuse("first and last must be byte positions")
	case last < first:
		return refuse("the last byte comes before the first")
	case last == 1<<63-1:
		return refuse("the last byte is past any file")
	}
	cr = contentRange{byteRange: byteRange{first: first, last: last}, complete: -1}
	if complete != "*" {
		n, err := parseDigits(complete)
		switch {
		case err != nil:
			return refuse("the length must be a number of bytes or *")
		case last >= n:
			return refuse("the last byte is not below the length")
		}
		cr.complete = n
	}
	return cr, true, nil
}

// fits checks the range against the rest of a PUT: ?offset, if given, is
// its first byte, and the body (whose length, Content-Length, is
// required with it) is exactly its bytes. A PUT that fails is refused
// before anything is written.
func (cr contentRange) fits(q putQuery, contentLength int64) error {
	header := "bytes " + strconv.FormatInt(cr.first, 10) + "-" + strconv.FormatInt(cr.last, 10) + "/"
	if cr.complete < 0 {
		header += "*"
	} else {
		header += strconv.FormatInt(cr.complete, 10)
	}
	switch {
	case q.offsetGiven && q.offset != cr.first:
		return contentRangeRefusal("Content-Range %s starts at %d, but offset=%d: give one of them, or both the same", header, cr.first, q.offset)
	case contentLength < 0:
		return contentRangeRefusal("Content-Range %s needs a Content-Length of its %d bytes; the body came without one (chunked)", header, cr.length())
	case contentLength != cr.length():
		return contentRangeRefusal("Content-Range %s is %d bytes, but the body is %d (Content-Length)", header, cr.length(), contentLength)
	}
	return nil
}

func contentRangeRefusal(format string, args ...any) error {
	return status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: "Content-Range"}, format, args...)
}
