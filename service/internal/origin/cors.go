package origin

import (
	"net/http"
	"strings"
)

// CORS lets web pages of the origins in --http-allowed-origins call the
// file routes from another origin (the Fetch standard's CORS protocol):
// it answers their preflights, and marks the answers to their requests as
// theirs to read. It is the one list BrowserGuard lets past its Origin
// check too; a page of any other origin gets no CORS header, and the
// guard's refusal where the guard is on (docs/security.md).
//
// A page of an origin listed by name may send credentials (its browser's
// client certificate, a token it holds): Access-Control-Allow-Credentials.
// "*" in the list lets every origin call, without credentials: a
// browser's ambient credentials are no stranger's to use.
type CORS struct {
	origins map[string]bool // lower case, without a trailing slash
	any     bool            // "*" is listed
}

// NewCORS is the CORS of the origins in --http-allowed-origins.
func NewCORS(origins []string) (*CORS, error) {
	c := &CORS{origins: map[string]bool{}}
	for _, o := range origins {
		if err := checkOrigin(o); err != nil {
			return nil, err
		}
		if o == "*" {
			c.any = true
			continue
		}
		c.origins[strings.ToLower(strings.TrimSuffix(o, "/"))] = true
	}
	return c, nil
}

// The routes a page may call from another origin, and what it may send
// and read there.
var (
	corsPrefixes = []string{"/v1/files", "/v1/dirs", "/v1/uploads", "/dav"}
	corsMethods  = "GET, HEAD, PUT, POST, PATCH, DELETE, OPTIONS"
	davMethods   = ", PROPFIND, PROPPATCH, MKCOL, COPY, MOVE, LOCK, UNLOCK"
	corsHeaders  = "Authorization, Content-Type, Content-Range, Range, If-Match, If-None-Match, If-Modified-Since, If-Unmodified-Since, If-Range, " +
		"Grpc-Timeout, Filewrite-Path, X-Requested-With, X-HTTP-Method-Override, " +
		"Tus-Resumable, Upload-Length, Upload-Offset, Upload-Metadata, Upload-Defer-Length, Upload-Concat, Upload-Checksum, " +
		"Depth, Destination, Overwrite, Lock-Token, Timeout, If"
	corsExposed = "ETag, Location, Content-Range, Content-Disposition, Last-Modified, Accept-Ranges, Retry-After, " +
		"Tus-Resumable, Tus-Version, Tus-Extension, Tus-Max-Size, Tus-Checksum-Algorithm, " +
		"Upload-Offset, Upload-Length, Upload-Metadata, Upload-Defer-Length, Upload-Concat, Upload-Expires, " +
		"DAV, Lock-Token"
)

// corsMaxAge is how long a browser may keep a preflight's answer.
const corsMaxAge = "3600"

// Wrap serves next behind CORS: a preflight of a listed origin for a
// route of corsPrefixes is answered here (204), before any token check (a
// browser sends none with it); a listed origin's request gets its
// Access-Control-Allow-Origin and the headers it may read.
func (c *CORS) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		if origin == "" || !corsRoute(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		named := c.origins[strings.ToLower(strings.TrimSuffix(origin, "/"))]
		if !named && !c.any {
			next.ServeHTTP(w, r) // no CORS: BrowserGuard refuses it, where it is on
			return
		}
		h := w.Header()
		h.Add("Vary", "Origin")
		if named {
			h.Set("Access-Control-Allow-Origin", origin)
			h.Set("Access-Control-Allow-Credentials", "true")
		} else {
			h.Set("Access-Control-Allow-Origin", "*")
		}
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			methods := corsMethods
			if r.URL.Path == "/dav" || strings.HasPrefix(r.URL.Path, "/dav/") {
				methods += davMethods
			}
			h.Set("Access-Control-Allow-Methods", methods)
			h.Set("Access-Control-Allow-Headers", corsHeaders)
			h.Set("Access-Control-Max-Age", corsMaxAge)
			h.Add("Vary", "Access-Control-Request-Method, Access-Control-Request-Headers")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		h.Set("Access-Control-Expose-Headers", corsExposed)
		next.ServeHTTP(w, r)
	})
}

func corsRoute(p string) bool {
	for _, pre := range corsPrefixes {
		if p == pre || strings.HasPrefix(p, pre+"/") {
			return true
		}
	}
	return false
}
