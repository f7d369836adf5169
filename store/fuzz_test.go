package store

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzValidatePath checks validatePath against properties stated without
// its code: an accepted path is local to the root by the standard
// library's own rule (filepath.IsLocal), is its own clean form (so one file
// has one key in the inode table), has no NUL and fits in MaxPathLen; a
// refused one is refused with ErrInvalidPath or ErrPathTooLong and
// nothing else. The seeds run as an ordinary test; `go test -fuzz
// FuzzValidatePath ./store` explores further.
func FuzzValidatePath(f *testing.F) {
	for _, seed := range []string{
		"a", "a/b", "a/b/c.bin", "..a", "a..", "a/..b", ".hidden", "dir/.x",
		"", ".", "..", "/", "/abs", "../x", "a/..", "a/../b", "a/./b", "./a",
		"a/", "a//b", "a\x00b", "\x00", "a/b/", "..\\x", "C:\\x", "a\\..\\b",
		"con", "nul", " ", "a /b", "\xff\xfe", strings.Repeat("a", MaxPathLen),
		strings.Repeat("a", MaxPathLen+1), strings.Repeat("ab/", 2000),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, name string) {
		err := validatePath(name)
		if err != nil {
			if !errors.Is(err, ErrInvalidPath) && !errors.Is(err, ErrPathTooLong) {
				t.Fatalf("validatePath(%q) = %v, want ErrInvalidPath or ErrPathTooLong", name, err)
			}
			if errors.Is(err, ErrPathTooLong) != (len(name) > MaxPathLen) {
				t.Fatalf("validatePath(%q) = %v for a %d-byte path (limit %d)", name, err, len(name), MaxPathLen)
			}
			return
		}
		switch {
		case !filepath.IsLocal(name):
			t.Fatalf("validatePath(%q) accepted a path that is not local to the root", name)
		case filepath.Clean(name) != name:
			t.Fatalf("validatePath(%q) accepted a path that is not clean (%q)", name, filepath.Clean(name))
		case name == "." || strings.HasSuffix(name, "/"):
			t.Fatalf("validatePath(%q) accepted a name for a directory", name)
		case strings.IndexByte(name, 0) >= 0:
			t.Fatalf("validatePath(%q) accepted a NUL byte", name)
		case len(name) > MaxPathLen:
			t.Fatalf("validatePath(%q) accepted %d bytes, over MaxPathLen", name, len(name))
		}
		for _, elem := range strings.Split(name, "/") {
			if elem == ".." || elem == "." || elem == "" {
				t.Fatalf("validatePath(%q) accepted the element %q", name, elem)
			}
		}
	})
}
