package service

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

// TestContentTypes: a PUT's Content-Type is the file's, answered by Stat
// and served with downloads; a download is shown in place only for the
// safe types and never with download=1; a type that is no media type is
// refused before anything is written.
func TestContentTypes(t *testing.T) {
	d := startDaemon(t, nil)
	files := d.url + "/v1/files/"
	for _, tc := range []struct {
		name, path, putType string
		download            bool
		wantType, wantDisp  string
	}{
		{"image", "a/photo.png", "image/png", false, "image/png", `inline; filename="photo.png"`},
		{"image, download=1", "a/photo.png", "", true, "image/png", `attachment; filename="photo.png"`},
		{"html", "a/page.html", "text/html; charset=utf-8", false, "text/html; charset=utf-8", `attachment; filename="page.html"`},
		{"no type (curl -T)", "a/raw.bin", "", false, "application/octet-stream", `attachment; filename="raw.bin"`},
		{"text", "a/notes.txt", "text/plain", false, "text/plain", `inline; filename="notes.txt"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr := map[string]string{}
			if tc.putType != "" {
				hdr["Content-Type"] = tc.putType
			}
			if !tc.download {
				if r := testutil.DoHTTP(t, "PUT", files+tc.path, strings.NewReader("<b>x</b>"), hdr); r.Status/100 != 2 {
					t.Fatalf("PUT: %d %s", r.Status, r.Body)
				}
			}
			q := "?alt=media"
			if tc.download {
				q += "&download=1"
			}
			for _, method := range []string{"GET", "HEAD"} {
				r := testutil.DoHTTP(t, method, files+tc.path+q, nil, nil)
				if r.Status != http.StatusOK {
					t.Fatalf("%s: %d %s", method, r.Status, r.Body)
				}
				if r.ContentType != tc.wantType || r.Header.Get("Content-Disposition") != tc.wantDisp || r.Header.Get("X-Content-Type-Options") != "nosniff" {
					t.Errorf("%s: Content-Type %q, Content-Disposition %q, X-Content-Type-Options %q; want %q, %q, nosniff",
						method, r.ContentType, r.Header.Get("Content-Disposition"), r.Header.Get("X-Content-Type-Options"), tc.wantType, tc.wantDisp)
				}
			}
			r := testutil.DoHTTP(t, "GET", files+tc.path, nil, nil)
			var st struct {
				ContentType string `json:"contentType"`
			}
			if err := json.Unmarshal(r.Body, &st); err != nil {
				t.Fatal(err)
			}
			if want := tc.putType; want != "" && st.ContentType != want {
				t.Errorf("Stat: contentType %q, want %q", st.ContentType, want)
			}
		})
	}
	before := testutil.Snapshot(t, d.root)
	for _, bad := range []string{"text", "text/plain; x=\"\u00e9\"", "image/" + strings.Repeat("x", 300)} {
		r := testutil.DoHTTP(t, "PUT", files+"a/bad.bin", strings.NewReader("x"), map[string]string{"Content-Type": bad})
		if r.Status != http.StatusBadRequest {
			t.Errorf("PUT with Content-Type %q: %d %s, want 400", bad, r.Status, r.Body)
		}
	}
	testutil.CheckUnchanged(t, d.root, before)
	if r := testutil.DoHTTP(t, "GET", files+"a/raw.bin?alt=media&download=yes", nil, nil); r.Status != http.StatusBadRequest {
		t.Errorf("download=yes: %d, want 400", r.Status)
	}
}
