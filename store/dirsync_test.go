//go:build linux

package store

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

// heldDirFS counts SyncDir calls by directory and holds the first sync of
// one directory until the test releases it.
type heldDirFS struct {
	FS
	dir     string
	arrived chan struct{} // closed when the held sync has begun
	release chan struct{}

	mu    sync.Mutex
	calls map[string]int
}

func (f *heldDirFS) SyncDir(name string) error {
	f.mu.Lock()
	f.calls[name]++
	first := name == f.dir && f.calls[name] == 1
	f.mu.Unlock()
	if first {
		close(f.arrived)
		<-f.release
	}
	return f.FS.SyncDir(name)
}

func (f *heldDirFS) count(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[name]
}

// dirWaiters is how many callers wait for an fsync of dir: the running
// one's (once it started) and the next one's.
func dirWaiters(s *Store, dir string) int {
	d := s.table.dirs
	d.mu.Lock()
	ds := d.byDir[dir]
	d.mu.Unlock()
	if ds == nil {
		return 0
	}
	ds.mu.Lock()
	defer ds.mu.Unlock()
	n := 0
	for _, b := range []*dirBatch{ds.running, ds.pending} {
		if b != nil {
			n += b.callers
		}
	}
	return n
}

// TestNewFilesShareDirectorySyncs: the first syncs of files created in one
// new directory share the fsyncs of that directory. Files created before
// a running fsync of it started are covered by that one; files created
// while it runs wait for the next, which covers them all: n files cost one
// or two fsyncs of the directory rather than n. With --fsync=per-call each
// pays its own. It counts SyncDir calls through the FS seam.
func TestNewFilesShareDirectorySyncs(t *testing.T) {
	const n = 8
	for _, tt := range []struct {
		name string
		mode FsyncMode
		// createWhileHeld creates files 1 to n-1 while the first sync of
		// d (file 0's) runs, rather than before it.
		createWhileHeld bool
		want            int // fsyncs of the shared directory
	}{
		{"created before the running fsync: covered by it", FsyncGroup, false, 1},
		{"created while it runs: covered by the next", FsyncGroup, true, 2},
		{"per-call: one each", FsyncPerCall, false, n},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			held := &heldDirFS{dir: "d", arrived: make(chan struct{}), release: make(chan struct{}), calls: map[string]int{}}
			dir := testutil.Dir(t)
			osfs, err := OpenOSFS(dir)
			if err != nil {
				t.Fatal(err)
			}
			held.FS = osfs
			s, err := Open(held, Options{Fsync: tt.mode})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			create := func(i int) {
				if _, err := s.Write(ctx, fmt.Sprintf("d/f%d", i), 0, []byte("x"), SyncNone); err != nil {
					t.Fatal(err)
				}
			}
			create(0)
			if !tt.createWhileHeld {
				for i := 1; i < n; i++ {
					create(i)
				}
			}
			errs := make(chan error, n)
			go func() { errs <- s.Fsync(ctx, "d/f0", SyncData) }()
			<-held.arrived
			if tt.createWhileHeld {
				for i := 1; i < n; i++ {
					create(i)
				}
			}
			for i := 1; i < n; i++ {
				go func() { errs <- s.Fsync(ctx, fmt.Sprintf("d/f%d", i), SyncData) }()
			}
			// The others wait for the held fsync of d or the next, or,
			// one each, sync d themselves.
			testutil.WaitFor(t, "the other files to reach d's sync", func() bool {
				if tt.mode == FsyncPerCall {
					return held.count("d") == n
				}
				return dirWaiters(s, "d") == n
			})
			close(held.release)
			for range n {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			if got := held.count("d"); got != tt.want {
				t.Errorf("fsyncs of d for %d new files: %d, want %d", n, got, tt.want)
			}
			// Every file's name is durable once: a later sync syncs no
			// directory.
			before := held.count("d") + held.count(".")
			if err := s.Fsync(ctx, "d/f0", SyncData); err != nil {
				t.Fatal(err)
			}
			if got := held.count("d") + held.count("."); got != before {
				t.Errorf("a second sync of d/f0 synced %d directories, want none", got-before)
			}
		})
	}
}

// TestRenameSyncAfterMadeDirsFull: once more directories were made than
// the store keeps count of, a synced Rename into one made past the count
// still syncs its parent, and once an fsync of that parent covered them
// all, a synced Rename no longer syncs directories that are durable: the
// store does not stay on the slow path for good.
func TestRenameSyncAfterMadeDirsFull(t *testing.T) {
	ctx := context.Background()
	osfs, err := OpenOSFS(testutil.Dir(t))
	if err != nil {
		t.Fatal(err)
	}
	counting := &heldDirFS{FS: osfs, dir: "never synced", calls: map[string]int{}}
	s, err := Open(counting, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.table.dirs.maxMade = 2
	for _, name := range []string{"a/f", "b/f", "c/f", "d/f"} { // c and d past the count
		if _, err := s.Write(ctx, name, 0, []byte("x"), SyncNone); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range []struct {
		name         string
		do           func() error
		wantRootSync int // fsyncs of "." the step makes
	}{
		{"rename into a directory made past the count", func() error { return s.Rename(ctx, "a/f", "c/g", false, true) }, 1},
		{"the first sync of a file created at the root", func() error {
			if _, err := s.Write(ctx, "top", 0, []byte("x"), SyncNone); err != nil {
				return err
			}
			return s.Fsync(ctx, "top", SyncData)
		}, 1},
		{"rename into a directory made before, durable now", func() error { return s.Rename(ctx, "c/g", "b/g", false, true) }, 0},
		{"rename into one made past the count, durable now", func() error { return s.Rename(ctx, "b/g", "d/g", false, true) }, 0},
	} {
		before := counting.count(".")
		if err := step.do(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got := counting.count(".") - before; got != step.wantRootSync {
			t.Errorf("%s: got %d fsyncs of the root, want %d", step.name, got, step.wantRootSync)
		}
	}
}
