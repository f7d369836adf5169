package service

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/gateway"
)

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
	// Pieces of 1 MiB (--max-request-bytes): a broken PUT's pieces are
	// sent in well under a second, however loaded the machine.
	const maxRequest = 1 << 20
	d := startDaemon(t, func(c *Config) {
		c.BodyTimeout = time.Second
		c.Store.MaxRequestBytes = maxRequest
	})
	addr := strings.TrimPrefix(d.url, "http://")
	put := func(path string, length int) string {
		return fmt.Sprintf("PUT /v1/files/%s HTTP/1.1\r\nHost: localhost\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n",
			path, gateway.MIMEOctetStream, length)
	}
	piece := strings.Repeat("p", gateway.BodyProgressBytes)
	// What one Write of a raw PUT carries.
	putPiece := int(gateway.PutPieceBytes(maxRequest))
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
		{"raw PUT, 64 KiB every 100 ms", put("steady.bin", 20*gateway.BodyProgressBytes), steady, 100 * time.Millisecond,
			http.StatusCreated, "steady.bin", 20 * gateway.BodyProgressBytes},
		{"raw PUT broken after three pieces", put("broken.bin", 4*putPiece),
			[]string{strings.Repeat(piece, 3*putPiece/gateway.BodyProgressBytes)}, 0, http.StatusRequestTimeout, "broken.bin", int64(3 * putPiece)},
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
				if e := testutil.ParseErrorBody(t, testutil.HTTPResult{Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"), Body: b}); e.Code != codes.DeadlineExceeded || !strings.Contains(e.Message, "--body-timeout") {
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
