package status

import (
	"errors"
	"strconv"
	"strings"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/store"
)

// ETag is the strong entity tag (RFC 9110, section 8.8.3) of a file at
// generation gen: the generation in decimal between double quotes. Every
// face that hands out a validator uses it: REST's ETag header and Stat's
// etag, and WebDAV's getetag, so that a tag taken by one face is a
// precondition on another.
//
// The generation alone names the state: it moves with every mutation of
// the file and never repeats for its path, and a span of generations
// belongs to one file (store/generation.go), so two files never share a
// value and nothing of the inode need be added. Tags are the issuing
// daemon's: a file moved to another daemon's root takes that daemon's
// generations.
func ETag(gen int64) string {
	return `"` + strconv.FormatInt(gen, 10) + `"`
}

// ParseETag returns the generation an ETag names, or false for a tag that
// ETag did not make (a weak one, W/"...", or another server's).
func ParseETag(tag string) (int64, bool) {
	if len(tag) < 3 || tag[0] != '"' || tag[len(tag)-1] != '"' {
		return 0, false
	}
	digits := tag[1 : len(tag)-1]
	if digits[0] == '0' || digits[0] == '+' || digits[0] == '-' {
		return 0, false // one spelling per tag; never 0
	}
	gen, err := strconv.ParseInt(digits, 10, 64)
	return gen, err == nil && gen > 0
}

// Precondition is the store's condition of a request's
// if_generation_match and if_generation_not_match fields.
func Precondition(ifMatch, ifNotMatch *int64) store.Precondition {
	return store.Precondition{IfMatch: ifMatch, IfNotMatch: ifNotMatch}
}

// mismatchReason is the reason of a failed generation condition: a
// condition on the file's existence (a generation of 0) is
// PRECONDITION_FAILED, one on its generation ETAG_MISMATCH.
func mismatchReason(m *store.GenerationMismatch) filewritev1.ErrorReason {
	p := m.Precondition
	existence := false
	switch {
	case p.IfMatch != nil && *p.IfMatch != m.Current:
		existence = *p.IfMatch == 0
	case p.IfNotMatch != nil:
		existence = *p.IfNotMatch == 0
	}
	if existence {
		return filewritev1.ErrorReason_PRECONDITION_FAILED
	}
	return filewritev1.ErrorReason_ETAG_MISMATCH
}

// mismatchMetadata adds to md what a failed condition's refusal says: the
// file's generation, its tag, and the path the condition was on.
func mismatchMetadata(md map[string]string, m *store.GenerationMismatch) {
	md[errorinfo.KeyGeneration] = strconv.FormatInt(m.Current, 10)
	if m.Current != 0 {
		md["etag"] = ETag(m.Current)
	}
	md["path"] = m.Path
}

// CurrentGeneration returns the generation that the refusal err of a
// failed precondition names (errorinfo.KeyGeneration), if it is one.
func CurrentGeneration(err error) (int64, bool) {
	info := errorinfo.From(err)
	if info == nil {
		return 0, false
	}
	switch info.GetReason() {
	case filewritev1.ErrorReason_ETAG_MISMATCH.String(), filewritev1.ErrorReason_PRECONDITION_FAILED.String():
	default:
		return 0, false
	}
	gen, err := strconv.ParseInt(info.GetMetadata()[errorinfo.KeyGeneration], 10, 64)
	return gen, err == nil
}

// DigestAlgorithm is the store's algorithm of a request's name for it, as
// RFC 9530 names them: "crc32c" (the default, for "") or "sha-256".
func DigestAlgorithm(name string) (store.DigestAlgorithm, error) {
	switch name {
	case "", "crc32c":
		return store.DigestCRC32C, nil
	case "sha-256":
		return store.DigestSHA256, nil
	}
	return 0, &store.Refusal{Err: store.ErrInvalidMode, Arg: "algorithm", Detail: "checksum algorithm " + strconv.Quote(name) + " (want crc32c or sha-256)"}
}

// errIsMismatch reports whether err is a failed generation condition, and
// which.
func errIsMismatch(err error) (*store.GenerationMismatch, bool) {
	var m *store.GenerationMismatch
	return m, errors.As(err, &m)
}

// ErrMalformedETags is returned when an If-Match or If-None-Match value is
// not "*" nor a list of entity tags.
var ErrMalformedETags = errors.New(`not "*" nor a list of entity tags such as "1234" or W/"1234"`)

// entityTag is one tag of an If-Match or If-None-Match list.
type entityTag struct {
	opaque string // quotes kept
	weak   bool   // W/ before it
}

// ETagList is a parsed If-Match or If-None-Match value (RFC 9110,
// sections 13.1.1 and 13.1.2), for every face that takes them: the
// gateway's routes and the WebDAV door.
type ETagList struct {
	// Any is "*".
	Any  bool
	tags []entityTag
}

// ParseETagList parses the values of an If-Match or If-None-Match header.
func ParseETagList(values []string) (ETagList, error) {
	var l ETagList
	for _, v := range values {
		s := strings.TrimSpace(v)
		if s == "*" {
			l.Any = true
			continue
		}
		for {
			s = strings.TrimLeft(s, " \t,")
			if s == "" {
				break
			}
			var t entityTag
			s, t.weak = strings.CutPrefix(s, "W/")
			if !strings.HasPrefix(s, `"`) {
				return ETagList{}, ErrMalformedETags
			}
			end := strings.IndexByte(s[1:], '"')
			if end < 0 {
				return ETagList{}, ErrMalformedETags
			}
			t.opaque = s[:end+2]
			l.tags = append(l.tags, t)
			s = s[end+2:]
			if s != "" && s[0] != ',' && s[0] != ' ' && s[0] != '\t' {
				return ETagList{}, ErrMalformedETags
			}
		}
	}
	if l.Any && len(l.tags) > 0 {
		return ETagList{}, ErrMalformedETags
	}
	return l, nil
}

// MatchesStrong is If-Match's comparison (RFC 9110, section 8.8.3.2)
// with the file's tag etag (empty: no file): a tag matches if neither is
// weak and their opaque parts are equal; "*" if the file exists.
func (l ETagList) MatchesStrong(etag string, exists bool) bool {
	if l.Any {
		return exists
	}
	for _, t := range l.tags {
		if !t.weak && etag != "" && t.opaque == etag {
			return true
		}
	}
	return false
}

// MatchesWeak is If-None-Match's comparison: the opaque parts are equal,
// W/ or not.
func (l ETagList) MatchesWeak(etag string, exists bool) bool {
	if l.Any {
		return exists
	}
	for _, t := range l.tags {
		if etag != "" && t.opaque == etag {
			return true
		}
	}
	return false
}

// PreconditionFailed is the refusal of the HTTP precondition header that
// failed on a file at generation gen with tag etag (empty: no file
// exists): ETAG_MISMATCH for a condition on a tag (onTag), else
// PRECONDITION_FAILED (one on existence, "*", or on a date), carrying
// the file's generation and tag as the store's refusal of a generation
// does; note follows the tag in the message. 412 over HTTP (Rules).
func PreconditionFailed(header string, onTag bool, gen int64, etag, note string) error {
	current := etag
	if etag == "" {
		current = "none: the file does not exist"
	}
	reason := filewritev1.ErrorReason_PRECONDITION_FAILED
	if onTag {
		reason = filewritev1.ErrorReason_ETAG_MISMATCH
	}
	md := map[string]string{errorinfo.KeyGeneration: strconv.FormatInt(gen, 10)}
	if etag != "" {
		md["etag"] = etag
	}
	return Refusal(reason, md, "precondition failed: %s; the file's ETag is %s%s", header, current, note)
}
