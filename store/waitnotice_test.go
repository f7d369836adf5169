//go:build linux

package store

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

// TestWaitNotice: a write that must queue for the file's lock calls its
// context's WithWaitNotice before it waits, once; writes that take the
// lock at once, or need none, never call it.
func TestWaitNotice(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t, Options{Policy: PolicyExclusive})
	if _, err := s.Write(ctx, "f", 0, make([]byte, 8192), SyncNone); err != nil {
		t.Fatal(err)
	}
	var quick atomic.Int32
	if _, err := s.Write(WithWaitNotice(ctx, func() { quick.Add(1) }), "f", 0, []byte("a"), SyncNone); err != nil {
		t.Fatal(err)
	}
	if got := quick.Load(); got != 0 {
		t.Fatalf("a write that took the free lock noticed %d waits, want 0", got)
	}

	g := newGate(t, 2)
	s.opts.Hooks = g.hooks()
	held := make(chan error, 1)
	go func() {
		_, err := s.Write(ctx, "f", 4096, []byte("held"), SyncNone)
		held <- err
	}()
	<-g.arrived // it holds the lock, inside its write
	var waits atomic.Int32
	noticed := make(chan struct{})
	queued := make(chan error, 1)
	go func() {
		_, err := s.Write(WithWaitNotice(ctx, func() {
			if waits.Add(1) == 1 {
				close(noticed)
			}
		}), "f", 0, []byte("b"), SyncNone)
		queued <- err
	}()
	<-noticed // before the holder lets go: the notice comes with the wait
	testutil.WaitFor(t, "the second write to queue for the lock", func() bool { return fileLocks(s, "f").Waiting == 1 })
	g.open()
	for _, ch := range []chan error{held, queued} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	if got := waits.Load(); got != 1 {
		t.Errorf("the queued write noticed %d waits, want 1", got)
	}
}
