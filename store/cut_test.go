//go:build linux

package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

// TestWritesAfterCutToPartialPage is issue 36's second item: a 2 MiB
// region made hot (and so written through the file's mapping) by 16
// writers; the file cut from outside to 5,000 bytes, not a page multiple;
// then three writes of 100 bytes at 6000, 6100 and 6200, below the size
// the store knew and within the page that holds the new end, where a store
// through the mapping does not fault. The store used to acknowledge them
// and keep none: no write may vanish without its call or a later one
// saying so. Each face the writes take is tried: Write, a Handle's Write,
// and a stream reader's TryWrite, then Write when it is refused.
func TestWritesAfterCutToPartialPage(t *testing.T) {
	ctx := context.Background()
	faces := []struct {
		name  string
		write func(s *Store, h *Handle, off int64, data []byte) error
	}{
		{"Write", func(s *Store, _ *Handle, off int64, data []byte) error {
			_, err := s.Write(ctx, "f", off, data, SyncNone)
			return err
		}},
		{"Handle.Write", func(_ *Store, h *Handle, off int64, data []byte) error {
			_, err := h.Write(ctx, off, data, SyncNone)
			return err
		}},
		{"TryWrite, then Write", func(_ *Store, h *Handle, off int64, data []byte) error {
			if _, ok := h.TryWrite(ctx, off, data); ok {
				return nil
			}
			_, err := h.Write(ctx, off, data, SyncNone)
			return err
		}},
	}
	for _, face := range faces {
		t.Run(face.name, func(t *testing.T) {
			var c mappedCounter
			s, dir := newTestStore(t, Options{Hooks: c.hooks(false)})
			const size = 4 << 20
			prepareFile(t, s, "f", size, 64<<10)
			h, err := s.OpenHandle(ctx, "f", OpenMustExist)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			// 16 writers, 64 pages each, over the first 2 MiB: hot after
			// 256 writes, whatever the 5 s period does.
			var wg sync.WaitGroup
			page := bytes.Repeat([]byte{9}, 4096)
			for w := range 16 {
				wg.Go(func() {
					for i := range 64 {
						if _, err := h.Write(ctx, int64(i*16+w)*4096, page, SyncNone); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			if c.count("f") == 0 {
				t.Fatal("no write went through the mapping: the region did not turn hot")
			}
			if err := os.Truncate(filepath.Join(dir, "f"), 5000); err != nil {
				t.Fatal(err)
			}
			reported := 0
			var want []byte
			for i := range 3 {
				data := bytes.Repeat([]byte{byte('a' + i)}, 100)
				off := int64(6000 + 100*i)
				err := face.write(s, h, off, data)
				switch {
				case errors.Is(err, ErrChangedOutside):
					reported++
				case err != nil:
					t.Fatalf("write at %d: %v", off, err)
				}
				want = append(want, data...)
			}
			got, err := s.Read(ctx, "f", 6000, 300)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("Read at 6000 after the writes: %d bytes %.12q..., want the writes' %d (%d of them reported the cut)", len(got), got, len(want), reported)
			}
			st, err := s.Stat(ctx, "f")
			if errors.Is(err, ErrChangedOutside) {
				reported++
				st, err = s.Stat(ctx, "f")
			}
			if err != nil || st.Size != 6300 {
				t.Errorf("Stat: size %d, %v; want 6300, nil", st.Size, err)
			}
			if reported != 1 {
				t.Errorf("the cut was reported %d times, want once", reported)
			}
			onDisk, err := os.ReadFile(filepath.Join(dir, "f"))
			if err != nil {
				t.Fatal(err)
			}
			if len(onDisk) != 6300 || !bytes.Equal(onDisk[6000:], want) {
				t.Errorf("the file holds %d bytes, not the writes at 6000", len(onDisk))
			}
		})
	}
}

// TestCutFromOutsideReported: a file cut short from outside the store is
// reported once, as ErrChangedOutside, by the first call that finds it,
// however it finds it; the store then takes the file as it is, and the
// calls after succeed.
func TestCutFromOutsideReported(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		// find is the call that finds the cut; it returns what it got.
		find func(t *testing.T, s *Store) error
	}{
		{"Stat", func(t *testing.T, s *Store) error {
			_, err := s.Stat(ctx, "f")
			return err
		}},
		{"Fsync", func(t *testing.T, s *Store) error {
			return s.Fsync(ctx, "f", SyncData)
		}},
		{"synced Write", func(t *testing.T, s *Store) error {
			_, err := s.Write(ctx, "f", 100, []byte("x"), SyncData)
			return err
		}},
		{"closed for room, then Stat", func(t *testing.T, s *Store) error {
			// MaxOpenFiles is 1: opening g closes f.
			if _, err := s.Write(ctx, "g", 0, []byte("g"), SyncNone); err != nil {
				t.Fatal(err)
			}
			_, err := s.Stat(ctx, "f")
			return err
		}},
		{"closed for room, then Fsync", func(t *testing.T, s *Store) error {
			if _, err := s.Write(ctx, "g", 0, []byte("g"), SyncNone); err != nil {
				t.Fatal(err)
			}
			return s.Fsync(ctx, "f", SyncFull)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, dir := newTestStore(t, Options{MaxOpenFiles: 1})
			if _, err := s.Write(ctx, "f", 0, bytes.Repeat([]byte{1}, 10000), SyncNone); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(filepath.Join(dir, "f"), 9000); err != nil {
				t.Fatal(err)
			}
			if err := tt.find(t, s); !errors.Is(err, ErrChangedOutside) {
				t.Fatalf("first call after the cut: %v, want ErrChangedOutside", err)
			}
			st, err := s.Stat(ctx, "f")
			if err != nil {
				t.Fatalf("Stat after the cut was reported: %v", err)
			}
			if err := s.Fsync(ctx, "f", SyncData); err != nil {
				t.Fatalf("Fsync after the cut was reported: %v", err)
			}
			if fi, err := os.Stat(filepath.Join(dir, "f")); err != nil || st.Size != fi.Size() {
				t.Errorf("Stat after: size %d, the file's %d (%v)", st.Size, fi.Size(), err)
			}
		})
	}
}

// TestCutFoundAtClose: Close reports a file cut from outside that no call
// found before, whether it was open then or closed for room.
func TestCutFoundAtClose(t *testing.T) {
	ctx := context.Background()
	for _, open := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d files open", open), func(t *testing.T) {
			dir := testutil.Dir(t)
			s := openStore(t, dir, Options{MaxOpenFiles: open})
			if _, err := s.Write(ctx, "f", 0, bytes.Repeat([]byte{1}, 10000), SyncNone); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(filepath.Join(dir, "f"), 10); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Write(ctx, "g", 0, []byte("g"), SyncNone); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); !errors.Is(err, ErrChangedOutside) {
				t.Errorf("Close: %v, want ErrChangedOutside", err)
			}
		})
	}
}
