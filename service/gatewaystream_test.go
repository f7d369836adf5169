package service

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// hiddenLength hides a reader's length from net/http, which then sends it
// chunked, without a Content-Length.
type hiddenLength struct{ io.Reader }

// TestGatewayPutStreamsInChunks: a raw PUT reaches the server as Writes
// of at most rawPutChunkBytes at successive offsets, whatever its size and
// whether its length is declared, so that it holds one chunk at a time;
// only the last Write carries the sync asked for.
func TestGatewayPutStreamsInChunks(t *testing.T) {
	fake, base := startFakeGateway(t, 64<<20)
	tests := []struct {
		name     string
		size     int
		declared bool
		want     int // Writes
	}{
		{"empty", 0, true, 1},
		{"one byte", 1, true, 1},
		{"exactly one chunk", rawPutChunkBytes, true, 1},
		{"exactly two chunks", 2 * rawPutChunkBytes, true, 2},
		{"five chunks and a bit", 5*rawPutChunkBytes + 3, true, 6},
		{"five chunks and a bit, length not declared", 5*rawPutChunkBytes + 3, false, 6},
		{"exactly two chunks, length not declared", 2 * rawPutChunkBytes, false, 2},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := fmt.Sprintf("put/%d.bin", i)
			data := allBytes(tt.size)
			var body io.Reader = bytes.NewReader(data)
			if !tt.declared {
				body = hiddenLength{body}
			}
			fake.requests()
			r := doHTTP(t, "PUT", base+"/v1/files/"+path+"?offset=7&sync=data", body, map[string]string{"Content-Type": mimeOctetStream})
			if r.status != http.StatusOK {
				t.Fatalf("PUT: %d %s, want 200", r.status, r.body)
			}
			if want := fmt.Sprintf(`"bytesWritten":"%d"`, tt.size); !strings.Contains(string(r.body), want) {
				t.Errorf("PUT answered %s, want %s", r.body, want)
			}
			reqs := fake.requests()
			if len(reqs) != tt.want {
				t.Fatalf("%d Writes reached the server, want %d", len(reqs), tt.want)
			}
			var got []byte
			for j, req := range reqs {
				w := req.(*filewritev1.WriteRequest)
				if len(w.Data) > rawPutChunkBytes {
					t.Errorf("Write %d carries %d bytes, want at most %d", j, len(w.Data), rawPutChunkBytes)
				}
				if want := int64(7 + len(got)); w.Offset != want {
					t.Errorf("Write %d at offset %d, want %d", j, w.Offset, want)
				}
				wantSync := filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED
				if j == len(reqs)-1 {
					wantSync = filewritev1.SyncMode_SYNC_MODE_DATA
				}
				if w.Sync != wantSync {
					t.Errorf("Write %d of %d has sync %v, want %v", j, len(reqs), w.Sync, wantSync)
				}
				got = append(got, w.Data...)
			}
			if !bytes.Equal(got, data) {
				t.Errorf("the Writes carry %d bytes that differ from the %d sent", len(got), len(data))
			}
		})
	}
}

// TestGatewayReadStreamsInChunks: a REST :read reaches the server as Reads
// of at most readChunkBytes, and its answer, raw or JSON, is the same as
// one Read's.
func TestGatewayReadStreamsInChunks(t *testing.T) {
	fake, base := startFakeGateway(t, 64<<20)
	data := allBytes(2*readChunkBytes + 1000)
	fake.files["r.bin"] = data
	tests := []struct {
		name           string
		offset, length int
		want           []byte
		reads          int
	}{
		{"within one chunk", 5, 100, data[5:105], 1},
		{"three chunks", 0, len(data), data, 3},
		{"past the end: stops at the short read", 10, 10 * readChunkBytes, data[10:], 3},
		{"exactly one chunk", readChunkBytes, readChunkBytes, data[readChunkBytes : 2*readChunkBytes], 1},
		{"nothing", 0, 0, nil, 1},
	}
	for _, tt := range tests {
		for _, accept := range []string{mimeOctetStream, "application/json"} {
			t.Run(tt.name+"/"+accept, func(t *testing.T) {
				fake.requests()
				r := doHTTP(t, "GET", fmt.Sprintf("%s/v1/files/r.bin:read?offset=%d&length=%d", base, tt.offset, tt.length), nil,
					map[string]string{"Accept": accept})
				if r.status != http.StatusOK {
					t.Fatalf("read: %d %s, want 200", r.status, r.body)
				}
				got := r.body
				if accept != mimeOctetStream {
					want := `{"data":"` + base64.StdEncoding.EncodeToString(tt.want) + `"}`
					if string(got) != want {
						t.Errorf("JSON read: %.60s... (%d bytes), want %.60s... (%d bytes)", got, len(got), want, len(want))
					}
				} else if !bytes.Equal(got, tt.want) {
					t.Errorf("raw read: %d bytes, want the %d at offset %d", len(got), len(tt.want), tt.offset)
				}
				reqs := fake.requests()
				if len(reqs) != tt.reads {
					t.Errorf("%d Reads reached the server, want %d", len(reqs), tt.reads)
				}
				for j, req := range reqs {
					if n := req.(*filewritev1.ReadRequest).Length; n > readChunkBytes {
						t.Errorf("Read %d asks for %d bytes, want at most %d", j, n, readChunkBytes)
					}
				}
			})
		}
	}
}

// rawRequest sends head and then body over a new connection to addr,
// pausing pause between the pieces of body, and returns the response, or
// an error if none came within a minute.
func rawRequest(addr, head string, body []string, pause time.Duration) (*http.Response, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if _, err := io.WriteString(c, head); err != nil {
		return nil, err
	}
	go func() {
		for _, piece := range body {
			time.Sleep(pause)
			if _, err := io.WriteString(c, piece); err != nil {
				return
			}
		}
	}()
	c.SetReadDeadline(time.Now().Add(time.Minute))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return resp, err
}

// TestBodyTimeout: a REST body that stops, or trickles, fails with 408
// once 64 KiB have taken longer than --body-timeout to arrive, while one
// that keeps coming, however slowly overall, goes through. A raw PUT that
// breaks midway leaves the chunks it wrote (docs/guarantees.md, durability contract).
func TestBodyTimeout(t *testing.T) {
	d := startDaemon(t, func(c *Config) { c.BodyTimeout = time.Second })
	addr := strings.TrimPrefix(d.url, "http://")
	put := func(path string, length int) string {
		return fmt.Sprintf("PUT /v1/files/%s HTTP/1.1\r\nHost: localhost\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n",
			path, mimeOctetStream, length)
	}
	piece := strings.Repeat("p", bodyProgressBytes)
	var steady []string // 64 KiB every 100 ms: slow, but steady
	for range 20 {
		steady = append(steady, piece)
	}
	tests := []struct {
		name     string
		head     string
		body     []string
		pause    time.Duration
		want     int
		file     string
		fileSize int64 // what the file holds afterwards
	}{
		{"raw PUT, body never sent", put("stalled.bin", 100), nil, 0, http.StatusRequestTimeout, "stalled.bin", -1},
		{"JSON write, stalled after one byte",
			"POST /v1/files/json.bin:write HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n",
			[]string{"{"}, 0, http.StatusRequestTimeout, "json.bin", -1},
		{"raw PUT, a byte every 100 ms", put("trickle.bin", 1000), strings.Split(strings.Repeat("t", 100), ""), 100 * time.Millisecond,
			http.StatusRequestTimeout, "trickle.bin", -1},
		{"raw PUT, 64 KiB every 100 ms", put("steady.bin", 20*bodyProgressBytes), steady, 100 * time.Millisecond,
			http.StatusOK, "steady.bin", 20 * bodyProgressBytes},
		{"raw PUT broken after three chunks", put("broken.bin", 4*rawPutChunkBytes),
			[]string{strings.Repeat(piece, 3*rawPutChunkBytes/bodyProgressBytes)}, 0, http.StatusRequestTimeout, "broken.bin", 3 * rawPutChunkBytes},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := rawRequest(addr, tt.head, tt.body, tt.pause)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.want {
				t.Fatalf("%s, want %d: %s", resp.Status, tt.want, b)
			}
			if tt.want == http.StatusRequestTimeout {
				if e := parseErrorBody(t, httpResult{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: b}); e.Code != codes.DeadlineExceeded || !strings.Contains(e.Message, "--body-timeout") {
					t.Errorf("error %+v, want DEADLINE_EXCEEDED naming --body-timeout", e)
				}
			}
			st, err := d.client.Stat(testContext(t), &filewritev1.StatRequest{Path: tt.file})
			switch {
			case tt.fileSize < 0 && err == nil:
				t.Errorf("%s exists (%d bytes): nothing should have been written", tt.file, st.GetSize())
			case tt.fileSize >= 0 && (err != nil || st.GetSize() != tt.fileSize):
				t.Errorf("%s: %v, %v; want %d bytes", tt.file, st, err, tt.fileSize)
			}
		})
	}
}
