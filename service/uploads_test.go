package service

import (
	"encoding/base64"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

// tusMeta is an Upload-Metadata header of key, value pairs.
func tusMeta(kv ...string) string {
	var parts []string
	for i := 0; i+1 < len(kv); i += 2 {
		parts = append(parts, kv[i]+" "+base64.StdEncoding.EncodeToString([]byte(kv[i+1])))
	}
	return strings.Join(parts, ",")
}

// TestScopedUploads: a tus upload is scoped as a PUT of its target: a
// tenant's filename lands in its own directory, a path outside its
// prefix or a read-only credential is refused before anything is kept,
// and another tenant cannot see the upload.
func TestScopedUploads(t *testing.T) {
	d, _ := startTenantDaemon(t)
	hdr := func(tok string, kv ...string) map[string]string {
		m := map[string]string{"Authorization": "Bearer " + tok, "Tus-Resumable": "1.0.0"}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, tc := range []struct {
		name string
		hdr  map[string]string
		want int
	}{
		{"filename in the tenant's directory", hdr(tokenRW, "Upload-Length", "5", "Upload-Metadata", tusMeta("filename", "up.bin")), 201},
		{"path inside", hdr(tokenRW, "Upload-Length", "5", "Upload-Metadata", tusMeta("path", "tenants/a/sub/up.bin")), 201},
		{"path outside", hdr(tokenRW, "Upload-Length", "5", "Upload-Metadata", tusMeta("path", "tenants/b/up.bin")), 403},
		{"through the link", hdr(tokenRW, "Upload-Length", "5", "Upload-Metadata", tusMeta("path", "tenants/a/link/up.bin")), 403},
		{"read-only", hdr(tokenRO, "Upload-Length", "5", "Upload-Metadata", tusMeta("filename", "up.bin")), 403},
		{"read-only partial", hdr(tokenRO, "Upload-Length", "5", "Upload-Concat", "partial"), 403},
		{"no token", map[string]string{"Tus-Resumable": "1.0.0", "Upload-Length": "5", "Upload-Metadata": tusMeta("filename", "up.bin")}, 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testutil.DoHTTP(t, "POST", d.url+"/v1/uploads/", nil, tc.hdr)
			if r.Status != tc.want {
				t.Fatalf("POST: %d (%s), want %d", r.Status, r.Body, tc.want)
			}
			if r.Status != http.StatusCreated {
				return
			}
			loc := r.Header.Get("Location")
			if r := testutil.DoHTTP(t, "HEAD", loc, nil, hdr(tokenAdmin)); r.Status != http.StatusNotFound {
				t.Errorf("HEAD by another credential: %d, want 404", r.Status)
			}
			r = testutil.DoHTTP(t, "PATCH", loc, strings.NewReader("hello"), hdr(tokenRW, "Upload-Offset", "0", "Content-Type", "application/offset+octet-stream"))
			if r.Status != http.StatusNoContent {
				t.Fatalf("PATCH: %d (%s)", r.Status, r.Body)
			}
		})
	}
	for _, p := range []string{"tenants/a/up.bin", "tenants/a/sub/up.bin"} {
		if b, err := os.ReadFile(filepath.Join(d.root, p)); err != nil || string(b) != "hello" {
			t.Errorf("%s: %q, %v; want hello", p, b, err)
		}
	}
}
