//go:build linux

package store

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// longestElement is the length in bytes of name's longest element.
func longestElement(name string) int {
	n := 0
	for elem := range strings.SplitSeq(name, "/") {
		n = max(n, len(elem))
	}
	return n
}

// FuzzValidatePath checks validatePath against properties stated without
// its code: an accepted path is local to the root by the standard
// library's own rule (filepath.IsLocal), is its own clean form (so one file
// has one key in the inode table), has no NUL, is valid UTF-8 and fits in
// MaxPathLen with no element over MaxNameLen; a refused one is refused with
// ErrInvalidPath or ErrPathTooLong and nothing else, ErrPathTooLong only
// for a path or element over its limit. The seeds run as an ordinary test; `go test -fuzz
// FuzzValidatePath ./store` explores further.
func FuzzValidatePath(f *testing.F) {
	for _, seed := range []string{
		"a", "a/b", "a/b/c.bin", "..a", "a..", "a/..b", ".hidden", "dir/.x",
		"", ".", "..", "/", "/abs", "../x", "a/..", "a/../b", "a/./b", "./a",
		"a/", "a//b", "a\x00b", "\x00", "a/b/", "..\\x", "C:\\x", "a\\..\\b",
		"con", "nul", " ", "a /b", "\xff\xfe", "a/\xc3", strings.Repeat("a", MaxNameLen),
		strings.Repeat("a", MaxNameLen+1), "d/" + strings.Repeat("é", 128), strings.Repeat("a", MaxPathLen),
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
			tooLong := len(name) > MaxPathLen || longestElement(name) > MaxNameLen
			if errors.Is(err, ErrPathTooLong) != tooLong && (!tooLong || len(name) > MaxPathLen) {
				// Too long is the verdict exactly for a path or element
				// over its limit, except that an element over MaxNameLen
				// may be refused first for another reason.
				t.Fatalf("validatePath(%.64q...) = %v for a %d-byte path with a %d-byte element (limits %d, %d)",
					name, err, len(name), longestElement(name), MaxPathLen, MaxNameLen)
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
		case longestElement(name) > MaxNameLen:
			t.Fatalf("validatePath(%q) accepted an element of %d bytes, over MaxNameLen", name, longestElement(name))
		case !utf8.ValidString(name):
			t.Fatalf("validatePath(%q) accepted invalid UTF-8", name)
		}
		for _, elem := range strings.Split(name, "/") {
			if elem == ".." || elem == "." || elem == "" {
				t.Fatalf("validatePath(%q) accepted the element %q", name, elem)
			}
		}
	})
}
