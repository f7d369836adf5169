package service

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store"
)

// getLocks fetches /debug/locks as JSON over HTTP.
func (d *daemon) getLocks(t *testing.T) locksReport {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, d.url+"/debug/locks", nil)
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "application/json" {
		t.Fatalf("GET /debug/locks: %s, %s", resp.Status, ct)
	}
	var rep locksReport
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		t.Fatal(err)
	}
	return rep
}

func (r locksReport) file(path string) (store.FileLocks, bool) {
	for _, f := range r.Files {
		if f.Path == path {
			return f, true
		}
	}
	return store.FileLocks{}, false
}

func TestPrefersHTML(t *testing.T) {
	for _, tc := range []struct {
		accept string
		html   bool
	}{
		{"", false},
		{"*/*", false},
		{"application/json", false},
		{"text/html", true},
		{"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", true}, // a browser
		{"application/json, text/html;q=0.5", false},
		{"text/*;q=0.9, application/json;q=0.8", true},
		{"text/html;q=0, */*", false},
		{"not a type, text/html", true},
	} {
		if got := prefersHTML(tc.accept); got != tc.html {
			t.Errorf("prefersHTML(%q) = %v, want %v", tc.accept, got, tc.html)
		}
	}
}

// TestDebugLocksHTMLAndBounds: a browser gets a table with the paths
// escaped; ?limit bounds the list and says so; other methods are refused.
func TestDebugLocksHTMLAndBounds(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	for _, name := range []string{"a<b>.txt", "b", "c"} {
		if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: name, Data: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	r := testutil.DoHTTP(t, http.MethodGet, d.url+"/debug/locks", nil, map[string]string{"Accept": "text/html,*/*;q=0.8"})
	if r.Status != http.StatusOK || !strings.HasPrefix(r.ContentType, "text/html") {
		t.Fatalf("GET /debug/locks as a browser: %d %s", r.Status, r.ContentType)
	}
	if !bytes.Contains(r.Body, []byte("<table>")) || !bytes.Contains(r.Body, []byte("a&lt;b&gt;.txt")) {
		t.Errorf("HTML page lacks the table or the escaped path:\n%s", r.Body)
	}

	r = testutil.DoHTTP(t, http.MethodGet, d.url+"/debug/locks?limit=2&format=json", nil, map[string]string{"Accept": "text/html"})
	var rep locksReport
	if err := json.Unmarshal(r.Body, &rep); err != nil {
		t.Fatalf("?format=json: %v\n%s", err, r.Body)
	}
	if rep.OpenFiles != 3 || rep.Shown != 2 || len(rep.Files) != 2 || !rep.Truncated || !strings.Contains(rep.Note, "limit 2") {
		t.Errorf("?limit=2 of 3 open files: %+v, want 2 shown, truncated, with a note", rep)
	}
	for _, tt := range []struct{ query, reason, field string }{
		{"?limit=0", "PAGE_INVALID", "limit"},
		{"?limit=1001", "PAGE_INVALID", "limit"},
		{"?limit=x", "PAGE_INVALID", "limit"},
		{"?format=xml", "REQUEST_MALFORMED", "format"},
	} {
		r := testutil.DoHTTP(t, http.MethodGet, d.url+"/debug/locks"+tt.query, nil, nil)
		if r.Status != http.StatusBadRequest {
			t.Errorf("GET /debug/locks%s: %d, want 400", tt.query, r.Status)
		}
		err := restStatus(t, r.Body).Err()
		if got, field := errorinfo.Reason(err), errorinfo.From(err).GetMetadata()[errorinfo.KeyField]; got != tt.reason || field != tt.field {
			t.Errorf("GET /debug/locks%s: reason %q, field %q; want %q, %q", tt.query, got, field, tt.reason, tt.field)
		}
	}
	for _, path := range []string{"/debug/locks", "/metrics"} {
		r := testutil.DoHTTP(t, http.MethodPost, d.url+path, nil, nil)
		if r.Status != http.StatusMethodNotAllowed || r.ContentType != "application/json" {
			t.Errorf("POST %s: %d, %s; want 405, application/json", path, r.Status, r.ContentType)
		}
		// The body is a google.rpc.Status, as on every other route.
		st := restStatus(t, r.Body)
		if st.Code() != codes.Unimplemented || errorinfo.Reason(st.Err()) != "METHOD_NOT_ALLOWED" {
			t.Errorf("POST %s: body %s, want UNIMPLEMENTED with reason METHOD_NOT_ALLOWED", path, r.Body)
		}
	}
}

// TestObservabilityRoutesNeedToken: with tokens configured, /metrics and
// /debug/locks are refused without one, like every route: they show file
// paths and trace ids.
func TestObservabilityRoutesNeedToken(t *testing.T) {
	d := startAuthDaemon(t)
	for _, path := range []string{"/metrics", "/debug/locks"} {
		if r := testutil.DoHTTP(t, http.MethodGet, d.url+path, nil, nil); r.Status != http.StatusUnauthorized {
			t.Errorf("GET %s without a token: %d, want 401", path, r.Status)
		}
		r := testutil.DoHTTP(t, http.MethodGet, d.url+path, nil, map[string]string{"Authorization": "Bearer " + tokenAlpha})
		if r.Status != http.StatusOK {
			t.Errorf("GET %s with a token: %d, want 200", path, r.Status)
		}
	}
}
