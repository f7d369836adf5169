//go:build linux

package store

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryFileSaysLinux: every Go file of the package but doc.go and
// unsupported_other.go builds on Linux only (and perhaps under another tag
// too), so that elsewhere the build
// stops at unsupported_other.go's one clear message instead of at whatever
// Linux-only name it meets first.
func TestEveryFileSaysLinux(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		if name == "doc.go" || name == "unsupported_other.go" || strings.HasSuffix(name, "_linux.go") || strings.HasSuffix(name, "_linux_test.go") {
			continue
		}
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		first, _ := bufio.NewReader(f).ReadString('\n')
		f.Close()
		// A file of the invariants build (invariants_test.go) adds its
		// tag after linux.
		got, want := strings.TrimSpace(first), "//go:build linux"
		if got != want && !strings.HasPrefix(got, want+" && ") {
			t.Errorf("%s starts with %q, want %q (or a _linux.go name)", name, got, want)
		}
	}
}
