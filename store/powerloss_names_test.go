//go:build linux

package store_test

// The power-loss test of names: a Rename or Delete on a store over
// store/crashfs, the power cut before each call the store makes to its FS
// while the operation runs, and after it returned, and every crashed image
// that cut can leave checked against the two states the contract allows:
// the names as they were before the operation, or as it leaves them. Once
// the operation returned OK and the contract calls it durable (sync, or an
// Fsync of the directories after it), only the second is allowed.

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store"
	"github.com/filewrite/filewrite/store/crashfs"
)

// cutFS cuts the power, through crashfs, just before the store's call
// number at (counted from arm) into the FS or one of its files.
type cutFS struct {
	store.FS
	crash *crashfs.FS

	mu    sync.Mutex
	armed bool
	calls int // since arm
	at    int // -1: never
	state *crashfs.State
	cutAt int // the call the cut came before, or -1
}

var (
	_ store.FS   = (*cutFS)(nil)
	_ store.File = (*cutFile)(nil)
)

func newCutFS(base store.FS) *cutFS {
	c := crashfs.New(base)
	return &cutFS{FS: c, crash: c, at: -1, cutAt: -1}
}

// arm starts counting calls; the cut comes before call at (-1: never).
func (f *cutFS) arm(at int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.armed, f.calls, f.at = true, 0, at
}

// tick counts a call and cuts the power before it if its number came up.
func (f *cutFS) tick() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.armed || f.state != nil {
		return
	}
	if f.calls == f.at {
		f.state, f.cutAt = f.crash.Crash(), f.calls
	}
	f.calls++
}

// cut cuts the power now if it is still on, and returns the state.
func (f *cutFS) cut() *crashfs.State {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state == nil {
		f.state = f.crash.Crash()
	}
	return f.state
}

func (f *cutFS) OpenFile(name string, flag int, perm fs.FileMode) (store.File, error) {
	f.tick()
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &cutFile{File: file, fsys: f}, nil
}
func (f *cutFS) MkdirAll(name string, perm fs.FileMode) error {
	f.tick()
	return f.FS.MkdirAll(name, perm)
}
func (f *cutFS) SyncDir(name string) error                 { f.tick(); return f.FS.SyncDir(name) }
func (f *cutFS) Mkdir(name string, perm fs.FileMode) error { f.tick(); return f.FS.Mkdir(name, perm) }
func (f *cutFS) Remove(name string) error                  { f.tick(); return f.FS.Remove(name) }
func (f *cutFS) Rename(oldName, newName string, noReplace bool) error {
	f.tick()
	return f.FS.Rename(oldName, newName, noReplace)
}
func (f *cutFS) Stat(name string) (store.FileInfo, error)  { f.tick(); return f.FS.Stat(name) }
func (f *cutFS) Lstat(name string) (store.FileInfo, error) { f.tick(); return f.FS.Lstat(name) }
func (f *cutFS) OpenDir(name string) (store.Dir, error)    { f.tick(); return f.FS.OpenDir(name) }

// cutFile counts its calls with its FS's.
type cutFile struct {
	store.File
	fsys *cutFS
}

func (f *cutFile) ReadAt(p []byte, off int64) (int, error) {
	f.fsys.tick()
	return f.File.ReadAt(p, off)
}
func (f *cutFile) WriteAt(p []byte, off int64) (int, error) {
	f.fsys.tick()
	return f.File.WriteAt(p, off)
}
func (f *cutFile) Truncate(size int64) error { f.fsys.tick(); return f.File.Truncate(size) }
func (f *cutFile) Fallocate(mode uint32, off, length int64) error {
	f.fsys.tick()
	return f.File.Fallocate(mode, off, length)
}
func (f *cutFile) Sync(mode store.SyncMode) error   { f.fsys.tick(); return f.File.Sync(mode) }
func (f *cutFile) WriteBack(off, n int64) error     { f.fsys.tick(); return f.File.WriteBack(off, n) }
func (f *cutFile) Stat() (store.FileInfo, error)    { f.fsys.tick(); return f.File.Stat() }
func (f *cutFile) Extents() ([]store.Extent, error) { f.fsys.tick(); return f.File.Extents() }

// plNameCase is one operation on names and the states it may leave.
type plNameCase struct {
	name string
	// files are written, each with SYNC_MODE_FULL (which makes its name
	// durable too), before the operation.
	files map[string]string
	// op is the operation; after is the names as it leaves them.
	op    func(ctx context.Context, s *store.Store) error
	after map[string]string
	// durable: once op returned OK, after is durable.
	durable bool
}

// renamed is files with old renamed to new.
func renamed(files map[string]string, old, new string) map[string]string {
	out := maps.Clone(files)
	out[new] = out[old]
	delete(out, old)
	return out
}

// deleted is files without name.
func deleted(files map[string]string, name string) map[string]string {
	out := maps.Clone(files)
	delete(out, name)
	return out
}

func plNameCases() []plNameCase {
	rename := func(old, new string, sync bool, thenSync ...string) func(context.Context, *store.Store) error {
		return func(ctx context.Context, s *store.Store) error {
			if err := s.Rename(ctx, old, new, false, sync); err != nil {
				return err
			}
			for _, dir := range thenSync {
				if err := s.Fsync(ctx, dir, store.SyncFull); err != nil {
					return err
				}
			}
			return nil
		}
	}
	del := func(name string, sync bool, thenSync ...string) func(context.Context, *store.Store) error {
		return func(ctx context.Context, s *store.Store) error {
			if err := s.Delete(ctx, name, sync); err != nil {
				return err
			}
			for _, dir := range thenSync {
				if err := s.Fsync(ctx, dir, store.SyncFull); err != nil {
					return err
				}
			}
			return nil
		}
	}
	over := map[string]string{"d/.f.tmp": "new content", "d/f": "old", "d/other": "o"}
	across := map[string]string{"a/t": "new content", "b/x": "x"}
	inA := map[string]string{"a/t": "new content"}
	inRoot := map[string]string{"t": "new content"}
	two := map[string]string{"d/f": "content", "d/g": "g"}
	return []plNameCase{
		{"rename over a file in its directory, sync", over,
			rename("d/.f.tmp", "d/f", true), renamed(over, "d/.f.tmp", "d/f"), true},
		{"rename between directories, sync", across,
			rename("a/t", "b/f", true), renamed(across, "a/t", "b/f"), true},
		{"rename into new directories, sync", inA,
			rename("a/t", "n/m/f", true), renamed(inA, "a/t", "n/m/f"), true},
		{"rename from the root into a new directory, sync", inRoot,
			rename("t", "n/f", true), renamed(inRoot, "t", "n/f"), true},
		{"rename between directories, no sync", across,
			rename("a/t", "b/f", false), renamed(across, "a/t", "b/f"), false},
		{"rename between directories, no sync, then Fsync of both", across,
			rename("a/t", "b/f", false, "a", "b"), renamed(across, "a/t", "b/f"), true},
		{"rename between directories, no sync, then Fsync of one", across,
			rename("a/t", "b/f", false, "b"), renamed(across, "a/t", "b/f"), false},
		{"delete, sync", two, del("d/f", true), deleted(two, "d/f"), true},
		{"delete, no sync", two, del("d/f", false), deleted(two, "d/f"), false},
		{"delete, no sync, then Fsync of the directory", two, del("d/f", false, "d"), deleted(two, "d/f"), true},
	}
}

// plNameCut is what one cut of a case left.
type plNameCut struct {
	at         int  // the call the cut came before; -1: after the operation
	acked      bool // the operation returned OK
	images     int
	before     int // images that hold the names as before the operation
	after      int // and as after it
	violations []string
}

// cutNames runs c on a fresh store, cuts the power before call at (-1:
// after c returned) and checks every image the cut can leave. It returns
// what it saw and how many calls c made before its end or the cut.
func cutNames(t *testing.T, c plNameCase, opts store.Options, at int) (plNameCut, int) {
	t.Helper()
	ctx := context.Background()
	base, err := store.OpenOSFS(testutil.Dir(t))
	if err != nil {
		t.Fatal(err)
	}
	fsys := newCutFS(base)
	s, err := store.Open(fsys, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range slices.Sorted(maps.Keys(c.files)) {
		if _, err := s.Write(ctx, name, 0, []byte(c.files[name]), store.SyncFull); err != nil {
			t.Fatalf("write %s: %v", name, err)
		}
	}
	fsys.arm(at)
	err = c.op(ctx, s)
	fsys.mu.Lock()
	calls, cutAt := fsys.calls, fsys.cutAt
	fsys.mu.Unlock()
	st := fsys.cut()
	s.Close() // fails: the disk is gone

	res := plNameCut{at: cutAt, acked: err == nil}
	want := []map[string]string{c.files, c.after}
	if res.acked && c.durable {
		want = want[1:]
	}
	for _, keep := range everySubset(st.Pieces()) {
		dir := testutil.Dir(t)
		img, werr := st.Write(dir, keep.keep)
		if werr != nil {
			t.Fatalf("cut before call %d: image %s: %v", cutAt, keep.name, werr)
		}
		got := filesIn(t, dir)
		res.images++
		if maps.Equal(got, c.files) {
			res.before++
		}
		if maps.Equal(got, c.after) {
			res.after++
		}
		if !slices.ContainsFunc(want, func(w map[string]string) bool { return maps.Equal(got, w) }) {
			when := fmt.Sprintf("cut before call %d, the operation failed (%v)", cutAt, err)
			switch {
			case cutAt < 0:
				when = "cut after the operation returned OK"
			case res.acked:
				when = fmt.Sprintf("cut before call %d, the operation returned OK", cutAt)
			}
			res.violations = append(res.violations, fmt.Sprintf("%s; image %s (%d pieces kept, %d lost) holds %q, want one of %q",
				when, keep.name, img.Kept, img.Lost, got, want))
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
	}
	return res, calls
}

// everySubset is a Keep for each subset of pieces, if there are few, else
// for none, all, each prefix and 64 random subsets.
func everySubset(pieces []crashfs.Piece) []struct {
	name string
	keep crashfs.Keep
} {
	type named = struct {
		name string
		keep crashfs.Keep
	}
	var out []named
	if len(pieces) <= 8 {
		for mask := range 1 << len(pieces) {
			kept := make(map[crashfs.Piece]bool)
			var names []string
			for i, p := range pieces {
				if mask&(1<<i) != 0 {
					kept[p] = true
					names = append(names, p.String())
				}
			}
			out = append(out, named{"keeping [" + strings.Join(names, ", ") + "]", func(p crashfs.Piece) bool { return kept[p] }})
		}
		return out
	}
	out = append(out, named{"none", crashfs.KeepNone}, named{"all", crashfs.KeepAll})
	for _, p := range pieces {
		out = append(out, named{fmt.Sprintf("before #%d", p.Seq), crashfs.KeepBefore(p.Seq)})
	}
	rng := rand.New(rand.NewPCG(uint64(len(pieces)), 1))
	for i := range 64 {
		out = append(out, named{fmt.Sprintf("random %d", i), crashfs.KeepRandom(rng, 0.5)})
	}
	return out
}

// filesIn maps each regular file below dir, by slash path, to its content.
// Directories left empty are no names and are not listed.
func filesIn(t *testing.T, dir string) map[string]string {
	t.Helper()
	got := make(map[string]string)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if rel == store.StateDir {
			return filepath.SkipDir // the store's own state
		}
		if d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(p)
		got[filepath.ToSlash(rel)] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// cutEverywhere runs c once to count its calls, then cuts before each of
// them and after the last, and returns the cuts.
func cutEverywhere(t *testing.T, c plNameCase, opts store.Options) []plNameCut {
	t.Helper()
	_, calls := cutNames(t, c, opts, -1)
	var cuts []plNameCut
	for at := 0; at <= calls; at++ {
		cut, _ := cutNames(t, c, opts, at) // at == calls: after the last
		cuts = append(cuts, cut)
	}
	return cuts
}

// TestPowerLossNames: a crash after Rename(sync) returned keeps the new
// name with the file's content and not the old; a crash before, the old
// name, or, between the rename(2) and the directory syncs, exactly one of
// the two names with the full content (never both, never neither, and the
// file it replaced is whole under the new name until the rename is). The
// same for Delete(sync): after it returned, the name is gone. Without
// sync either state may survive, until an Fsync of the directories.
func TestPowerLossNames(t *testing.T) {
	for _, fsync := range []store.FsyncMode{store.FsyncGroup, store.FsyncPerCall} {
		for _, c := range plNameCases() {
			t.Run(fsync.String()+"/"+c.name, func(t *testing.T) {
				opts := store.Options{Fsync: fsync}
				cuts := cutEverywhere(t, c, opts)
				var both, acked int
				for _, cut := range cuts {
					for _, v := range cut.violations[:min(len(cut.violations), 3)] {
						t.Error(v)
					}
					if cut.before > 0 && cut.after > 0 {
						both++ // a cut that may leave either state
					}
					if cut.acked {
						acked++
					}
				}
				// The cuts must reach both sides: before the operation
				// changes anything, and after it returned.
				if first := cuts[0]; first.acked || first.before != first.images {
					t.Errorf("the cut before the first call: acked %v, %d of %d images as before; want every image as before", first.acked, first.before, first.images)
				}
				if last := cuts[len(cuts)-1]; !last.acked {
					t.Errorf("the cut after the operation: it did not return OK")
				}
				if both == 0 {
					t.Errorf("no cut left images of both states: the window between the change and its sync was never cut")
				}
				t.Logf("%d cuts, %d after the operation returned OK, %d that may leave either state", len(cuts), acked, both)
			})
		}
	}
}

// TestPowerLossNamesCatchesSkippedSyncs: with a deliberate break that
// leaves out a directory sync of Rename or Delete with sync, the cut after
// the operation returned finds the name change lost.
func TestPowerLossNamesCatchesSkippedSyncs(t *testing.T) {
	cases := plNameCases()
	byName := func(name string) plNameCase {
		i := slices.IndexFunc(cases, func(c plNameCase) bool { return c.name == name })
		if i < 0 {
			t.Fatalf("no case %q", name)
		}
		return cases[i]
	}
	tests := []struct {
		name  string
		hooks *store.Hooks
		c     plNameCase
	}{
		{"rename syncs only the old directory", store.BrokenHooks(t, store.BreakRenameSyncsOldDirOnly), byName("rename between directories, sync")},
		{"rename syncs only the old directory, into new ones", store.BrokenHooks(t, store.BreakRenameSyncsOldDirOnly), byName("rename into new directories, sync")},
		{"delete skips its directory sync", store.BrokenHooks(t, store.BreakDeleteSkipsDirSync), byName("delete, sync")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cut, _ := cutNames(t, tt.c, store.Options{Hooks: tt.hooks}, -1)
			if !cut.acked {
				t.Fatalf("the operation failed")
			}
			if len(cut.violations) == 0 {
				t.Fatalf("no violation in %d images of the cut after the operation returned OK", cut.images)
			}
			t.Logf("caught: %s", cut.violations[0])
		})
	}
}

// TestPowerLossRenamedNewFile: a file the store created and renamed before
// its first sync has its new name, with its data, after a crash once that
// sync returned: the sync must make durable the create's entry in the old
// directory and the rename in both, not only the directories above the
// new name.
func TestPowerLossRenamedNewFile(t *testing.T) {
	for _, to := range []string{"a/y", "b/y", "n/m/y"} {
		t.Run(to, func(t *testing.T) {
			c := plNameCase{
				name:  "create, rename, fsync",
				files: map[string]string{"keep": "k"},
				op: func(ctx context.Context, s *store.Store) error {
					if _, err := s.Write(ctx, "a/x", 0, []byte("data"), store.SyncNone); err != nil {
						return err
					}
					if err := s.Rename(ctx, "a/x", to, false, false); err != nil {
						return err
					}
					return s.Fsync(ctx, to, store.SyncData)
				},
				after:   map[string]string{"keep": "k", to: "data"},
				durable: true,
			}
			res, _ := cutNames(t, c, store.Options{}, -1)
			if !res.acked {
				t.Fatalf("the operation failed")
			}
			for _, v := range res.violations[:min(len(res.violations), 3)] {
				t.Error(v)
			}
		})
	}
}

// TestPowerLossEmptySyncedWrite: a Write of no bytes with SyncData or
// SyncFull syncs like any synced write: once it returned, a crash keeps
// the file it created with every directory above it, and what was written
// to the file before. It once returned before any sync. The same for a
// stream's write (Handle.Write, then Wait).
func TestPowerLossEmptySyncedWrite(t *testing.T) {
	ctx := context.Background()
	write := func(s *store.Store, name string, off int64, data []byte, sync store.SyncMode) error {
		_, err := s.Write(ctx, name, off, data, sync)
		return err
	}
	streamWrite := func(s *store.Store, name string, off int64, data []byte, sync store.SyncMode) error {
		hd, err := s.OpenHandle(ctx, name, store.OpenCreate)
		if err != nil {
			return err
		}
		defer hd.Close()
		w, err := hd.Write(ctx, off, data, sync)
		if err != nil {
			return err
		}
		return hd.Wait(ctx, w)
	}
	for _, how := range []struct {
		name  string
		write func(s *store.Store, name string, off int64, data []byte, sync store.SyncMode) error
	}{{"Write", write}, {"stream", streamWrite}} {
		for _, sync := range []store.SyncMode{store.SyncData, store.SyncFull} {
			for _, tt := range []struct {
				name string
				// before runs first, unsynced; then the empty synced write
				// of path.
				before func(s *store.Store) error
				path   string
				want   map[string]string
			}{
				{"new file in new directories", nil, "n/m/f", map[string]string{"n/m/f": ""}},
				{"file written unsynced before", func(s *store.Store) error {
					return write(s, "d/f", 0, []byte("data"), store.SyncNone)
				}, "d/f", map[string]string{"d/f": "data"}},
			} {
				t.Run(how.name+"/"+sync.String()+"/"+tt.name, func(t *testing.T) {
					base, err := store.OpenOSFS(testutil.Dir(t))
					if err != nil {
						t.Fatal(err)
					}
					fsys := crashfs.New(base)
					s, err := store.Open(fsys, store.Options{})
					if err != nil {
						t.Fatal(err)
					}
					defer s.Close()
					if tt.before != nil {
						if err := tt.before(s); err != nil {
							t.Fatal(err)
						}
					}
					if err := how.write(s, tt.path, 4, nil, sync); err != nil {
						t.Fatal(err)
					}
					dir := testutil.Dir(t)
					if _, err := fsys.Crash().Write(dir, crashfs.KeepNone); err != nil {
						t.Fatal(err)
					}
					if got := filesIn(t, dir); !maps.Equal(got, tt.want) {
						t.Errorf("after the empty synced write returned, a crash left %q, want %q", got, tt.want)
					}
				})
			}
		}
	}
}

// TestPowerLossRenameIntoUnsyncedDirectory: a Rename with sync into a
// directory that an earlier Write made and no sync has made durable yet
// keeps the new name after a crash: the Rename syncs every directory up
// the new name's path, not only its two parents (and those it made), whose
// syncs alone leave the directory's own entry, and with it the file, to
// the filesystem's ordering of metadata writes. The crash is on crashfs
// with and without that ordering.
func TestPowerLossRenameIntoUnsyncedDirectory(t *testing.T) {
	ctx := context.Background()
	for _, fsName := range []string{"ordered", "unordered"} {
		for _, to := range []string{"n/m/f", "n/m/k/f"} {
			t.Run(fsName+"/"+to, func(t *testing.T) {
				base, err := store.OpenOSFS(testutil.Dir(t))
				if err != nil {
					t.Fatal(err)
				}
				fsys := crashfs.New(base)
				if fsName == "unordered" {
					fsys = crashfs.NewUnordered(base)
				}
				s, err := store.Open(fsys, store.Options{})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				if _, err := s.Write(ctx, "t", 0, []byte("content"), store.SyncFull); err != nil {
					t.Fatal(err)
				}
				// Makes n and n/m, whose entries no sync covers.
				if _, err := s.Write(ctx, "n/m/other", 0, []byte("o"), store.SyncNone); err != nil {
					t.Fatal(err)
				}
				if err := s.Rename(ctx, "t", to, false, true); err != nil {
					t.Fatal(err)
				}
				st := fsys.Crash()
				for _, keep := range everySubset(st.Pieces()) {
					dir := testutil.Dir(t)
					if _, err := st.Write(dir, keep.keep); err != nil {
						t.Fatal(err)
					}
					got := filesIn(t, dir)
					if _, old := got["t"]; got[to] != "content" || old {
						t.Errorf("after Rename(t, %s) with sync returned, image %s holds %q; want %s with the content and no t", to, keep.name, got, to)
					}
				}
			})
		}
	}
}
