//go:build linux

package store

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestBadPathsFromTheFilesystem: paths that validatePath cannot judge
// alone, because they depend on what is on disk or on the filesystem's own
// limits, are refused as bad paths rather than as I/O errors, and create
// nothing.
func TestBadPathsFromTheFilesystem(t *testing.T) {
	s, dir := newTestStore(t, Options{})
	if err := os.WriteFile(filepath.Join(dir, "file"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		path string
		want error
	}{
		{"a file as a parent", "file/child", ErrInvalidPath},
		{"a file as a grandparent", "file/a/b", ErrInvalidPath},
		{"an element over NAME_MAX", strings.Repeat("n", 256), ErrPathTooLong},
		{"a directory element over NAME_MAX", strings.Repeat("d", 256) + "/f", ErrPathTooLong},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Write(t.Context(), tt.path, 0, []byte("x"), SyncNone)
			if !errors.Is(err, tt.want) {
				t.Errorf("Write(%q) = %v, want %v", tt.path, err, tt.want)
			}
			entries, err := os.ReadDir(dir)
			entries = slices.DeleteFunc(entries, func(e os.DirEntry) bool { return e.Name() == StateDir })
			if err != nil || len(entries) != 1 {
				t.Errorf("the root holds %d entries (%v) after a refused write, want only the file", len(entries), err)
			}
		})
	}
}
