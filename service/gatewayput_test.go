package service

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/gateway"
)

// patternReader gives n bytes of a pattern that depends on the offset,
// without holding them: a body of any size that costs the test nothing.
type patternReader struct{ off, n int64 }

func (p *patternReader) Read(b []byte) (int, error) {
	if p.off >= p.n {
		return 0, io.EOF
	}
	b = b[:min(int64(len(b)), p.n-p.off)]
	for i := range b {
		o := p.off + int64(i)
		b[i] = byte(o*7 + o>>12)
	}
	p.off += int64(len(b))
	return len(b), nil
}

// put PUTs body of length n (-1: chunked) to url with header, and returns
// the response and its body.
func put(t *testing.T, url string, body io.Reader, n int64, header map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = n
	req.Header.Set("Content-Type", gateway.MIMEOctetStream)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestRawPutOfAnySize: a raw PUT larger than --max-request-bytes (and than
// a piece) goes in whole, declared or chunked, and answers 201 Created
// with a Location when it made the file, 200 when the file was there; the
// file holds the bytes sent. A PUT with a Content-Range writes its body at
// the range's first byte and leaves the size alone.
func TestRawPutOfAnySize(t *testing.T) {
	const maxRequest = 4 << 20
	d := startDaemon(t, func(c *Config) { c.Store.MaxRequestBytes = maxRequest })
	size := int64(3*maxRequest + 12345)
	want, _ := io.ReadAll(&patternReader{n: size})
	for _, tt := range []struct {
		name     string
		path     string
		declared bool
		code     int
	}{
		{"new file", "put/a.bin", true, http.StatusCreated},
		{"the same file again", "put/a.bin", true, http.StatusOK},
		{"new file, chunked", "put/b.bin", false, http.StatusCreated},
	} {
		n := size
		var body io.Reader = &patternReader{n: size}
		if !tt.declared {
			n, body = -1, io.MultiReader(body)
		}
		resp, text := put(t, d.url+"/v1/files/"+tt.path+"?sync=data", body, n, nil)
		if resp.StatusCode != tt.code {
			t.Fatalf("%s: PUT of %d bytes: %d %s, want %d", tt.name, size, resp.StatusCode, text, tt.code)
		}
		created := tt.code == http.StatusCreated
		if loc := resp.Header.Get("Location"); created != (loc == "/v1/files/"+tt.path) || !created && loc != "" {
			t.Errorf("%s: Location %q, want %q only if created", tt.name, loc, "/v1/files/"+tt.path)
		}
		if w := fmt.Sprintf(`"bytesWritten":"%d"`, size); !strings.Contains(text, w) || strings.Contains(text, `"created":true`) != created {
			t.Errorf("%s: answered %s, want %s and created %v", tt.name, text, w, created)
		}
		got, err := os.ReadFile(filepath.Join(d.root, tt.path))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: the file holds %d bytes (%v) unlike the %d sent", tt.name, len(got), err, size)
		}
	}
	resp, text := put(t, d.url+"/v1/files/put/a.bin", strings.NewReader("0123456789"), 10,
		map[string]string{"Content-Range": fmt.Sprintf("bytes 100-109/%d", 10*size)})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT with Content-Range: %d %s, want 200", resp.StatusCode, text)
	}
	copy(want[100:], "0123456789")
	if got, _ := os.ReadFile(filepath.Join(d.root, "put/a.bin")); !bytes.Equal(got, want) {
		t.Errorf("after a PUT with Content-Range bytes 100-109/%d, the file (%d bytes) is not the one sent with those bytes at 100 (%d)", 10*size, len(got), len(want))
	}
	// A refused range writes nothing.
	resp, text = put(t, d.url+"/v1/files/put/a.bin?offset=5", strings.NewReader("xx"), 2, map[string]string{"Content-Range": "bytes 0-1/*"})
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(text, "offset=5") {
		t.Errorf("PUT with a Content-Range unlike its offset: %d %s, want 400 naming the offset", resp.StatusCode, text)
	}
	if got, _ := os.ReadFile(filepath.Join(d.root, "put/a.bin")); !bytes.Equal(got, want) {
		t.Error("a refused PUT changed the file")
	}
}

// TestRawPutStopsAtTheRefusedPiece: a chunked PUT whose body runs past
// --max-file-size is refused by the Write of the piece that would cross
// it; the pieces before it are in the file and nothing after them, and a
// later PUT of the same file still goes through (the failed one left no
// hold of the budget or the file behind).
func TestRawPutStopsAtTheRefusedPiece(t *testing.T) {
	const piece = 4 << 20
	d := startDaemon(t, func(c *Config) {
		c.Store.MaxRequestBytes = piece
		c.Store.MaxFileSize = 2*piece + piece/2
	})
	size := int64(5 * piece)
	want, _ := io.ReadAll(&patternReader{n: size})
	resp, text := put(t, d.url+"/v1/files/put/cut.bin?sync=data", io.MultiReader(&patternReader{n: size}), -1, nil)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(text, "FILE_TOO_LARGE") {
		t.Fatalf("a chunked PUT of %d bytes past --max-file-size: %d %s, want 400 FILE_TOO_LARGE", size, resp.StatusCode, text)
	}
	got, err := os.ReadFile(filepath.Join(d.root, "put/cut.bin"))
	if err != nil || !bytes.Equal(got, want[:2*piece]) {
		t.Fatalf("after the refused piece the file holds %d bytes (%v); want the two pieces before it, %d bytes, as sent", len(got), err, 2*piece)
	}
	// The refused PUT gave its piece's share back when its handler
	// returned, which may be just after its answer arrived.
	testutil.WaitFor(t, "the budget to hold nothing after the refused PUT", func() bool {
		return d.srv.budget.Held() == 0
	})
	resp, text = put(t, d.url+"/v1/files/put/cut.bin", strings.NewReader("again"), 5, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a PUT after the refused one: %d %s, want 200", resp.StatusCode, text)
	}
}

// TestRawPutMemoryBounded: a PUT four times --max-inflight-bytes (64 MiB)
// goes through with the daemon's heap growing by far less than it moves:
// the body is read into one piece at a time, which the budget holds.
func TestRawPutMemoryBounded(t *testing.T) {
	const budget = 64 << 20
	const size = 4 * budget
	d := startDaemon(t, func(c *Config) {
		c.Store.MaxRequestBytes = 8 << 20
		c.MaxInflightBytes = budget
	})
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		var m runtime.MemStats
		for ctx.Err() == nil {
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	resp, text := put(t, d.url+"/v1/files/big.bin", &patternReader{n: size}, size, nil)
	cancel()
	<-done
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("PUT of %d MiB: %d %s, want 201", size>>20, resp.StatusCode, text)
	}
	st, err := d.client.Stat(context.Background(), &filewritev1.StatRequest{Path: "big.bin"})
	if err != nil || st.GetSize() != size {
		t.Fatalf("Stat after the PUT: %v, %v; want %d bytes", st, err, size)
	}
	grew := int64(peak.Load()) - int64(base.HeapInuse)
	t.Logf("heap in use grew by %d KiB at most while %d MiB went in", grew>>10, size>>20)
	if grew > budget {
		t.Errorf("heap in use grew by %d bytes during a PUT of %d: want under %d (--max-inflight-bytes)", grew, size, budget)
	}
}
