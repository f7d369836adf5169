package service

import (
	"encoding/json"
	"fmt"
	"hash/crc32"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// TestAppendREST appends through both REST forms and checks the offset in
// the body and the header, and the refusals of a raw append's body.
func TestAppendREST(t *testing.T) {
	d := startDaemon(t, func(c *Config) { c.Store.MaxRequestBytes = 1024 })
	cases := []struct {
		name       string
		path, body string
		header     map[string]string
		wantStatus int
		wantOffset string // the header and the body's offset; "" when refused
	}{
		{"raw", "/v1/files/log:append", "hello", octetHeader, http.StatusOK, "0"},
		{"json", "/v1/files/log:append", `{"data":"IHdvcmxk"}`, nil, http.StatusOK, "5"},
		{"raw, synced, conditional", "/v1/files/log:append?sync=data&expected_offset=11", "!", octetHeader, http.StatusOK, "11"},
		{"raw, the end elsewhere", "/v1/files/log:append?expected_offset=3", "x", octetHeader, http.StatusBadRequest, ""},
		{"raw, too large", "/v1/files/log:append", strings.Repeat("x", 1025), octetHeader, http.StatusBadRequest, ""},
		{"raw, unknown parameter", "/v1/files/log:append?offset=3", "x", octetHeader, http.StatusBadRequest, ""},
		{"raw, zero-length", "/v1/files/log:append", "", octetHeader, http.StatusOK, "12"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, d.url+c.path, strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			for k, v := range c.header {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if got := resp.StatusCode; got != c.wantStatus {
				t.Fatalf("status: got %d, want %d", got, c.wantStatus)
			}
			if got := resp.Header.Get(HeaderAppendOffset); got != c.wantOffset {
				t.Errorf("%s: got %q, want %q", HeaderAppendOffset, got, c.wantOffset)
			}
			if c.wantOffset == "" {
				return
			}
			var body struct{ Offset, Size string }
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			if body.Offset != c.wantOffset {
				t.Errorf("body offset: got %q, want %q", body.Offset, c.wantOffset)
			}
		})
	}
	b, err := os.ReadFile(filepath.Join(d.root, "log"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), "hello world!"; got != want {
		t.Errorf("file: got %q, want %q", got, want)
	}
}

// TestAppendRESTNeedsLength: a chunked raw append has no length to
// reserve, and is refused with 411 before its body is read.
func TestAppendRESTNeedsLength(t *testing.T) {
	d := startDaemon(t, nil)
	resp, err := rawRequest(strings.TrimPrefix(d.url, "http://"),
		"POST /v1/files/log:append HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
		[]string{"1\r\nx\r\n0\r\n\r\n"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got, want := resp.StatusCode, http.StatusLengthRequired; got != want {
		t.Errorf("status: got %d, want %d", got, want)
	}
}

// TestAppendGRPC appends from many goroutines over gRPC, some with
// CRC-32C, some resent with their id, and checks that the offsets tile
// the file and that a wrong CRC-32C writes nothing.
func TestAppendGRPC(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	castagnoliTable := crc32.MakeTable(crc32.Castagnoli)
	bad := uint32(1)
	if _, err := d.client.Append(ctx, &filewritev1.AppendRequest{Path: "log", Data: []byte("x"), Crc32C: &bad}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("wrong CRC-32C: got %v, want INVALID_ARGUMENT", err)
	}
	const writers, each = 8, 20
	var mu sync.Mutex
	offsets := map[int64]string{}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				data := fmt.Sprintf("<%d.%d>", w, i)
				sum := crc32.Checksum([]byte(data), castagnoliTable)
				req := &filewritev1.AppendRequest{Path: "log", Data: []byte(data), Crc32C: &sum, AppendId: data}
				first, err := d.client.Append(ctx, req)
				if err != nil {
					t.Error(err)
					return
				}
				again, err := d.client.Append(ctx, req)
				if err != nil || again.GetOffset() != first.GetOffset() {
					t.Errorf("resend of %s: got %v, %v, want offset %d", data, again, err, first.GetOffset())
				}
				mu.Lock()
				offsets[first.GetOffset()] = data
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	b, err := os.ReadFile(filepath.Join(d.root, "log"))
	if err != nil {
		t.Fatal(err)
	}
	var rebuilt strings.Builder
	for off := int64(0); off < int64(len(b)); {
		data, ok := offsets[off]
		if !ok {
			t.Fatalf("no append landed at %d: the offsets do not tile the file", off)
		}
		rebuilt.WriteString(data)
		off += int64(len(data))
	}
	if got := rebuilt.String(); got != string(b) || len(offsets) != writers*each {
		t.Errorf("file %q, rebuilt from %d offsets %q", b, len(offsets), got)
	}
}
