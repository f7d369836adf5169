//go:build linux

package store

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/filewrite/filewrite/internal/testutil"
)

// TestOpenBeneathAgreesWithRoot: OSFS opens an existing file with one
// openat2(2) where the kernel has it, and that gives what os.Root's walk
// gives, file for file and error for error (by the store's sentinels), on
// paths without symlinks and with them: inside the root, out of it, in
// loops, and in a chain longer than os.Root follows but the kernel would.
func TestOpenBeneathAgreesWithRoot(t *testing.T) {
	dir := testutil.Dir(t)
	root := filepath.Join(dir, "root")
	fast, err := OpenOSFS(root)
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Close()
	if fd, err := unix.Openat2(unix.AT_FDCWD, root, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_CLOEXEC}); err == nil {
		unix.Close(fd)
		if fast.beneath == nil {
			t.Fatal("the kernel has openat2, and OpenOSFS does not use it")
		}
	} else {
		t.Skipf("no openat2 here: %v", err)
	}
	walk := &OSFS{root: fast.root} // os.Root alone

	for _, d := range []string{"d/e", "fifo-dir"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"f", "d/e/f", filepath.Join("..", "outside")} {
		if err := os.WriteFile(filepath.Join(root, f), []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mkfifo(filepath.Join(root, "fifo-dir/p"), 0o644); err != nil {
		t.Fatal(err)
	}
	links := map[string]string{
		"in":       "d/e/f",
		"d/up":     "../f",
		"dir-in":   "d",
		"out":      "../outside",
		"abs-in":   filepath.Join(root, "f"),
		"loop":     "loop",
		"dangling": "missing",
		"chain0":   "f",
	}
	for i := 1; i <= 9; i++ {
		links[fmt.Sprintf("chain%d", i)] = fmt.Sprintf("chain%d", i-1)
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}

	for _, name := range []string{
		"f", "d/e/f", "missing", "d/missing", "d/e/missing", "d/e/f/x", "d", "d/e",
		"fifo-dir/p", "in", "d/up", "dir-in/e/f", "out", "abs-in", "loop", "loop/x",
		"dangling", "chain7", "chain8", "chain9",
	} {
		got, gotErr := openOutcome(fast, name)
		want, wantErr := openOutcome(walk, name)
		if got != want || !sameSentinel(mapOpenErr(name, gotErr), mapOpenErr(name, wantErr)) {
			t.Errorf("%s: openat2 gives file %v, error %v; os.Root gives file %v, error %v", name, got, gotErr, want, wantErr)
		}
	}
}

// openOutcome opens name as the store opens its files and says which file
// it reached.
func openOutcome(f *OSFS, name string) (fileID, error) {
	file, err := f.OpenFile(name, openFlags, 0)
	if err != nil {
		return fileID{}, err
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		return fileID{}, err
	}
	return fileID{fi.Dev, fi.Ino}, nil
}

// sameSentinel reports whether a and b are both nil, or match the same one
// of the store's errors (or of the errno values under them).
func sameSentinel(a, b error) bool {
	if (a == nil) != (b == nil) {
		return false
	}
	for _, s := range []error{ErrNotFound, ErrIsDirectory, ErrInvalidPath, ErrPathEscapes, ErrNotRegular, ErrUnsupported, syscall.ELOOP, syscall.ENOTDIR} {
		if errors.Is(a, s) != errors.Is(b, s) {
			return false
		}
	}
	return true
}

// TestOSFileCalls: the descriptor OSFS hands out does what os.File would:
// positional reads and writes, a short read at EOF with io.EOF, and errors
// that name the file by its path below the root, never by the root's own
// path, for descriptors of openat2 and of os.Root (a create) alike.
func TestOSFileCalls(t *testing.T) {
	dir := testutil.Dir(t)
	fsys, err := OpenOSFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	if err := fsys.MkdirAll("d", 0o755); err != nil {
		t.Fatal(err)
	}
	created, err := fsys.OpenFile("d/f", openFlags|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	opened, err := fsys.OpenFile("d/f", openFlags, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []File{created, opened} {
		if n, err := f.WriteAt([]byte("hello"), 2); n != 5 || err != nil {
			t.Fatalf("WriteAt: %d, %v", n, err)
		}
		buf := make([]byte, 10)
		n, err := f.ReadAt(buf, 0)
		if n != 7 || err != io.EOF || string(buf[:n]) != "\x00\x00hello" {
			t.Errorf("ReadAt past EOF: %d %q, %v; want 7 \"\\x00\\x00hello\", EOF", n, buf[:n], err)
		}
		if n, err := f.ReadAt(buf[:3], 4); n != 3 || err != nil || string(buf[:3]) != "llo" {
			t.Errorf("ReadAt inside the file: %d %q, %v", n, buf[:3], err)
		}
		if fi, err := f.Stat(); err != nil || fi.Size != 7 || fi.Nlink != 1 {
			t.Errorf("Stat: %+v, %v", fi, err)
		}
		if err := f.Truncate(3); err != nil {
			t.Errorf("Truncate: %v", err)
		}
		if err := f.Sync(SyncFull); err != nil {
			t.Errorf("Sync: %v", err)
		}
		if err := f.Fallocate(0, -1, 1); err == nil || !strings.Contains(err.Error(), "fallocate d/f: ") || strings.Contains(err.Error(), dir) {
			t.Errorf("Fallocate with a negative offset: %v, want an error naming d/f and not the root", err)
		}
	}
	for _, f := range []File{created, opened} {
		if err := f.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
}
