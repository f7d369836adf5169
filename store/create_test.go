//go:build linux

package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// hookFS is an FS whose OpenFile, Remove and Rename calls a test can see,
// fail or hold. beforeOpen runs before each OpenFile and fails it with the
// error it returns; afterRemove and afterRename run after each Remove and
// Rename; beforeResize, if set when a file is opened, runs before each
// Truncate and Fallocate of that file.
type hookFS struct {
	FS
	beforeOpen   func(name string, flag int) error
	afterRemove  func(name string, err error)
	afterRename  func(oldName, newName string, err error)
	beforeResize func(name string)
}

func (h *hookFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	if h.beforeOpen != nil {
		if err := h.beforeOpen(name, flag); err != nil {
			return nil, &os.PathError{Op: "openat", Path: name, Err: err}
		}
	}
	f, err := h.FS.OpenFile(name, flag, perm)
	if err != nil || h.beforeResize == nil {
		return f, err
	}
	return hookFile{File: f, name: name, beforeResize: h.beforeResize}, nil
}

// hookFile is a file of a hookFS with beforeResize set.
type hookFile struct {
	File
	name         string
	beforeResize func(name string)
}

func (f hookFile) Truncate(size int64) error {
	f.beforeResize(f.name)
	return f.File.Truncate(size)
}

func (f hookFile) Fallocate(mode uint32, off, length int64) error {
	f.beforeResize(f.name)
	return f.File.Fallocate(mode, off, length)
}

func (h *hookFS) Remove(name string) error {
	err := h.FS.Remove(name)
	if h.afterRemove != nil {
		h.afterRemove(name, err)
	}
	return err
}

func (h *hookFS) Rename(oldName, newName string, noReplace bool) error {
	err := h.FS.Rename(oldName, newName, noReplace)
	if h.afterRename != nil {
		h.afterRename(oldName, newName, err)
	}
	return err
}

// newHookStore opens a store over a hookFS of a fresh directory that holds
// an empty directory "dir".
func newHookStore(t *testing.T, opts Options) (*Store, *hookFS, string) {
	t.Helper()
	var h *hookFS
	s, dir := newWrappedStore(t, func(fsys FS) FS {
		h = &hookFS{FS: fsys}
		return h
	}, opts)
	if err := os.Mkdir(filepath.Join(dir, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	return s, h, dir
}

// creating reports whether flag asks open(2) to create.
func creating(flag int) bool { return flag&os.O_CREATE != 0 }

// creatingOps are the operations that create a missing file.
var creatingOps = []pathOp{pathOps[0], pathOps[2], pathOps[3]} // Write, Truncate, Fallocate

// TestRefusedCreateLeavesNoDirectories: a request refused while it creates
// a file takes back the directories it made for it, whether validation
// refuses it (an element longer than NAME_MAX, which once reached the
// filesystem only after its parents were made) or the filesystem does (no
// space for the file, O_DIRECT refused once the file exists). Directories
// that were there before stay.
func TestRefusedCreateLeavesNoDirectories(t *testing.T) {
	long := strings.Repeat("y", 256)
	for _, tt := range []struct {
		name string
		path string
		io   IOMode
		// fail fails the OpenFile calls it returns an errno for.
		fail func(name string, flag int) error
		want error
	}{
		{"element over NAME_MAX", "leak1/leak2/" + long, IOBuffered, nil, ErrPathTooLong},
		{"element over NAME_MAX below a directory", "dir/leak/" + long, IOBuffered, nil, ErrPathTooLong},
		{"no space for the file", "a/b/c/f", IOBuffered, func(name string, flag int) error {
			if creating(flag) {
				return syscall.ENOSPC
			}
			return nil
		}, ErrNoSpace},
		{"no space below a directory", "dir/new/f", IOBuffered, func(name string, flag int) error {
			if creating(flag) {
				return syscall.ENOSPC
			}
			return nil
		}, ErrNoSpace},
		{"O_DIRECT refused once the file exists", "d1/d2/f", IODirect, func(name string, flag int) error {
			if flag&syscall.O_DIRECT != 0 {
				return syscall.EINVAL
			}
			return nil
		}, ErrUnsupported},
	} {
		for _, op := range creatingOps {
			t.Run(tt.name+"/"+op.name, func(t *testing.T) {
				s, h, dir := newHookStore(t, Options{IO: tt.io})
				h.beforeOpen = tt.fail
				before := snapshotTree(t, dir)
				if err := op.do(context.Background(), s, tt.path); !errors.Is(err, tt.want) {
					t.Errorf("%s(%q) = %v, want %v", op.name, tt.path, err, tt.want)
				}
				if d := treeDiff(before, snapshotTree(t, dir)); d != "" {
					t.Errorf("the refused request changed the tree: %s", d)
				}
			})
		}
	}
}

// TestCreateRetriesWhenItsDirectoryIsRemoved: B creates a file in a
// directory that A made for a file of its own. A's create fails and A
// removes the directory, empty, between B finding it and B creating its
// file there. B makes the directory again and succeeds.
func TestCreateRetriesWhenItsDirectoryIsRemoved(t *testing.T) {
	s, h, dir := newHookStore(t, Options{})
	aInside := make(chan struct{})  // A has made "new" and is creating new/a
	releaseA := make(chan struct{}) // A may fail now
	aDone := make(chan error, 1)
	var once sync.Once
	h.beforeOpen = func(name string, flag int) error {
		switch {
		case name == "new/a" && creating(flag):
			close(aInside)
			<-releaseA
			return syscall.ENOSPC
		case name == "new/b" && creating(flag):
			// B's first create: let A fail and take "new" back first.
			once.Do(func() {
				close(releaseA)
				if err := <-aDone; !errors.Is(err, ErrNoSpace) {
					t.Errorf("A's Write = %v, want ErrNoSpace", err)
				}
			})
		}
		return nil
	}
	go func() {
		_, err := s.Write(context.Background(), "new/a", 0, []byte("a"), SyncNone)
		aDone <- err
	}()
	<-aInside
	if _, err := s.Write(context.Background(), "new/b", 0, []byte("b"), SyncData); err != nil {
		t.Fatalf("B's Write = %v, want it to make the directory again and succeed", err)
	}
	if got := string(readFile(t, dir, "new/b")); got != "b" {
		t.Errorf("new/b = %q, want \"b\"", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "new/a")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("new/a exists (%v) after its create failed", err)
	}
}

// TestConcurrentCreatesWithFailures: writers create files in directories
// that none of them finds, at once, and every other create fails for lack
// of space. Every write that was not failed succeeds, and afterwards a
// directory exists exactly when a created file lies below it: the model.
func TestConcurrentCreatesWithFailures(t *testing.T) {
	s, h, dir := newHookStore(t, Options{})
	h.beforeOpen = func(name string, flag int) error {
		if creating(flag) && strings.HasPrefix(path.Base(name), "fail") {
			return syscall.ENOSPC
		}
		return nil
	}
	const rounds, writers = 40, 8
	for round := range rounds {
		var wg sync.WaitGroup
		errs := make([]error, writers)
		names := make([]string, writers)
		for w := range writers {
			// Two writers of each kind share each leaf directory, and all
			// share the round's top directory.
			kind := "ok"
			if w%2 == 1 {
				kind = "fail"
			}
			names[w] = fmt.Sprintf("r%d/d%d/s%d/%s%d", round, w%3, w/4, kind, w)
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[w] = s.Write(context.Background(), names[w], 0, []byte(names[w]), SyncNone)
			}()
		}
		wg.Wait()
		want := map[string]bool{}
		for w, name := range names {
			failing := strings.HasPrefix(path.Base(name), "fail")
			switch {
			case failing && !errors.Is(errs[w], ErrNoSpace):
				t.Errorf("Write(%s) = %v, want ErrNoSpace", name, errs[w])
			case !failing && errs[w] != nil:
				t.Errorf("Write(%s) = %v, want success", name, errs[w])
			case !failing:
				for p := name; p != "."; p = path.Dir(p) {
					want[p] = true
				}
			}
		}
		got := map[string]bool{}
		filepath.WalkDir(filepath.Join(dir, fmt.Sprintf("r%d", round)), func(p string, d fs.DirEntry, err error) error {
			if err == nil {
				rel, _ := filepath.Rel(dir, p)
				got[rel] = true
			}
			return nil
		})
		for p := range got {
			if !want[p] {
				t.Errorf("round %d: %s is left behind", round, p)
			}
		}
		for p := range want {
			if !got[p] {
				t.Errorf("round %d: %s is missing", round, p)
			}
		}
	}
}

// TestNonRegularFiles: a FIFO, a unix socket and a character device are
// refused by every operation as not regular files, like a directory is,
// without blocking on the FIFO and without touching them.
func TestNonRegularFiles(t *testing.T) {
	s, dir := newTestStore(t, Options{})
	for _, mk := range []struct {
		name string
		make func(p string) error
	}{
		{"fifo", func(p string) error { return syscall.Mkfifo(p, 0o644) }},
		{"socket", func(p string) error { return syscall.Mknod(p, syscall.S_IFSOCK|0o644, 0) }},
		{"chardev", func(p string) error { return syscall.Mknod(p, syscall.S_IFCHR|0o666, 1<<8|3) }}, // like /dev/null
	} {
		if err := mk.make(filepath.Join(dir, mk.name)); err != nil {
			if mk.name == "chardev" && errors.Is(err, syscall.EPERM) {
				t.Logf("no character device: mknod needs CAP_MKNOD (%v)", err)
				continue
			}
			t.Fatal(err)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == StateDir {
			continue // the store's own state
		}
		for _, op := range pathOps {
			t.Run(e.Name()+"/"+op.name, func(t *testing.T) {
				before := snapshotTree(t, dir)
				if err := op.do(context.Background(), s, e.Name()); !errors.Is(err, ErrNotRegular) {
					t.Errorf("%s(%s) = %v, want ErrNotRegular", op.name, e.Name(), err)
				}
				if d := treeDiff(before, snapshotTree(t, dir)); d != "" {
					t.Errorf("the refused request changed the tree: %s", d)
				}
			})
		}
	}
}

// TestSymlinksInsideTheRoot: a symlink loop is a bad path, not an escape;
// a symlink whose target's directory is missing is a bad path to the
// operations that create (the store makes the missing directories of the
// path it is given, never of a symlink's target) and a missing file to the
// others; a symlink to a missing file in an existing directory creates it.
func TestSymlinksInsideTheRoot(t *testing.T) {
	s, dir := newTestStore(t, Options{})
	if err := os.Mkdir(filepath.Join(dir, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{
		"loop":          "loop",
		"ping":          "pong",
		"pong":          "ping",
		"dangling":      "missingdir/f",
		"dangling-dir":  "missingdir",
		"dangling-here": "dir/new",
	} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	var cases []rejectCase
	for _, op := range pathOps {
		for _, p := range []string{"loop", "ping", "loop/x"} {
			cases = append(cases, rejectCase{
				name:    op.name + "/" + p,
				do:      func(ctx context.Context, s *Store) error { return op.do(ctx, s, p) },
				want:    ErrInvalidPath,
				message: "symbolic links",
			})
		}
		want, message := ErrNotFound, ""
		if op.name == "Write" || op.name == "Truncate" || strings.HasPrefix(op.name, "Fallocate") {
			want, message = ErrInvalidPath, "symlink"
		}
		for _, p := range []string{"dangling", "dangling-dir/f"} {
			cases = append(cases, rejectCase{
				name:    op.name + "/" + p,
				do:      func(ctx context.Context, s *Store) error { return op.do(ctx, s, p) },
				want:    want,
				message: message,
			})
		}
	}
	checkRejected(t, s, dir, cases)
	for _, c := range cases {
		if err := c.do(context.Background(), s); errors.Is(err, ErrPathEscapes) {
			t.Errorf("%s: %v, a path that stays inside the root reported as an escape", c.name, err)
		}
	}
	if _, err := s.Write(context.Background(), "dangling-here", 0, []byte("x"), SyncNone); err != nil {
		t.Fatalf("Write through a symlink to a new file in an existing directory: %v", err)
	}
	if got := string(readFile(t, dir, "dir/new")); got != "x" {
		t.Errorf("dir/new = %q, want \"x\" written through the symlink", got)
	}
}

// TestErrorsNameRelativePaths: the errors of the file layer name files by
// their path below the root, never by the daemon's own path to them.
// Offsets past what ext4 allows in a file (16 TiB) make the kernel refuse
// with EFBIG.
func TestErrorsNameRelativePaths(t *testing.T) {
	for _, io := range []IOMode{IOBuffered, IODirect} {
		t.Run(io.String(), func(t *testing.T) {
			s, dir := newTestStore(t, Options{IO: io, MaxFileSize: 1 << 62})
			ctx := context.Background()
			if _, err := s.Write(ctx, "sub/f", 0, make([]byte, 4096), SyncData); err != nil {
				t.Fatal(err)
			}
			for _, tt := range []struct {
				name string
				do   func() error
			}{
				{"Write", func() error {
					_, err := s.Write(ctx, "sub/f", 1<<60, make([]byte, 4096), SyncNone)
					return err
				}},
				{"Truncate", func() error { return s.Truncate(ctx, "sub/f", 1<<60) }},
				{"Fallocate", func() error {
					_, err := s.Fallocate(ctx, "sub/f", FallocAllocate, 1<<60, 4096)
					return err
				}},
			} {
				err := tt.do()
				if err == nil {
					t.Errorf("%s past ext4's file size limit succeeded", tt.name)
					continue
				}
				if strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "sub/f") {
					t.Errorf("%s: %q, want the path below the root (sub/f) and not the root's (%s)", tt.name, err, dir)
				}
			}
		})
	}
}

// TestWriteSaysWhetherItCreated: WriteOpen's result says whether this
// call created the file (what a raw PUT answers 201 for), also for a
// write of no bytes, and only for the call that did, of many racing.
func TestWriteSaysWhetherItCreated(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	ctx := context.Background()
	for _, tt := range []struct {
		path string
		data string
		want bool
	}{
		{"a/new", "x", true},
		{"a/new", "y", false},
		{"a/empty", "", true},
		{"a/empty", "", false},
	} {
		res, err := s.WriteOpen(ctx, tt.path, OpenCreate, 0, []byte(tt.data), SyncNone)
		if err != nil || res.Created != tt.want {
			t.Errorf("Write %q to %s: created %v, error %v; want %v, nil", tt.data, tt.path, res.Created, err, tt.want)
		}
	}
	const racers = 8
	created := make(chan bool, racers)
	for range racers {
		go func() {
			res, err := s.WriteOpen(ctx, "b/raced", OpenCreate, 0, []byte("z"), SyncNone)
			created <- err == nil && res.Created
		}()
	}
	n := 0
	for range racers {
		if <-created {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d of %d racing writes say they created the file, want 1", n, racers)
	}
}
