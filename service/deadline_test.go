package service

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/store"
	"github.com/filewrite/filewrite/store/faultfs"
)

// expireWhile runs call under deadlines of growing length until got says,
// before call returned, that it reached the wait under test; it returns
// call's error from that run. Each run has its own attempt number, so that
// a run the server finishes late cannot vouch for the next. Growing deadlines keep the test free of
// timing assumptions: a deadline too short for the request to reach the
// server is simply tried again, longer.
func expireWhile(t *testing.T, got func(attempt int) bool, call func(ctx context.Context, attempt int) error) error {
	t.Helper()
	for attempt, d := 0, 100*time.Millisecond; d <= 30*time.Second; attempt, d = attempt+1, d*4 {
		ctx, cancel := context.WithTimeout(t.Context(), d)
		done := make(chan error, 1)
		go func() { done <- call(ctx, attempt) }()
		for reached := false; ; {
			select {
			case err := <-done:
				cancel()
				if reached {
					return err
				}
			default:
				if got(attempt) {
					reached = true
				}
				time.Sleep(time.Millisecond)
				continue
			}
			break
		}
	}
	t.Fatal("the call never reached the wait under test before its deadline")
	return nil
}

// TestDeadlineWhileWaitingForLock: a write whose deadline passes while it
// queues for the file's lock fails with DEADLINE_EXCEEDED and is never
// performed, not even once the lock is free.
func TestDeadlineWhileWaitingForLock(t *testing.T) {
	for _, policy := range []string{"exclusive", "unlocked-below-eof"} {
		t.Run(policy, func(t *testing.T) {
			gate := newWriteGate("f.bin")
			d := startDaemon(t, func(c *Config) {
				c.Store.Hooks = gate.hooks()
				if policy == "exclusive" {
					c.Store.Policy = store.PolicyExclusive
				}
			})
			defer gate.open()
			ctx := testContext(t)

			// A: an extending write, held inside the store with the lock
			// held exclusively.
			a := bytes.Repeat([]byte("A"), 4096)
			aDone := make(chan error, 1)
			go func() {
				_, err := d.client.Write(requestID(ctx, "A"), &filewritev1.WriteRequest{Path: "f.bin", Data: a})
				aDone <- err
			}()
			gate.waitEntered(t, ctx)

			// B: queues behind A until its deadline passes.
			err := expireWhile(t, func(int) bool { return d.waiting("f.bin") > 0 }, func(ctx context.Context, attempt int) error {
				_, err := d.client.Write(requestID(ctx, "B"), &filewritev1.WriteRequest{Path: "f.bin", Offset: 8192, Data: []byte("BBBB")})
				return err
			})
			wantCode(t, "write queued past its deadline", err, codes.DeadlineExceeded)
			// The server may see the deadline a moment after the client
			// does: wait for B to leave the queue.
			for d.waiting("f.bin") > 0 {
				time.Sleep(time.Millisecond)
			}

			// C queues behind A after B did. The lock is FIFO, so had B
			// stayed queued it would write before C does.
			cDone := make(chan error, 1)
			go func() {
				_, err := d.client.Write(requestID(ctx, "C"), &filewritev1.WriteRequest{Path: "f.bin", Offset: 4096, Data: []byte("CCCC")})
				cDone <- err
			}()
			for d.waiting("f.bin") < 1 {
				time.Sleep(time.Millisecond)
			}
			gate.open()
			for name, done := range map[string]chan error{"A": aDone, "C": cDone} {
				if err := <-done; err != nil {
					t.Fatalf("write %s: %v", name, err)
				}
			}
			if gate.reachedData("B") {
				t.Error("the write that timed out in the queue reached the file later")
			}
			want := append(a, []byte("CCCC")...)
			if got := d.onDisk(t, "f.bin"); !bytes.Equal(got, want) {
				t.Errorf("f.bin is %d bytes ending %q, want %d bytes: A then C, and nothing of B", len(got), got[max(0, len(got)-8):], len(want))
			}
		})
	}
}

// TestDeadlineWhileWaitingForSync: a synced write whose deadline passes
// while it waits for a group commit fails with DEADLINE_EXCEEDED; the
// sync that was running goes on for the callers it covers. (Its data was
// written: DEADLINE_EXCEEDED from a synced write means "not known
// durable", see docs/guarantees.md.)
func TestDeadlineWhileWaitingForSync(t *testing.T) {
	gate := newWriteGate("")
	var ffs **faultfs.FS
	d := startDaemon(t, func(c *Config) {
		c.Store.Hooks = gate.hooks()
		ffs = withFaultFS(c)
	})
	ctx := testContext(t)
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "s.bin", Data: []byte("before")}); err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(hold) }) }
	defer release()
	held := (*ffs).Inject(faultfs.Rule{Op: faultfs.OpSync, Path: "s.bin", Hold: hold})
	fsyncDone := make(chan error, 1)
	go func() {
		_, err := d.client.Fsync(ctx, &filewritev1.FsyncRequest{Path: "s.bin"})
		fsyncDone <- err
	}()
	for held.Hits() == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("the Fsync never reached its sync")
		case <-time.After(time.Millisecond):
		}
	}

	for _, tt := range []struct {
		name string
		call func(ctx context.Context, id string) error
		// reached says the call is past everything but the sync wait.
		reached func(id string) bool
	}{
		{
			name: "synced write",
			call: func(ctx context.Context, id string) error {
				_, err := d.client.Write(requestID(ctx, id), &filewritev1.WriteRequest{Path: "s.bin", Offset: 6, Data: []byte("-after"), Sync: filewritev1.SyncMode_SYNC_MODE_DATA})
				return err
			},
			reached: gate.reachedData,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			id := func(attempt int) string { return fmt.Sprint("S", attempt) }
			err := expireWhile(t, func(attempt int) bool { return tt.reached(id(attempt)) }, func(ctx context.Context, attempt int) error {
				return tt.call(ctx, id(attempt))
			})
			wantCode(t, tt.name+" waiting for a held sync", err, codes.DeadlineExceeded)
		})
	}
	release()
	if err := <-fsyncDone; err != nil {
		t.Errorf("the Fsync whose sync was held: %v, want OK once released", err)
	}
}
