package service

import (
	"bytes"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/gateway"
	"github.com/filewrite/filewrite/store/faultfs"
)

// TestDiskFull: a write that runs out of space (ENOSPC) or quota (EDQUOT)
// part way is RESOURCE_EXHAUSTED on both protocols, with the path and the
// bytes that reached the file in the message, and Stat, Read and Extents
// afterwards tell the truth about what is in the file.
func TestDiskFull(t *testing.T) {
	const (
		fits  = 5000 // bytes the disk still takes
		total = 3 * 4096
	)
	tests := []struct {
		name  string
		errno syscall.Errno
		http  bool
	}{
		{"ENOSPC over gRPC", syscall.ENOSPC, false},
		{"EDQUOT over gRPC", syscall.EDQUOT, false},
		{"ENOSPC over REST", syscall.ENOSPC, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ffs **faultfs.FS
			d := startDaemon(t, func(c *Config) { ffs = withFaultFS(c) })
			ctx := testContext(t)
			const path = "dir/full.bin"
			full := (*ffs).Inject(faultfs.Rule{Op: faultfs.OpWrite, Path: path, After: fits, Err: tt.errno})
			data := testutil.AllBytes(total)

			var code codes.Code
			var msg string
			if tt.http {
				r := testutil.DoHTTP(t, "PUT", d.url+"/v1/files/"+path+"?sync=data", bytes.NewReader(data), map[string]string{"Content-Type": gateway.MIMEOctetStream})
				if r.Status != 429 {
					t.Errorf("HTTP status %d, want 429", r.Status)
				}
				e := testutil.ParseErrorBody(t, r)
				code, msg = e.Code, e.Message
			} else {
				_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: path, Data: data, Sync: filewritev1.SyncMode_SYNC_MODE_DATA})
				code, msg = status.Code(err), status.Convert(err).Message()
			}
			if code != codes.ResourceExhausted {
				t.Errorf("code %v (%s), want RESOURCE_EXHAUSTED", code, msg)
			}
			for _, want := range []string{"no space left", path, fmt.Sprintf("%d bytes written", fits), tt.errno.Error()} {
				if !strings.Contains(msg, want) {
					t.Errorf("message %q does not say %q", msg, want)
				}
			}

			st, err := d.client.Stat(ctx, &filewritev1.StatRequest{Path: path})
			if err != nil || st.GetSize() != fits {
				t.Fatalf("Stat after the failed write: size %d, %v; want %d, the bytes that reached the file", st.GetSize(), err, fits)
			}
			rd, err := d.client.Read(ctx, &filewritev1.ReadRequest{Path: path, Length: total})
			if err != nil || !bytes.Equal(rd.GetData(), data[:fits]) {
				t.Errorf("Read after the failed write: %d bytes, %v; want the first %d bytes written", len(rd.GetData()), err, fits)
			}
			wantExtents(t, d.client, path, 0, 0, []*filewritev1.Extent{
				{Offset: 0, Length: fits, State: filewritev1.ExtentState_EXTENT_STATE_WRITTEN},
			})

			// Space comes back: the file is usable, nothing was poisoned.
			full.Remove()
			if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: path, Offset: fits, Data: data[fits:], Sync: filewritev1.SyncMode_SYNC_MODE_DATA}); err != nil {
				t.Fatalf("the rest of the write once space came back: %v", err)
			}
			if got := d.onDisk(t, path); !bytes.Equal(got, data) {
				t.Errorf("file after the retry: %d bytes, want the %d written", len(got), total)
			}
		})
	}
}
