//go:build linux

package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

// fileState is what a user can see of a file through the store.
type fileState struct {
	size      int64
	allocated int64
	extents   []Extent
	content   []byte
}

// stateSpan is how far past EOF extents are listed, so that blocks
// preallocated there (keep-size) are part of the state too.
const stateSpan = 8 * 4096

func observe(t *testing.T, s *Store, name string) fileState {
	t.Helper()
	ctx := context.Background()
	st, err := s.Stat(ctx, name)
	if err != nil {
		t.Fatalf("Stat(%s): %v", name, err)
	}
	ext, err := s.Extents(ctx, name, 0, stateSpan)
	if err != nil {
		t.Fatalf("Extents(%s): %v", name, err)
	}
	b, err := s.Read(ctx, name, 0, stateSpan)
	if err != nil {
		t.Fatalf("Read(%s): %v", name, err)
	}
	return fileState{size: st.Size, allocated: st.AllocatedBytes, extents: ext, content: b}
}

// isOpen and openFiles look at the inode table without taking references,
// which would count as a use and move files in its LRU list.
func isOpen(s *Store, name string) bool {
	s.table.mu.Lock()
	defer s.table.mu.Unlock()
	_, ok := s.table.byPath[name]
	return ok
}

func openFiles(s *Store) int {
	s.table.mu.Lock()
	defer s.table.mu.Unlock()
	return s.table.open
}

// TestInodeTableReopen: with room for two open files, touching many closes
// the idle ones, and a closed file reopened later has the state it had
// while open: size, allocation, extent map (rebuilt from FIEMAP) and
// content.
func TestInodeTableReopen(t *testing.T) {
	const bs = 4096
	fill := func(b byte, n int) []byte { return bytes.Repeat([]byte{b}, n) }
	type step func(ctx context.Context, s *Store, name string) error
	write := func(off int64, data []byte) step {
		return func(ctx context.Context, s *Store, name string) error {
			_, err := s.Write(ctx, name, off, data, SyncNone)
			return err
		}
	}
	falloc := func(mode FallocateMode, off, length int64) step {
		return func(ctx context.Context, s *Store, name string) error {
			_, err := s.Fallocate(ctx, name, mode, off, length)
			return err
		}
	}
	truncate := func(size int64) step {
		return func(ctx context.Context, s *Store, name string) error { return s.Truncate(ctx, name, size) }
	}
	files := []struct {
		name  string
		steps []step
	}{
		{"written", []step{write(0, fill('w', 3*bs))}},
		{"unwritten", []step{falloc(FallocAllocate, 0, 4*bs), write(bs, fill('u', bs))}},
		{"hole", []step{truncate(4 * bs), write(3*bs, fill('h', 10))}},
		{"punched", []step{write(0, fill('p', 4*bs)), falloc(FallocPunchHole, bs, bs), falloc(FallocZeroRange, 2*bs, bs)}},
		{"sub/dir/prealloc-past-eof", []step{write(0, fill('k', bs+100)), falloc(FallocKeepSize, 2*bs, 3*bs)}},
		// ext4 punches nothing past the page that holds EOF: the map must
		// say so too, or it changes when the file is reopened.
		{"punch-past-eof", []step{write(0, fill('e', 2*bs)), falloc(FallocKeepSize, 2*bs, 2*bs), falloc(FallocPunchHole, 3*bs, bs)}},
		{"truncated", []step{write(0, fill('t', 4*bs)), falloc(FallocKeepSize, 4*bs, bs), truncate(bs + 1)}},
		{"empty", []step{truncate(0)}},
	}
	ctx := context.Background()
	s, dir := newTestStore(t, Options{MaxOpenFiles: 2})
	want := make(map[string]fileState)
	for _, f := range files {
		for i, st := range f.steps {
			if err := st(ctx, s, f.name); err != nil {
				t.Fatalf("%s step %d: %v", f.name, i, err)
			}
		}
		want[f.name] = observe(t, s, f.name)
		if got := openFiles(s); got > 2 {
			t.Errorf("after %s: %d files open, want at most 2", f.name, got)
		}
	}
	// Twice: the second round reopens files closed in the first.
	for round := range 2 {
		for _, f := range files {
			t.Run(fmt.Sprintf("round%d/%s", round, f.name), func(t *testing.T) {
				if isOpen(s, f.name) {
					t.Fatalf("%s is still open after %d other files were used", f.name, len(files)-1)
				}
				got := observe(t, s, f.name)
				if !isOpen(s, f.name) {
					t.Errorf("%s was not reopened", f.name)
				}
				w := want[f.name]
				if got.size != w.size {
					t.Errorf("size after reopen = %d, want %d", got.size, w.size)
				}
				if got.allocated != w.allocated {
					t.Errorf("allocated bytes after reopen = %d, want %d", got.allocated, w.allocated)
				}
				if !reflect.DeepEqual(got.extents, w.extents) {
					t.Errorf("extents after reopen = %v, want %v", got.extents, w.extents)
				}
				if !bytes.Equal(got.content, w.content) {
					t.Errorf("content after reopen differs: %d bytes, want %d", len(got.content), len(w.content))
				}
				if disk := readFile(t, dir, f.name); !bytes.Equal(got.content, disk) {
					t.Errorf("content read through the store differs from the file: %d bytes, file has %d", len(got.content), len(disk))
				}
				if n := openFiles(s); n > 2 {
					t.Errorf("%d files open, want at most 2", n)
				}
			})
		}
	}
}

// TestInodeTableFull: when every open file is busy (writers held inside
// their writes), one more file cannot be opened: the request fails with
// ErrTooManyOpenFiles naming the limit and creates nothing, neither the
// file nor its parent directories. Once a writer finishes it can.
func TestInodeTableFull(t *testing.T) {
	ctx := context.Background()
	s, dir := newTestStore(t, Options{MaxOpenFiles: 2})
	g := newGate(t, 2)
	s.opts.Hooks = g.hooks()
	var wg sync.WaitGroup
	for _, name := range []string{"busy1", "busy2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Write(ctx, name, 0, []byte(name), SyncNone); err != nil {
				t.Error(err)
			}
		}()
	}
	<-g.arrived
	<-g.arrived
	if err := os.WriteFile(filepath.Join(dir, "existing"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		op   string
		name string
		call func(name string) error
	}{
		{"Write", "new", func(n string) error { _, err := s.Write(ctx, n, 0, []byte("x"), SyncNone); return err }},
		{"Write", "newdir/new", func(n string) error { _, err := s.Write(ctx, n, 0, []byte("x"), SyncNone); return err }},
		{"Truncate", "newdir/new", func(n string) error { return s.Truncate(ctx, n, 10) }},
		{"Fallocate", "new", func(n string) error { _, err := s.Fallocate(ctx, n, FallocAllocate, 0, 4096); return err }},
		{"Read", "existing", func(n string) error { _, err := s.Read(ctx, n, 0, 1); return err }},
		{"Stat", "existing", func(n string) error { _, err := s.Stat(ctx, n); return err }},
	} {
		t.Run(tc.op+"/"+tc.name, func(t *testing.T) {
			err := tc.call(tc.name)
			if !errors.Is(err, ErrTooManyOpenFiles) {
				t.Fatalf("got %v, want ErrTooManyOpenFiles", err)
			}
			if want := "the limit is 2"; !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not name the limit (%q)", err, want)
			}
			for _, p := range []string{"new", "newdir"} {
				if _, err := os.Lstat(filepath.Join(dir, p)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s exists after a refused %s (lstat: %v)", p, tc.op, err)
				}
			}
			if got := string(readFile(t, dir, "existing")); got != "x" {
				t.Errorf("existing = %q, want %q", got, "x")
			}
		})
	}
	g.open()
	wg.Wait()
	s.opts.Hooks = nil
	// The writers are done, so their files are idle and can be closed.
	if _, err := s.Write(ctx, "newdir/new", 0, []byte("now"), SyncNone); err != nil {
		t.Fatalf("Write once a file is idle: %v", err)
	}
	if got := string(readFile(t, dir, "newdir/new")); got != "now" {
		t.Errorf("newdir/new = %q, want %q", got, "now")
	}
}

// TestInodeTableAliases: two names for one file share one inode, so one
// lock: under PolicyExclusive a writer held inside its write through one
// name keeps a writer through the other name queued.
func TestInodeTableAliases(t *testing.T) {
	const bs = 4096
	for _, tc := range []struct {
		name          string
		link          func(dir string) error
		first, second string
	}{
		{"hard link", func(dir string) error {
			return os.Link(filepath.Join(dir, "f"), filepath.Join(dir, "hard"))
		}, "f", "hard"},
		{"hard link held", func(dir string) error {
			return os.Link(filepath.Join(dir, "f"), filepath.Join(dir, "hard"))
		}, "hard", "f"},
		{"symlink", func(dir string) error {
			return os.Symlink("f", filepath.Join(dir, "link"))
		}, "f", "link"},
		{"symlink held", func(dir string) error {
			return os.Symlink("f", filepath.Join(dir, "link"))
		}, "link", "f"},
		{"symlink up from a subdirectory", func(dir string) error {
			if err := os.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
				return err
			}
			return os.Symlink("../f", filepath.Join(dir, "d", "link"))
		}, "f", "d/link"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s, dir := newTestStore(t, Options{Policy: PolicyExclusive})
			if err := os.WriteFile(filepath.Join(dir, "f"), make([]byte, 2*bs), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := tc.link(dir); err != nil {
				t.Fatal(err)
			}
			g := newGate(t, 2)
			s.opts.Hooks = g.hooks()
			done := make(chan error, 2)
			go func() {
				_, err := s.Write(ctx, tc.first, 0, bytes.Repeat([]byte{1}, bs), SyncNone)
				done <- err
			}()
			<-g.arrived
			go func() {
				_, err := s.Write(ctx, tc.second, bs, bytes.Repeat([]byte{2}, bs), SyncNone)
				done <- err
			}()
			testutil.WaitFor(t, "the second writer to queue", func() bool { return fileLocks(s, tc.first).Waiting == 1 })
			if got := len(g.arrived); got != 0 {
				t.Fatalf("%d writers through %s got inside while one through %s held the lock, want 0", got, tc.second, tc.first)
			}
			g.open()
			for range 2 {
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
			s.opts.Hooks = nil
			want := append(bytes.Repeat([]byte{1}, bs), bytes.Repeat([]byte{2}, bs)...)
			if got := readFile(t, dir, "f"); !bytes.Equal(got, want) {
				t.Errorf("content after both writes differs from %d bytes of 1 then 2", len(want))
			}
			for _, name := range []string{tc.first, tc.second} {
				if st, err := s.Stat(ctx, name); err != nil || st.Size != 2*bs {
					t.Errorf("Stat(%s) = %d, %v; want %d", name, st.Size, err, 2*bs)
				}
			}
			a, err := s.table.get(ctx, tc.first, false)
			if err != nil {
				t.Fatal(err)
			}
			defer s.table.put(a)
			b, err := s.table.get(ctx, tc.second, false)
			if err != nil {
				t.Fatal(err)
			}
			defer s.table.put(b)
			if a != b {
				t.Errorf("%s and %s have two inodes, want one", tc.first, tc.second)
			}
		})
	}
}

// TestInodeTableLookIsNotUse: listing the open files (/debug/locks) or
// syncing them all takes a reference to each, but that is not a use: the
// least recently used idle file is still the one closed next.
func TestInodeTableLookIsNotUse(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		look func(s *Store) error
	}{
		{"Locks", func(s *Store) error { s.Locks(100); return nil }},
		{"Locks limit 1", func(s *Store) error { s.Locks(1); return nil }},
		{"SyncAll", func(s *Store) error { return s.syncAll(ctx) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newTestStore(t, Options{MaxOpenFiles: 2})
			// Map order is random: one look reorders two files half the
			// time, so look at several pairs.
			for i := range 16 {
				older, newer, next := fmt.Sprint("old", i), fmt.Sprint("new", i), fmt.Sprint("next", i)
				for _, name := range []string{older, newer} {
					if _, err := s.Write(ctx, name, 0, []byte(name), SyncNone); err != nil {
						t.Fatal(err)
					}
				}
				if err := tc.look(s); err != nil {
					t.Fatal(err)
				}
				if _, err := s.Write(ctx, next, 0, []byte(next), SyncNone); err != nil {
					t.Fatal(err)
				}
				if got, want := isOpen(s, older), false; got != want {
					t.Errorf("pair %d: %s (least recently used) open = %v, want %v", i, older, got, want)
				}
				if got, want := isOpen(s, newer), true; got != want {
					t.Errorf("pair %d: %s (used after %s) open = %v, want %v", i, newer, older, got, want)
				}
			}
		})
	}
}

// TestMaxOpenFilesFor: the daemon's default bound on open files leaves a
// quarter of the descriptors (at least 256) to the rest, halves with
// direct I/O, and is capped.
func TestMaxOpenFilesFor(t *testing.T) {
	for _, tt := range []struct {
		nofile uint64
		io     IOMode
		want   int
	}{
		{1024, IOBuffered, 768},
		{1024, IODirect, 384},
		{20000, IOBuffered, 15000},
		{20000, IODirect, 7500},
		{1 << 20, IOBuffered, MaxOpenFilesCap},
		{^uint64(0), IODirect, MaxOpenFilesCap}, // RLIM_INFINITY
		{256, IOBuffered, 1},
		{300, IOBuffered, 44},
	} {
		if got := MaxOpenFilesFor(tt.nofile, tt.io); got != tt.want {
			t.Errorf("MaxOpenFilesFor(%d, %v) = %d, want %d", tt.nofile, tt.io, got, tt.want)
		}
	}
}

// TestCheckMaxOpenFiles: checkMaxOpenFiles: an explicit bound must fit in the descriptor
// limit, two descriptors a file with direct I/O, with a few to spare, and
// the error says what to do.
func TestCheckMaxOpenFiles(t *testing.T) {
	for _, tt := range []struct {
		files  int
		io     IOMode
		nofile uint64
		ok     bool
	}{
		{1024, IOBuffered, 20000, true},
		{20000 - MinSpareDescriptors, IOBuffered, 20000, true},
		{20000 - MinSpareDescriptors + 1, IOBuffered, 20000, false},
		{10000, IODirect, 20000, false},
		{9000, IODirect, 20000, true},
		{0, IOBuffered, 20000, false},
	} {
		err := checkMaxOpenFiles(tt.files, tt.io, tt.nofile)
		if got := err == nil; got != tt.ok {
			t.Errorf("checkMaxOpenFiles(%d, %v, %d) = %v, want ok %v", tt.files, tt.io, tt.nofile, err, tt.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "RLIMIT_NOFILE") {
			t.Errorf("error %q does not name RLIMIT_NOFILE", err)
		}
	}
}

// TestRecycledStateStartsEmpty: the in-flight counters and extent maps
// that inodes closed for room give back are emptied for the next inodes:
// no write in flight, no wake-up left over for a waiter, no runs, and
// newInflightCounter and newExtentMap hand them out so, with the block
// size asked for. A map too large to empty cheaply is not kept.
func TestRecycledStateStartsEmpty(t *testing.T) {
	const n = 64
	for i := range n {
		c := newInflightCounter()
		c.end(c.begin())
		c.waiting.Store(true)
		c.end(c.begin()) // leaves a wake-up no waiter takes
		c.waiting.Store(false)
		c.recycle()
		select {
		case <-c.wake:
			t.Fatalf("counter %d: recycled with a wake-up left in it", i)
		default:
		}

		m := newExtentMap(4096)
		m.set(0, 4, ExtentWritten)
		m.set(8, 9, ExtentUnwritten)
		m.recycle()
		if m.runs() != 0 || m.allocated != 0 {
			t.Fatalf("map %d: recycled with %d runs, %d allocated", i, m.runs(), m.allocated)
		}
	}
	for i := range n {
		if c := newInflightCounter(); c.count() != 0 || c.waiting.Load() || len(c.wake) != 0 {
			t.Fatalf("counter %d: %d writes in flight, waiting %v, %d wake-ups; want none", i, c.count(), c.waiting.Load(), len(c.wake))
		}
		if m := newExtentMap(512); m.runs() != 0 || m.allocated != 0 || m.blockSize != 512 {
			t.Fatalf("map %d: %d runs, %d allocated, block size %d; want empty, block size 512", i, m.runs(), m.allocated, m.blockSize)
		}
	}

	large := newExtentMap(4096)
	for i := range int64(recycleRuns + 1) {
		large.set(2*i, 2*i+1, ExtentWritten)
	}
	large.recycle()
	if large.runs() != recycleRuns+1 {
		t.Errorf("a map of %d runs was emptied for reuse; want it left to the collector", recycleRuns+1)
	}
}
