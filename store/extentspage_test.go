//go:build linux

package store

import (
	"context"
	"fmt"
	"reflect"
	"testing"
)

// TestExtentsPage: the pages of a range, each started at the end of the
// one before, are the range's extents, cut into pieces of limit; more is
// false exactly on the last page. The file alternates written blocks and
// holes, ending in a hole that a Truncate made.
func TestExtentsPage(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	ctx := context.Background()
	const blocks = 40
	for b := int64(0); b < blocks; b += 2 {
		if _, err := s.Write(ctx, "f", b*4096, make([]byte, 4096), SyncNone); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Truncate(ctx, "f", (blocks+3)*4096); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ off, length int64 }{{0, 0}, {0, blocks * 4096}, {100, 7 * 4096}, {4096 + 1, 0}} {
		all, err := s.Extents(ctx, "f", r.off, r.length)
		if err != nil {
			t.Fatal(err)
		}
		for _, limit := range []int{1, 2, 3, 7, len(all), len(all) + 1} {
			t.Run(fmt.Sprintf("off%d/len%d/limit%d", r.off, r.length, limit), func(t *testing.T) {
				var got []Extent
				off, end := r.off, r.off+r.length
				for page := 0; ; page++ {
					length := int64(0)
					if r.length > 0 {
						length = end - off
					}
					exts, more, err := s.ExtentsPage(ctx, "f", off, length, limit)
					if err != nil {
						t.Fatal(err)
					}
					if len(exts) > limit || len(exts) == 0 && more {
						t.Fatalf("page %d: %d extents, more %v, limit %d", page, len(exts), more, limit)
					}
					got = append(got, exts...)
					if !more {
						break
					}
					last := exts[len(exts)-1]
					off = last.Offset + last.Length
				}
				if !reflect.DeepEqual(got, all) {
					t.Errorf("pages of %d joined = %v, want %v", limit, got, all)
				}
			})
		}
	}
}
