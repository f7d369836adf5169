//go:build linux

package store_test

import (
	"context"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store"
	"github.com/filewrite/filewrite/store/crashfs"
)

// TestGenerationAfterPowerCut: a store whose power was cut (store/crashfs)
// leaves images, with every choice of what was not durable, in which each
// file has a generation never seen before the cut, changed or not, and
// whose next writes never show one seen before either: the generations'
// lease was durable before any generation from it was handed out, and the
// records of a clean close are not believed after a cut.
func TestGenerationAfterPowerCut(t *testing.T) {
	ctx := context.Background()
	for _, keep := range []struct {
		name string
		keep crashfs.Keep
	}{{"all kept", crashfs.KeepAll}, {"none kept", crashfs.KeepNone}} {
		t.Run(keep.name, func(t *testing.T) {
			base, err := store.OpenOSFS(testutil.Dir(t))
			if err != nil {
				t.Fatal(err)
			}
			fsys := crashfs.New(base)
			a, err := store.Open(fsys, store.Options{})
			if err != nil {
				t.Fatal(err)
			}
			seen := map[int64]bool{}
			note := func(r store.WriteResult, err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
				seen[r.Generation] = true
			}
			note(a.Write(ctx, "durable", 0, []byte("synced"), store.SyncFull))
			note(a.Write(ctx, "changed", 0, []byte("before"), store.SyncFull))
			note(a.Write(ctx, "changed", 0, []byte("after!"), store.SyncNone))
			note(a.Write(ctx, "new", 0, []byte("unsynced"), store.SyncNone))
			dir := testutil.Dir(t)
			if _, err := fsys.Crash().Write(dir, keep.keep); err != nil {
				t.Fatal(err)
			}
			a.Close() // fails: the FS is frozen

			ofs, err := store.OpenOSFS(dir)
			if err != nil {
				t.Fatal(err)
			}
			b, err := store.Open(ofs, store.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			for _, name := range []string{"durable", "changed", "new"} {
				st, err := b.Stat(ctx, name)
				if err != nil {
					continue // not in this image
				}
				if seen[st.Generation] {
					t.Errorf("%s after the cut: generation %d, seen before it", name, st.Generation)
				}
				r, err := b.Write(ctx, name, 0, []byte("again"), store.SyncNone)
				if err != nil {
					t.Fatal(err)
				}
				if seen[r.Generation] {
					t.Errorf("%s, written after the cut: generation %d, seen before it", name, r.Generation)
				}
			}
		})
	}
}
