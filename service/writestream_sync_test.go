package service

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store"
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

// TestWriteStreamDurableWritesRunTogether: with --synced-writes direct,
// the synced writes of one stream message, each made durable by itself
// and holding its worker for the device's round trip, are applied at once,
// past the stream's usual two workers; every one is acked OK.
func TestWriteStreamDurableWritesRunTogether(t *testing.T) {
	const path, writes = "durable/f", 8
	var armed atomic.Bool
	var inside atomic.Int32
	allIn := make(chan struct{})
	hooks := &store.Hooks{InsideWrite: func(ctx context.Context, p, _, _ string) {
		if p != path || !armed.Load() {
			return
		}
		if inside.Add(1) == writes {
			close(allIn)
		}
		select {
		case <-allIn:
		case <-time.After(30 * time.Second): // they did not run together: the test fails below
		}
	}}
	d := startDaemon(t, func(c *Config) {
		c.Store.SyncedWrites = store.SyncedWritesDirect
		c.Store.Hooks = hooks
	})
	ctx := testContext(t)
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: path, Data: make([]byte, writes*4096)}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.Fsync(ctx, &filewritev1.FsyncRequest{Path: path, DataOnly: true}); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	stream := openStream(t, ctx, d.client, path)
	ends := endOf(stream)
	req := &filewritev1.WriteStreamRequest{}
	for i := range writes {
		req.Writes = append(req.Writes, streamWriteOf(uint64(i), int64(i)*4096, bytes.Repeat([]byte{byte(i + 1)}, 4096), filewritev1.SyncMode_SYNC_MODE_DATA))
	}
	if err := stream.Send(req); err != nil {
		t.Fatal(err)
	}
	select {
	case <-allIn:
	case <-time.After(30 * time.Second):
		t.Fatalf("%d of %d durable writes were applied at once, want all", inside.Load(), writes)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	e := <-ends
	acks := byID(t, e.acks)
	for i := range uint64(writes) {
		if a := acks[i]; a == nil || a.GetStatus() != nil {
			t.Errorf("write %d: ack %v, want OK", i, a)
		}
	}
}
