// Package media decides how a file's bytes are labelled when they leave
// the daemon, for every door that serves them (the REST download route,
// WebDAV's GET): the media type a PUT gave the file (kept with it, see
// store.AttrContentType), and whether a browser may show them in place.
//
// A download is served from the daemon's own origin, so a page among the
// files (text/html, image/svg+xml with scripts) shown in place would run
// as the daemon's: it could call the API with the browser's ambient
// credentials, or read what the daemon answers. So only a short list of
// types that run nothing are shown inline (raster images, PDF, which
// browsers show in a viewer of their own, and text/plain); everything
// else is an attachment, which a browser saves rather than opens, and
// every download carries X-Content-Type-Options: nosniff, so that the
// browser does not guess a type that would run.
package media

import (
	"fmt"
	"mime"
	"net/http"
	"path"
	"strings"
	"unicode"
)

// OctetStream is the type of bytes that say nothing of themselves: a
// file's type when it was given none.
const OctetStream = "application/octet-stream"

// inline are the media types a browser may show in place.
var inline = map[string]bool{
	"image/png":       true,
	"image/jpeg":      true,
	"image/gif":       true,
	"image/webp":      true,
	"image/avif":      true,
	"image/bmp":       true,
	"application/pdf": true,
	"text/plain":      true,
}

// Inline reports whether a file of type ct may be shown in place.
func Inline(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && inline[mt]
}

// SetHeaders labels a download of the file at p, of type ct ("" if it
// has none), on h: Content-Type, Content-Disposition (inline for the safe
// types unless attachment, else attachment with the file's name) and
// X-Content-Type-Options.
func SetHeaders(h http.Header, p, ct string, attachment bool) {
	if ct == "" {
		ct = OctetStream
	}
	h.Set("Content-Type", ct)
	h.Set("X-Content-Type-Options", "nosniff")
	disposition := "attachment"
	if !attachment && Inline(ct) {
		disposition = "inline"
	}
	h.Set("Content-Disposition", Disposition(disposition, path.Base(p)))
}

// Disposition is a Content-Disposition value of kind (inline or
// attachment) naming the file name (RFC 6266): an ASCII fallback in
// filename, and the name itself in filename* (RFC 8187) where it is not
// plain ASCII.
func Disposition(kind, name string) string {
	if name == "" || name == "." || name == "/" {
		return kind
	}
	plain := true
	var fallback strings.Builder
	for _, r := range name {
		switch {
		case r < 0x20 || r == 0x7f || r > unicode.MaxASCII:
			plain = false
			fallback.WriteByte('_')
		case r == '"' || r == '\\':
			plain = false
			fallback.WriteByte('_')
		default:
			fallback.WriteRune(r)
		}
	}
	v := kind + `; filename="` + fallback.String() + `"`
	if !plain {
		v += "; filename*=UTF-8''" + pctEncode(name)
	}
	return v
}

// pctEncode is RFC 8187's value-chars: attr-char as it is, the rest
// percent-encoded.
func pctEncode(s string) string {
	const attrChar = "!#$&+-.^_`|~"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte(attrChar, c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}
