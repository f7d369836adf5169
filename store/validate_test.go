//go:build linux

package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

// treeEntry is what a rejected request must leave as it was: the kind of
// each entry, its permissions, and a file's content or a symlink's target.
type treeEntry struct {
	mode    fs.FileMode
	content string // regular files
	target  string // symlinks
}

// snapshotTree records every entry below dir without following symlinks,
// but for the store's own state (StateDir at the root).
func snapshotTree(t *testing.T, dir string) map[string]treeEntry {
	t.Helper()
	tree := make(map[string]treeEntry)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if rel == StateDir {
			return filepath.SkipDir
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		e := treeEntry{mode: info.Mode()}
		switch {
		case info.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			e.content = string(b)
		case info.Mode()&fs.ModeSymlink != 0:
			if e.target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		tree[rel] = e
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot %s: %v", dir, err)
	}
	return tree
}

// treeDiff describes how two snapshots differ, or returns "".
func treeDiff(before, after map[string]treeEntry) string {
	var diffs []string
	for p, b := range before {
		a, ok := after[p]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%s removed", p))
		case a.mode != b.mode:
			diffs = append(diffs, fmt.Sprintf("%s mode %v, was %v", p, a.mode, b.mode))
		case a.content != b.content:
			diffs = append(diffs, fmt.Sprintf("%s content changed: %d bytes, was %d", p, len(a.content), len(b.content)))
		case a.target != b.target:
			diffs = append(diffs, fmt.Sprintf("%s now points to %q, was %q", p, a.target, b.target))
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s created", p))
		}
	}
	sort.Strings(diffs)
	return strings.Join(diffs, "; ")
}

// validationFixture is a store whose root sits next to a directory it must
// never reach:
//
//	base/outside/secret, base/outside/sub/
//	base/root/f, base/root/dir/inner, and symlinks in base/root that lead
//	out of it: absolute and relative, to a file, to a directory and to a
//	file that does not exist yet.
func validationFixture(t *testing.T, opts Options) (s *Store, base string) {
	t.Helper()
	base = testutil.Dir(t)
	root := filepath.Join(base, "root")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(root, "dir"), filepath.Join(outside, "sub")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for p, content := range map[string]string{
		filepath.Join(root, "f"):             "file in the root",
		filepath.Join(root, "dir", "inner"):  "file in a directory",
		filepath.Join(outside, "secret"):     "must not change",
		filepath.Join(outside, "sub", "doc"): "must not change either",
	} {
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, target := range map[string]string{
		"esc-abs":         filepath.Join(outside, "secret"),
		"esc-rel":         "../outside/secret",
		"esc-dir-abs":     outside,
		"esc-dir-rel":     "../outside",
		"esc-new-abs":     filepath.Join(outside, "new"),
		"esc-new-rel":     "../outside/new",
		"dir/esc-up-rel":  "../../outside/secret",
		"esc-via-dir-rel": "dir/../../outside/secret",
	} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	fsys, err := OpenOSFS(root)
	if err != nil {
		t.Fatal(err)
	}
	s, err = Open(fsys, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s, base
}

// pathOp is one operation of the store applied to a path with arguments
// that are valid in themselves.
type pathOp struct {
	name string
	do   func(ctx context.Context, s *Store, path string) error
}

var pathOps = []pathOp{
	{"Write", func(ctx context.Context, s *Store, p string) error {
		_, err := s.Write(ctx, p, 0, []byte("overwritten"), SyncData)
		return err
	}},
	{"Read", func(ctx context.Context, s *Store, p string) error {
		_, err := s.Read(ctx, p, 0, 16)
		return err
	}},
	{"Truncate", func(ctx context.Context, s *Store, p string) error { return s.Truncate(ctx, p, 1) }},
	{"Fallocate", func(ctx context.Context, s *Store, p string) error {
		_, err := s.Fallocate(ctx, p, FallocAllocate, 0, 1<<20)
		return err
	}},
	{"FallocatePunch", func(ctx context.Context, s *Store, p string) error {
		_, err := s.Fallocate(ctx, p, FallocPunchHole, 0, 4096)
		return err
	}},
	{"Stat", func(ctx context.Context, s *Store, p string) error {
		_, err := s.Stat(ctx, p)
		return err
	}},
	{"Extents", func(ctx context.Context, s *Store, p string) error {
		_, err := s.Extents(ctx, p, 0, 0)
		return err
	}},
	{"Fsync", func(ctx context.Context, s *Store, p string) error { return s.Fsync(ctx, p, SyncFull) }},
}

// rejectCase is one request that must fail with want and change nothing.
type rejectCase struct {
	name    string
	do      func(ctx context.Context, s *Store) error
	want    error
	message string // a substring the error must contain, if not ""
}

// checkRejected runs each case against s and checks its error and that the
// tree below base is exactly as it was before the request.
func checkRejected(t *testing.T, s *Store, base string, cases []rejectCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := snapshotTree(t, base)
			err := tc.do(context.Background(), s)
			if !errors.Is(err, tc.want) {
				t.Errorf("got error %v, want %v", err, tc.want)
			}
			if err != nil && tc.message != "" && !strings.Contains(err.Error(), tc.message) {
				t.Errorf("error %q does not say %q", err, tc.message)
			}
			if d := treeDiff(before, snapshotTree(t, base)); d != "" {
				t.Errorf("the rejected request changed the tree: %s", d)
			}
		})
	}
}

// forEveryOp expands paths × pathOps into cases that all want want.
func forEveryOp(paths map[string]string, want error) []rejectCase {
	var cases []rejectCase
	for label, p := range paths {
		for _, op := range pathOps {
			cases = append(cases, rejectCase{
				name: op.name + "/" + label,
				do:   func(ctx context.Context, s *Store) error { return op.do(ctx, s, p) },
				want: want,
			})
		}
	}
	sort.Slice(cases, func(i, j int) bool { return cases[i].name < cases[j].name })
	return cases
}

// TestValidatePaths: malformed paths are refused by every operation before
// anything is touched.
func TestValidatePaths(t *testing.T) {
	s, base := validationFixture(t, Options{})
	checkRejected(t, s, base, forEveryOp(map[string]string{
		"empty":            "",
		"absolute":         "/f",
		"absolute-outside": filepath.Join(base, "outside", "secret"),
		"dotdot":           "..",
		"dotdot-outside":   "../outside/secret",
		"dotdot-inside":    "dir/../f",
		"dot-prefix":       "./f",
		"dot-inside":       "dir/./inner",
		"double-slash":     "dir//inner",
		"trailing-slash":   "dir/inner/",
		"nul":              "f\x00x",
		"root-itself":      ".",
		"state-dir":        ".filewrite",
		"in-state-dir":     ".filewrite/appends.1",
	}, ErrInvalidPath))
	checkRejected(t, s, base, forEveryOp(map[string]string{
		"5000-bytes": strings.Repeat("a/", 2499) + "aa",
	}, ErrPathTooLong))
	// A path of exactly MaxPathLen bytes is not too long: it gets past
	// validation and fails only because it does not exist.
	checkRejected(t, s, base, []rejectCase{{
		name: "Stat/4096-bytes",
		do: func(ctx context.Context, s *Store) error {
			_, err := s.Stat(ctx, strings.Repeat("a/", MaxPathLen/2-1)+"aa")
			return err
		},
		want: ErrNotFound,
	}})
}

// TestValidateEscapes: symlinks inside the root that lead out of it, by an
// absolute or a relative target, to a file, through a directory, or to a
// file that does not exist yet, are refused by every operation, and nothing
// inside or outside the root is created or changed.
func TestValidateEscapes(t *testing.T) {
	s, base := validationFixture(t, Options{})
	checkRejected(t, s, base, forEveryOp(map[string]string{
		"abs-file":           "esc-abs",
		"rel-file":           "esc-rel",
		"abs-dir":            "esc-dir-abs/secret",
		"rel-dir":            "esc-dir-rel/secret",
		"abs-dir-new-file":   "esc-dir-abs/new",
		"rel-dir-new-parent": "esc-dir-rel/newdir/new",
		"abs-dir-sub":        "esc-dir-abs/sub/doc",
		"abs-missing":        "esc-new-abs",
		"rel-missing":        "esc-new-rel",
		"from-subdirectory":  "dir/esc-up-rel",
		"through-dir-dotdot": "esc-via-dir-rel",
	}, ErrPathEscapes))
}

// TestValidateKinds: files that are missing (for the operations that do
// not create) or are not regular files.
func TestValidateKinds(t *testing.T) {
	s, base := validationFixture(t, Options{})
	var cases []rejectCase
	for _, op := range pathOps {
		if op.name != "Fsync" { // Fsync of a directory syncs it: TestNamespaceSyncs
			cases = append(cases, rejectCase{
				name: op.name + "/directory",
				do:   func(ctx context.Context, s *Store) error { return op.do(ctx, s, "dir") },
				want: ErrIsDirectory,
			})
		}
		cases = append(cases, rejectCase{
			name: op.name + "/parent-is-a-file",
			do:   func(ctx context.Context, s *Store) error { return op.do(ctx, s, "f/x") },
			want: ErrInvalidPath,
		})
		switch op.name {
		case "Read", "Stat", "Extents", "Fsync":
			for _, p := range []string{"missing", "missingdir/missing", "dir/missing"} {
				cases = append(cases, rejectCase{
					name: op.name + "/" + p,
					do:   func(ctx context.Context, s *Store) error { return op.do(ctx, s, p) },
					want: ErrNotFound,
				})
			}
		}
	}
	checkRejected(t, s, base, cases)
}

// TestValidateArguments: offsets, lengths, sizes and modes, against limits
// small enough to reach.
func TestValidateArguments(t *testing.T) {
	const maxFile, maxRequest = 1 << 20, 64 << 10
	s, base := validationFixture(t, Options{MaxFileSize: maxFile, MaxRequestBytes: maxRequest})
	const limitMsg = "1048576"
	write := func(p string, off int64, n int, sync SyncMode) func(ctx context.Context, s *Store) error {
		return func(ctx context.Context, s *Store) error {
			_, err := s.Write(ctx, p, off, make([]byte, n), sync)
			return err
		}
	}
	read := func(off, n int64) func(ctx context.Context, s *Store) error {
		return func(ctx context.Context, s *Store) error {
			_, err := s.Read(ctx, "f", off, n)
			return err
		}
	}
	falloc := func(p string, mode FallocateMode, off, n int64) func(ctx context.Context, s *Store) error {
		return func(ctx context.Context, s *Store) error {
			_, err := s.Fallocate(ctx, p, mode, off, n)
			return err
		}
	}
	truncate := func(p string, size int64) func(ctx context.Context, s *Store) error {
		return func(ctx context.Context, s *Store) error { return s.Truncate(ctx, p, size) }
	}
	extents := func(off, n int64) func(ctx context.Context, s *Store) error {
		return func(ctx context.Context, s *Store) error {
			_, err := s.Extents(ctx, "f", off, n)
			return err
		}
	}
	checkRejected(t, s, base, []rejectCase{
		{"Write/negative-offset", write("f", -1, 1, SyncNone), ErrInvalidOffset, ""},
		{"Write/new-file-negative-offset", write("new", -1, 1, SyncNone), ErrInvalidOffset, ""},
		{"Write/overflow", write("f", math.MaxInt64, 2, SyncNone), ErrInvalidOffset, ""},
		{"Write/past-max-file-size", write("f", maxFile-1, 2, SyncNone), ErrFileTooLarge, limitMsg},
		{"Write/new-file-past-max-file-size", write("newdir/new", maxFile, 1, SyncNone), ErrFileTooLarge, limitMsg},
		{"Write/longer-than-max-io", write("f", 0, maxRequest+1, SyncNone), ErrRequestTooLarge, "65536"},
		{"Write/sync-mode-3", write("f", 0, 1, SyncMode(3)), ErrInvalidMode, ""},
		{"Write/sync-mode-negative", write("new", 0, 1, SyncMode(-1)), ErrInvalidMode, ""},

		{"Read/negative-offset", read(-1, 1), ErrInvalidOffset, ""},
		{"Read/negative-length", read(0, -1), ErrInvalidOffset, ""},
		{"Read/overflow", read(math.MaxInt64-1, 10), ErrInvalidOffset, ""},
		{"Read/longer-than-max-io", read(0, maxRequest+1), ErrRequestTooLarge, "65536"},

		{"Truncate/negative-size", truncate("f", -1), ErrInvalidOffset, ""},
		{"Truncate/past-max-file-size", truncate("f", maxFile+1), ErrFileTooLarge, limitMsg},
		{"Truncate/new-file-past-max-file-size", truncate("new", math.MaxInt64), ErrFileTooLarge, limitMsg},

		{"Fallocate/negative-offset", falloc("f", FallocAllocate, -1, 4096), ErrInvalidOffset, ""},
		{"Fallocate/negative-length", falloc("f", FallocAllocate, 0, -4096), ErrInvalidOffset, ""},
		{"Fallocate/zero-length", falloc("f", FallocAllocate, 0, 0), ErrInvalidOffset, ""},
		{"Fallocate/new-file-zero-length", falloc("new", FallocKeepSize, 0, 0), ErrInvalidOffset, ""},
		{"Fallocate/overflow", falloc("f", FallocKeepSize, math.MaxInt64, 1), ErrInvalidOffset, ""},
		{"Fallocate/past-max-file-size", falloc("f", FallocAllocate, maxFile-4096, 8192), ErrFileTooLarge, limitMsg},
		{"Fallocate/keep-size-past-max-file-size", falloc("new", FallocKeepSize, maxFile, 4096), ErrFileTooLarge, limitMsg},
		{"Fsync/sync-none", func(ctx context.Context, s *Store) error { return s.Fsync(ctx, "f", SyncNone) }, ErrInvalidMode, ""},
		{"Fsync/sync-mode-3", func(ctx context.Context, s *Store) error { return s.Fsync(ctx, "f", SyncMode(3)) }, ErrInvalidMode, ""},
		{"Fallocate/mode-0", falloc("f", FallocateMode(0), 0, 4096), ErrInvalidMode, ""},
		{"Fallocate/mode-5", falloc("new", FallocateMode(5), 0, 4096), ErrInvalidMode, ""},

		{"Extents/negative-offset", extents(-1, 1), ErrInvalidOffset, ""},
		{"Extents/negative-length", extents(0, -1), ErrInvalidOffset, ""},
		{"Extents/overflow", extents(math.MaxInt64, 1), ErrInvalidOffset, ""},
	})
	// The limits are inclusive: a request that reaches them exactly is
	// accepted.
	ctx := context.Background()
	if _, err := s.Write(ctx, "f", maxFile-1, []byte{1}, SyncNone); err != nil {
		t.Errorf("Write ending at the maximum file size: %v", err)
	}
	if _, err := s.Read(ctx, "f", 0, maxRequest); err != nil {
		t.Errorf("Read of MaxRequestBytes: %v", err)
	}
	if _, err := s.Write(ctx, "f", 0, make([]byte, maxRequest), SyncNone); err != nil {
		t.Errorf("Write of MaxRequestBytes: %v", err)
	}
	if err := s.Truncate(ctx, "f", maxFile); err != nil {
		t.Errorf("Truncate to the maximum file size: %v", err)
	}
	if got := readFile(t, filepath.Join(base, "root"), "f"); int64(len(got)) != maxFile || !bytes.Equal(got[:maxRequest], make([]byte, maxRequest)) {
		t.Errorf("f after the accepted requests: %d bytes, want %d of zeros first", len(got), maxFile)
	}
}

// TestHardLinkOutOfTheRootIsServed pins a documented limit (docs/guarantees.md,
// "What it does not promise"): a hard link in the root to a file outside it is
// that file, not a pointer to it, and the store serves it like any other
// name. Symlinks out of the root are refused (TestValidateEscapes) because
// a symlink can be read; a hard link cannot be told from the file's first
// name, and the store supports hard links inside the root
// (TestInodeTableAliases), so refusing every file with several links
// would refuse those too.
func TestHardLinkOutOfTheRootIsServed(t *testing.T) {
	s, base := validationFixture(t, Options{})
	if err := os.Link(filepath.Join(base, "outside", "secret"), filepath.Join(base, "root", "hard")); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if got, err := s.Read(ctx, "hard", 0, 64); err != nil || string(got) != "must not change" {
		t.Errorf("Read through the hard link = %q, %v; want the outside file's contents", got, err)
	}
	if _, err := s.Write(ctx, "hard", 0, []byte("MUST"), SyncData); err != nil {
		t.Fatalf("Write through the hard link: %v", err)
	}
	if got := readFile(t, filepath.Join(base, "outside"), "secret"); string(got) != "MUST not change" {
		t.Errorf("the outside file after a Write through the hard link = %q, want \"MUST not change\"", got)
	}
}

// TestStateDirUnreachable: no operation reaches StateDir at the root,
// where the store keeps its append-ID journal, and List of the root leaves
// it out; a directory of that name below the root is a name like any
// other.
func TestStateDirUnreachable(t *testing.T) {
	ctx := context.Background()
	s, dir := newTestStore(t, Options{})
	if err := os.MkdirAll(filepath.Join(dir, StateDir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, StateDir, "f"), []byte("state"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write(ctx, "a/"+StateDir+"/f", 0, []byte("x"), SyncNone); err != nil {
		t.Fatalf("Write below a directory named %s: %v, want nil", StateDir, err)
	}
	for _, tc := range []struct {
		name string
		do   func() error
	}{
		{"Append", func() error {
			_, err := s.Append(ctx, StateDir+"/f", []byte("x"), SyncNone, AppendOptions{})
			return err
		}},
		{"Delete", func() error { return s.Delete(ctx, StateDir+"/f", false) }},
		{"Rename from", func() error { return s.Rename(ctx, StateDir+"/f", "g", false, false) }},
		{"Rename to", func() error { return s.Rename(ctx, "a/"+StateDir+"/f", StateDir+"/g", false, false) }},
		{"Rename the directory", func() error { return s.Rename(ctx, StateDir, "g", false, false) }},
		{"List", func() error { _, _, err := s.List(ctx, StateDir, 0, ""); return err }},
		{"Stat", func() error { _, err := s.Stat(ctx, StateDir); return err }},
	} {
		if err := tc.do(); !errors.Is(err, ErrInvalidPath) || !strings.Contains(err.Error(), StateDir) {
			t.Errorf("%s: got %v, want ErrInvalidPath naming %s", tc.name, err, StateDir)
		}
	}
	got, _ := listAll(t, s, "", 0)
	if want := []DirEntry{{Name: "a", IsDir: true}}; !slices.Equal(got, want) {
		t.Errorf("List of the root: got %+v, want %+v", got, want)
	}
	got, _ = listAll(t, s, "a", 0)
	if want := []DirEntry{{Name: StateDir, IsDir: true}}; !slices.Equal(got, want) {
		t.Errorf("List(a): got %+v, want %+v", got, want)
	}
	if b, err := os.ReadFile(filepath.Join(dir, StateDir, "f")); err != nil || string(b) != "state" {
		t.Errorf("the state file: %q, %v, want it untouched", b, err)
	}
}
