//go:build linux

package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

// tree is the files below a root as a user sees them: regular files by
// slash path with their content, directories with a trailing slash.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for p, e := range snapshotTree(t, dir) {
		switch {
		case p == ".":
		case e.mode.IsDir():
			out[filepath.ToSlash(p)+"/"] = ""
		case e.mode.IsRegular():
			out[filepath.ToSlash(p)] = e.content
		default:
			out[filepath.ToSlash(p)] = "-> " + e.target
		}
	}
	return out
}

// TestDeleteAndRename: each step's outcome and the tree it leaves, through
// the store's own calls.
func TestDeleteAndRename(t *testing.T) {
	ctx := context.Background()
	write := func(name, data string) func(s *Store) error {
		return func(s *Store) error {
			_, err := s.Write(ctx, name, 0, []byte(data), SyncNone)
			return err
		}
	}
	del := func(name string) func(s *Store) error {
		return func(s *Store) error { return s.Delete(ctx, name, false) }
	}
	rename := func(from, to string, noReplace bool) func(s *Store) error {
		return func(s *Store) error { return s.Rename(ctx, from, to, noReplace, false) }
	}
	tests := []struct {
		name    string
		setup   []func(s *Store) error
		do      func(s *Store) error
		wantErr error
		want    map[string]string
	}{
		{"delete", []func(*Store) error{write("a", "1"), write("b", "2")}, del("a"), nil,
			map[string]string{"b": "2"}},
		{"delete in a directory keeps the directory", []func(*Store) error{write("d/a", "1")}, del("d/a"), nil,
			map[string]string{"d/": ""}},
		{"delete a missing file", nil, del("a"), ErrNotFound, map[string]string{}},
		{"delete a directory", []func(*Store) error{write("d/a", "1")}, del("d"), ErrIsDirectory,
			map[string]string{"d/": "", "d/a": "1"}},
		{"write after delete creates a new file", []func(*Store) error{write("a", "long content"), del("a")}, write("a", "x"), nil,
			map[string]string{"a": "x"}},
		{"rename", []func(*Store) error{write("a", "1")}, rename("a", "b", false), nil,
			map[string]string{"b": "1"}},
		{"rename creates missing parents", []func(*Store) error{write("a", "1")}, rename("a", "x/y/b", false), nil,
			map[string]string{"x/": "", "x/y/": "", "x/y/b": "1"}},
		{"rename out of a directory", []func(*Store) error{write("x/a", "1")}, rename("x/a", "b", false), nil,
			map[string]string{"x/": "", "b": "1"}},
		{"rename replaces", []func(*Store) error{write("a", "1"), write("b", "old")}, rename("a", "b", false), nil,
			map[string]string{"b": "1"}},
		{"rename without replacing", []func(*Store) error{write("a", "1"), write("b", "old")}, rename("a", "b", true), ErrExists,
			map[string]string{"a": "1", "b": "old"}},
		{"rename without replacing, to a free name", []func(*Store) error{write("a", "1")}, rename("a", "b", true), nil,
			map[string]string{"b": "1"}},
		{"rename onto itself", []func(*Store) error{write("a", "1")}, rename("a", "a", true), nil,
			map[string]string{"a": "1"}},
		{"rename a missing file onto itself", nil, rename("a", "a", false), ErrNotFound, map[string]string{}},
		{"rename a missing file", nil, rename("a", "b", false), ErrNotFound, map[string]string{}},
		{"rename onto a directory", []func(*Store) error{write("a", "1"), write("d/x", "2")}, rename("a", "d", false), ErrIsDirectory,
			map[string]string{"a": "1", "d/": "", "d/x": "2"}},
		{"rename without replacing onto a directory", []func(*Store) error{write("a", "1"), write("d/x", "2")}, rename("a", "d", true), ErrIsDirectory,
			map[string]string{"a": "1", "d/": "", "d/x": "2"}},
		{"rename onto an empty directory", []func(*Store) error{write("a", "1"), write("d/x", "2"), del("d/x")}, rename("a", "d", false), ErrIsDirectory,
			map[string]string{"a": "1", "d/": ""}},
		{"rename onto its own directory", []func(*Store) error{write("d/x", "2")}, rename("d/x", "d", false), ErrIsDirectory,
			map[string]string{"d/": "", "d/x": "2"}},
		{"rename a directory", []func(*Store) error{write("d/x", "2")}, rename("d", "e", false), ErrIsDirectory,
			map[string]string{"d/": "", "d/x": "2"}},
		{"rename below itself", []func(*Store) error{write("a", "1")}, rename("a", "a/b", false), ErrInvalidPath,
			map[string]string{"a": "1"}},
		{"rename below another file", []func(*Store) error{write("a", "1"), write("f", "2")}, rename("a", "f/g/b", false), ErrInvalidPath,
			map[string]string{"a": "1", "f": "2"}},
		{"rename back and forth", []func(*Store) error{write("a", "1"), rename("a", "b", false)}, rename("b", "a", false), nil,
			map[string]string{"a": "1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, dir := newTestStore(t, Options{})
			for i, step := range tt.setup {
				if err := step(s); err != nil {
					t.Fatalf("setup step %d: %v", i, err)
				}
			}
			if err := tt.do(s); !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
				t.Errorf("got error %v, want %v", err, tt.wantErr)
			}
			if got := tree(t, dir); fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("tree after: got %v, want %v", got, tt.want)
			}
		})
	}
}

// TestRenameFollowsOpenFile: the inode table re-keys a renamed file, so a
// file open under its old name is written and read under its new one, a
// Write to the old name creates a new file, and a Delete closes the file.
func TestRenameFollowsOpenFile(t *testing.T) {
	ctx := context.Background()
	s, dir := newTestStore(t, Options{})
	if _, err := s.Write(ctx, "a", 0, []byte("hello"), SyncNone); err != nil {
		t.Fatal(err)
	}
	if err := s.Rename(ctx, "a", "b", false, false); err != nil {
		t.Fatal(err)
	}
	if isOpen(s, "a") || !isOpen(s, "b") {
		t.Errorf("after rename: open a %v, b %v; want only b", isOpen(s, "a"), isOpen(s, "b"))
	}
	if _, err := s.Write(ctx, "b", 5, []byte(" world"), SyncNone); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write(ctx, "a", 0, []byte("new"), SyncNone); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"a": "new", "b": "hello world"} {
		if got := string(readFile(t, dir, name)); got != want {
			t.Errorf("%s holds %q, want %q", name, got, want)
		}
		if st, err := s.Stat(ctx, name); err != nil || st.Size != int64(len(want)) {
			t.Errorf("Stat(%s) = %+v, %v; want size %d", name, st, err, len(want))
		}
	}
	open := openFiles(s)
	if err := s.Delete(ctx, "b", false); err != nil {
		t.Fatal(err)
	}
	if got := openFiles(s); got != open-1 || isOpen(s, "b") {
		t.Errorf("after delete: %d files open (b open: %v), want %d", got, isOpen(s, "b"), open-1)
	}
	if _, err := s.Read(ctx, "b", 0, 1); !errors.Is(err, ErrNotFound) {
		t.Errorf("Read of the deleted file: %v, want %v", err, ErrNotFound)
	}
}

// TestDeleteAndRenameAliases: a second name of an open file (a symlink or a
// hard link made outside the store) is only a name. Deleting or renaming
// it leaves the file, under the name the table knows, open and usable.
func TestDeleteAndRenameAliases(t *testing.T) {
	ctx := context.Background()
	for _, link := range []string{"symlink", "hardlink"} {
		t.Run(link, func(t *testing.T) {
			s, dir := newTestStore(t, Options{})
			if _, err := s.Write(ctx, "f", 0, []byte("data"), SyncNone); err != nil {
				t.Fatal(err)
			}
			mk := os.Link
			if link == "symlink" {
				mk = func(_, newname string) error { return os.Symlink("f", newname) }
			}
			for _, alias := range []string{"alias1", "alias2"} {
				if err := mk(filepath.Join(dir, "f"), filepath.Join(dir, alias)); err != nil {
					t.Fatal(err)
				}
				// Through the alias: the table shares the inode of f.
				if _, err := s.Read(ctx, alias, 0, 4); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Delete(ctx, "alias1", false); err != nil {
				t.Fatal(err)
			}
			err := s.Rename(ctx, "alias2", "moved", false, false)
			if link == "symlink" {
				if !errors.Is(err, ErrInvalidPath) {
					t.Errorf("rename of a symlink: %v, want %v", err, ErrInvalidPath)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Write(ctx, "f", 4, []byte("+"), SyncNone); err != nil {
				t.Fatal(err)
			}
			if got := string(readFile(t, dir, "f")); got != "data+" {
				t.Errorf("f holds %q after its aliases were deleted and renamed, want %q", got, "data+")
			}
			if _, err := os.Lstat(filepath.Join(dir, "alias1")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("alias1 after Delete: %v, want it gone", err)
			}
		})
	}
}

// TestDeleteAndRenameRejects: requests refused before anything changes, on
// the validation fixture (symlinks out of the root and their targets).
func TestDeleteAndRenameRejects(t *testing.T) {
	s, base := validationFixture(t, Options{})
	del := func(name string) func(ctx context.Context, s *Store) error {
		return func(ctx context.Context, s *Store) error { return s.Delete(ctx, name, true) }
	}
	rename := func(from, to string) func(ctx context.Context, s *Store) error {
		return func(ctx context.Context, s *Store) error { return s.Rename(ctx, from, to, false, true) }
	}
	checkRejected(t, s, base, []rejectCase{
		{name: "delete: empty", do: del(""), want: ErrInvalidPath},
		{name: "delete: the root", do: del("."), want: ErrInvalidPath},
		{name: "delete: ..", do: del("../outside/secret"), want: ErrInvalidPath},
		{name: "delete: a directory", do: del("dir"), want: ErrIsDirectory},
		{name: "delete: missing", do: del("dir/missing"), want: ErrNotFound},
		{name: "delete: through a symlink out", do: del("esc-dir-abs/secret"), want: ErrPathEscapes},
		{name: "delete: a symlink out", do: del("esc-rel"), want: ErrPathEscapes},
		{name: "rename: empty new name", do: rename("f", ""), want: ErrInvalidPath},
		{name: "rename: absolute new name", do: rename("f", filepath.Join(base, "outside", "x")), want: ErrInvalidPath},
		{name: "rename: .. new name", do: rename("f", "../outside/x"), want: ErrInvalidPath},
		{name: "rename: unclean new name", do: rename("f", "dir//x"), want: ErrInvalidPath},
		{name: "rename: into a symlink out", do: rename("f", "esc-dir-abs/x"), want: ErrPathEscapes},
		{name: "rename: into a new directory under a symlink out", do: rename("f", "esc-dir-rel/new/x"), want: ErrPathEscapes},
		{name: "rename: a symlink out", do: rename("esc-abs", "x"), want: ErrPathEscapes},
		{name: "rename: through a symlink out", do: rename("esc-dir-rel/secret", "x"), want: ErrPathEscapes},
		{name: "rename: onto a directory", do: rename("f", "dir"), want: ErrIsDirectory},
		{name: "rename: a directory", do: rename("dir", "x"), want: ErrIsDirectory},
		{name: "rename: missing", do: rename("missing", "x/y"), want: ErrNotFound},
		{name: "rename: into a file", do: rename("dir/inner", "f/x"), want: ErrInvalidPath},
		{name: "rename: without replacing", do: func(ctx context.Context, s *Store) error {
			return s.Rename(ctx, "f", "dir/inner", true, true)
		}, want: ErrExists},
	})
}

// failingRenameFS fails every rename with err, after the store created
// the new name's parents.
type failingRenameFS struct {
	FS
	err error
}

func (f failingRenameFS) Rename(oldName, newName string, noReplace bool) error {
	return &os.LinkError{Op: "renameat2", Old: oldName, New: newName, Err: f.err}
}

// TestFailedRenameRemovesNewParents: a rename that fails after creating
// the new name's parents removes them again, except those a concurrent
// create put a file into.
func TestFailedRenameRemovesNewParents(t *testing.T) {
	ctx := context.Background()
	dir := testutil.Dir(t)
	base, err := OpenOSFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(failingRenameFS{base, syscall.ENOSPC}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Write(ctx, "x/a", 0, []byte("1"), SyncNone); err != nil {
		t.Fatal(err)
	}
	before := tree(t, dir)
	if err := s.Rename(ctx, "x/a", "x/new/deeper/b", false, false); !errors.Is(err, ErrNoSpace) {
		t.Errorf("got %v, want %v", err, ErrNoSpace)
	}
	if got := tree(t, dir); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Errorf("tree after the failed rename: %v, want %v", got, before)
	}
	if _, err := s.Write(ctx, "x/a", 1, []byte("2"), SyncNone); err != nil {
		t.Errorf("the file is not usable under its old name: %v", err)
	}
}

// TestNamespaceSyncs: which directories Delete, Rename and Fsync of a
// directory sync, and that they sync nothing without sync.
func TestNamespaceSyncs(t *testing.T) {
	ctx := context.Background()
	rec := &syncRecorder{}
	s, _ := newRecordedStore(t, rec, Options{})
	for _, name := range []string{"a/f1", "a/f2", "a/f3", "b/g", "top"} {
		if _, err := s.Write(ctx, name, 0, []byte("x"), SyncData); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name     string
		do       func() error
		wantDirs []string
	}{
		{"delete", func() error { return s.Delete(ctx, "a/f1", false) }, nil},
		{"delete with sync", func() error { return s.Delete(ctx, "a/f2", true) }, []string{"a"}},
		{"delete with sync in the root", func() error { return s.Delete(ctx, "top", true) }, []string{"."}},
		{"rename", func() error { return s.Rename(ctx, "a/f3", "b/f3", false, false) }, nil},
		{"rename with sync", func() error { return s.Rename(ctx, "b/f3", "a/f3", false, true) }, []string{"b", "a"}},
		{"rename with sync in one directory", func() error { return s.Rename(ctx, "a/f3", "a/f4", false, true) }, []string{"a"}},
		{"rename with sync into new directories", func() error { return s.Rename(ctx, "a/f4", "b/c/d/f4", false, true) },
			[]string{"a", "b", "b/c", "b/c/d"}},
		{"fsync of a directory", func() error { return s.Fsync(ctx, "b/c", SyncData) }, []string{"b/c"}},
	}
	for _, st := range steps {
		before := len(rec.syncedDirs())
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := rec.syncedDirs()[before:]; fmt.Sprint(got) != fmt.Sprint(st.wantDirs) && len(got)+len(st.wantDirs) > 0 {
			t.Errorf("%s: synced directories %v, want %v", st.name, got, st.wantDirs)
		}
	}
	if err := s.Fsync(ctx, "nodir", SyncFull); !errors.Is(err, ErrNotFound) {
		t.Errorf("Fsync of a missing directory: %v, want %v", err, ErrNotFound)
	}
}

// TestRenameSyncsDirectoriesNotDurable: a Rename with sync syncs, beside
// the two parents, the parent of each directory up the new path that the
// store made and no sync has covered (here made by a Write without sync),
// and no other; and Close syncs the parents of the directories made by a
// Rename without sync, so that a Rename with sync after a restart may take
// every directory it did not make as durable.
func TestRenameSyncsDirectoriesNotDurable(t *testing.T) {
	ctx := context.Background()
	rec := &syncRecorder{}
	s, _ := newRecordedStore(t, rec, Options{})
	for _, name := range []string{"t", "u", "d/e/synced"} {
		if _, err := s.Write(ctx, name, 0, []byte("x"), SyncData); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Write(ctx, "d/e/n/m/unsynced", 0, []byte("x"), SyncNone); err != nil {
		t.Fatal(err)
	}
	before := len(rec.syncedDirs())
	if err := s.Rename(ctx, "t", "d/e/n/m/f", false, true); err != nil {
		t.Fatal(err)
	}
	// d and d/e are durable (d/e/synced's first sync synced them); n and
	// n/m are not: the parents of d/e/n and d/e/n/m are synced.
	if got, want := rec.syncedDirs()[before:], []string{".", "d/e", "d/e/n", "d/e/n/m"}; !slices.Equal(got, want) {
		t.Errorf("Rename with sync into a directory an unsynced Write made synced %v, want %v", got, want)
	}
	if err := s.Rename(ctx, "u", "p/q/u", false, false); err != nil {
		t.Fatal(err)
	}
	before = len(rec.syncedDirs())
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	got := rec.syncedDirs()[before:]
	for _, want := range []string{".", "p"} {
		if !slices.Contains(got, want) {
			t.Errorf("Close after a Rename without sync into p/q synced %v, want %s among them", got, want)
		}
	}
}

// TestRenameMovesPendingDirectories: a file the store created and renamed
// before its first sync has its new name made durable by that sync: the
// directories above the new name are synced, and those it left, which
// hold the create's entry and the rename's other half (store's
// TestPowerLossRenamedNewFile shows the name lost without them). Once the
// creation was durable, a Rename without sync is like any other: nothing
// of it is durable until a directory is synced.
func TestRenameMovesPendingDirectories(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		opts Options
		// before runs between the create and the Rename.
		before   func(s *Store) error
		wantDirs []string // synced by the Fsync after the Rename
	}{
		{name: "open", wantDirs: []string{".", "a", "b", "b/c"}},
		{name: "closed for room before the Rename", opts: Options{MaxOpenFiles: 1},
			before: func(s *Store) error {
				_, err := s.Write(ctx, "other", 0, []byte("x"), SyncNone) // closes a/x
				return err
			},
			wantDirs: []string{".", "a", "b", "b/c"}},
		{name: "creation already durable",
			before: func(s *Store) error { return s.Fsync(ctx, "a/x", SyncData) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &syncRecorder{}
			s, _ := newRecordedStore(t, rec, tt.opts)
			if _, err := s.Write(ctx, "a/x", 0, []byte("x"), SyncNone); err != nil {
				t.Fatal(err)
			}
			if tt.before != nil {
				if err := tt.before(s); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Rename(ctx, "a/x", "b/c/y", false, false); err != nil {
				t.Fatal(err)
			}
			before := len(rec.syncedDirs())
			if err := s.Fsync(ctx, "b/c/y", SyncData); err != nil {
				t.Fatal(err)
			}
			got := slices.Sorted(slices.Values(rec.syncedDirs()[before:]))
			if fmt.Sprint(got) != fmt.Sprint(tt.wantDirs) && len(got)+len(tt.wantDirs) > 0 {
				t.Errorf("the first sync after the Rename synced directories %v, want %v", got, tt.wantDirs)
			}
		})
	}
}

// stillCtimeFile reports one ctime for every file, as a filesystem might
// whose clock was set back between changes: the extent cache's ctime check
// cannot tell one file from another, and only what the store forgets
// keeps a removed file's state from a new file with its inode number.
type stillCtimeFile struct{ File }

const stillCtime = int64(1e9)

func (f stillCtimeFile) Stat() (FileInfo, error) {
	fi, err := f.File.Stat()
	fi.Ctime = stillCtime
	return fi, err
}

// TestRemovedFileLeavesNothingBehind: once the store removes a file's
// last name (Delete, or a Rename over it), the table keeps nothing of it:
// no extent cache entry, no failed sync, no directories to sync, also when
// the table had closed the file for room. A new file that the kernel gives
// the same inode number, created from outside with the same size, is then
// opened with its own extent map, its first sync believed, and Close
// reports nothing of the removed file. The new file's ctime is made to
// tell nothing (stillCtimeFile), so that the cache's ctime check cannot be
// what saves it.
func TestRemovedFileLeavesNothingBehind(t *testing.T) {
	ctx := context.Background()
	const size = 8192
	tests := []struct {
		name     string
		poisoned bool // d/b's last sync failed: the table keeps that, not its map
		closed   bool // d/b is closed for room before the removal
		remove   func(s *Store) error
	}{
		{"Delete of a closed file", false, true, func(s *Store) error { return s.Delete(ctx, "d/b", false) }},
		{"Rename over a closed file", false, true, func(s *Store) error { return s.Rename(ctx, "d/a", "d/b", false, false) }},
		{"Rename over an open file", false, false, func(s *Store) error { return s.Rename(ctx, "d/a", "d/b", false, false) }},
		{"Delete of a closed file whose sync failed", true, true, func(s *Store) error { return s.Delete(ctx, "d/b", false) }},
		{"Rename over a closed file whose sync failed", true, true, func(s *Store) error { return s.Rename(ctx, "d/a", "d/b", false, false) }},
		{"Rename over an open file whose sync failed", true, false, func(s *Store) error { return s.Rename(ctx, "d/a", "d/b", false, false) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := testutil.Dir(t)
			osfs, err := OpenOSFS(dir)
			if err != nil {
				t.Fatal(err)
			}
			s, err := Open(fileWrapFS{osfs, func(f File) File { return stillCtimeFile{f} }}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			closed := false
			defer func() {
				if !closed {
					s.Close()
				}
			}()
			for _, name := range []string{"d/a", "d/b"} {
				if _, err := s.Write(ctx, name, 0, make([]byte, size), SyncNone); err != nil {
					t.Fatal(err)
				}
			}
			ino, err := s.table.get(ctx, "d/b", false)
			if err != nil {
				t.Fatal(err)
			}
			id := ino.id()
			if tt.poisoned {
				ino.commit.poison()
			}
			s.table.put(ino)
			if tt.closed {
				if !closeIfIdle(s, "d/b") {
					t.Fatal("d/b is busy; nothing else runs")
				}
				cached, failed, unsynced := kept(s, id)
				if cached == tt.poisoned || failed != tt.poisoned || !unsynced {
					t.Fatalf("closed d/b left cache entry %v, failed sync %v, unsynced directories %v; want %v, %v, true",
						cached, failed, unsynced, !tt.poisoned, tt.poisoned)
				}
			}

			if err := tt.remove(s); err != nil {
				t.Fatal(err)
			}
			if cached, failed, unsynced := kept(s, id); cached || failed || unsynced {
				t.Errorf("after the removal the table keeps of d/b: cache entry %v, failed sync %v, unsynced directories %v; want none",
					cached, failed, unsynced)
			}

			reused := reuseInode(t, filepath.Join(dir, "d"), id.ino, size)
			if reused == "" {
				t.Logf("no new file got inode %d; the table's records were checked, not their effect", id.ino)
			} else {
				name := "d/" + reused
				if st, err := s.Stat(ctx, name); err != nil || st.Size != size {
					t.Fatalf("Stat(%s) = %+v, %v; want size %d", name, st, err, size)
				}
				extentsMatchFile(t, s, name)
				if err := s.Fsync(ctx, name, SyncData); err != nil {
					t.Errorf("first Fsync of the new file with inode %d: %v", id.ino, err)
				}
			}
			closed = true
			if err := s.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
}

// kept reports what the table keeps, apart from open inodes, of file id.
func kept(s *Store, id fileID) (cached, failedSync, unsyncedDirs bool) {
	t := s.table
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closedExtents.mu.Lock()
	_, cached = t.closedExtents.byID[id]
	t.closedExtents.mu.Unlock()
	_, failedSync = t.failedSync[id]
	unsyncedDirs = t.unsyncedDirs.has(id)
	return cached, failedSync, unsyncedDirs
}

// reuseInode creates files of size bytes (holes) in osDir from outside the
// store until the kernel gives one inode number ino, and returns its name,
// or "" if none did within a thousand files. ext4 hands out the lowest free
// number of the directory's group, so a number just freed comes back
// soon; tmpfs never reuses one.
func reuseInode(t *testing.T, osDir string, ino uint64, size int64) string {
	t.Helper()
	for i := range 1000 {
		name := fmt.Sprintf("new%04d", i)
		f, err := os.OpenFile(filepath.Join(osDir, name), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		err = f.Truncate(size)
		var st syscall.Stat_t
		if err == nil {
			err = syscall.Fstat(int(f.Fd()), &st)
		}
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if st.Ino == ino {
			return name
		}
	}
	return ""
}

// mkdirHold is an FS whose Mkdir of one directory, once it has made it,
// waits until release opens.
type mkdirHold struct {
	FS
	dir     string
	made    chan struct{}
	release *testutil.Gate
}

func (m *mkdirHold) Mkdir(name string, perm os.FileMode) error {
	err := m.FS.Mkdir(name, perm)
	if name == m.dir && err == nil {
		m.made <- struct{}{}
		<-m.release.Opened()
	}
	return err
}

// TestRenameSyncsADirectoryBeingMade: a directory that a create has just
// made, and not yet told the store of, is not durable either: a Rename
// with sync into it, which finds it on disk and makes nothing, syncs its
// parent. The store counts a directory as not durable from before its
// mkdir(2), not from after.
func TestRenameSyncsADirectoryBeingMade(t *testing.T) {
	ctx := context.Background()
	rec := &syncRecorder{}
	dir := testutil.Dir(t)
	osfs, err := OpenOSFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	hold := &mkdirHold{FS: osfs, dir: "n/m", made: make(chan struct{}, 1), release: testutil.NewGate(t)}
	rec.FS = hold
	s, err := Open(rec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Write(ctx, "t", 0, []byte("x"), SyncData); err != nil {
		t.Fatal(err)
	}
	created := make(chan error, 1)
	go func() {
		_, err := s.Write(ctx, "n/m/x", 0, []byte("x"), SyncNone)
		created <- err
	}()
	<-hold.made
	before := len(rec.syncedDirs())
	if err := s.Rename(ctx, "t", "n/m/f", false, true); err != nil {
		t.Fatal(err)
	}
	got := rec.syncedDirs()[before:]
	hold.release.Open()
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	if want := []string{".", "n", "n/m"}; !slices.Equal(got, want) {
		t.Errorf("Rename with sync into a directory being made synced %v, want %v", got, want)
	}
}
