package crashfs_test

import (
	"bytes"
	"errors"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store"
	"github.com/filewrite/filewrite/store/crashfs"
	"github.com/filewrite/filewrite/store/faultfs"
	"golang.org/x/sys/unix"
)

// newBase returns an empty FS over a fresh directory and the directory.
func newBase(t *testing.T) (*store.OSFS, string) {
	t.Helper()
	dir := testutil.Dir(t)
	osfs, err := store.OpenOSFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	return osfs, dir
}

func newCrashFS(t *testing.T) (*crashfs.FS, string) {
	t.Helper()
	base, dir := newBase(t)
	fsys := crashfs.New(base)
	t.Cleanup(func() { fsys.Close() })
	return fsys, dir
}

// image writes the crashed image keep chooses and returns what it holds:
// each file's content by slash path, each directory as its path with a
// trailing slash and no content.
func image(t *testing.T, st *crashfs.State, keep crashfs.Keep) map[string]string {
	t.Helper()
	dir := testutil.Dir(t)
	if _, err := st.Write(dir, keep); err != nil {
		t.Fatalf("Write: %v", err)
	}
	return readTree(t, dir)
}

func readTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	got := make(map[string]string)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			got[rel+"/"] = ""
			return nil
		}
		b, err := os.ReadFile(p)
		got[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func create(t *testing.T, fsys store.FS, name string) store.File {
	t.Helper()
	f, err := fsys.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	must(t, err)
	t.Cleanup(func() { f.Close() })
	return f
}

func write(t *testing.T, f store.File, off int64, s string) {
	t.Helper()
	if _, err := f.WriteAt([]byte(s), off); err != nil {
		t.Fatal(err)
	}
}

// createSynced creates name holding data, the data synced (fdatasync) and
// the name not.
func createSynced(t *testing.T, fsys store.FS, name, data string) store.File {
	t.Helper()
	f := create(t, fsys, name)
	write(t, f, 0, data)
	must(t, f.Sync(store.SyncData))
	return f
}

// TestImages: what the image holds when everything not durable is lost
// (KeepNone) and when everything is kept (KeepAll).
func TestImages(t *testing.T) {
	tests := []struct {
		name      string
		run       func(t *testing.T, fsys *crashfs.FS)
		none, all map[string]string
	}{
		{
			name: "a new file's name waits for its directory's sync",
			run: func(t *testing.T, fsys *crashfs.FS) {
				createSynced(t, fsys, "f", "abc")
			},
			none: map[string]string{},
			all:  map[string]string{"f": "abc"},
		},
		{
			name: "synced data stays, later data may go",
			run: func(t *testing.T, fsys *crashfs.FS) {
				f := create(t, fsys, "f")
				must(t, fsys.SyncDir("."))
				write(t, f, 0, "abc")
				must(t, f.Sync(store.SyncFull))
				write(t, f, 3, "def")
			},
			none: map[string]string{"f": "abc"},
			all:  map[string]string{"f": "abcdef"},
		},
		{
			name: "a new directory waits for its parent's sync",
			run: func(t *testing.T, fsys *crashfs.FS) {
				must(t, fsys.MkdirAll("a/b", 0o755))
				createSynced(t, fsys, "a/b/f", "x")
				must(t, fsys.SyncDir("a/b"))
				must(t, fsys.SyncDir("a")) // but not "."
			},
			none: map[string]string{},
			all:  map[string]string{"a/": "", "a/b/": "", "a/b/f": "x"},
		},
		{
			name: "every directory synced",
			run: func(t *testing.T, fsys *crashfs.FS) {
				must(t, fsys.MkdirAll("a/b", 0o755))
				createSynced(t, fsys, "a/b/f", "x")
				for _, d := range []string{"a/b", "a", "."} {
					must(t, fsys.SyncDir(d))
				}
			},
			none: map[string]string{"a/": "", "a/b/": "", "a/b/f": "x"},
			all:  map[string]string{"a/": "", "a/b/": "", "a/b/f": "x"},
		},
		{
			name: "Mkdir's directory waits for its parent's sync, rmdir too",
			run: func(t *testing.T, fsys *crashfs.FS) {
				must(t, fsys.Mkdir("d", 0o755))
				must(t, fsys.Mkdir("e", 0o755))
				f := create(t, fsys, "d/f")
				must(t, f.Sync(store.SyncData))
				must(t, fsys.SyncDir("d"))
				must(t, fsys.SyncDir("."))
				must(t, fsys.Remove("e"))
			},
			none: map[string]string{"d/": "", "d/f": "", "e/": ""},
			all:  map[string]string{"d/": "", "d/f": ""},
		},
		{
			name: "WriteBack makes nothing durable",
			run: func(t *testing.T, fsys *crashfs.FS) {
				f := create(t, fsys, "f")
				must(t, fsys.SyncDir("."))
				write(t, f, 0, "abc")
				must(t, f.WriteBack(0, 3))
			},
			none: map[string]string{"f": ""},
			all:  map[string]string{"f": "abc"},
		},
		{
			name: "truncate and fallocate wait for a sync too",
			run: func(t *testing.T, fsys *crashfs.FS) {
				f := create(t, fsys, "f")
				must(t, fsys.SyncDir("."))
				write(t, f, 0, "abcdef")
				must(t, f.Sync(store.SyncData))
				must(t, f.Truncate(2))
				must(t, f.Fallocate(0, 0, 4))
			},
			none: map[string]string{"f": "abcdef"},
			all:  map[string]string{"f": "ab\x00\x00"},
		},
		{
			name: "a later descriptor of the file is the same file",
			run: func(t *testing.T, fsys *crashfs.FS) {
				f := create(t, fsys, "f")
				must(t, fsys.SyncDir("."))
				g, err := fsys.OpenFile("f", os.O_RDWR, 0)
				must(t, err)
				defer g.Close()
				write(t, g, 0, "abc")
				must(t, f.Sync(store.SyncData)) // through the other descriptor
			},
			none: map[string]string{"f": "abc"},
			all:  map[string]string{"f": "abc"},
		},
		{
			name: "a rename waits for its directory's sync",
			run: func(t *testing.T, fsys *crashfs.FS) {
				createSynced(t, fsys, "f", "x")
				must(t, fsys.SyncDir("."))
				must(t, fsys.Rename("f", "g", false))
			},
			none: map[string]string{"f": "x"},
			all:  map[string]string{"g": "x"},
		},
		{
			name: "a synced rename keeps the new name",
			run: func(t *testing.T, fsys *crashfs.FS) {
				createSynced(t, fsys, "f", "x")
				must(t, fsys.SyncDir("."))
				must(t, fsys.Rename("f", "g", false))
				must(t, fsys.SyncDir("."))
			},
			none: map[string]string{"g": "x"},
			all:  map[string]string{"g": "x"},
		},
		{
			name: "a rename over another file, synced, keeps the renamed file",
			run: func(t *testing.T, fsys *crashfs.FS) {
				createSynced(t, fsys, "tmp", "new")
				createSynced(t, fsys, "ckpt", "old")
				must(t, fsys.SyncDir("."))
				must(t, fsys.Rename("tmp", "ckpt", false))
				must(t, fsys.SyncDir("."))
			},
			none: map[string]string{"ckpt": "new"},
			all:  map[string]string{"ckpt": "new"},
		},
		{
			name: "a rename that may not replace changes nothing",
			run: func(t *testing.T, fsys *crashfs.FS) {
				for _, name := range []string{"f", "g"} {
					createSynced(t, fsys, name, name)
				}
				must(t, fsys.SyncDir("."))
				if err := fsys.Rename("f", "g", true); !errors.Is(err, fs.ErrExist) {
					t.Errorf("Rename with noReplace onto g: got %v, want EEXIST", err)
				}
			},
			none: map[string]string{"f": "f", "g": "g"},
			all:  map[string]string{"f": "f", "g": "g"},
		},
		{
			name: "a rename across directories with only the new one synced is not durable",
			run: func(t *testing.T, fsys *crashfs.FS) {
				must(t, fsys.MkdirAll("d", 0o755))
				createSynced(t, fsys, "f", "x")
				must(t, fsys.SyncDir("."))
				must(t, fsys.Rename("f", "d/g", false))
				must(t, fsys.SyncDir("d"))
			},
			none: map[string]string{"d/": "", "f": "x"},
			all:  map[string]string{"d/": "", "d/g": "x"},
		},
		{
			name: "a rename across directories with only the old one synced is not durable",
			run: func(t *testing.T, fsys *crashfs.FS) {
				must(t, fsys.MkdirAll("d", 0o755))
				createSynced(t, fsys, "d/f", "x")
				must(t, fsys.SyncDir("d"))
				must(t, fsys.SyncDir("."))
				must(t, fsys.Rename("d/f", "g", false))
				must(t, fsys.SyncDir("d"))
			},
			none: map[string]string{"d/": "", "d/f": "x"},
			all:  map[string]string{"d/": "", "g": "x"},
		},
		{
			name: "a rename across directories with both synced keeps the new name",
			run: func(t *testing.T, fsys *crashfs.FS) {
				must(t, fsys.MkdirAll("d", 0o755))
				createSynced(t, fsys, "f", "x")
				must(t, fsys.SyncDir("."))
				must(t, fsys.Rename("f", "d/g", false))
				must(t, fsys.SyncDir("d"))
				must(t, fsys.SyncDir("."))
				// A later change in the first directory synced, behind
				// the rename, is durable too.
				h := create(t, fsys, "d/h")
				must(t, h.Sync(store.SyncData))
				must(t, fsys.SyncDir("d"))
			},
			none: map[string]string{"d/": "", "d/g": "x", "d/h": ""},
			all:  map[string]string{"d/": "", "d/g": "x", "d/h": ""},
		},
		{
			name: "a change synced behind a rename not yet durable is durable",
			run: func(t *testing.T, fsys *crashfs.FS) {
				must(t, fsys.MkdirAll("d", 0o755))
				f := create(t, fsys, "f")
				must(t, f.Sync(store.SyncData))
				must(t, fsys.SyncDir("."))
				must(t, fsys.Rename("f", "d/g", false))
				h := create(t, fsys, "d/h")
				must(t, h.Sync(store.SyncData))
				must(t, fsys.SyncDir("d")) // not "."
			},
			none: map[string]string{"d/": "", "d/h": "", "f": ""},
			all:  map[string]string{"d/": "", "d/g": "", "d/h": ""},
		},
		{
			name: "a rename into a new directory, synced there only, is lost with the directory",
			run: func(t *testing.T, fsys *crashfs.FS) {
				createSynced(t, fsys, "f", "x")
				must(t, fsys.SyncDir("."))
				must(t, fsys.MkdirAll("n/m", 0o755))
				must(t, fsys.Rename("f", "n/m/g", false))
				must(t, fsys.SyncDir("n/m"))
				must(t, fsys.SyncDir(".")) // but not "n": n/m is lost
			},
			none: map[string]string{"n/": ""},
			all:  map[string]string{"n/": "", "n/m/": "", "n/m/g": "x"},
		},
		{
			name: "a removal waits for its directory's sync",
			run: func(t *testing.T, fsys *crashfs.FS) {
				f := create(t, fsys, "f")
				must(t, f.Sync(store.SyncData))
				must(t, fsys.SyncDir("."))
				must(t, fsys.Remove("f"))
			},
			none: map[string]string{"f": ""},
			all:  map[string]string{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fsys, _ := newCrashFS(t)
			tt.run(t, fsys)
			st := fsys.Crash()
			if got := image(t, st, crashfs.KeepNone); !maps.Equal(got, tt.none) {
				t.Errorf("KeepNone: got %q, want %q", got, tt.none)
			}
			if got := image(t, st, crashfs.KeepAll); !maps.Equal(got, tt.all) {
				t.Errorf("KeepAll: got %q, want %q", got, tt.all)
			}
		})
	}
}

// TestRenameIsOnePiece: a rename not durable is one piece, which leaves
// the old name or the new one, never both or neither; kept, it keeps the
// new directories above the new name, which were not synced.
func TestRenameIsOnePiece(t *testing.T) {
	fsys, _ := newCrashFS(t)
	must(t, fsys.MkdirAll("a", 0o755))
	createSynced(t, fsys, "a/f", "x")
	must(t, fsys.SyncDir("a"))
	must(t, fsys.SyncDir("."))
	must(t, fsys.MkdirAll("n/m", 0o755))
	must(t, fsys.Rename("a/f", "n/m/g", false))
	st := fsys.Crash()
	var pieces []string
	for _, p := range st.Pieces() {
		pieces = append(pieces, p.Kind.String()+" "+p.From+" "+p.Path)
	}
	if want := []string{"link  n", "rename a/f n/m/g", "link  n/m"}; !slices.Equal(pieces, want) {
		t.Fatalf("pieces: got %q, want %q", pieces, want)
	}
	tests := []struct {
		name string
		keep crashfs.Keep
		want map[string]string
	}{
		{"the rename alone", func(p crashfs.Piece) bool { return p.Kind == crashfs.PieceRename },
			map[string]string{"a/": "", "n/": "", "n/m/": "", "n/m/g": "x"}},
		{"the directories alone", func(p crashfs.Piece) bool { return p.Kind == crashfs.PieceLink },
			map[string]string{"a/": "", "a/f": "x", "n/": "", "n/m/": ""}},
		{"the first directory alone", func(p crashfs.Piece) bool { return p.Path == "n" },
			map[string]string{"a/": "", "a/f": "x", "n/": ""}},
	}
	for _, tt := range tests {
		if got := image(t, st, tt.keep); !maps.Equal(got, tt.want) {
			t.Errorf("%s: got %q, want %q", tt.name, got, tt.want)
		}
	}
	if img, err := st.Write(testutil.Dir(t), func(p crashfs.Piece) bool { return p.Kind == crashfs.PieceRename }); err != nil || img.Kept != 3 || img.Lost != 0 {
		t.Errorf("Write keeping the rename: %+v, %v; want the 3 pieces kept", img, err)
	}
}

// TestUnorderedKeepsNoDirectories: on a filesystem that does not order its
// metadata writes (NewUnordered) a kept rename into new directories does
// not keep them: the image has the file under neither name. A kept change
// still keeps the earlier changes of its own entry.
func TestUnorderedKeepsNoDirectories(t *testing.T) {
	base, _ := newBase(t)
	fsys := crashfs.NewUnordered(base)
	t.Cleanup(func() { fsys.Close() })
	must(t, fsys.MkdirAll("a", 0o755))
	createSynced(t, fsys, "a/f", "x")
	must(t, fsys.SyncDir("a"))
	must(t, fsys.SyncDir("."))
	must(t, fsys.MkdirAll("n/m", 0o755))
	must(t, fsys.Rename("a/f", "n/m/g", false))
	must(t, fsys.Rename("n/m/g", "n/m/h", false))
	st := fsys.Crash()
	only := func(kind crashfs.PieceKind, path string) crashfs.Keep {
		return func(p crashfs.Piece) bool { return p.Kind == kind && p.Path == path }
	}
	tests := []struct {
		name string
		keep crashfs.Keep
		want map[string]string
	}{
		{"the first rename alone", only(crashfs.PieceRename, "n/m/g"), map[string]string{"a/": ""}},
		{"the second rename keeps the first, not the directories", only(crashfs.PieceRename, "n/m/h"), map[string]string{"a/": ""}},
		{"the first directory alone", only(crashfs.PieceLink, "n"), map[string]string{"a/": "", "a/f": "x", "n/": ""}},
		{"everything", crashfs.KeepAll, map[string]string{"a/": "", "n/": "", "n/m/": "", "n/m/h": "x"}},
	}
	for _, tt := range tests {
		if got := image(t, st, tt.keep); !maps.Equal(got, tt.want) {
			t.Errorf("%s: got %q, want %q", tt.name, got, tt.want)
		}
	}
}

// TestEntryChangesKeepTheirOrder: a kept change of an entry keeps the
// changes of that entry before it, so that no image renames a name that
// was never made or holds a file under two names.
func TestEntryChangesKeepTheirOrder(t *testing.T) {
	fsys, _ := newCrashFS(t)
	createSynced(t, fsys, "f", "old")
	must(t, fsys.SyncDir("."))
	must(t, fsys.Rename("f", "g", false))
	must(t, fsys.Rename("g", "h", false))
	nf := create(t, fsys, "f") // the old name, made anew
	write(t, nf, 0, "new")
	must(t, nf.Sync(store.SyncData))
	st := fsys.Crash()
	only := func(kind crashfs.PieceKind, path string) crashfs.Keep {
		return func(p crashfs.Piece) bool { return p.Kind == kind && p.Path == path }
	}
	tests := []struct {
		name string
		keep crashfs.Keep
		want map[string]string
	}{
		{"nothing", crashfs.KeepNone, map[string]string{"f": "old"}},
		{"the first rename", only(crashfs.PieceRename, "g"), map[string]string{"g": "old"}},
		{"the second rename keeps the first", only(crashfs.PieceRename, "h"), map[string]string{"h": "old"}},
		{"the new file keeps the rename away from its name", only(crashfs.PieceLink, "f"), map[string]string{"f": "new", "g": "old"}},
		{"everything", crashfs.KeepAll, map[string]string{"f": "new", "h": "old"}},
	}
	for _, tt := range tests {
		if got := image(t, st, tt.keep); !maps.Equal(got, tt.want) {
			t.Errorf("%s: got %q, want %q", tt.name, got, tt.want)
		}
	}
}

// TestDirectDescriptorIsTheSameFile: a write through an O_DIRECT descriptor
// is made durable by a sync through the buffered one, as the store does in
// direct mode.
func TestDirectDescriptorIsTheSameFile(t *testing.T) {
	fsys, _ := newCrashFS(t)
	f := create(t, fsys, "f")
	must(t, fsys.SyncDir("."))
	d, err := fsys.OpenFile("f", os.O_RDWR|syscall.O_DIRECT, 0)
	if err != nil {
		t.Skipf("O_DIRECT: %v", err)
	}
	defer d.Close()
	fi, err := f.Stat()
	must(t, err)
	buf := alignedBlock(int(fi.BlockSize))
	for i := range buf {
		buf[i] = byte('a' + i%26)
	}
	if _, err := d.WriteAt(buf, 0); err != nil {
		t.Skipf("O_DIRECT write: %v", err)
	}
	must(t, f.Sync(store.SyncData))
	got := image(t, fsys.Crash(), crashfs.KeepNone)
	if want := map[string]string{"f": string(buf)}; !maps.Equal(got, want) {
		t.Errorf("KeepNone: got %d files, f %d bytes; want f %d bytes", len(got), len(got["f"]), len(buf))
	}
}

// TestDSyncWriteIsDurableByItself: a write through an O_DSYNC descriptor
// that returned OK survives every cut, and makes no other write durable;
// one that failed (here after a byte of it landed) is not durable.
func TestDSyncWriteIsDurableByItself(t *testing.T) {
	base, _ := newBase(t)
	faults := faultfs.New(base)
	fsys := crashfs.New(faults)
	defer fsys.Close()
	f := create(t, fsys, "f")
	write(t, f, 0, "aaaa")
	must(t, f.Sync(store.SyncData))
	must(t, fsys.SyncDir("."))
	write(t, f, 4, "bbbb") // buffered, never synced
	d, err := fsys.OpenFile("f", os.O_RDWR|syscall.O_DSYNC, 0)
	must(t, err)
	defer d.Close()
	write(t, d, 0, "AA")
	// A short write: "C" lands, then EIO.
	faults.Inject(faultfs.Rule{Op: faultfs.OpWrite, Err: syscall.EIO, After: 1, Times: 1})
	if n, err := d.WriteAt([]byte("CD"), 2); n != 1 || err == nil {
		t.Fatalf("the injected short write wrote %d bytes, error %v; want 1 and EIO", n, err)
	}
	st := fsys.Crash()
	for _, tt := range []struct {
		name string
		keep crashfs.Keep
		want string
	}{
		{"none", crashfs.KeepNone, "AAaa"},
		{"all", crashfs.KeepAll, "AACabbbb"},
	} {
		if got := image(t, st, tt.keep); got["f"] != tt.want {
			t.Errorf("Keep %s: f is %q, want %q", tt.name, got["f"], tt.want)
		}
	}
}

// alignedBlock is n bytes aligned to n, for O_DIRECT.
func alignedBlock(n int) []byte {
	raw := make([]byte, 2*n)
	shift := (n - int(uintptr(unsafe.Pointer(&raw[0])))%n) % n
	return raw[shift : shift+n]
}

// TestSyncCoversWhatCompletedWhenCalled: a write that completes while a
// sync runs is not covered by it, although the kernel may write it.
func TestSyncCoversWhatCompletedWhenCalled(t *testing.T) {
	base, _ := newBase(t)
	faults := faultfs.New(base)
	fsys := crashfs.New(faults)
	defer fsys.Close()
	f := create(t, fsys, "f")
	must(t, fsys.SyncDir("."))
	write(t, f, 0, "before")
	hold := make(chan struct{})
	held := faults.Inject(faultfs.Rule{Op: faultfs.OpSync, Hold: hold, Times: 1})
	done := make(chan error)
	go func() { done <- f.Sync(store.SyncData) }()
	for held.Hits() == 0 {
		time.Sleep(time.Millisecond)
	}
	write(t, f, 6, "during")
	close(hold)
	must(t, <-done)
	got := image(t, fsys.Crash(), crashfs.KeepNone)
	if want := map[string]string{"f": "before"}; !maps.Equal(got, want) {
		t.Errorf("KeepNone: got %q, want %q", got, want)
	}
}

// TestCrashFreezes: after Crash every call fails with EIO, and a sync that
// was running makes nothing durable although it succeeds underneath.
func TestCrashFreezes(t *testing.T) {
	base, _ := newBase(t)
	faults := faultfs.New(base)
	fsys := crashfs.New(faults)
	f := create(t, fsys, "f")
	must(t, fsys.SyncDir("."))
	write(t, f, 0, "abc")
	hold := make(chan struct{})
	held := faults.Inject(faultfs.Rule{Op: faultfs.OpSync, Hold: hold, Times: 1})
	running := make(chan error)
	go func() { running <- f.Sync(store.SyncData) }()
	for held.Hits() == 0 {
		time.Sleep(time.Millisecond)
	}
	st := fsys.Crash()
	close(hold)
	if err := <-running; !errors.Is(err, syscall.EIO) {
		t.Errorf("sync running at the crash: got %v, want EIO", err)
	}
	calls := map[string]func() error{
		"OpenFile":  func() error { _, err := fsys.OpenFile("f", os.O_RDWR, 0); return err },
		"MkdirAll":  func() error { return fsys.MkdirAll("d", 0o755) },
		"SyncDir":   func() error { return fsys.SyncDir(".") },
		"Rename":    func() error { return fsys.Rename("f", "g", false) },
		"Remove":    func() error { return fsys.Remove("f") },
		"ReadAt":    func() error { _, err := f.ReadAt(make([]byte, 1), 0); return err },
		"WriteAt":   func() error { _, err := f.WriteAt([]byte("x"), 0); return err },
		"Truncate":  func() error { return f.Truncate(0) },
		"Fallocate": func() error { return f.Fallocate(0, 0, 1) },
		"Sync":      func() error { return f.Sync(store.SyncFull) },
		"WriteBack": func() error { return f.WriteBack(0, 1) },
		"Stat":      func() error { _, err := f.Stat(); return err },
		"Extents":   func() error { _, err := f.Extents(); return err },
		"Close":     f.Close,
	}
	for _, name := range slices.Sorted(maps.Keys(calls)) {
		if err := calls[name](); !errors.Is(err, syscall.EIO) {
			t.Errorf("%s after Crash: got %v, want EIO", name, err)
		}
	}
	if err := fsys.Close(); !errors.Is(err, syscall.EIO) {
		t.Errorf("Close after Crash: got %v, want EIO", err)
	}
	if got, want := image(t, st, crashfs.KeepNone), map[string]string{"f": ""}; !maps.Equal(got, want) {
		t.Errorf("KeepNone: got %q, want %q", got, want)
	}
}

// TestTornWrites: each block of a write, and its growth of the size,
// survive on their own.
func TestTornWrites(t *testing.T) {
	fsys, _ := newCrashFS(t)
	f := create(t, fsys, "f")
	must(t, fsys.SyncDir("."))
	fi, err := f.Stat()
	must(t, err)
	bs := fi.BlockSize
	data := bytes.Repeat([]byte("w"), int(3*bs))
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	st := fsys.Crash()
	var kinds []string
	for _, p := range st.Pieces() {
		kinds = append(kinds, p.Kind.String())
	}
	if want := []string{"data", "data", "data", "size"}; !slices.Equal(kinds, want) {
		t.Fatalf("pieces: got %v, want %v", kinds, want)
	}
	zeros, block := strings.Repeat("\x00", int(bs)), strings.Repeat("w", int(bs))
	tests := []struct {
		name string
		keep crashfs.Keep
		want string
	}{
		{"the middle block and the size", func(p crashfs.Piece) bool { return p.Kind == crashfs.PieceSize || p.Block == 1 }, zeros + block + zeros},
		{"the size alone: zeros", func(p crashfs.Piece) bool { return p.Kind == crashfs.PieceSize }, zeros + zeros + zeros},
		{"the data without the size: lost past EOF", func(p crashfs.Piece) bool { return p.Kind == crashfs.PieceData }, ""},
		{"a prefix in completion order", crashfs.KeepBefore(st.LastSeq() + 1), block + block + block},
	}
	for _, tt := range tests {
		if got := image(t, st, tt.keep)["f"]; got != tt.want {
			t.Errorf("%s: got %d bytes (%q...), want %d", tt.name, len(got), got[:min(len(got), 8)], len(tt.want))
		}
	}
}

// TestImageExtents: the image is made with the same system calls, so its
// holes, unwritten and written blocks are the ones the live file had.
func TestImageExtents(t *testing.T) {
	fsys, live := newCrashFS(t)
	f := create(t, fsys, "f")
	must(t, fsys.SyncDir("."))
	fi, err := f.Stat()
	must(t, err)
	bs := fi.BlockSize
	rng := rand.New(rand.NewPCG(1, 2))
	modes := []uint32{0, unix.FALLOC_FL_KEEP_SIZE, unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE, unix.FALLOC_FL_ZERO_RANGE | unix.FALLOC_FL_KEEP_SIZE}
	for range 40 {
		off := rng.Int64N(32 * bs)
		n := 1 + rng.Int64N(4*bs)
		switch rng.IntN(3) {
		case 0:
			write(t, f, off, strings.Repeat("d", int(n)))
		case 1:
			if err := f.Fallocate(modes[rng.IntN(len(modes))], off, n); err != nil {
				t.Skipf("fallocate: %v", err)
			}
		default:
			must(t, f.Truncate(off))
		}
	}
	must(t, f.Sync(store.SyncData))
	want, err := osExtents(live, "f")
	if err != nil {
		t.Skipf("FIEMAP: %v", err)
	}
	wantData, err := os.ReadFile(filepath.Join(live, "f"))
	must(t, err)
	st := fsys.Crash()
	for name, keep := range map[string]crashfs.Keep{"none": crashfs.KeepNone, "all": crashfs.KeepAll} {
		dir := testutil.Dir(t)
		if _, err := st.Write(dir, keep); err != nil {
			t.Fatal(err)
		}
		got, err := osExtents(dir, "f")
		must(t, err)
		if !slices.Equal(got, want) {
			t.Errorf("%s: image extents\n got  %v\n want %v (the live file's)", name, got, want)
		}
		gotData, err := os.ReadFile(filepath.Join(dir, "f"))
		must(t, err)
		if !bytes.Equal(gotData, wantData) {
			t.Errorf("%s: image content differs from the live file's (%d bytes, want %d)", name, len(gotData), len(wantData))
		}
	}
}

// osExtents is what the operating system's File.Extents (FIEMAP) says of
// name in dir.
func osExtents(dir, name string) ([]store.Extent, error) {
	osfs, err := store.OpenOSFS(dir)
	if err != nil {
		return nil, err
	}
	defer osfs.Close()
	f, err := osfs.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Extents()
}
