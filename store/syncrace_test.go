//go:build linux

package store

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

// syncHold holds the next Sync of a file, once armed, until released: the
// test then knows that the caller's write reached the file and that its
// sync has not been issued.
type syncHold struct {
	armed   atomic.Bool
	arrived chan struct{}
	release *testutil.Gate
}

type syncHoldFile struct {
	File
	h *syncHold
}

func (f syncHoldFile) Sync(mode SyncMode) error {
	if f.h.armed.CompareAndSwap(true, false) {
		f.h.arrived <- struct{}{}
		<-f.h.release.Opened()
	}
	return f.File.Sync(mode)
}

// TestSyncRacingDeleteOrRename: a synced Write, a synced stream write
// (Handle.Write, then Wait) or an Fsync whose sync runs after a Delete of
// the file, or a Rename over it, made through the store unlinked it,
// answers as one order of the calls allows: the write (or Fsync) came
// first, OK, or the file was gone, ErrNotFound. Never ErrFileRemoved,
// which is for files removed from outside the store: the sync's fstat(2)
// finds the file without a name either way, and the store once took its
// own Delete for an outside one. The namespace operation is held after
// its unlink(2) or rename(2), before it marks the file deleted, or let
// finish, while the sync is held after the write reached the file.
func TestSyncRacingDeleteOrRename(t *testing.T) {
	ctx := context.Background()
	syncers := []struct {
		name string
		// exclusive: whether the syncer can run under PolicyExclusive,
		// where a synced write syncs under its lock, which the namespace
		// operation then waits for.
		exclusive bool
		do        func(s *Store, hd *Handle) error
	}{
		{"synced Write", false, func(s *Store, _ *Handle) error {
			_, err := s.Write(ctx, "f", 0, []byte("racing"), SyncData)
			return err
		}},
		{"synced stream write", false, func(_ *Store, hd *Handle) error {
			w, err := hd.Write(ctx, 0, []byte("racing"), SyncData)
			if err != nil {
				return err
			}
			return hd.Wait(ctx, w)
		}},
		{"Fsync", true, func(s *Store, _ *Handle) error {
			return s.Fsync(ctx, "f", SyncData)
		}},
	}
	ops := []struct {
		name string
		do   func(s *Store) error
	}{
		{"Delete", func(s *Store) error { return s.Delete(ctx, "f", false) }},
		{"Rename over", func(s *Store) error { return s.Rename(ctx, "g", "f", false, false) }},
	}
	for _, p := range Policies() {
		for _, sy := range syncers {
			if p == PolicyExclusive && !sy.exclusive {
				continue
			}
			for _, op := range ops {
				for _, held := range []bool{true, false} {
					name := p.String() + "/" + sy.name + "/" + op.name
					if held {
						name += "/held after its syscall"
					}
					t.Run(name, func(t *testing.T) {
						hold := &syncHold{arrived: make(chan struct{}, 1), release: testutil.NewGate(t)}
						var h *hookFS
						s, _ := newWrappedStore(t, func(fsys FS) FS {
							h = &hookFS{FS: fileWrapFS{fsys, func(f File) File { return syncHoldFile{f, hold} }}}
							return h
						}, Options{Policy: p})
						for _, name := range []string{"f", "g"} {
							if _, err := s.Write(ctx, name, 0, make([]byte, 8192), SyncData); err != nil {
								t.Fatal(err)
							}
						}
						hd, err := s.OpenHandle(ctx, "f", OpenMustExist)
						if err != nil {
							t.Fatal(err)
						}
						defer hd.Close()
						old := lookupInode(t, s, "f")

						hold.armed.Store(true)
						synced := make(chan error, 1)
						go func() { synced <- sy.do(s, hd) }()
						<-hold.arrived

						unlinked, letOp := make(chan struct{}, 1), testutil.NewGate(t)
						if held {
							h.afterRemove = func(string, error) { unlinked <- struct{}{}; <-letOp.Opened() }
							h.afterRename = func(string, string, error) { unlinked <- struct{}{}; <-letOp.Opened() }
						} else {
							letOp.Open()
						}
						done := make(chan error, 1)
						go func() { done <- op.do(s) }()
						if held {
							<-unlinked
						} else if err := <-done; err != nil {
							t.Fatal(err)
						}

						hold.release.Open()
						var early error
						returned := false
						if held {
							testutil.WaitFor(t, sy.name+" to return or wait for the "+op.name, func() bool {
								select {
								case early = <-synced:
									returned = true
									return true
								default:
								}
								return old.lock.snapshot(1).Waiting > 0
							})
							letOp.Open()
							if err := <-done; err != nil {
								t.Fatal(err)
							}
						}
						if !returned {
							early = <-synced
						}
						if early != nil && !errors.Is(early, ErrNotFound) {
							t.Errorf("%s racing %s: %v, want success or %v", sy.name, op.name, early, ErrNotFound)
						}
					})
				}
			}
		}
	}
}
