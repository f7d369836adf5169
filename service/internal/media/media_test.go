package media

import (
	"net/http"
	"testing"
)

func TestSetHeaders(t *testing.T) {
	for _, tc := range []struct {
		path, ct   string
		attachment bool
		wantType   string
		wantDisp   string
	}{
		{"a/photo.png", "image/png", false, "image/png", `inline; filename="photo.png"`},
		{"a/notes.txt", "text/plain; charset=utf-8", false, "text/plain; charset=utf-8", `inline; filename="notes.txt"`},
		{"doc.pdf", "application/pdf", false, "application/pdf", `inline; filename="doc.pdf"`},
		{"page.html", "text/html", false, "text/html", `attachment; filename="page.html"`},
		{"logo.svg", "image/svg+xml", false, "image/svg+xml", `attachment; filename="logo.svg"`},
		{"raw.bin", "", false, OctetStream, `attachment; filename="raw.bin"`},
		{"photo.png", "image/png", true, "image/png", `attachment; filename="photo.png"`},
		{"résumé \"v2\".txt", "text/plain", true, "text/plain", `attachment; filename="r_sum_ _v2_.txt"; filename*=UTF-8''r%C3%A9sum%C3%A9%20%22v2%22.txt`},
	} {
		h := http.Header{}
		SetHeaders(h, tc.path, tc.ct, tc.attachment)
		if got := h.Get("Content-Type"); got != tc.wantType {
			t.Errorf("%s: Content-Type %q, want %q", tc.path, got, tc.wantType)
		}
		if got := h.Get("Content-Disposition"); got != tc.wantDisp {
			t.Errorf("%s: Content-Disposition %q, want %q", tc.path, got, tc.wantDisp)
		}
		if got := h.Get("X-Content-Type-Options"); got != "nosniff" {
			t.Errorf("%s: X-Content-Type-Options %q, want nosniff", tc.path, got)
		}
	}
}
