package gateway

import (
	"net/http"
	"strings"
	"testing"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
)

func TestParseContentRange(t *testing.T) {
	for _, tt := range []struct {
		values []string
		want   contentRange
		ok     bool
		err    string // in the refusal; "" for none
	}{
		{nil, contentRange{}, false, ""},
		{[]string{"bytes 0-0/1"}, contentRange{byteRange{0, 0}, 1}, true, ""},
		{[]string{"bytes 100-115/116"}, contentRange{byteRange{100, 115}, 116}, true, ""},
		{[]string{"bytes 100-115/*"}, contentRange{byteRange{100, 115}, -1}, true, ""},
		{[]string{"bytes 5-5/1000000000000"}, contentRange{byteRange{5, 5}, 1000000000000}, true, ""},
		{[]string{"bytes 0-0/1", "bytes 1-1/2"}, contentRange{}, false, "2 Content-Range headers"},
		{[]string{"bytes=0-0/1"}, contentRange{}, false, "not a range of bytes"},
		{[]string{"Bytes 0-0/1"}, contentRange{}, false, "not a range of bytes"},
		{[]string{"bytes */116"}, contentRange{}, false, "no first-last/length"},
		{[]string{"bytes 0-/1"}, contentRange{}, false, "first and last must be byte positions"},
		{[]string{"bytes -1-2/3"}, contentRange{}, false, "first and last must be byte positions"},
		{[]string{"bytes 0-1"}, contentRange{}, false, "no first-last/length"},
		{[]string{"bytes 3-2/10"}, contentRange{}, false, "the last byte comes before the first"},
		{[]string{"bytes 0-10/10"}, contentRange{}, false, "the last byte is not below the length"},
		{[]string{"bytes 0-1/x"}, contentRange{}, false, "the length must be a number of bytes or *"},
		{[]string{"bytes 0-99999999999999999999/*"}, contentRange{}, false, "the last byte is past any file"},
	} {
		got, ok, err := parseContentRange(tt.values)
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("%q: error %v, want one saying %q", tt.values, err, tt.err)
		case tt.err == "" && err != nil:
			t.Errorf("%q: error %v", tt.values, err)
		case got != tt.want || ok != tt.ok:
			t.Errorf("%q: got %+v, %v; want %+v, %v", tt.values, got, ok, tt.want, tt.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "Content-Range") {
			t.Errorf("%q: the refusal %q does not name the header", tt.values, err)
		}
	}
}

// TestGatewayPutContentRange: a PUT with a Content-Range writes its body
// at the range's first byte, with or without an offset that agrees, and
// its complete length does not resize the file.
func TestGatewayPutContentRange(t *testing.T) {
	fake, base := startFakeGateway(t, 1<<20)
	for _, tt := range []struct{ query, header string }{
		{"", "bytes 100-115/116"},
		{"?offset=100", "bytes 100-115/*"},
		{"?sync=data", "bytes 100-115/1000000"},
	} {
		fake.requests()
		r := testutil.DoHTTP(t, "PUT", base+"/v1/files/p"+tt.query, strings.NewReader("0123456789abcdef"), withRange(tt.header))
		if r.Status != http.StatusOK {
			t.Fatalf("PUT %s with Content-Range %s: %d %s, want 200", tt.query, tt.header, r.Status, r.Body)
		}
		reqs := fake.requests()
		if len(reqs) != 1 {
			t.Fatalf("PUT %s with Content-Range %s: %d requests reached the server, want one Write", tt.query, tt.header, len(reqs))
		}
		w, ok := reqs[0].(*filewritev1.WriteRequest)
		if !ok || w.Offset != 100 || string(w.Data) != "0123456789abcdef" {
			t.Errorf("PUT %s with Content-Range %s: the server got %v, want a Write of the body at 100", tt.query, tt.header, reqs[0])
		}
	}
}
