//go:build linux

package store_test

// The power-loss test of staged files, the durability that the tus door
// promises: an upload's pieces, each synced before it is acknowledged (a
// PATCH answered with its Upload-Offset), survive a power cut whatever
// the disk kept of the rest, and a Publish that returned leaves the whole
// file at its name.

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store"
	"github.com/filewrite/filewrite/store/crashfs"
)

const stagedPiece = 3 * 4096

func stagedData(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/4096)
	}
	return b
}

func TestPowerLossStaged(t *testing.T) {
	const pieces = 6
	data := stagedData(pieces * stagedPiece)
	for cut := 0; cut <= pieces; cut++ {
		for _, keep := range []string{"none", "random", "all"} {
			dir := testutil.Dir(t)
			base, err := store.OpenOSFS(dir)
			if err != nil {
				t.Fatal(err)
			}
			fsys := crashfs.New(base)
			s, err := store.Open(fsys, store.Options{})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			h, err := s.OpenStaged(ctx, "up", store.OpenExclusive)
			if err != nil {
				t.Fatal(err)
			}
			acked := int64(0)
			for i := range pieces {
				off := int64(i * stagedPiece)
				if _, err := h.Write(ctx, off, data[off:off+stagedPiece], store.SyncNone); err != nil {
					t.Fatal(err)
				}
				if i == cut {
					break // the cut comes before this piece's sync
				}
				if err := h.Sync(ctx, store.SyncData); err != nil {
					t.Fatal(err)
				}
				acked = off + stagedPiece
			}
			published := false
			if cut == pieces {
				if err := s.Publish(ctx, "up", "dir/file", false); err != nil {
					t.Fatal(err)
				}
				published = true
			}
			state := fsys.Crash()
			h.Close()
			s.Close() // fails: the disk is gone

			rng := rand.New(rand.NewPCG(uint64(cut), 1))
			keepFn := map[string]crashfs.Keep{"none": crashfs.KeepNone, "random": crashfs.KeepRandom(rng, 0.5), "all": crashfs.KeepAll}[keep]
			img := testutil.Dir(t)
			if _, err := state.Write(img, keepFn); err != nil {
				t.Fatal(err)
			}
			ibase, err := store.OpenOSFS(img)
			if err != nil {
				t.Fatal(err)
			}
			s2, err := store.Open(ibase, store.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if published {
				got, err := s2.Read(ctx, "dir/file", 0, int64(len(data))+1)
				if err != nil || !bytes.Equal(got, data) {
					t.Errorf("cut %d, keep %s: published file: %d bytes, %v; want the %d bytes whole", cut, keep, len(got), err, len(data))
				}
			} else {
				staged, err := s2.Staged()
				if err == nil && len(staged) == 0 && acked == 0 {
					s2.Close()
					continue // nothing was acknowledged: nothing need survive
				}
				if err != nil || len(staged) != 1 {
					t.Fatalf("cut %d, keep %s: staged files: %v, %v; want up", cut, keep, staged, err)
				}
				got, err := os.ReadFile(filepath.Join(img, ".filewrite", "staged", "up"))
				if err != nil {
					t.Fatal(err)
				}
				if int64(len(got)) < acked || !bytes.Equal(got[:acked], data[:acked]) {
					t.Errorf("cut %d, keep %s: staged file of %d bytes; want at least the %d acknowledged, as written", cut, keep, len(got), acked)
				}
				// What survived past the acknowledged bytes is theirs too,
				// or zeros where the size outlived the data.
				for i := acked; i < int64(len(got)); i++ {
					if got[i] != data[i] && got[i] != 0 {
						t.Errorf("cut %d, keep %s: byte %d is %d, neither written nor zero", cut, keep, i, got[i])
						break
					}
				}
			}
			if err := s2.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}
