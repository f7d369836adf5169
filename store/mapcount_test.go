//go:build linux

package store

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

// fileMappings counts the process's mappings (the lines of
// /proc/self/maps, each a VMA that counts against vm.max_map_count) of
// files below dir.
func fileMappings(t *testing.T, dir string) int {
	t.Helper()
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.Contains(sc.Text(), " "+real+"/") {
			n++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// growForMappings writes file name as a writer that grows many files
// while it overwrites them does: one byte at 0, then for each length L
// from 64 KiB to 64 MiB, doubling, one byte at L (the file grows) and one
// over the byte written at L/2 (an overwrite of a written block that is not
// the last page: with every region hot, it goes through the mapping, which
// must grow with the file).
func growForMappings(t *testing.T, s *Store, name string) {
	t.Helper()
	ctx := context.Background()
	if _, err := s.Write(ctx, name, 0, []byte{1}, SyncNone); err != nil {
		t.Fatal(err)
	}
	for l := int64(64 << 10); l <= 64<<20; l *= 2 {
		if _, err := s.Write(ctx, name, l, []byte{2}, SyncNone); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write(ctx, name, l/2, []byte{3}, SyncNone); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMappingsBounded: a store's file mappings, each a VMA of the process,
// stay below its bound on their number however many files are written
// and grown, and a file that grows keeps no mapping behind per doubling:
// vm.max_map_count is finite, and a process that reaches it dies the next
// time the Go runtime maps memory.
func TestMappingsBounded(t *testing.T) {
	tests := []struct {
		name  string
		files int
		// limit is the bound on mappings (Hooks.maxMappings), 0 for the
		// process's own.
		limit int64
		// most is the most mappings of the test's files wanted.
		most int
	}{
		{"under a small bound", 600, 100, 100},
		// The current mapping, and the one it replaced until the next
		// write that waits for the writes in flight.
		{"growth leaves no mapping behind", 300, 0, 2 * 300},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c mappedCounter
			hooks := c.hooks(true)
			hooks.maxMappings = tt.limit
			dir := testutil.Dir(t)
			s := openStore(t, dir, Options{MaxOpenFiles: tt.files + 16, Hooks: hooks})
			mapped := 0
			for i := range tt.files {
				name := fmt.Sprintf("f%04d", i)
				growForMappings(t, s, name)
				if c.count(name) > 0 {
					mapped++
				}
			}
			got := fileMappings(t, dir)
			t.Logf("%d files, %d of them written through a mapping; %d mappings of them", tt.files, mapped, got)
			if got > tt.most {
				t.Errorf("%d mappings of %d files, want at most %d", got, tt.files, tt.most)
			}
			if mapped == 0 {
				t.Error("no file was written through a mapping")
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if got := fileMappings(t, dir); got != 0 {
				t.Errorf("%d mappings left after Close, want none", got)
			}
		})
	}
}
