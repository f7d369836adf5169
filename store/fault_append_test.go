//go:build linux

package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/filewrite/filewrite/store"
	"github.com/filewrite/filewrite/store/faultfs"
)

// TestAppendFailureLeavesNoHole fails one append with ENOSPC while appends
// above it are in flight, under every policy. Under exclusive nothing is in
// flight beside it; under the others the appends above it fail too
// (ErrAppendAborted) and the file goes back to the failed offset, so that
// no reader sees a hole and the next append lands there.
func TestAppendFailureLeavesNoHole(t *testing.T) {
	for _, p := range store.Policies() {
		t.Run(p.String(), func(t *testing.T) {
			fs := newFaultStore(t, store.Options{Policy: p})
			ctx := context.Background()
			if _, err := fs.Append(ctx, faultPath, bytes.Repeat([]byte("h"), 100), store.SyncNone, store.AppendOptions{}); err != nil {
				t.Fatal(err)
			}
			hold := make(chan struct{})
			fs.fsys.Inject(faultfs.Rule{Op: faultfs.OpWrite, Path: faultPath, Off: 100, Len: 1, Err: syscall.ENOSPC, After: 3, Times: 1, Hold: hold})
			type result struct {
				res store.AppendResult
				err error
			}
			failed := make(chan result, 1)
			go func() {
				res, err := fs.Append(ctx, faultPath, []byte("fail-me"), store.SyncNone, store.AppendOptions{})
				failed <- result{res, err}
			}()
			const above = 4
			results := make(chan result, above)
			if p != store.PolicyExclusive {
				// Wait until the failing append holds its range.
				waitAppending(t, fs.Store, 1)
				for range above {
					go func() {
						res, err := fs.Append(ctx, faultPath, []byte("above"), store.SyncNone, store.AppendOptions{})
						results <- result{res, err}
					}()
				}
				waitAppending(t, fs.Store, 1+above)
				if st, err := fs.Stat(ctx, faultPath); err != nil || st.Size != 100 {
					t.Errorf("Stat while appends are in flight: got %d, %v, want 100 (no reserved range)", st.Size, err)
				}
			}
			close(hold)
			if r := <-failed; !errors.Is(r.err, store.ErrNoSpace) {
				t.Errorf("the failing append: got %+v, %v, want ErrNoSpace", r.res, r.err)
			}
			if p != store.PolicyExclusive {
				for range above {
					if r := <-results; !errors.Is(r.err, store.ErrAppendAborted) {
						t.Errorf("an append above it: got %+v, %v, want ErrAppendAborted", r.res, r.err)
					}
				}
			}
			res, err := fs.Append(ctx, faultPath, []byte("next"), store.SyncNone, store.AppendOptions{})
			if err != nil || res.Offset != 100 {
				t.Errorf("the next append: got %+v, %v, want offset 100", res, err)
			}
			if got, want := string(fs.content(t, faultPath)), string(bytes.Repeat([]byte("h"), 100))+"next"; got != want {
				t.Errorf("file: got %q, want %q", got, want)
			}
			fs.checkTrue(t, faultPath, true)
		})
	}
}

// waitAppending waits until path's file has at least n appends in flight.
func waitAppending(t *testing.T, s *store.Store, n int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		for _, f := range s.Locks(100) {
			if f.Path == faultPath && f.Appending >= n {
				return
			}
		}
	}
	t.Fatalf("fewer than %d appends in flight after 10s", n)
}

// TestAppendGiveBackTruncateFails fails an append after part of its bytes
// reached the file, and then the ftruncate that gives its range back, under
// every policy. The size readers see stays at the failed offset all the
// same, so no reader sees the failed bytes and the next append lands there,
// over them.
func TestAppendGiveBackTruncateFails(t *testing.T) {
	for _, p := range store.Policies() {
		t.Run(p.String(), func(t *testing.T) {
			fs := newFaultStore(t, store.Options{Policy: p})
			ctx := context.Background()
			head := bytes.Repeat([]byte("h"), 100)
			if _, err := fs.Append(ctx, faultPath, head, store.SyncNone, store.AppendOptions{}); err != nil {
				t.Fatal(err)
			}
			// Three bytes of the failing append reach the file.
			fs.fsys.Inject(faultfs.Rule{Op: faultfs.OpWrite, Path: faultPath, Off: 100, Err: syscall.ENOSPC, After: 3, Times: 1})
			trunc := fs.fsys.Inject(faultfs.Rule{Op: faultfs.OpTruncate, Path: faultPath, Err: syscall.EIO, Times: 1})
			if res, err := fs.Append(ctx, faultPath, []byte("fail-me"), store.SyncNone, store.AppendOptions{}); !errors.Is(err, store.ErrNoSpace) {
				t.Fatalf("the failing append: got %+v, %v, want ErrNoSpace", res, err)
			}
			if got, want := trunc.Hits(), 1; got != want {
				t.Fatalf("ftruncates failed: got %d, want %d (the give-back)", got, want)
			}
			if got, want := len(fs.content(t, faultPath)), 103; got != want {
				t.Fatalf("file length after the failed give-back: got %d, want %d", got, want)
			}
			st, err := fs.Stat(ctx, faultPath)
			if err != nil || st.Size != 100 {
				t.Errorf("Stat: got %d, %v, want 100 (the failed offset)", st.Size, err)
			}
			got, err := fs.Read(ctx, faultPath, 0, 1000)
			if err != nil || !bytes.Equal(got, head) {
				t.Errorf("Read: got %q, %v, want %q", got, err, head)
			}
			res, err := fs.Append(ctx, faultPath, []byte("next"), store.SyncNone, store.AppendOptions{})
			if err != nil || res.Offset != 100 || res.Size != 104 {
				t.Errorf("the next append: got %+v, %v, want offset 100, size 104", res, err)
			}
			if got, want := string(fs.content(t, faultPath)), string(head)+"next"; got != want {
				t.Errorf("file: got %q, want %q", got, want)
			}
			fs.checkTrue(t, faultPath, true)
		})
	}
}

// TestListHidesUnpublishedAppends: while an append below it is still being
// written, an append that has written its bytes has moved the file's own
// size, but List, like Stat, shows the published size, also for a file
// past the first batch of the page's lookups.
func TestListHidesUnpublishedAppends(t *testing.T) {
	fs := newFaultStore(t, store.Options{Policy: store.PolicySharedOverwrite})
	ctx := context.Background()
	const others = 200 // named before faultPath's file, so it comes last
	for i := range others {
		if _, err := fs.Write(ctx, fmt.Sprintf("ckpt/a%03d", i), 0, []byte("x"), store.SyncNone); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := fs.Append(ctx, faultPath, bytes.Repeat([]byte("h"), 100), store.SyncNone, store.AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	fs.fsys.Inject(faultfs.Rule{Op: faultfs.OpWrite, Path: faultPath, Off: 100, Len: 1, Hold: hold, Times: 1})
	errs := make(chan error, 2)
	go func() {
		_, err := fs.Append(ctx, faultPath, []byte("below"), store.SyncNone, store.AppendOptions{})
		errs <- err
	}()
	waitAppending(t, fs.Store, 1)
	go func() {
		_, err := fs.Append(ctx, faultPath, []byte("above"), store.SyncNone, store.AppendOptions{})
		errs <- err
	}()
	waitAppending(t, fs.Store, 2)
	for deadline := time.Now().Add(10 * time.Second); len(fs.content(t, faultPath)) < 110; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the append above never wrote its bytes")
		}
	}
	entries, _, err := fs.List(ctx, "ckpt", 0, "")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(entries), others+1; got != want {
		t.Fatalf("List: got %d entries, want %d", got, want)
	}
	if got := entries[others]; got.Name != "rank-3.bin" || got.Size != 100 {
		t.Errorf("List while the append below is held: got %+v, want rank-3.bin of 100 bytes (the published size)", got)
	}
	close(hold)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	entries, _, err = fs.List(ctx, "ckpt", 0, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := entries[others]; got.Size != 110 {
		t.Errorf("List after both appends: got %+v, want 110 bytes", got)
	}
}
