//go:build linux

package store_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store"
	"github.com/filewrite/filewrite/store/crashfs"
	"github.com/filewrite/filewrite/store/faultfs"
)

// durableCount opts counts the writes made durable by themselves.
func durableCount(opts *store.Options) *atomic.Int64 {
	n := new(atomic.Int64)
	h := store.Hooks{DurableWrite: func(string) { n.Add(1) }}
	if opts.Hooks != nil {
		h = *opts.Hooks
		h.DurableWrite = func(string) { n.Add(1) }
	}
	opts.Hooks = &h
	return n
}

// TestDurableWritePath: which synced writes are made durable by
// themselves (durable.go) and which wait for a sync of the file. The
// file is 16 blocks, written and synced, before each case's steps.
func TestDurableWritePath(t *testing.T) {
	skipWithoutODirect(t)
	ctx := context.Background()
	const path = "d/f"
	block := int64(4096)
	write := func(off, n int64, sync store.SyncMode) func(*store.Store) error {
		return func(s *store.Store) error {
			_, err := s.Write(ctx, path, off, pattern(int(n), byte(off)), sync)
			return err
		}
	}
	fsync := func(s *store.Store) error { return s.Fsync(ctx, path, store.SyncData) }
	truncate := func(s *store.Store) error { return s.Truncate(ctx, path, 16*block) }
	for _, tt := range []struct {
		name   string
		opts   store.Options
		before []func(*store.Store) error
		write  func(*store.Store) error
		want   int64 // writes made durable by themselves, the steps before included
	}{
		{"aligned below EOF", store.Options{}, nil, write(block, block, store.SyncData), 1},
		{"two in a row", store.Options{}, []func(*store.Store) error{write(0, block, store.SyncData)}, write(block, 2*block, store.SyncData), 2},
		{"shared-overwrite over written blocks", store.Options{Policy: store.PolicySharedOverwrite}, nil, write(block, block, store.SyncData), 1},
		{"--synced-writes fsync", store.Options{SyncedWrites: store.SyncedWritesFsync}, nil, write(block, block, store.SyncData), 0},
		{"exclusive policy", store.Options{Policy: store.PolicyExclusive}, nil, write(block, block, store.SyncData), 0},
		{"SyncFull", store.Options{}, nil, write(block, block, store.SyncFull), 0},
		{"unaligned", store.Options{}, nil, write(100, block, store.SyncData), 0},
		{"extending", store.Options{}, nil, write(16*block, block, store.SyncData), 0},
		{"after an unsynced write", store.Options{}, []func(*store.Store) error{write(0, 10, store.SyncNone)}, write(block, block, store.SyncData), 0},
		{"after an unsynced write and an Fsync", store.Options{}, []func(*store.Store) error{write(0, 10, store.SyncNone), fsync}, write(block, block, store.SyncData), 1},
		{"after a truncate", store.Options{}, []func(*store.Store) error{truncate}, write(block, block, store.SyncData), 0},
		{"after a synced write that waited for a sync", store.Options{}, []func(*store.Store) error{write(100, 10, store.SyncData)}, write(block, block, store.SyncData), 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			opts := tt.opts
			if opts.SyncedWrites == 0 {
				opts.SyncedWrites = store.SyncedWritesDirect
			}
			n := durableCount(&opts)
			s, dir := newStoreIn(t, opts)
			for _, step := range append([]func(*store.Store) error{write(0, 16*block, store.SyncNone), fsync}, tt.before...) {
				if err := step(s); err != nil {
					t.Fatal(err)
				}
			}
			before := n.Load()
			if err := tt.write(s); err != nil {
				t.Fatal(err)
			}
			if got := n.Load(); got != tt.want {
				t.Errorf("%d writes made durable by themselves (%d before the last), want %d", got, before, tt.want)
			}
			// Whichever way, every reader sees the bytes.
			got, err := os.ReadFile(filepath.Join(dir, path))
			if err != nil {
				t.Fatal(err)
			}
			if want, err := s.Read(ctx, path, 0, int64(len(got))); err != nil || string(got) != string(want) {
				t.Errorf("the file read directly differs from a Read (%v)", err)
			}
		})
	}
}

// newStoreIn opens a store over a fresh directory on the project
// filesystem, closed when the test ends.
func newStoreIn(t *testing.T, opts store.Options) (*store.Store, string) {
	t.Helper()
	dir := testutil.Dir(t)
	base, err := store.OpenOSFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := store.Open(base, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s, dir
}

// TestDurableWriteAndFailedSyncs: a failed sync is reported to the next
// batch before any synced write is made durable by itself again, and a
// durable write that fails makes the file's next sync fail too (its
// O_DSYNC sync may have been the one to see a writeback error).
func TestDurableWriteAndFailedSyncs(t *testing.T) {
	skipWithoutODirect(t)
	ctx := context.Background()
	opts := store.Options{SyncedWrites: store.SyncedWritesDirect}
	n := durableCount(&opts)
	fs := newFaultStore(t, opts)
	block := 4096
	write := func(off int) error {
		_, err := fs.Write(ctx, faultPath, int64(off), pattern(block, byte(off)), store.SyncData)
		return err
	}
	if _, err := fs.Write(ctx, faultPath, 0, pattern(16*block, 1), store.SyncNone); err != nil {
		t.Fatal(err)
	}
	if err := fs.Fsync(ctx, faultPath, store.SyncData); err != nil {
		t.Fatal(err)
	}

	// A sync fails: the synced write after it waits for the next batch,
	// which fails as the batch after a failure does.
	fs.fsys.Inject(faultfs.Rule{Op: faultfs.OpSync, Path: faultPath, Err: syscall.EIO, Times: 1})
	if err := fs.Fsync(ctx, faultPath, store.SyncData); !errors.Is(err, store.ErrSyncFailed) {
		t.Fatalf("Fsync with EIO: %v, want ErrSyncFailed", err)
	}
	if err := write(block); !errors.Is(err, store.ErrSyncFailed) || n.Load() != 0 {
		t.Fatalf("synced write after a failed sync: %v, %d made durable by itself; want ErrSyncFailed from the next batch, 0", err, n.Load())
	}
	// That write owes a sync no batch believed: the next waits too.
	if err := write(2 * block); err != nil || n.Load() != 0 {
		t.Fatalf("second synced write: %v, %d made durable by themselves; want nil, 0", err, n.Load())
	}
	if err := write(3 * block); err != nil || n.Load() != 1 {
		t.Fatalf("third synced write: %v, %d made durable by themselves; want nil, 1", err, n.Load())
	}

	// A durable write fails: so does the next sync, once.
	fs.fsys.Inject(faultfs.Rule{Op: faultfs.OpWrite, Path: faultPath, Err: syscall.EIO, Times: 1})
	if err := write(4 * block); err == nil || n.Load() != 1 {
		t.Fatalf("durable write with EIO: %v, %d made durable by themselves; want an error, 1", err, n.Load())
	}
	if err := fs.Fsync(ctx, faultPath, store.SyncData); !errors.Is(err, store.ErrSyncFailed) {
		t.Fatalf("Fsync after a failed durable write: %v, want ErrSyncFailed", err)
	}
	if err := fs.Fsync(ctx, faultPath, store.SyncData); err != nil {
		t.Fatalf("the Fsync after that: %v, want nil", err)
	}
}

// TestDurableWriteKeepsWhatCameBefore: a synced write makes durable what
// was written to the file before it, as the raw PUT relies on (only its
// last chunk asks for the sync), whether the write waits for a sync (the
// file owed one) or is made durable by itself (it owed none).
func TestDurableWriteKeepsWhatCameBefore(t *testing.T) {
	skipWithoutODirect(t)
	ctx := context.Background()
	const path = "f"
	block := 4096
	for _, earlier := range []bool{true, false} {
		dir := testutil.Dir(t)
		base, err := store.OpenOSFS(dir)
		if err != nil {
			t.Fatal(err)
		}
		fsys := crashfs.New(base)
		opts := store.Options{SyncedWrites: store.SyncedWritesDirect}
		n := durableCount(&opts)
		s, err := store.Open(fsys, opts)
		if err != nil {
			t.Fatal(err)
		}
		want := pattern(16*block, 'a')
		if _, err := s.Write(ctx, path, 0, want, store.SyncData); err != nil {
			t.Fatal(err)
		}
		if earlier {
			b := pattern(100, 'b')
			if _, err := s.Write(ctx, path, 0, b, store.SyncNone); err != nil {
				t.Fatal(err)
			}
			copy(want, b)
		}
		c := pattern(block, 'c')
		if _, err := s.Write(ctx, path, int64(8*block), c, store.SyncData); err != nil {
			t.Fatal(err)
		}
		copy(want[8*block:], c)
		if got, wantN := n.Load(), map[bool]int64{true: 0, false: 1}[earlier]; got != wantN {
			t.Errorf("earlier unsynced write %v: %d writes made durable by themselves, want %d", earlier, got, wantN)
		}
		st := fsys.Crash()
		s.Close() // fails: the disk is gone
		img := testutil.Dir(t)
		if _, err := st.Write(img, crashfs.KeepNone); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(img, path))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("earlier unsynced write %v: the image that keeps nothing unsynced differs from what was acknowledged (%d bytes, want %d)", earlier, len(got), len(want))
		}
	}
}
