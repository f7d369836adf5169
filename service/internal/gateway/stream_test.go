package gateway

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
)

// TestGatewayPutStreamsInChunks: a raw PUT reaches the server as Writes
// of at most a piece (PutPieceBytes: --max-request-bytes, 1 MiB here, or
// 8 MiB) at successive offsets, whatever its size, past
// --max-request-bytes too, and whether its length is declared, so that it
// holds one piece at a time; only the last Write carries the sync asked
// for.
func TestGatewayPutStreamsInChunks(t *testing.T) {
	const maxRequestBytes = 1 << 20
	fake, base := startFakeGateway(t, maxRequestBytes)
	piece := int(PutPieceBytes(maxRequestBytes))
	tests := []struct {
		name     string
		size     int
		declared bool
		want     int // Writes
	}{
		{"empty", 0, true, 1},
		{"one byte", 1, true, 1},
		{"exactly one chunk", piece, true, 1},
		{"exactly two chunks", 2 * piece, true, 2},
		{"five chunks and a bit", 5*piece + 3, true, 6},
		{"five chunks and a bit, length not declared", 5*piece + 3, false, 6},
		{"exactly two chunks, length not declared", 2 * piece, false, 2},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := fmt.Sprintf("put/%d.bin", i)
			data := testutil.AllBytes(tt.size)
			var body io.Reader = bytes.NewReader(data)
			if !tt.declared {
				body = hiddenLength{body}
			}
			fake.requests()
			r := testutil.DoHTTP(t, "PUT", base+"/v1/files/"+path+"?offset=7&sync=data", body, map[string]string{"Content-Type": MIMEOctetStream})
			if r.Status != http.StatusOK {
				t.Fatalf("PUT: %d %s, want 200", r.Status, r.Body)
			}
			if want := fmt.Sprintf(`"bytesWritten":"%d"`, tt.size); !strings.Contains(string(r.Body), want) {
				t.Errorf("PUT answered %s, want %s", r.Body, want)
			}
			reqs := fake.requests()
			if len(reqs) != tt.want {
				t.Fatalf("%d Writes reached the server, want %d", len(reqs), tt.want)
			}
			var got []byte
			for j, req := range reqs {
				w := req.(*filewritev1.WriteRequest)
				if len(w.Data) > piece {
					t.Errorf("Write %d carries %d bytes, want at most %d", j, len(w.Data), piece)
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
// of at most ReadChunkBytes, and its answer, raw or JSON, is the same as
// one Read's.
func TestGatewayReadStreamsInChunks(t *testing.T) {
	fake, base := startFakeGateway(t, 64<<20)
	data := testutil.AllBytes(2*ReadChunkBytes + 1000)
	fake.files["r.bin"] = data
	tests := []struct {
		name           string
		offset, length int
		want           []byte
		reads          int
	}{
		{"within one chunk", 5, 100, data[5:105], 1},
		{"three chunks", 0, len(data), data, 3},
		{"past the end: stops at the short read", 10, 10 * ReadChunkBytes, data[10:], 3},
		{"exactly one chunk", ReadChunkBytes, ReadChunkBytes, data[ReadChunkBytes : 2*ReadChunkBytes], 1},
		{"nothing", 0, 0, nil, 1},
	}
	for _, tt := range tests {
		for _, accept := range []string{MIMEOctetStream, "application/json"} {
			t.Run(tt.name+"/"+accept, func(t *testing.T) {
				fake.requests()
				r := testutil.DoHTTP(t, "GET", fmt.Sprintf("%s/v1/files/r.bin:read?offset=%d&length=%d", base, tt.offset, tt.length), nil,
					map[string]string{"Accept": accept})
				if r.Status != http.StatusOK {
					t.Fatalf("read: %d %s, want 200", r.Status, r.Body)
				}
				got := r.Body
				if accept != MIMEOctetStream {
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
					if n := req.(*filewritev1.ReadRequest).Length; n > ReadChunkBytes {
						t.Errorf("Read %d asks for %d bytes, want at most %d", j, n, ReadChunkBytes)
					}
				}
			})
		}
	}
}

// hiddenLength hides a reader's length from net/http, which then sends it
// chunked, without a Content-Length.
type hiddenLength struct{ io.Reader }
