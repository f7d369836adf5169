package gateway

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/service/internal/status"
)

// The gateway's preconditions and ranges (RFC 9110, sections 13 and 14),
// decided on one Stat of the file: what the headers announce and what the
// conditions compare is that one state.

// validators is what a Stat says about a file's version: its ETag and its
// Last-Modified, both empty while the file changed too recently to be
// told from its next change (statResponse).
type validators struct {
	etag         string    // W/"...", or empty
	lastModified time.Time // to the second, or zero
	exists       bool
}

func validatorsOf(st *filewritev1.StatResponse) validators {
	v := validators{etag: st.GetEtag(), exists: true}
	if v.etag != "" && st.GetChangeTime() != nil {
		v.lastModified = st.GetChangeTime().AsTime().Truncate(time.Second)
	}
	return v
}

// setHeaders announces v.
func (v validators) setHeaders(h http.Header) {
	if v.etag != "" {
		h.Set("ETag", v.etag)
	}
	if !v.lastModified.IsZero() {
		h.Set("Last-Modified", v.lastModified.UTC().Format(http.TimeFormat))
	}
}

// errMalformedETags is returned when an If-Match or If-None-Match value is
// not "*" nor a list of entity tags.
var errMalformedETags = errors.New("not \"*\" nor a list of entity tags such as W/\"...\"")

// etagList is a parsed If-Match or If-None-Match value.
type etagList struct {
	any  bool     // "*"
	tags []string // the opaque tags, quotes kept, without any W/ prefix
}

// parseETags parses the values of an If-Match or If-None-Match header.
func parseETags(values []string) (etagList, error) {
	var l etagList
	for _, v := range values {
		s := strings.TrimSpace(v)
		if s == "*" {
			l.any = true
			continue
		}
		for {
			s = strings.TrimLeft(s, " \t,")
			if s == "" {
				break
			}
			s = strings.TrimPrefix(s, "W/")
			if !strings.HasPrefix(s, `"`) {
				return etagList{}, errMalformedETags
			}
			end := strings.IndexByte(s[1:], '"')
			if end < 0 {
				return etagList{}, errMalformedETags
			}
			l.tags = append(l.tags, s[:end+2])
			s = s[end+2:]
			if s != "" && s[0] != ',' && s[0] != ' ' && s[0] != '\t' {
				return etagList{}, errMalformedETags
			}
		}
	}
	if l.any && len(l.tags) > 0 {
		return etagList{}, errMalformedETags
	}
	return l, nil
}

// matches compares with the weak comparison function (RFC 9110, section
// 8.8.3.2): the tags' opaque parts are equal. If-Match is compared so too,
// where RFC 9110 asks for the strong function, which no weak tag passes:
// every tag here is weak, and a precondition that could never hold would
// be no precondition at all. AIP-154 compares etags likewise, as strings.
func (l etagList) matches(v validators) bool {
	if l.any {
		return v.exists
	}
	tag := strings.TrimPrefix(v.etag, "W/")
	if tag == "" {
		return false
	}
	for _, t := range l.tags {
		if t == tag {
			return true
		}
	}
	return false
}

// preconditionStatus evaluates r's preconditions against v in the order of
// RFC 9110, section 13.2.2, and returns the status to answer instead of
// serving the request (412, or 304 for GET and HEAD) and the header that
// decided it, or 0 to serve it. A malformed entity-tag list is a
// REQUEST_MALFORMED refusal (400); a malformed date is ignored, as RFC
// 9110 asks.
func preconditionStatus(r *http.Request, v validators) (code int, header string, err error) {
	read := r.Method == http.MethodGet || r.Method == http.MethodHead
	if vals := r.Header.Values("If-Match"); len(vals) > 0 {
		l, err := parseETags(vals)
		if err != nil {
			return 0, "", malformedHeader("If-Match", err)
		}
		if !l.matches(v) {
			return http.StatusPreconditionFailed, "If-Match", nil
		}
	} else if t, ok := headerDate(r, "If-Unmodified-Since"); ok {
		if v.lastModified.IsZero() || v.lastModified.After(t) {
			return http.StatusPreconditionFailed, "If-Unmodified-Since", nil
		}
	}
	if vals := r.Header.Values("If-None-Match"); len(vals) > 0 {
		l, err := parseETags(vals)
		if err != nil {
			return 0, "", malformedHeader("If-None-Match", err)
		}
		if l.matches(v) {
			if read {
				return http.StatusNotModified, "If-None-Match", nil
			}
			return http.StatusPreconditionFailed, "If-None-Match", nil
		}
	} else if t, ok := headerDate(r, "If-Modified-Since"); ok && read {
		if !v.lastModified.IsZero() && !v.lastModified.After(t) {
			return http.StatusNotModified, "If-Modified-Since", nil
		}
	}
	return 0, "", nil
}

// malformedHeader is the refusal of a request header that does not parse.
func malformedHeader(name string, err error) error {
	return status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: name}, "%s: %v", name, err)
}

// headerDate is the HTTP-date in r's header name, if it holds one.
func headerDate(r *http.Request, name string) (time.Time, bool) {
	s := r.Header.Get(name)
	if s == "" {
		return time.Time{}, false
	}
	t, err := http.ParseTime(s)
	return t, err == nil
}

// byteRange is the inclusive range [first, last] of a file.
type byteRange struct{ first, last int64 }

func (b byteRange) length() int64 { return b.last - b.first + 1 }

// errUnsatisfiable is returned when a Range names no byte of the file, or
// cannot be parsed as a byte range (RFC 9110, section 14.1.1: a server
// answers both with 416).
var errUnsatisfiable = errors.New("range not satisfiable")

// parseRange reads a Range header against a file of size bytes. ok is false
// when the whole file is to be served: no Range, another unit than bytes,
// or more than one range (served whole rather than as multipart/byteranges,
// which no client of a file service needs).
func parseRange(header string, size int64) (r byteRange, ok bool, err error) {
	if header == "" {
		return byteRange{}, false, nil
	}
	unit, spec, found := strings.Cut(header, "=")
	if !found {
		return byteRange{}, false, errUnsatisfiable
	}
	if !strings.EqualFold(strings.TrimSpace(unit), "bytes") {
		return byteRange{}, false, nil
	}
	if strings.Contains(spec, ",") {
		return byteRange{}, false, nil
	}
	spec = strings.TrimSpace(spec)
	firstS, lastS, found := strings.Cut(spec, "-")
	if !found {
		return byteRange{}, false, errUnsatisfiable
	}
	if firstS == "" { // bytes=-n: the last n bytes
		n, err := parseDigits(lastS)
		if err != nil || n == 0 || size == 0 {
			return byteRange{}, false, errUnsatisfiable
		}
		return byteRange{first: max(size-n, 0), last: size - 1}, true, nil
	}
	first, err := parseDigits(firstS)
	if err != nil || first >= size {
		return byteRange{}, false, errUnsatisfiable
	}
	last := size - 1
	if lastS != "" {
		l, err := parseDigits(lastS)
		if err != nil || l < first {
			return byteRange{}, false, errUnsatisfiable
		}
		last = min(l, size-1)
	}
	return byteRange{first: first, last: last}, true, nil
}

// parseDigits parses 1*DIGIT; a value past int64 counts as its largest.
func parseDigits(s string) (int64, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, errUnsatisfiable
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if errors.Is(err, strconv.ErrRange) {
		return 1<<63 - 1, nil
	}
	return n, err
}

// ifRangeHolds reports whether r's If-Range (if any) lets its Range apply
// (RFC 9110, section 13.1.5). An entity tag there must match strongly,
// which no weak tag does, so only a date equal to Last-Modified holds.
func ifRangeHolds(r *http.Request, v validators) bool {
	s := strings.TrimSpace(r.Header.Get("If-Range"))
	if s == "" {
		return true
	}
	if strings.HasPrefix(s, `"`) || strings.HasPrefix(s, "W/") {
		return false
	}
	t, err := http.ParseTime(s)
	return err == nil && !v.lastModified.IsZero() && v.lastModified.Equal(t)
}
