//go:build linux

package store

import (
	"os"
	"path/filepath"
	"testing"
)

// testDir returns a fresh directory next to the package source and removes
// it when the test ends. It is not under os.TempDir because /tmp may be
// tmpfs, where FIEMAP, O_DIRECT and unwritten extents behave differently
// from the filesystem the store is meant to run on. The path is absolute so
// that it survives a t.Chdir.
func testDir(t testing.TB) string {
	t.Helper()
	base, err := filepath.Abs(".")
	if err != nil {
		t.Fatalf("package directory: %v", err)
	}
	dir, err := os.MkdirTemp(base, "testdata-tmp-")
	if err != nil {
		t.Fatalf("create test directory: %v", err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove test directory: %v", err)
		}
	})
	return dir
}
