package service

import (
	"context"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
)

// TestWriteStreamGoroutinesEnd: a WriteStream runs a reader, workers, a
// syncer per file, a watcher of its file's deletion and, with tokens, a
// watcher of reloads. However the stream ends (half-close, the client's
// cancellation, its file deleted, a stream error, declared files closed),
// every one of them ends with it, while the daemon goes on serving: the
// package's leak check would only see them once the daemon shut down.
func TestWriteStreamGoroutinesEnd(t *testing.T) {
	d := startAuthDaemon(t)
	ctx := withAuth(testContext(t), "Bearer "+tokenAlpha)
	// The connection's and the server's own goroutines run already.
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "warm", Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	before := goleak.IgnoreCurrent()
	synced := filewritev1.SyncMode_SYNC_MODE_DATA
	var id uint64
	writes := func(file uint32, n int) []*filewritev1.StreamWrite {
		var ws []*filewritev1.StreamWrite
		for i := range n {
			id++
			ws = append(ws, fileWrite(file, id, int64(i)*512, make([]byte, 512), filewritev1.SyncMode(i%2)*synced))
		}
		return ws
	}
	tests := []struct {
		name string
		run  func(t *testing.T) error // the stream's end as the client saw it
		want codes.Code
	}{
		{"half-close", func(t *testing.T) error {
			s := openStream(t, ctx, d.client, "leak/half")
			s.Send(&filewritev1.WriteStreamRequest{Writes: writes(0, 64)})
			s.CloseSend()
			return recvAll(s).err
		}, codes.OK},
		{"cancelled with writes in flight", func(t *testing.T) error {
			sctx, cancel := context.WithCancel(ctx)
			s := openStream(t, sctx, d.client, "leak/cancel")
			s.Send(&filewritev1.WriteStreamRequest{Writes: writes(0, 256)})
			cancel()
			return recvAll(s).err
		}, codes.Canceled},
		{"file deleted", func(t *testing.T) error {
			s := openStream(t, ctx, d.client, "leak/deleted")
			s.Send(&filewritev1.WriteStreamRequest{Writes: writes(0, 16)})
			if _, err := d.client.Delete(ctx, &filewritev1.DeleteRequest{Path: "leak/deleted"}); err != nil {
				t.Fatal(err)
			}
			return recvAll(s).err
		}, codes.NotFound},
		{"stream error", func(t *testing.T) error {
			s := openStream(t, ctx, d.client, "leak/error")
			s.Send(&filewritev1.WriteStreamRequest{Writes: writes(0, 16)})
			s.Send(&filewritev1.WriteStreamRequest{Path: "leak/other"})
			return recvAll(s).err
		}, codes.InvalidArgument},
		{"declared files", func(t *testing.T) error {
			s, err := d.client.WriteStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			s.Send(&filewritev1.WriteStreamRequest{
				Files:  []*filewritev1.StreamFile{declare(1, "leak/d1"), declare(2, "leak/d2")},
				Writes: append(writes(1, 32), writes(2, 32)...),
			})
			s.Send(&filewritev1.WriteStreamRequest{Close: []uint32{1}, Writes: writes(2, 8)})
			s.CloseSend()
			return recvAll(s).err
		}, codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.run(t); status.Code(err) != tt.want {
				t.Errorf("the stream ended with %v, want %v", err, tt.want)
			}
		})
	}
	if err := testutil.FindLeaks(before); err != nil {
		t.Errorf("goroutines left by streams that ended, the daemon still serving:\n%v", err)
	}
}
