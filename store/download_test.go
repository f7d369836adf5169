//go:build linux

package store_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/filewrite/filewrite/store"
)

// TestOpenReader: a Handle's reader reads what the store wrote, with an
// offset of its own per reader, follows the file through a Rename and a
// Delete (Gone says when to stop), and a wrapping FS gives none.
func TestOpenReader(t *testing.T) {
	ctx := context.Background()
	s, _ := newStoreIn(t, store.Options{})
	want := pattern(3<<20, 7)
	if _, err := s.Write(ctx, "a/f", 0, want, store.SyncNone); err != nil {
		t.Fatal(err)
	}
	h, err := s.OpenHandle(ctx, "a/f", store.OpenMustExist)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	r1, err := h.OpenReader()
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Close()
	r2, err := h.OpenReader()
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if _, err := r1.Seek(1<<20, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	got2, err := io.ReadAll(io.LimitReader(r2, 1<<20))
	if err != nil || string(got2) != string(want[:1<<20]) {
		t.Fatalf("second reader: %d bytes, %v; want the file's first MiB (its offset its own)", len(got2), err)
	}
	if err := s.Rename(ctx, "a/f", "b/g", false, false); err != nil {
		t.Fatal(err)
	}
	got1, err := io.ReadAll(r1)
	if err != nil || string(got1) != string(want[1<<20:]) {
		t.Fatalf("first reader after a Rename: %d bytes, %v; want the file from 1 MiB", len(got1), err)
	}
	if err := s.Delete(ctx, "b/g", false); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.Gone():
	default:
		t.Error("Gone not closed after the Delete")
	}

	fs := newFaultStore(t, store.Options{})
	if _, err := fs.Write(ctx, faultPath, 0, want[:10], store.SyncNone); err != nil {
		t.Fatal(err)
	}
	fh, err := fs.OpenHandle(ctx, faultPath, store.OpenMustExist)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.OpenReader(); !errors.Is(err, store.ErrNoReader) {
		t.Errorf("OpenReader over faultfs: %v, want ErrNoReader", err)
	}
}

// TestStartWriteBack: starting a range's writeback changes nothing a
// reader sees, needs the file to exist, and is no error over a file
// layer that cannot start one.
func TestStartWriteBack(t *testing.T) {
	ctx := context.Background()
	s, _ := newStoreIn(t, store.Options{})
	want := pattern(1<<20, 3)
	if _, err := s.Write(ctx, "f", 0, want, store.SyncNone); err != nil {
		t.Fatal(err)
	}
	if err := s.StartWriteBack(ctx, "f", 0, 1<<20); err != nil {
		t.Fatalf("StartWriteBack: %v", err)
	}
	if got, err := s.Read(ctx, "f", 0, 1<<20); err != nil || string(got) != string(want) {
		t.Errorf("Read after StartWriteBack: %d bytes, %v; want what was written", len(got), err)
	}
	if err := s.StartWriteBack(ctx, "missing", 0, 1); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("StartWriteBack of a missing file: %v, want ErrNotFound", err)
	}
	fs := newFaultStore(t, store.Options{})
	if _, err := fs.Write(ctx, faultPath, 0, want[:10], store.SyncNone); err != nil {
		t.Fatal(err)
	}
	if err := fs.StartWriteBack(ctx, faultPath, 0, 10); err != nil {
		t.Errorf("StartWriteBack over faultfs: %v, want nil (nothing to hurry)", err)
	}
}

// TestLargeWriteStartsWriteBack: a write of store.WriteBackAfter or more
// leaves none of its pages dirty when it returns: their writeback is
// started (cachestat(2) counts them as under writeback, or clean once
// written), so that the disk takes a bulk writer's pieces as they land.
func TestLargeWriteStartsWriteBack(t *testing.T) {
	ctx := context.Background()
	s, dir := newStoreIn(t, store.Options{})
	const n = 2 * store.WriteBackAfter
	if _, err := s.Write(ctx, "bulk", 0, pattern(n, 5), store.SyncNone); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, "bulk"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cs unix.Cachestat_t
	if err := unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{Off: 0, Len: n}, &cs, 0); err != nil {
		t.Skipf("cachestat(2): %v (Linux 6.5 or later counts a file's dirty pages)", err)
	}
	if cs.Dirty != 0 {
		t.Errorf("after a write of %d bytes: %d of its %d cached pages dirty, want 0 (writeback started)", n, cs.Dirty, cs.Cache)
	}
}
