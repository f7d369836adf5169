//go:build linux

package store

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

// newTestStore opens a store over a fresh directory on the project
// filesystem and returns it with the directory.
func newTestStore(t testing.TB, opts Options) (*Store, string) {
	return newWrappedStore(t, nil, opts)
}

// newWrappedStore is newTestStore over wrap(the directory's OSFS), an FS
// that counts, holds or reorders calls; over the OSFS itself if wrap is
// nil. The store is closed when the test ends, and a failed Close fails it.
func newWrappedStore(t testing.TB, wrap func(FS) FS, opts Options) (*Store, string) {
	t.Helper()
	dir := testutil.Dir(t)
	base, err := OpenOSFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	var fsys FS = base
	if wrap != nil {
		fsys = wrap(base)
	}
	return openTestStore(t, fsys, opts), dir
}

// openStore opens a store over dir for a test that closes it itself, or
// never (as a killed process leaves it).
func openStore(t testing.TB, dir string, opts Options) *Store {
	t.Helper()
	fsys, err := OpenOSFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(fsys, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// openTestStore opens a store over fsys, closed when the test ends; a
// failed Close fails the test.
func openTestStore(t testing.TB, fsys FS, opts Options) *Store {
	t.Helper()
	s, err := Open(fsys, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// fileWrapFS is an FS whose every opened file is wrap(the file): how a
// test puts a File that pauses, holds or lies under the store.
type fileWrapFS struct {
	FS
	wrap func(File) File
}

func (f fileWrapFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil || strings.HasPrefix(name, StateDir+"/") {
		return file, err // the store's own state is not the test's
	}
	return f.wrap(file), nil
}

func readFile(t testing.TB, dir, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sizeResult is what a call started by inBackground returned: a size or
// a byte count, and the error.
type sizeResult struct {
	size int64
	err  error
}

// inBackground runs call in its own goroutine and returns the channel
// that receives its result, so that a test can hold the call inside the
// store and check whether it has returned yet.
func inBackground(call func() (int64, error)) <-chan sizeResult {
	c := make(chan sizeResult, 1)
	go func() {
		n, err := call()
		c <- sizeResult{n, err}
	}()
	return c
}
