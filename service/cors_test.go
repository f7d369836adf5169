package service

import (
	"net/http"
	"strings"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

// TestCORS: a page of an origin in --http-allowed-origins gets its
// preflights answered, before any token, on the file routes, tus and
// WebDAV, and reads the answers, with credentials when its origin is
// named; any other origin gets no CORS header, and the guard's 403.
func TestCORS(t *testing.T) {
	const app = "http://app.example:3000"
	for _, tc := range []struct {
		name      string
		allowed   []string
		tokens    bool
		origin    string
		wantAllow string // Access-Control-Allow-Origin, "" for none
		wantCreds bool
	}{
		{"named origin", []string{app}, false, app, app, true},
		{"named origin, with tokens", []string{app}, true, app, app, true},
		{"any origin", []string{"*"}, false, "http://elsewhere.example", "*", false},
		{"other origin", []string{app}, false, "http://evil.example", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := startDaemon(t, func(c *Config) {
				c.HTTPAllowedOrigins = tc.allowed
				if tc.tokens {
					c.AuthTokenFile = testutil.WriteTokenFile(t, testutil.Dir(t), "tokens", tokenAdmin)
				}
			})
			for _, route := range []struct{ method, path, reqHeaders string }{
				{"PUT", "/v1/files/a/b.bin", "content-type, content-range"},
				// A verb route's preflight is no 405 of the wrong method.
				{"POST", "/v1/files/a/b.bin:truncate", "content-type"},
				{"PATCH", "/v1/uploads/0123456789abcdef0123456789abcdef", "tus-resumable, upload-offset, content-type"},
				{"POST", "/v1/uploads/", "tus-resumable, upload-length, upload-metadata"},
				{"PROPFIND", "/dav/a/", "depth, authorization"},
			} {
				r := testutil.DoHTTP(t, "OPTIONS", d.url+route.path, nil, map[string]string{
					"Origin": tc.origin, "Access-Control-Request-Method": route.method, "Access-Control-Request-Headers": route.reqHeaders})
				if got := r.Header.Get("Access-Control-Allow-Origin"); got != tc.wantAllow {
					t.Errorf("preflight of %s %s: Access-Control-Allow-Origin %q, want %q", route.method, route.path, got, tc.wantAllow)
				}
				if tc.wantAllow == "" {
					continue
				}
				if r.Status != http.StatusNoContent {
					t.Errorf("preflight of %s %s: %d, want 204", route.method, route.path, r.Status)
				}
				if !strings.Contains(r.Header.Get("Access-Control-Allow-Methods"), route.method) {
					t.Errorf("preflight of %s %s: Allow-Methods %q", route.method, route.path, r.Header.Get("Access-Control-Allow-Methods"))
				}
				allowed := strings.ToLower(r.Header.Get("Access-Control-Allow-Headers"))
				for _, h := range strings.Split(route.reqHeaders, ", ") {
					if !strings.Contains(allowed, h) {
						t.Errorf("preflight of %s %s: Allow-Headers %q lacks %s", route.method, route.path, allowed, h)
					}
				}
				if got := r.Header.Get("Access-Control-Allow-Credentials") == "true"; got != tc.wantCreds {
					t.Errorf("preflight: credentials %v, want %v", got, tc.wantCreds)
				}
			}
			hdr := map[string]string{"Origin": tc.origin}
			if tc.tokens {
				hdr["Authorization"] = "Bearer " + tokenAdmin
			}
			r := testutil.DoHTTP(t, "PUT", d.url+"/v1/files/a/b.bin", strings.NewReader("x"), hdr)
			if got := r.Header.Get("Access-Control-Allow-Origin"); got != tc.wantAllow {
				t.Errorf("PUT: Access-Control-Allow-Origin %q, want %q", got, tc.wantAllow)
			}
			if tc.wantAllow == "" {
				if r.Status != http.StatusForbidden {
					t.Errorf("PUT from another origin: %d, want the guard's 403", r.Status)
				}
				return
			}
			if r.Status != http.StatusCreated {
				t.Fatalf("PUT: %d %s", r.Status, r.Body)
			}
			exposed := r.Header.Get("Access-Control-Expose-Headers")
			for _, h := range []string{"ETag", "Location", "Upload-Offset", "Upload-Length", "Tus-Resumable", "Content-Range"} {
				if !strings.Contains(exposed, h) {
					t.Errorf("PUT: Expose-Headers %q lacks %s", exposed, h)
				}
			}
		})
	}
	// Routes outside the list get no CORS.
	d := startDaemon(t, func(c *Config) { c.HTTPAllowedOrigins = []string{app} })
	r := testutil.DoHTTP(t, "OPTIONS", d.url+"/metrics", nil, map[string]string{"Origin": app, "Access-Control-Request-Method": "GET"})
	if r.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("preflight of /metrics: answered with CORS")
	}
}
