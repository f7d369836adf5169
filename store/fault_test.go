//go:build linux

package store_test

// Faults the disk gives rarely and at bad moments, reached through
// store/faultfs (and, where the machine allows, a real full tmpfs): after
// each one the store must report it truthfully and its view of the file
// (size, extent map) must still be the file's. This file holds the shared
// helpers and the faults of writes, fallocates and truncates;
// fault_sync_test.go has failing syncs, fault_tmpfs_test.go a real ENOSPC.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store"
	"github.com/filewrite/filewrite/store/faultfs"
)

// faultPath is the file the tests fail; nested, so that Write creates a
// parent directory, and distinctive, so that error messages can be checked
// for it.
const faultPath = "ckpt/rank-3.bin"

// faultStore is a store over faultfs over a directory of real files.
type faultStore struct {
	*store.Store
	fsys      *faultfs.FS
	dir       string
	closeOnce *sync.Once
}

// close closes the store the first time it is called and returns nil after.
func (fs faultStore) close() error {
	var err error
	fs.closeOnce.Do(func() { err = fs.Store.Close() })
	return err
}

func newFaultStore(t *testing.T, opts store.Options) faultStore {
	t.Helper()
	return openFaultStore(t, testutil.Dir(t), opts)
}

func openFaultStore(t *testing.T, dir string, opts store.Options) faultStore {
	t.Helper()
	base, err := store.OpenOSFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	fsys := faultfs.New(base)
	s, err := store.Open(fsys, opts)
	if err != nil {
		t.Fatal(err)
	}
	fs := faultStore{Store: s, fsys: fsys, dir: dir, closeOnce: new(sync.Once)}
	t.Cleanup(func() {
		fsys.Reset()
		if err := fs.close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return fs
}

func (fs faultStore) osPath(path string) string {
	return filepath.Join(fs.dir, filepath.FromSlash(path))
}

func (fs faultStore) content(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(fs.osPath(path))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkTrue checks that the store's view of path is the file's: Stat's
// size is the size on disk and, when fiemap, Extents (past EOF too, where
// KEEP_SIZE preallocation lives) is what FIEMAP says after writing back.
func (fs faultStore) checkTrue(t *testing.T, path string, fiemap bool) {
	t.Helper()
	ctx := context.Background()
	st, err := fs.Stat(ctx, path)
	if err != nil {
		t.Fatalf("Stat: %v", err)
	}
	fi, err := os.Stat(fs.osPath(path))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := st.Size, fi.Size(); got != want {
		t.Errorf("Stat size: got %d, want %d (the file's size)", got, want)
	}
	if !fiemap {
		return
	}
	const span = 16 << 20
	got, err := fs.Extents(ctx, path, 0, span)
	if err != nil {
		t.Fatalf("Extents: %v", err)
	}
	want, err := store.FiemapExtents(fs.osPath(path), int64(st.BlockSize), 0, span)
	if err != nil {
		t.Fatalf("FIEMAP: %v", err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("Extents:\n got  %v\n want %v (FIEMAP of the file)", got, want)
	}
}

// pattern is n bytes that differ from their neighbours and from other
// seeds, so that a misplaced or missing byte shows.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i%251)
	}
	return b
}

// overlay is file content after p is written at off into old.
func overlay(old []byte, off int64, p []byte) []byte {
	out := slices.Clone(old)
	if end := int(off) + len(p); end > len(out) {
		out = append(out, make([]byte, end-len(out))...)
	}
	copy(out[off:], p)
	return out
}

// TestWriteFaults: a write that fails part-way (ENOSPC or EDQUOT after a
// short write, or EIO) under every policy, extending and below EOF over
// each kind of block. The error says what happened, and the store's size,
// extent map and the file agree afterwards, with the bytes that were
// written on disk; a retry then succeeds.
func TestWriteFaults(t *testing.T) {
	ctx := context.Background()
	write := func(off int64, n int) func(*store.Store) error {
		return func(s *store.Store) error {
			_, err := s.Write(ctx, faultPath, off, pattern(n, 'a'), store.SyncNone)
			return err
		}
	}
	setups := []struct {
		name    string
		io      store.IOMode
		prepare func(*store.Store) error
		off     int64
		n       int
		after   int64 // bytes that reach the file before the error
	}{
		{name: "extending", prepare: write(0, 8192), off: 8192, n: 16384, after: 5000},
		{name: "extending from past EOF", prepare: write(0, 4096), off: 20000, n: 10000, after: 3000},
		{name: "extending, nothing written", prepare: write(0, 4096), off: 4096, n: 8192, after: 0},
		{name: "below EOF over written", prepare: write(0, 65536), off: 8292, n: 16384, after: 5000},
		{
			name: "below EOF over unwritten",
			prepare: func(s *store.Store) error {
				_, err := s.Fallocate(ctx, faultPath, store.FallocAllocate, 0, 65536)
				return err
			},
			off: 8192, n: 16384, after: 5000,
		},
		{
			name:    "below EOF over a hole",
			prepare: func(s *store.Store) error { return s.Truncate(ctx, faultPath, 65536) },
			off:     8192, n: 16384, after: 5000,
		},
		{
			name: "direct, below EOF over unwritten",
			io:   store.IODirect,
			prepare: func(s *store.Store) error {
				_, err := s.Fallocate(ctx, faultPath, store.FallocAllocate, 0, 65536)
				return err
			},
			off: 8192, n: 16384, after: 8192,
		},
		{name: "direct, extending", io: store.IODirect, prepare: write(0, 8192), off: 8192, n: 16384, after: 4096},
	}
	faults := []struct {
		errno   syscall.Errno
		noSpace bool // the store must report ErrNoSpace
	}{
		{syscall.ENOSPC, true},
		{syscall.EDQUOT, true},
		{syscall.EIO, false},
	}
	for _, p := range store.Policies() {
		for _, su := range setups {
			for _, f := range faults {
				t.Run(fmt.Sprintf("%v/%s/%v", p, su.name, f.errno), func(t *testing.T) {
					fs := newFaultStore(t, store.Options{Policy: p, IO: su.io})
					if err := su.prepare(fs.Store); err != nil {
						t.Fatalf("prepare: %v", err)
					}
					before := fs.content(t, faultPath)
					data := pattern(su.n, 'A')
					rule := fs.fsys.Inject(faultfs.Rule{
						Op: faultfs.OpWrite, Path: faultPath, Off: su.off, Len: int64(su.n),
						After: su.after, Err: f.errno,
					})

					res, err := fs.Write(ctx, faultPath, su.off, data, store.SyncNone)
					if err == nil {
						t.Fatalf("Write succeeded through a %v fault", f.errno)
					}
					if got, want := rule.Hits(), 1; got != want {
						t.Errorf("fault hit %d writes, want %d", got, want)
					}
					if got, want := errors.Is(err, store.ErrNoSpace), f.noSpace; got != want {
						t.Errorf("errors.Is(%q, ErrNoSpace): got %v, want %v", err, got, want)
					}
					if !errors.Is(err, f.errno) {
						t.Errorf("error %q does not wrap %v", err, f.errno)
					}
					for _, part := range []string{faultPath, fmt.Sprintf("%d bytes written", su.after)} {
						if !strings.Contains(err.Error(), part) {
							t.Errorf("error %q does not say %q", err, part)
						}
					}
					want := overlay(before, su.off, data[:su.after])
					if got, want := res.BytesWritten, int(su.after); got != want {
						t.Errorf("BytesWritten: got %d, want %d", got, want)
					}
					if got, want := res.Size, int64(len(want)); got != want {
						t.Errorf("Size in the result: got %d, want %d", got, want)
					}
					testutil.SameBytes(t, "file after the fault", fs.content(t, faultPath), want)
					fs.checkTrue(t, faultPath, true)

					// The space is back: the same write goes through and
					// reads back.
					fs.fsys.Reset()
					if _, err := fs.Write(ctx, faultPath, su.off, data, store.SyncData); err != nil {
						t.Fatalf("Write after the fault: %v", err)
					}
					got, err := fs.Read(ctx, faultPath, su.off, int64(su.n))
					if err != nil {
						t.Fatalf("Read after the fault: %v", err)
					}
					testutil.SameBytes(t, "Read after the retry", got, data)
					testutil.SameBytes(t, "file after the retry", fs.content(t, faultPath), overlay(before, su.off, data))
					fs.checkTrue(t, faultPath, true)
				})
			}
		}
	}
}

// TestFallocateFaults: a refused fallocate is reported as the sentinel its
// errno maps to and changes neither the size nor the extent map.
func TestFallocateFaults(t *testing.T) {
	ctx := context.Background()
	modes := []struct {
		mode      store.FallocateMode
		off, size int64
	}{
		{store.FallocAllocate, 0, 1 << 20},
		{store.FallocKeepSize, 16384, 1 << 20},
		{store.FallocPunchHole, 4096, 8192},
		{store.FallocZeroRange, 4096, 8192},
	}
	faults := []struct {
		errno syscall.Errno
		want  error
	}{
		{syscall.ENOSPC, store.ErrNoSpace},
		{syscall.EDQUOT, store.ErrNoSpace},
		{syscall.EOPNOTSUPP, store.ErrUnsupported},
	}
	for _, m := range modes {
		for _, f := range faults {
			t.Run(fmt.Sprintf("%v/%v", m.mode, f.errno), func(t *testing.T) {
				fs := newFaultStore(t, store.Options{})
				// Written blocks, and unwritten ones past EOF.
				if _, err := fs.Write(ctx, faultPath, 0, pattern(16384, 'a'), store.SyncNone); err != nil {
					t.Fatal(err)
				}
				if _, err := fs.Fallocate(ctx, faultPath, store.FallocKeepSize, 32768, 16384); err != nil {
					t.Fatal(err)
				}
				statBefore, extentsBefore := statAndExtents(t, fs)
				fs.fsys.Inject(faultfs.Rule{Op: faultfs.OpFallocate, Path: faultPath, Err: f.errno})

				size, err := fs.Fallocate(ctx, faultPath, m.mode, m.off, m.size)
				if !errors.Is(err, f.want) || !errors.Is(err, f.errno) {
					t.Errorf("Fallocate: got %v, want %v wrapping %v", err, f.want, f.errno)
				}
				if !strings.Contains(fmt.Sprint(err), faultPath) {
					t.Errorf("error %q does not name %s", err, faultPath)
				}
				if got, want := size, statBefore.Size; got != want {
					t.Errorf("size returned: got %d, want %d", got, want)
				}
				statAfter, extentsAfter := statAndExtents(t, fs)
				if got, want := statAfter.Size, statBefore.Size; got != want {
					t.Errorf("Stat size: got %d, want %d (unchanged)", got, want)
				}
				if !slices.Equal(extentsAfter, extentsBefore) {
					t.Errorf("Extents:\n got  %v\n want %v (unchanged)", extentsAfter, extentsBefore)
				}
				fs.checkTrue(t, faultPath, true)
			})
		}
	}
}

// TestTruncateFaults: a failed ftruncate is a plain error (not a space or
// support problem) and leaves the size and extent map as they were.
func TestTruncateFaults(t *testing.T) {
	ctx := context.Background()
	for _, size := range []int64{4096, 5000, 1 << 20} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			fs := newFaultStore(t, store.Options{})
			if _, err := fs.Write(ctx, faultPath, 0, pattern(65536, 'a'), store.SyncNone); err != nil {
				t.Fatal(err)
			}
			statBefore, extentsBefore := statAndExtents(t, fs)
			fs.fsys.Inject(faultfs.Rule{Op: faultfs.OpTruncate, Path: faultPath, Err: syscall.EIO})

			err := fs.Truncate(ctx, faultPath, size)
			if !errors.Is(err, syscall.EIO) || errors.Is(err, store.ErrNoSpace) || errors.Is(err, store.ErrUnsupported) {
				t.Errorf("Truncate: got %v, want a plain error wrapping EIO", err)
			}
			statAfter, extentsAfter := statAndExtents(t, fs)
			if got, want := statAfter.Size, statBefore.Size; got != want {
				t.Errorf("Stat size: got %d, want %d (unchanged)", got, want)
			}
			if !slices.Equal(extentsAfter, extentsBefore) {
				t.Errorf("Extents:\n got  %v\n want %v (unchanged)", extentsAfter, extentsBefore)
			}
			fs.checkTrue(t, faultPath, true)

			fs.fsys.Reset()
			if err := fs.Truncate(ctx, faultPath, size); err != nil {
				t.Fatalf("Truncate after the fault: %v", err)
			}
			fs.checkTrue(t, faultPath, true)
		})
	}
}

func statAndExtents(t *testing.T, fs faultStore) (store.FileStat, []store.Extent) {
	t.Helper()
	ctx := context.Background()
	st, err := fs.Stat(ctx, faultPath)
	if err != nil {
		t.Fatal(err)
	}
	ext, err := fs.Extents(ctx, faultPath, 0, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	return st, ext
}

// TestExtentRebuildFault: the store rebuilds a file's extent map through
// File.Extents when it opens it, so a wrapper sees that call too. A failed
// listing fails the open with the path named and nothing held; the next
// open, once the listing passes, serves the file as it was.
func TestExtentRebuildFault(t *testing.T) {
	ctx := context.Background()
	fs := newFaultStore(t, store.Options{MaxOpenFiles: 1})
	data := pattern(10000, 'e')
	if _, err := fs.Write(ctx, faultPath, 0, data, store.SyncNone); err != nil {
		t.Fatal(err)
	}
	// A second file takes the only descriptor: faultPath is closed.
	if _, err := fs.Write(ctx, "other", 0, []byte("x"), store.SyncNone); err != nil {
		t.Fatal(err)
	}
	flt := fs.fsys.Inject(faultfs.Rule{Op: faultfs.OpExtents, Path: faultPath, Err: syscall.EIO, Times: 1})

	_, err := fs.Read(ctx, faultPath, 0, int64(len(data)))
	if !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), "rebuild extent map of "+faultPath) {
		t.Errorf("Read while the listing fails: got %v, want EIO naming the rebuild of %s", err, faultPath)
	}
	if got, want := flt.Hits(), 1; got != want {
		t.Errorf("extent listings failed: got %d, want %d", got, want)
	}
	got, err := fs.Read(ctx, faultPath, 0, int64(len(data)))
	if err != nil {
		t.Fatalf("Read once the listing passes: %v", err)
	}
	testutil.SameBytes(t, "Read", got, data)
	fs.checkTrue(t, faultPath, true)
}
