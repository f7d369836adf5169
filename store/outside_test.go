//go:build linux

package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

// The root is the daemon's; these tests change files behind the store's
// back, as an operator's rm or mv would, and check the contract docs/guarantees.md
// states for that: the store notices when it next syncs, stats or opens
// the file, and never calls data durable that went to a file no name
// reaches.

// TestFileRemovedFromOutside: after rm of an open file, a synced Write or
// an Fsync fails with ErrFileRemoved, Stat says the file is gone, and the
// next request opens what the path names then: a Write creates it anew.
func TestFileRemovedFromOutside(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		// after runs once the file is removed, and says what it wants.
		after func(s *Store) error
		want  error
	}{
		{"synced Write", func(s *Store) error {
			_, err := s.Write(ctx, "f", 0, []byte("lost"), SyncData)
			return err
		}, ErrFileRemoved},
		{"unsynced Write, then Fsync", func(s *Store) error {
			if _, err := s.Write(ctx, "f", 0, []byte("lost"), SyncNone); err != nil {
				return err
			}
			return s.Fsync(ctx, "f", SyncData)
		}, ErrFileRemoved},
		{"Stat", func(s *Store) error {
			_, err := s.Stat(ctx, "f")
			return err
		}, ErrNotFound},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, dir := newTestStore(t, Options{})
			if _, err := s.Write(ctx, "f", 0, []byte("first"), SyncData); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(filepath.Join(dir, "f")); err != nil {
				t.Fatal(err)
			}
			if err := tt.after(s); !errors.Is(err, tt.want) {
				t.Fatalf("after rm: %v, want %v", err, tt.want)
			}
			if _, err := s.Write(ctx, "f", 0, []byte("again"), SyncData); err != nil {
				t.Fatalf("a Write after the store noticed: %v", err)
			}
			if got := string(readFile(t, dir, "f")); got != "again" {
				t.Errorf("f = %q, want the new file's \"again\"", got)
			}
		})
	}
}

// TestFileReplacedFromOutside: after mv of another file over an open one,
// a sync of it fails with ErrFileRemoved (the old file has no name left),
// and from then on the path's new file is served; Stat notices at once.
func TestFileReplacedFromOutside(t *testing.T) {
	ctx := context.Background()
	for _, notice := range []string{"Fsync", "Stat"} {
		t.Run(notice, func(t *testing.T) {
			s, dir := newTestStore(t, Options{})
			if _, err := s.Write(ctx, "f", 0, []byte("old contents"), SyncData); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "new"), []byte("NEW"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(filepath.Join(dir, "new"), filepath.Join(dir, "f")); err != nil {
				t.Fatal(err)
			}
			switch notice {
			case "Fsync":
				if err := s.Fsync(ctx, "f", SyncFull); !errors.Is(err, ErrFileRemoved) {
					t.Fatalf("Fsync after mv over the file: %v, want ErrFileRemoved", err)
				}
			case "Stat":
				if st, err := s.Stat(ctx, "f"); err != nil || st.Size != 3 {
					t.Fatalf("Stat after mv over the file: %+v, %v; want the new file's size 3", st, err)
				}
			}
			if got, err := s.Read(ctx, "f", 0, 64); err != nil || string(got) != "NEW" {
				t.Errorf("Read = %q, %v; want the new file's \"NEW\"", got, err)
			}
		})
	}
}

// TestRemovedFileIsNoShutdownError: a file removed from outside, and not
// synced since, is closed by SyncAll and Close without an error: nobody
// asked for its data to be durable, and the operator meant it gone.
func TestRemovedFileIsNoShutdownError(t *testing.T) {
	ctx := context.Background()
	s, dir := newTestStore(t, Options{}) // its cleanup checks Close
	if _, err := s.Write(ctx, "f", 0, []byte("x"), SyncNone); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "f")); err != nil {
		t.Fatal(err)
	}
	if err := s.syncAll(ctx); err != nil {
		t.Errorf("SyncAll: %v", err)
	}
}

// statCounter counts the fstat(2) calls made on the files of an FS.
type statCounter struct {
	FS
	stats atomic.Int64
}

func (c *statCounter) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := c.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return countedFile{f, c}, nil
}

type countedFile struct {
	File
	c *statCounter
}

func (f countedFile) Stat() (FileInfo, error) {
	f.c.stats.Add(1)
	return f.File.Stat()
}

// TestNoSystemCallPerWrite: watching for files changed from outside costs
// an unsynced write of an open file nothing, and a synced one at most the
// one fstat(2) of the sync that covers it.
func TestNoSystemCallPerWrite(t *testing.T) {
	dir := testutil.Dir(t)
	osfs, err := OpenOSFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	c := &statCounter{FS: osfs}
	s, err := Open(c, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if _, err := s.Write(ctx, "f", 0, make([]byte, 1<<20), SyncNone); err != nil {
		t.Fatal(err)
	}
	c.stats.Store(0)
	for i := range 100 {
		if _, err := s.Write(ctx, "f", int64(i)*4096, make([]byte, 4096), SyncNone); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.stats.Load(); got != 0 {
		t.Errorf("100 unsynced writes made %d fstat calls, want 0", got)
	}
	for i := range 10 {
		if _, err := s.Write(ctx, "f", int64(i)*4096, make([]byte, 4096), SyncData); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.stats.Load(); got > 10 {
		t.Errorf("10 synced writes made %d fstat calls, want at most one each", got)
	}
}

// lstatLimit is an FS that cancels a context once Lstat has looked at one
// name more than max times: how a test bounds a retry loop that would
// otherwise spin until the deadline, without a clock.
type lstatLimit struct {
	FS
	name   string
	max    int64
	cancel context.CancelFunc
	calls  atomic.Int64
}

func (l *lstatLimit) Lstat(name string) (FileInfo, error) {
	if name == l.name && l.calls.Add(1) > l.max {
		l.cancel()
	}
	return l.FS.Lstat(name)
}

// TestRenameOfFileChangedFromOutside: a Rename of an open file that was
// removed, moved away or replaced from outside answers at once, as Delete
// and Stat do: NOT_FOUND when the name names nothing any more, and
// otherwise it renames what the name names now. It once retried for as
// long as the caller's context allowed (forever without a deadline): the
// table still knew the old file by the name, and each attempt found the
// name naming something else.
func TestRenameOfFileChangedFromOutside(t *testing.T) {
	for _, tt := range []struct {
		name string
		// change changes f behind the store's back.
		change func(t *testing.T, dir string)
		// want is Rename's error, and moved what g holds after it.
		want  error
		moved string
	}{
		{"rm", func(t *testing.T, dir string) {
			must(t, os.Remove(filepath.Join(dir, "f")))
		}, ErrNotFound, ""},
		{"mv away", func(t *testing.T, dir string) {
			must(t, os.Rename(filepath.Join(dir, "f"), filepath.Join(dir, "elsewhere")))
		}, ErrNotFound, ""},
		{"mv another file over it", func(t *testing.T, dir string) {
			must(t, os.WriteFile(filepath.Join(dir, "new"), []byte("NEW"), 0o644))
			must(t, os.Rename(filepath.Join(dir, "new"), filepath.Join(dir, "f")))
		}, nil, "NEW"},
		{"mv away, and a new file made in its place", func(t *testing.T, dir string) {
			must(t, os.Rename(filepath.Join(dir, "f"), filepath.Join(dir, "elsewhere")))
			must(t, os.WriteFile(filepath.Join(dir, "f"), []byte("NEW"), 0o644))
		}, nil, "NEW"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var l *lstatLimit
			s, dir := newWrappedStore(t, func(fsys FS) FS {
				l = &lstatLimit{FS: fsys, name: "f", max: 100, cancel: cancel}
				return l
			}, Options{})
			if _, err := s.Write(ctx, "f", 0, []byte("old"), SyncData); err != nil {
				t.Fatal(err)
			}
			tt.change(t, dir)
			err := s.Rename(ctx, "f", "g", false, false)
			if l.calls.Load() > l.max {
				t.Fatalf("Rename looked at f %d times and was still retrying (then: %v)", l.calls.Load(), err)
			}
			if !errors.Is(err, tt.want) || (tt.want == nil && err != nil) {
				t.Fatalf("Rename after %s: %v, want %v", tt.name, err, tt.want)
			}
			if tt.moved != "" {
				if got := string(readFile(t, dir, "g")); got != tt.moved {
					t.Errorf("g = %q, want %q", got, tt.moved)
				}
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
