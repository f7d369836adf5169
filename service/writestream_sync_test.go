package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
)

// TestWriteStreamSyncedAcksAndEnds: the syncer sends the acks of its
// group commits while the handler sends the others, so that both may be
// sending around the stream's end. Streams of plain and synced writes,
// with acks read as they come, end by a half-close (every write acked
// once, OK) or by cancelling mid-flight (no write acked twice, the stream
// ends CANCELLED); either way the handler returns and every byte held is
// given back.
func TestWriteStreamSyncedAcksAndEnds(t *testing.T) {
	d := startDaemon(t, nil)
	const streams, messages, perMessage = 8, 30, 4
	var wg sync.WaitGroup
	for i := range streams {
		wg.Go(func() {
			cancelled := i%2 == 1
			ctx, cancel := context.WithCancel(testContext(t))
			defer cancel()
			stream := openStream(t, ctx, d.client, fmt.Sprintf("synced/%d", i))
			ends := endOf(stream)
			id := uint64(0)
			for m := range messages {
				if cancelled && m == messages/2 {
					cancel()
					break
				}
				req := &filewritev1.WriteStreamRequest{}
				for range perMessage {
					// Plain, DATA and FULL in turn: the handler and the
					// syncer both have acks to send.
					req.Writes = append(req.Writes, streamWriteOf(id, int64(id)*8, []byte("12345678"), filewritev1.SyncMode(id%3)))
					id++
				}
				if err := stream.Send(req); err != nil {
					t.Errorf("stream %d: send: %v", i, err)
					return
				}
			}
			if !cancelled {
				if err := stream.CloseSend(); err != nil {
					t.Errorf("stream %d: CloseSend: %v", i, err)
				}
			}
			e := <-ends
			acks := byID(t, e.acks)
			switch {
			case cancelled:
				if got := status.Code(e.err); got != codes.Canceled && !errors.Is(e.err, context.Canceled) {
					t.Errorf("stream %d: ended with %v, want %v", i, e.err, codes.Canceled)
				}
			case e.err != nil && !errors.Is(e.err, io.EOF):
				t.Errorf("stream %d: ended with %v, want OK", i, e.err)
			default:
				for w := range id {
					if a := acks[w]; a == nil || a.GetStatus() != nil || a.GetBytesWritten() != 8 {
						t.Errorf("stream %d: write %d: ack %v, want OK and 8 bytes", i, w, a)
					}
				}
			}
		})
	}
	wg.Wait()
	testutil.WaitFor(t, "every stream to give back what it held", func() bool {
		return d.srv.files.StreamHeld() == 0
	})
}
