package testutil

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"testing"
)

// Entry is what a rejected request must leave as it was: type and mode,
// size, contents of regular files, targets of symlinks.
type Entry struct {
	Mode fs.FileMode
	size int64
	Data []byte
	link string
}

// Snapshot describes every entry below dir, symlinks not followed.
func Snapshot(t testing.TB, dir string) map[string]Entry {
	t.Helper()
	out := map[string]Entry{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		e := Entry{Mode: fi.Mode()}
		switch {
		case fi.Mode().IsRegular():
			e.size = fi.Size()
			if e.Data, err = os.ReadFile(path); err != nil {
				return err
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			if e.link, err = os.Readlink(path); err != nil {
				return err
			}
		}
		rel, _ := filepath.Rel(dir, path)
		out[rel] = e
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot %s: %v", dir, err)
	}
	return out
}

// CheckUnchanged fails the test if anything below dir differs from before.
func CheckUnchanged(t testing.TB, dir string, before map[string]Entry) {
	t.Helper()
	after := Snapshot(t, dir)
	var names []string
	for name := range before {
		names = append(names, name)
	}
	for name := range after {
		if _, ok := before[name]; !ok {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		b, inBefore := before[name]
		a, inAfter := after[name]
		switch {
		case !inBefore:
			t.Errorf("%s: created by a rejected request (mode %v, size %d)", name, a.Mode, a.size)
		case !inAfter:
			t.Errorf("%s: removed by a rejected request", name)
		case a.Mode != b.Mode || a.size != b.size || a.link != b.link:
			t.Errorf("%s: changed by a rejected request: mode %v size %d link %q, want mode %v size %d link %q",
				name, a.Mode, a.size, a.link, b.Mode, b.size, b.link)
		case !bytes.Equal(a.Data, b.Data):
			t.Errorf("%s: contents changed by a rejected request", name)
		}
	}
}
