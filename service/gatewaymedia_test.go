package service

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/admit"
	"github.com/filewrite/filewrite/service/internal/gateway"
)

// send makes one request with Go's client and reads its whole answer.
func send(t *testing.T, method, url string, body io.Reader, header map[string]string) (*http.Response, []byte) {
	t.Helper()
	return sendWithHost(t, method, url, "", body, header)
}

// withFreshValidators, given to startDaemon, makes every file carry a
// Last-Modified at once, however recently it changed, so that tests need
// not wait gateway.DefaultLastModifiedDelay (the ETag is there at once
// anyway).
func withFreshValidators(c *Config) { c.freshLastModified = true }

func TestDownloadRanges(t *testing.T) {
	d := startDaemon(t, withFreshValidators)
	// Longer than one Read of the gateway, so that ranges cross chunks.
	content := testutil.AllBytes(2*gateway.ReadChunkBytes + 77)
	if err := os.WriteFile(filepath.Join(d.root, "r.bin"), content, 0o644); err != nil {
		t.Fatal(err)
	}
	n := int64(len(content))
	url := d.url + "/v1/files/r.bin?alt=media"
	whole := fmt.Sprintf("0-%d", n-1)
	tests := []struct {
		name      string
		rng       string
		wantCode  int
		wantSpan  string // first-last of the body, "" for none
		wantRange string // Content-Range
	}{
		{"no Range", "", 200, whole, ""},
		{"first 16 bytes", "bytes=0-15", 206, "0-15", "bytes 0-15/" + strconv.FormatInt(n, 10)},
		{"across a chunk boundary", fmt.Sprintf("bytes=%d-%d", gateway.ReadChunkBytes-3, gateway.ReadChunkBytes+3), 206,
			fmt.Sprintf("%d-%d", gateway.ReadChunkBytes-3, gateway.ReadChunkBytes+3), ""},
		{"from an offset to the end", fmt.Sprintf("bytes=%d-", n-10), 206, fmt.Sprintf("%d-%d", n-10, n-1), ""},
		{"the last 7 bytes", "bytes=-7", 206, fmt.Sprintf("%d-%d", n-7, n-1), ""},
		{"a suffix longer than the file", "bytes=-99999999", 206, whole, ""},
		{"an end past the file", fmt.Sprintf("bytes=5-%d", n+100), 206, fmt.Sprintf("5-%d", n-1), ""},
		{"two ranges: served whole", "bytes=0-1,4-5", 200, whole, ""},
		{"another unit: ignored", "items=0-1", 200, whole, ""},
		{"first byte past the end", fmt.Sprintf("bytes=%d-", n), 416, "", "bytes */" + strconv.FormatInt(n, 10)},
		{"last before first", "bytes=5-2", 416, "", ""},
		{"empty suffix", "bytes=-0", 416, "", ""},
		{"not a range", "bytes=abc", 416, "", ""},
		{"no dash", "bytes=5", 416, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := map[string]string{}
			if tt.rng != "" {
				h["Range"] = tt.rng
			}
			resp, body := send(t, "GET", url, nil, h)
			if resp.StatusCode != tt.wantCode {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, body, tt.wantCode)
			}
			if tt.wantRange != "" {
				if got := resp.Header.Get("Content-Range"); got != tt.wantRange {
					t.Errorf("Content-Range %q, want %q", got, tt.wantRange)
				}
			}
			if tt.wantSpan == "" {
				return
			}
			var first, last int64
			fmt.Sscanf(tt.wantSpan, "%d-%d", &first, &last)
			if want := content[first : last+1]; !bytes.Equal(body, want) {
				t.Errorf("body: %d bytes, want the %d of %s", len(body), len(want), tt.wantSpan)
			}
			if got := resp.Header.Get("Content-Type"); got != gateway.MIMEOctetStream {
				t.Errorf("Content-Type %q, want %q", got, gateway.MIMEOctetStream)
			}
			if resp.Header.Get("Accept-Ranges") != "bytes" || resp.Header.Get("ETag") == "" || resp.Header.Get("Last-Modified") == "" {
				t.Errorf("headers %v: want Accept-Ranges, ETag and Last-Modified", resp.Header)
			}

			// HEAD: the same headers, no body.
			head, hbody := send(t, "HEAD", url, nil, h)
			if head.StatusCode != resp.StatusCode || len(hbody) != 0 || head.ContentLength != int64(len(body)) {
				t.Errorf("HEAD: %d, %d body bytes, Content-Length %d; want %d, none, %d",
					head.StatusCode, len(hbody), head.ContentLength, resp.StatusCode, len(body))
			}
			for _, k := range []string{"ETag", "Last-Modified", "Content-Range", "Accept-Ranges", "Content-Type"} {
				if head.Header.Get(k) != resp.Header.Get(k) {
					t.Errorf("HEAD %s %q, GET %q", k, head.Header.Get(k), resp.Header.Get(k))
				}
			}
		})
	}

	// An empty file has no byte to range over, but downloads whole.
	if err := os.WriteFile(filepath.Join(d.root, "empty"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if resp, body := send(t, "GET", d.url+"/v1/files/empty?alt=media", nil, nil); resp.StatusCode != 200 || len(body) != 0 {
		t.Errorf("empty file: %d with %d bytes, want 200 with none", resp.StatusCode, len(body))
	}
	if resp, _ := send(t, "GET", d.url+"/v1/files/empty?alt=media", nil, map[string]string{"Range": "bytes=0-"}); resp.StatusCode != 416 {
		t.Errorf("empty file, bytes=0-: %d, want 416", resp.StatusCode)
	}
}

func TestDownloadRefusals(t *testing.T) {
	d := startDaemon(t, nil)
	os.WriteFile(filepath.Join(d.root, "f"), []byte("data"), 0o644)
	tests := []struct {
		name, method, path string
		want               int
	}{
		{"missing file", "GET", "/v1/files/missing?alt=media", 404},
		{"alt=json", "GET", "/v1/files/f?alt=json", 400},
		{"alt twice", "GET", "/v1/files/f?alt=media&alt=media", 400},
		{"unknown parameter", "GET", "/v1/files/f?alt=media&offset=1", 400},
		{"alt on :read", "GET", "/v1/files/f:read?alt=media", 400},
		{"alt on :extents", "GET", "/v1/files/f:extents?alt=media", 400},
		{"alt on a directory listing", "GET", "/v1/dirs?alt=media", 400},
		{"a directory", "GET", "/v1/files/?alt=media", 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := send(t, tt.method, d.url+tt.path, nil, nil)
			if resp.StatusCode != tt.want {
				t.Errorf("status %d (%s), want %d", resp.StatusCode, body, tt.want)
			}
		})
	}
}

func TestDownloadPreconditions(t *testing.T) {
	d := startDaemon(t, withFreshValidators)
	os.WriteFile(filepath.Join(d.root, "v"), []byte("version one"), 0o644)
	url := d.url + "/v1/files/v?alt=media"
	resp, _ := send(t, "GET", url, nil, nil)
	etag, lm := resp.Header.Get("ETag"), resp.Header.Get("Last-Modified")
	if !strings.HasPrefix(etag, `"`) || lm == "" {
		t.Fatalf("ETag %q, Last-Modified %q: want a strong tag and a date", etag, lm)
	}
	lmTime, _ := http.ParseTime(lm)
	before := lmTime.Add(-time.Second).Format(http.TimeFormat)
	weak := "W/" + etag
	tests := []struct {
		name   string
		header map[string]string
		want   int
	}{
		{"If-None-Match: current", map[string]string{"If-None-Match": etag}, 304},
		{"If-None-Match: current, weak (weak comparison)", map[string]string{"If-None-Match": weak}, 304},
		{"If-None-Match: in a list", map[string]string{"If-None-Match": `"a", ` + etag}, 304},
		{"If-None-Match: other", map[string]string{"If-None-Match": `W/"0000"`}, 200},
		{"If-None-Match: *", map[string]string{"If-None-Match": "*"}, 304},
		{"If-None-Match: malformed", map[string]string{"If-None-Match": "abc"}, 400},
		{"If-Modified-Since: Last-Modified", map[string]string{"If-Modified-Since": lm}, 304},
		{"If-Modified-Since: a second earlier", map[string]string{"If-Modified-Since": before}, 200},
		{"If-Modified-Since: not a date (ignored)", map[string]string{"If-Modified-Since": "yesterday"}, 200},
		{"If-None-Match wins over If-Modified-Since", map[string]string{"If-None-Match": `"x"`, "If-Modified-Since": lm}, 200},
		{"If-Match: current", map[string]string{"If-Match": etag}, 200},
		{"If-Match: current, weak (strong comparison)", map[string]string{"If-Match": weak}, 412},
		{"If-Match: *", map[string]string{"If-Match": "*"}, 200},
		{"If-Match: other", map[string]string{"If-Match": `"1234"`}, 412},
		{"If-Match: malformed", map[string]string{"If-Match": `W/"open`}, 400},
		{"If-Unmodified-Since: Last-Modified", map[string]string{"If-Unmodified-Since": lm}, 200},
		{"If-Unmodified-Since: a second earlier", map[string]string{"If-Unmodified-Since": before}, 412},
		{"If-Range: the tag", map[string]string{"If-Range": etag, "Range": "bytes=0-1"}, 206},
		{"If-Range: the tag, weak", map[string]string{"If-Range": weak, "Range": "bytes=0-1"}, 200},
		{"If-Range: another tag", map[string]string{"If-Range": `"1234"`, "Range": "bytes=0-1"}, 200},
		{"If-Range: Last-Modified", map[string]string{"If-Range": lm, "Range": "bytes=0-1"}, 206},
		{"If-Range: another date", map[string]string{"If-Range": before, "Range": "bytes=0-1"}, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, method := range []string{"GET", "HEAD"} {
				resp, body := send(t, method, url, nil, tt.header)
				if resp.StatusCode != tt.want {
					t.Errorf("%s: status %d (%s), want %d", method, resp.StatusCode, body, tt.want)
				}
				if resp.StatusCode == 304 && (len(body) != 0 || resp.Header.Get("ETag") != etag) {
					t.Errorf("%s: 304 with %d body bytes and ETag %q, want none and %q", method, len(body), resp.Header.Get("ETag"), etag)
				}
			}
		})
	}

	// A write changes the tag: the old one no longer matches.
	if _, err := d.client.Write(testContext(t), &filewritev1.WriteRequest{Path: "v", Offset: 8, Data: []byte("two")}); err != nil {
		t.Fatal(err)
	}
	resp, body := send(t, "GET", url, nil, map[string]string{"If-None-Match": etag})
	if resp.StatusCode != 200 || string(body) != "version two" || resp.Header.Get("ETag") == etag {
		t.Errorf("after a write: %d %q with ETag %q; want 200, the new content and a new tag", resp.StatusCode, body, resp.Header.Get("ETag"))
	}
	if resp, _ := send(t, "GET", url, nil, map[string]string{"If-Match": etag}); resp.StatusCode != 412 {
		t.Errorf("If-Match: the old tag after a write: %d, want 412", resp.StatusCode)
	}
}

// TestLastModifiedWaitsForTheClock: a file changed just now has its
// strong ETag at once, but no Last-Modified yet, so that a date
// precondition on it fails rather than pass wrongly; its tag tells the
// next change at once.
func TestLastModifiedWaitsForTheClock(t *testing.T) {
	d := startDaemon(t, nil) // DefaultLastModifiedDelay
	w, err := d.client.Write(testContext(t), &filewritev1.WriteRequest{Path: "new", Data: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	resp, _ := send(t, "GET", d.url+"/v1/files/new?alt=media", nil, nil)
	etag := resp.Header.Get("ETag")
	if resp.StatusCode != 200 || etag != fmt.Sprintf(`"%d"`, w.GetGeneration()) || resp.Header.Get("Last-Modified") != "" {
		t.Errorf("just written: %d, ETag %q, Last-Modified %q; want 200, the write's generation %d as the tag, no date",
			resp.StatusCode, etag, resp.Header.Get("Last-Modified"), w.GetGeneration())
	}
	now := time.Now().UTC().Format(http.TimeFormat)
	if resp, _ := send(t, "GET", d.url+"/v1/files/new?alt=media", nil, map[string]string{"If-Unmodified-Since": now}); resp.StatusCode != 412 {
		t.Errorf("If-Unmodified-Since on a file just written: %d, want 412", resp.StatusCode)
	}
	if resp, _ := send(t, "GET", d.url+"/v1/files/new?alt=media", nil, map[string]string{"If-None-Match": etag}); resp.StatusCode != 304 {
		t.Errorf("If-None-Match: its tag, at once: %d, want 304", resp.StatusCode)
	}
	if _, err := d.client.Write(testContext(t), &filewritev1.WriteRequest{Path: "new", Data: []byte("y")}); err != nil {
		t.Fatal(err)
	}
	if resp, _ := send(t, "GET", d.url+"/v1/files/new?alt=media", nil, map[string]string{"If-None-Match": etag}); resp.StatusCode != 200 {
		t.Errorf("If-None-Match: its tag, after a write within the second: %d, want 200", resp.StatusCode)
	}
	st, err := d.client.Stat(testContext(t), &filewritev1.StatRequest{Path: "new"})
	if err != nil || st.GetEtag() != fmt.Sprintf(`"%d"`, st.GetGeneration()) || st.GetEtag() == etag || st.GetChangeTime() == nil {
		t.Errorf("Stat: %v, %v; want a change time, and an etag of its generation, new", st, err)
	}
}

func TestPutPreconditions(t *testing.T) {
	d := startDaemon(t, withFreshValidators)
	os.WriteFile(filepath.Join(d.root, "p"), []byte("original"), 0o644)
	resp, _ := send(t, "GET", d.url+"/v1/files/p?alt=media", nil, nil)
	etag := resp.Header.Get("ETag")
	tests := []struct {
		name     string
		path     string
		header   map[string]string
		want     int
		wantFile string // what p holds afterwards
	}{
		{"If-Match: stale", "p", map[string]string{"If-Match": `"1234"`}, 412, "original"},
		{"If-Match: current but weak", "p", map[string]string{"If-Match": "W/" + etag}, 412, "original"},
		{"If-None-Match: current", "p", map[string]string{"If-None-Match": etag}, 412, "original"},
		{"If-Match: malformed", "p", map[string]string{"If-Match": "stale"}, 400, "original"},
		{"If-Unmodified-Since: long ago", "p", map[string]string{"If-Unmodified-Since": "Mon, 02 Jan 2006 15:04:05 GMT"}, 412, "original"},
		{"If-Match: * on a missing file", "missing", map[string]string{"If-Match": "*"}, 412, "original"},
		{"If-Match: current", "p", map[string]string{"If-Match": etag}, 200, "PUTginal"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := map[string]string{"Content-Type": gateway.MIMEOctetStream}
			for k, v := range tt.header {
				h[k] = v
			}
			resp, body := send(t, "PUT", d.url+"/v1/files/"+tt.path, strings.NewReader("PUT"), h)
			if resp.StatusCode != tt.want {
				t.Errorf("status %d (%s), want %d", resp.StatusCode, body, tt.want)
			}
			if got := string(d.onDisk(t, "p")); got != tt.wantFile {
				t.Errorf("p holds %q, want %q", got, tt.wantFile)
			}
			if _, err := os.Stat(filepath.Join(d.root, "missing")); err == nil {
				t.Errorf("a refused PUT created missing")
			}
		})
	}
}

func TestReadToEOF(t *testing.T) {
	d := startDaemon(t, func(c *Config) {
		c.Store.MaxRequestBytes = 1 << 20
		c.MaxInflightBytes = admit.MinInflightBytes(1 << 20)
	})
	content := testutil.AllBytes(gateway.ReadChunkBytes + 10)
	os.WriteFile(filepath.Join(d.root, "f"), content, 0o644)
	os.WriteFile(filepath.Join(d.root, "big"), make([]byte, 1<<20+1), 0o644)
	octet := map[string]string{"Accept": gateway.MIMEOctetStream}
	tests := []struct {
		name, query string
		want        int
		wantBody    []byte
	}{
		{"no length", "", 200, content},
		{"offset, no length", "?offset=100", 200, content[100:]},
		{"offset at EOF", fmt.Sprintf("?offset=%d", len(content)), 200, nil},
		{"offset past EOF", "?offset=99999999", 200, nil},
		{"length 0 reads nothing, as in gRPC", "?length=0", 200, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := send(t, "GET", d.url+"/v1/files/f:read"+tt.query, nil, octet)
			if resp.StatusCode != tt.want || !bytes.Equal(body, tt.wantBody) {
				t.Errorf("%d with %d bytes, want %d with %d", resp.StatusCode, len(body), tt.want, len(tt.wantBody))
			}
		})
	}
	resp, body := send(t, "GET", d.url+"/v1/files/big:read", nil, nil)
	if resp.StatusCode < 400 || !strings.Contains(string(body), "--max-request-bytes") || !strings.Contains(string(body), "alt=media") {
		t.Errorf("to EOF past --max-request-bytes: %d %s; want a refusal naming the limit and alt=media", resp.StatusCode, body)
	}
}

// TestMethodNotAllowed: a method that a path does not take is a 405 whose
// Allow lists the ones it does. A path whose last segment ends in a verb
// (":read", ":truncate") names that verb's route on every method: a wrong
// method is told the verb's methods, not answered as a request on a file
// named "x:truncate" (a Stat's 404, a raw PUT that creates it); such a
// file is reached by gRPC, or over REST as "x:truncate:read" and the like.
func TestMethodNotAllowed(t *testing.T) {
	d := startDaemon(t, nil)
	if err := os.WriteFile(filepath.Join(d.root, "x"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	json := map[string]string{"Content-Type": "application/json"}
	octet := map[string]string{"Content-Type": gateway.MIMEOctetStream}
	tests := []struct {
		method, path string
		header       map[string]string
		wantAllow    string
	}{
		{"PATCH", "/v1/files/a", nil, "GET, HEAD, PUT, DELETE"},
		{"POST", "/v1/files/a", json, "GET, HEAD, PUT, DELETE"},
		{"PUT", "/v1/dirs", nil, "GET, HEAD"},
		{"DELETE", "/v1/dirs/x", nil, "GET, HEAD"},
		{"POST", "/v1/dirs", json, "GET, HEAD"},
		{"POST", "/healthz", nil, "GET, HEAD"},
		// Verb routes.
		{"OPTIONS", "/v1/files/a:read", nil, "GET, HEAD"},
		{"GET", "/v1/files/x:truncate", nil, "POST"},
		{"HEAD", "/v1/files/x:append", nil, "POST"},
		{"GET", "/v1/files/x:write?alt=media", nil, "POST"},
		{"GET", "/v1/files/x%3Afsync", nil, "POST"},
		{"POST", "/v1/files/x:read", json, "GET, HEAD"},
		{"POST", "/v1/files/x:extents", octet, "GET, HEAD"},
		{"PUT", "/v1/files/x:write", octet, "POST"},
		{"PUT", "/v1/files/x:rename", nil, "POST"},
		{"DELETE", "/v1/files/x:read", nil, "GET, HEAD"},
		{"DELETE", "/v1/files/x:fallocate", nil, "POST"},
		{"PUT", "/v1/files/x:digest", octet, "GET, HEAD"},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			resp, body := send(t, tt.method, d.url+tt.path, strings.NewReader("body"), tt.header)
			if resp.StatusCode != 405 || resp.Header.Get("Allow") != tt.wantAllow {
				t.Errorf("%d, Allow %q (%s); want 405, Allow %q", resp.StatusCode, resp.Header.Get("Allow"), body, tt.wantAllow)
			}
			if tt.method == "HEAD" {
				return // no body
			}
			info := errorinfo.From(restStatus(t, body).Err())
			if got := info.GetReason(); got != "METHOD_NOT_ALLOWED" || info.GetMetadata()["allow"] != tt.wantAllow {
				t.Errorf("ErrorInfo %v, want reason METHOD_NOT_ALLOWED with allow %q", info, tt.wantAllow)
			}
		})
	}
	// Nothing was written, created or deleted (.filewrite is the
	// daemon's own).
	names, err := os.ReadDir(d.root)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range names {
		if e.Name() != ".filewrite" {
			got = append(got, e.Name())
		}
	}
	if !slices.Equal(got, []string{"x"}) || string(d.onDisk(t, "x")) != "x" {
		t.Errorf("root after the refused requests: %q, x holding %q; want only x, holding \"x\"", got, d.onDisk(t, "x"))
	}
}

// TestRouteNotFound: a path that no route serves is a 404 whose reason
// says so, not that a file is missing.
func TestRouteNotFound(t *testing.T) {
	d := startDaemon(t, nil)
	for _, path := range []string{"/", "/v1", "/v2/files/a", "/v1/file/a"} {
		resp, body := send(t, "GET", d.url+path, nil, nil)
		if resp.StatusCode != 404 {
			t.Errorf("GET %s: %d %s, want 404", path, resp.StatusCode, body)
			continue
		}
		if got := errorinfo.Reason(restStatus(t, body).Err()); got != "ROUTE_NOT_FOUND" {
			t.Errorf("GET %s: reason %q (%s), want ROUTE_NOT_FOUND", path, got, body)
		}
	}
}

// TestVerbRoutesServeTheirMethods: beside the refusals above, the verb
// routes and names with a colon that ends in no verb are served as before.
func TestVerbRoutesServeTheirMethods(t *testing.T) {
	d := startDaemon(t, nil)
	json := map[string]string{"Content-Type": "application/json"}
	for _, c := range []struct {
		method, path string
		header       map[string]string
		body         string
	}{
		{"PUT", "/v1/files/a:b?offset=0", nil, "colon"},
		{"GET", "/v1/files/a:b", nil, ""},
		{"GET", "/v1/files/a:b?alt=media", nil, ""},
		{"POST", "/v1/files/a:b:write", json, `{"offset":"5","data":"eA=="}`},
		{"GET", "/v1/files/a:b:read", nil, ""},
		{"HEAD", "/v1/files/a:b:read", nil, ""},
		{"POST", "/v1/files/a:b%3Atruncate", json, `{"size":"6"}`},
		{"GET", "/v1/files/a:b:extents", nil, ""},
		{"DELETE", "/v1/files/a:b", nil, ""},
	} {
		resp, body := send(t, c.method, d.url+c.path, strings.NewReader(c.body), c.header)
		if resp.StatusCode != 200 && resp.StatusCode != 201 {
			t.Errorf("%s %s: %d %s, want 200 or 201", c.method, c.path, resp.StatusCode, body)
		}
	}
}

// TestDoorsBesideVerbRoutes: the verb routes' 405 and the unknown route's
// 404 are the gateway's; the doors on the HTTP listener beside it serve
// their own paths whatever their last segment, and their own methods.
func TestDoorsBesideVerbRoutes(t *testing.T) {
	d := startDaemon(t, nil)
	tus := map[string]string{"Tus-Resumable": "1.0.0"}
	for _, c := range []struct {
		method, path string
		header       map[string]string
		body         string
		want         int
	}{
		{"PUT", "/dav/v:truncate", nil, "dav", 201},
		{"GET", "/dav/v:truncate", nil, "", 200},
		{"PROPFIND", "/dav/v:read", map[string]string{"Depth": "0"}, "", 404},
		{"PROPFIND", "/dav/", map[string]string{"Depth": "1"}, "", 207},
		{"MKCOL", "/dav/d:write", nil, "", 201},
		{"OPTIONS", "/v1/uploads/", tus, "", 200},
		{"POST", "/v1/uploads/", map[string]string{"Tus-Resumable": "1.0.0", "Upload-Length": "3",
			"Upload-Metadata": "filename dS5iaW4="}, "", 201},
		{"PATCH", "/v1/uploads/x:truncate", map[string]string{"Tus-Resumable": "1.0.0", "Upload-Offset": "0",
			"Content-Type": "application/offset+octet-stream"}, "abc", 404},
	} {
		resp, body := send(t, c.method, d.url+c.path, strings.NewReader(c.body), c.header)
		if resp.StatusCode != c.want {
			t.Errorf("%s %s: %d %s, want %d", c.method, c.path, resp.StatusCode, body, c.want)
		}
		for _, r := range []string{"METHOD_NOT_ALLOWED", "ROUTE_NOT_FOUND"} {
			if strings.Contains(string(body), r) {
				t.Errorf("%s %s: the gateway's %s (%s), want the door's answer", c.method, c.path, r, body)
			}
		}
	}
}

// TestNoGRPCMetadataHeaders: what the gateway's gRPC server sets is not
// the HTTP client's business.
func TestNoGRPCMetadataHeaders(t *testing.T) {
	d := startDaemon(t, nil)
	os.WriteFile(filepath.Join(d.root, "f"), []byte("x"), 0o644)
	for _, c := range []struct{ method, path, ct, body string }{
		{"GET", "/v1/files/f", "", ""},
		{"GET", "/v1/files/missing", "", ""},
		{"GET", "/v1/files/f:read?length=1", "", ""},
		{"GET", "/v1/files/f?alt=media", "", ""},
		{"PUT", "/v1/files/g", gateway.MIMEOctetStream, "y"},
		{"POST", "/v1/files/f:fsync", "application/json", "{}"},
		{"GET", "/v1/dirs", "", ""},
	} {
		resp, _ := send(t, c.method, d.url+c.path, strings.NewReader(c.body), map[string]string{"Content-Type": c.ct})
		for k := range resp.Header {
			if strings.HasPrefix(k, "Grpc-") {
				t.Errorf("%s %s: header %s: %v", c.method, c.path, k, resp.Header[k])
			}
		}
	}
}

// TestDownloadMemoryBounded downloads a file 64 times the in-flight
// budget: the heap must stay within a few chunks, not grow with the file.
// Not parallel: it measures the process's heap.
func TestDownloadMemoryBounded(t *testing.T) {
	const fileSize = 256 << 20
	d := startDaemon(t, func(c *Config) {
		c.Store.MaxRequestBytes = 1 << 20
		c.MaxInflightBytes = admit.MinInflightBytes(1 << 20)
	})
	if fileSize < 64*admit.MinInflightBytes(1<<20) {
		t.Fatalf("the file (%d bytes) is not 64 times the budget (%d)", fileSize, admit.MinInflightBytes(1<<20))
	}
	// Sparse: no disk to write, and reading it costs no I/O.
	f, err := os.Create(filepath.Join(d.root, "big"))
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(fileSize)
	f.Close()

	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	resp, err := http.Get(d.url + "/v1/files/big?alt=media")
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	close(stop)
	<-done
	if err != nil || n != fileSize {
		t.Fatalf("downloaded %d bytes (%v), want %d", n, err, fileSize)
	}
	grew := int64(peak.Load()) - int64(base.HeapInuse)
	t.Logf("heap in use grew by %d KiB at most while %d MiB went through", grew>>10, fileSize>>20)
	// Garbage collected at GOGC's pace: a few chunks in each of the copies
	// a chunk goes through, far from the file's size.
	if limit := int64(64 << 20); grew > limit {
		t.Errorf("heap in use grew by %d bytes during a download of %d: want under %d", grew, fileSize, limit)
	}
}

// TestDownloadCutWhenFileGoes: a file deleted while it is downloaded ends
// the download short of its announced length, so the client sees it
// failed; a file that grows is served to the length announced.
func TestDownloadCutWhenFileGoes(t *testing.T) {
	const size = 64 << 20 // more than the socket buffers hold, so the server is mid-file
	d := startDaemon(t, nil)
	for _, name := range []string{"going", "growing"} {
		f, err := os.Create(filepath.Join(d.root, name))
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(size)
		f.Close()
	}
	ctx := testContext(t)

	resp, err := http.Get(d.url + "/v1/files/going?alt=media")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.Delete(ctx, &filewritev1.DeleteRequest{Path: "going"}); err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Errorf("download of a deleted file: %d bytes, no error; want it cut short", n+1)
	}

	resp, err = http.Get(d.url + "/v1/files/growing?alt=media")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "growing", Offset: size, Data: []byte("more")}); err != nil {
		t.Fatal(err)
	}
	n, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || n != size || resp.ContentLength != size {
		t.Errorf("download of a growing file: %d bytes of %d announced (%v), want %d", n, resp.ContentLength, err, size)
	}
}

// TestPutCreateOnly: "If-None-Match: *" creates only, atomically: of PUTs
// racing to create one file exactly one wins, and the others change
// nothing. "If-Match: *" writes only a file that exists.
func TestPutCreateOnly(t *testing.T) {
	d := startDaemon(t, nil)
	const racers = 8
	for round := range 5 {
		name := fmt.Sprintf("race/%d", round)
		codes := make(chan int, racers)
		start := make(chan struct{})
		for i := range racers {
			go func() {
				<-start
				req, _ := http.NewRequest("PUT", d.url+"/v1/files/"+name, strings.NewReader(fmt.Sprintf("racer %d", i)))
				req.Header.Set("If-None-Match", "*")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					codes <- -1
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				codes <- resp.StatusCode
			}()
		}
		close(start)
		won := 0
		for range racers {
			switch c := <-codes; c {
			case 201:
				won++
			case 412:
			default:
				t.Errorf("round %d: a racer got %d, want 201 (it created the file) or 412", round, c)
			}
		}
		if won != 1 {
			t.Errorf("round %d: %d racers created %s, want exactly 1", round, won, name)
		}
		if got := string(d.onDisk(t, name)); !strings.HasPrefix(got, "racer ") || len(got) != len("racer 0") {
			t.Errorf("round %d: %s holds %q, want one racer's whole body", round, name, got)
		}
	}

	for _, tt := range []struct {
		name, header, path string
		want               int
	}{
		{"If-None-Match: * on an existing file", "If-None-Match", "race/0", 412},
		{"If-Match: * on a missing file", "If-Match", "nowhere/new", 412},
		{"If-Match: * on an existing file", "If-Match", "race/1", 200},
		{"If-None-Match: * on a new file, empty body", "If-None-Match", "empty", 201},
	} {
		body := "overwritten"
		if tt.path == "empty" {
			body = ""
		}
		resp, b := send(t, "PUT", d.url+"/v1/files/"+tt.path, strings.NewReader(body), map[string]string{tt.header: "*"})
		if resp.StatusCode != tt.want {
			t.Errorf("%s: %d (%s), want %d", tt.name, resp.StatusCode, b, tt.want)
		}
	}
	if _, err := os.Stat(filepath.Join(d.root, "nowhere")); err == nil {
		t.Errorf("a refused If-Match: * PUT created its directory")
	}
	if got := string(d.onDisk(t, "race/0")); !strings.HasPrefix(got, "racer ") {
		t.Errorf("race/0 holds %q after a refused create-only PUT", got)
	}
	if _, err := os.Stat(filepath.Join(d.root, "empty")); err != nil {
		t.Errorf("create-only PUT of an empty body: %v", err)
	}
}
