package service

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/filewrite/filewrite/internal/testutil"
)

// TestProbeRoutes: /healthz and /readyz answer without a token while
// authentication is on, and readiness turns 503 once the daemon drains.
func TestProbeRoutes(t *testing.T) {
	tokens := testutil.WriteTokenFile(t, t.TempDir(), "tokens", "probe-test-token")
	d := startDaemon(t, func(c *Config) { c.AuthTokenFile = tokens })
	// An unknown Host and a foreign Origin too: probes name pods by IP or
	// service name, and with tokens those checks are off anyway.
	h := map[string]string{"Origin": "http://evil.example"}
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, body := send(t, "GET", d.url+path, nil, h)
		if resp.StatusCode != 200 || !strings.Contains(string(body), "SERVING") {
			t.Errorf("GET %s without a token: %d %s, want 200 SERVING", path, resp.StatusCode, body)
		}
		if resp, body := send(t, "HEAD", d.url+path, nil, nil); resp.StatusCode != 200 || len(body) != 0 {
			t.Errorf("HEAD %s: %d with %d bytes, want 200 without a body", path, resp.StatusCode, len(body))
		}
	}
	if resp, _ := send(t, "GET", d.url+"/v1/dirs", nil, nil); resp.StatusCode != 401 {
		t.Errorf("GET /v1/dirs without a token: %d, want 401: the probes open nothing else", resp.StatusCode)
	}

	// The first step of Shutdown, before the listeners close.
	d.srv.health.Shutdown()
	if resp, body := send(t, "GET", d.url+"/readyz", nil, nil); resp.StatusCode != 503 || !strings.Contains(string(body), "NOT_SERVING") {
		t.Errorf("GET /readyz while draining: %d %s, want 503 NOT_SERVING", resp.StatusCode, body)
	}
	if resp, _ := send(t, "GET", d.url+"/healthz", nil, nil); resp.StatusCode != 200 {
		t.Errorf("GET /healthz while draining: %d, want 200: the process is up", resp.StatusCode)
	}
	if got, err := d.srv.health.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil || got.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("gRPC health %v, %v: the test did not start a drain", got, err)
	}
}

// TestBrowserRequestsRefused: without tokens, what a web page can make a
// browser send cross-site changes nothing; curl's requests still work.
func TestBrowserRequestsRefused(t *testing.T) {
	d := startDaemon(t, nil)
	port := d.url[strings.LastIndex(d.url, ":")+1:]
	if err := os.WriteFile(filepath.Join(d.root, "v.txt"), []byte("victim"), 0o644); err != nil {
		t.Fatal(err)
	}
	rename := `{"newPath":"moved.txt"}`
	json := "application/json"
	tests := []struct {
		name, method, path, body string
		header                   map[string]string
		want                     int
	}{
		{"text/plain POST", "POST", "/v1/files/v.txt:rename", rename, map[string]string{"Content-Type": "text/plain"}, 415},
		{"form POST", "POST", "/v1/files/v.txt:rename", rename, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415},
		{"multipart POST", "POST", "/v1/files/v.txt:rename", rename, map[string]string{"Content-Type": "multipart/form-data; boundary=x"}, 415},
		{"POST without a type or body", "POST", "/v1/files/v.txt:truncate", "", nil, 415},
		{"JSON POST from a foreign Origin", "POST", "/v1/files/v.txt:rename", rename, map[string]string{"Content-Type": json, "Origin": "http://evil.example"}, 403},
		{"Origin null", "POST", "/v1/files/v.txt:truncate", "{}", map[string]string{"Content-Type": json, "Origin": "null"}, 403},
		{"PUT from a foreign Origin", "PUT", "/v1/files/v.txt", "x", map[string]string{"Origin": "http://evil.example"}, 403},
		{"JSON POST under a rebound name", "POST", "/v1/files/v.txt:rename", rename, map[string]string{"Content-Type": json, "Host": "attacker.example:" + port}, 403},
		{"listing under a rebound name", "GET", "/v1/dirs", "", map[string]string{"Host": "attacker.example:" + port}, 403},
		{"download under a rebound name", "GET", "/v1/files/v.txt?alt=media", "", map[string]string{"Host": "attacker.example"}, 403},
		{"debug/locks under a rebound name", "GET", "/debug/locks", "", map[string]string{"Host": "attacker.example"}, 403},
		// Exempt: probes and scrapers.
		{"healthz under any name", "GET", "/healthz", "", map[string]string{"Host": "filewrite-0.filewrite", "Origin": "http://evil.example"}, 200},
		{"readyz under any name", "GET", "/readyz", "", map[string]string{"Host": "10-0-0-5.pod"}, 200},
		{"metrics under any name", "GET", "/metrics", "", map[string]string{"Host": "filewrite:8080"}, 200},
		// What curl sends.
		{"listing by localhost", "GET", "/v1/dirs", "", map[string]string{"Host": "localhost:" + port}, 200},
		{"listing by IPv6 literal", "GET", "/v1/dirs", "", map[string]string{"Host": "[::1]:" + port}, 200},
		{"curl -T (no type)", "PUT", "/v1/files/put.txt", "curl", nil, 201},
		{"JSON POST", "POST", "/v1/files/put.txt:fsync", "{}", map[string]string{"Content-Type": "application/json; charset=utf-8"}, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := strings.NewReader(tt.body)
			h := map[string]string{}
			for k, v := range tt.header {
				h[k] = v
			}
			host := h["Host"]
			delete(h, "Host")
			resp, body := sendWithHost(t, tt.method, d.url+tt.path, host, req, h)
			if resp.StatusCode != tt.want {
				t.Errorf("status %d (%s), want %d", resp.StatusCode, body, tt.want)
			}
			if got := string(d.onDisk(t, "v.txt")); got != "victim" {
				t.Fatalf("v.txt holds %q: a refused request changed it", got)
			}
		})
	}
}

// TestBrowserAllowLists: the flags let named origins and hosts through;
// with tokens the origin and host checks are off, the JSON rule stays.
func TestBrowserAllowLists(t *testing.T) {
	d := startDaemon(t, func(c *Config) {
		c.HTTPAllowedOrigins = []string{"https://ui.example"}
		c.HTTPAllowedHosts = []string{"files.internal"}
	})
	json := map[string]string{"Content-Type": "application/json"}
	for _, c := range []struct {
		name, host, origin string
		want               int
	}{
		{"listed origin", "", "https://ui.example", 200},
		{"another origin", "", "https://other.example", 403},
		{"listed host", "files.internal:8080", "", 200},
		{"listed host, another case", "FILES.internal", "", 200},
		{"another host", "other.internal", "", 403},
	} {
		h := map[string]string{"Content-Type": "application/json"}
		if c.origin != "" {
			h["Origin"] = c.origin
		}
		if resp, body := sendWithHost(t, "POST", d.url+"/v1/files/x:truncate", c.host, strings.NewReader("{}"), h); resp.StatusCode != c.want {
			t.Errorf("%s: %d (%s), want %d", c.name, resp.StatusCode, body, c.want)
		}
	}

	tokens := testutil.WriteTokenFile(t, t.TempDir(), "tokens", "browser-test-token")
	withTokens := startDaemon(t, func(c *Config) { c.AuthTokenFile = tokens })
	auth := map[string]string{"Authorization": "Bearer browser-test-token", "Origin": "http://evil.example"}
	for k, v := range json {
		auth[k] = v
	}
	if resp, body := sendWithHost(t, "POST", withTokens.url+"/v1/files/x:truncate", "any.example", strings.NewReader("{}"), auth); resp.StatusCode != 200 {
		t.Errorf("with tokens, a foreign Origin and Host: %d (%s), want 200", resp.StatusCode, body)
	}
	auth["Content-Type"] = "text/plain"
	if resp, body := send(t, "POST", withTokens.url+"/v1/files/x:truncate", strings.NewReader("{}"), auth); resp.StatusCode != 415 {
		t.Errorf("with tokens, a text/plain POST: %d (%s), want 415", resp.StatusCode, body)
	}
}

// TestBrowserGuardFor: a client certificate is sent by a browser on its
// own, as a token is not, so with one the Origin check stays.
func TestBrowserGuardFor(t *testing.T) {
	evil := func() *http.Request {
		r, _ := http.NewRequest("POST", "http://rebound.example/v1/files/x:truncate", nil)
		r.Header.Set("Origin", "http://evil.example")
		return r
	}
	rebound := func() *http.Request {
		r, _ := http.NewRequest("GET", "http://rebound.example/v1/dirs", nil)
		return r
	}
	for _, c := range []struct {
		name                            string
		clientCA                        string
		tokens                          bool
		wantGuard, wantOrigin, wantHost bool
	}{
		{"no credentials", "", false, true, true, true},
		{"bearer tokens", "", true, false, false, false},
		{"client certificates", "ca.pem", true, true, true, false},
	} {
		cfg := DefaultConfig()
		cfg.TLSClientCA = c.clientCA
		g, err := browserGuardFor(cfg, c.tokens)
		if err != nil {
			t.Fatal(err)
		}
		if (g != nil) != c.wantGuard {
			t.Errorf("%s: guard %v, want one: %v", c.name, g, c.wantGuard)
			continue
		}
		if g == nil {
			continue
		}
		if got := g.Check(evil()) != nil; got != c.wantOrigin {
			t.Errorf("%s: a foreign Origin refused: %v, want %v", c.name, got, c.wantOrigin)
		}
		if got := g.Check(rebound()) != nil; got != c.wantHost {
			t.Errorf("%s: a rebound Host refused: %v, want %v", c.name, got, c.wantHost)
		}
	}
}

func TestBrowserGuardConfig(t *testing.T) {
	for _, c := range []struct {
		origins, hosts []string
		ok             bool
	}{
		{[]string{"https://ui.example", "http://localhost:3000", "*"}, []string{"a.example", "*"}, true},
		{[]string{"ui.example"}, nil, false},
		{[]string{"https://ui.example/path"}, nil, false},
		{nil, []string{"a.example:80"}, false},
		{nil, []string{""}, false},
	} {
		cfg := DefaultConfig()
		cfg.HTTPAllowedOrigins, cfg.HTTPAllowedHosts = c.origins, c.hosts
		if err := cfg.Validate(); (err == nil) != c.ok {
			t.Errorf("origins %q, hosts %q: Validate() = %v, want ok %v", c.origins, c.hosts, err, c.ok)
		}
	}
}

// sendWithHost is send with the request's Host set to host, if not empty.
func sendWithHost(t *testing.T, method, url, host string, body io.Reader, header map[string]string) (*http.Response, []byte) {
	t.Helper()
	return testutil.SendHTTP(t, method, url, host, body, header)
}
