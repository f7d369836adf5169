//go:build linux

package store_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store"
)

// mountTmpfs mounts a 1 MiB tmpfs in a fresh test directory and unmounts it
// when the test ends (after the store on it is closed: cleanups run last in
// first out). It skips the test where mounting is not allowed.
func mountTmpfs(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a real ENOSPC needs a small tmpfs, and mounting one needs root (CI runs as root)")
	}
	mnt := filepath.Join(testutil.Dir(t), "tmpfs")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m"); err != nil {
		t.Skipf("cannot mount a 1 MiB tmpfs at %s (no CAP_SYS_ADMIN, or a container that forbids mounts): %v", mnt, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount the test tmpfs: %v", err)
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	return mnt
}

// fill writes chunks of size chunk at the end of path until the filesystem
// is full and returns the content the store acknowledged or reported
// written, the result and error of the write that failed.
func fill(t *testing.T, fs faultStore, path string, chunk int) ([]byte, store.WriteResult, error) {
	t.Helper()
	ctx := context.Background()
	var content []byte
	for i := 0; i < 100; i++ {
		data := pattern(chunk, byte(i))
		res, err := fs.Write(ctx, path, int64(len(content)), data, store.SyncNone)
		content = append(content, data[:res.BytesWritten]...)
		if err != nil {
			return content, res, err
		}
	}
	t.Fatalf("wrote %d bytes to a 1 MiB tmpfs without an error", len(content))
	return nil, store.WriteResult{}, nil
}

// TestRealENOSPC fills a real (tmpfs) filesystem through the store, with an
// extending write and with a write below EOF into a hole, under every
// policy: ErrNoSpace naming the path and the bytes written, the size still
// the file's, the acknowledged bytes on disk, and the store usable once
// space is freed. tmpfs has no FIEMAP (the store maps it with SEEK_DATA),
// so extents are not compared.
func TestRealENOSPC(t *testing.T) {
	ctx := context.Background()
	checkNoSpace := func(t *testing.T, res store.WriteResult, err error) {
		t.Helper()
		if !errors.Is(err, store.ErrNoSpace) || !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("got error %v, want ErrNoSpace wrapping ENOSPC", err)
		}
		for _, part := range []string{faultPath, fmt.Sprintf("%d bytes written", res.BytesWritten)} {
			if !strings.Contains(err.Error(), part) {
				t.Errorf("error %q does not say %q", err, part)
			}
		}
	}
	tests := []struct {
		name string
		// run fills the disk and returns the content path must have.
		run func(t *testing.T, fs faultStore) []byte
	}{
		{
			name: "extending",
			run: func(t *testing.T, fs faultStore) []byte {
				// 100,000 bytes: the last write is cut inside a page.
				want, res, err := fill(t, fs, faultPath, 100_000)
				checkNoSpace(t, res, err)
				if got, want := res.Size, int64(len(want)); got != want {
					t.Errorf("Size in the result: got %d, want %d (the bytes acknowledged, and BytesWritten of the write that failed)", got, want)
				}
				return want
			},
		},
		{
			name: "below EOF into a hole",
			run: func(t *testing.T, fs faultStore) []byte {
				if _, _, err := fill(t, fs, "filler", 100_000); !errors.Is(err, store.ErrNoSpace) {
					t.Fatalf("filling the disk: got %v, want ErrNoSpace", err)
				}
				const size = 512 << 10
				if err := fs.Truncate(ctx, faultPath, size); err != nil {
					t.Fatalf("Truncate to make a hole: %v", err)
				}
				data := pattern(64<<10, 'h')
				res, err := fs.Write(ctx, faultPath, 4096, data, store.SyncNone)
				checkNoSpace(t, res, err)
				if got, want := res.Size, int64(size); got != want {
					t.Errorf("Size in the result: got %d, want %d", got, want)
				}
				return overlay(make([]byte, size), 4096, data[:res.BytesWritten])
			},
		},
	}
	for _, p := range store.Policies() {
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%v/%s", p, tt.name), func(t *testing.T) {
				fs := openFaultStore(t, mountTmpfs(t), store.Options{Policy: p})
				want := tt.run(t, fs)
				testutil.SameBytes(t, "file when the disk is full", fs.content(t, faultPath), want)
				fs.checkTrue(t, faultPath, false)

				// Free space, then a write reads back.
				if err := fs.Truncate(ctx, "filler", 0); err != nil {
					t.Fatal(err)
				}
				if err := fs.Truncate(ctx, faultPath, 0); err != nil {
					t.Fatal(err)
				}
				data := pattern(200_000, 'r')
				if _, err := fs.Write(ctx, faultPath, 0, data, store.SyncData); err != nil {
					t.Fatalf("Write once space is free: %v", err)
				}
				got, err := fs.Read(ctx, faultPath, 0, int64(len(data)))
				if err != nil {
					t.Fatal(err)
				}
				testutil.SameBytes(t, "Read once space is free", got, data)
				fs.checkTrue(t, faultPath, false)
			})
		}
	}
}

// TestSizesNearMaxInt64 uses tmpfs, which allows files of MaxInt64 bytes,
// to reach the block rounding of truncate and fallocate where (n+bs-1)/bs
// would wrap negative (tmpfs has no zero-range: the extent map's own test
// covers it): the first 8 KiB, written, must stay written in the
// store's extent map whatever happens near the end of the range.
func TestSizesNearMaxInt64(t *testing.T) {
	ctx := context.Background()
	const huge = math.MaxInt64
	tests := []struct {
		name string
		do   func(fs faultStore) error
	}{
		{"Truncate to MaxInt64 twice", func(fs faultStore) error {
			if err := fs.Truncate(ctx, faultPath, huge); err != nil {
				return err
			}
			return fs.Truncate(ctx, faultPath, huge)
		}},
		{"punch the last bytes", func(fs faultStore) error {
			if err := fs.Truncate(ctx, faultPath, huge); err != nil {
				return err
			}
			_, err := fs.Fallocate(ctx, faultPath, store.FallocPunchHole, huge-100, 100)
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := openFaultStore(t, mountTmpfs(t), store.Options{MaxFileSize: huge})
			if _, err := fs.Write(ctx, faultPath, 0, pattern(8192, 'w'), store.SyncNone); err != nil {
				t.Fatal(err)
			}
			if err := tt.do(fs); err != nil {
				t.Fatal(err)
			}
			got, err := fs.Extents(ctx, faultPath, 0, 8192)
			if err != nil {
				t.Fatal(err)
			}
			if want := []store.Extent{{Offset: 0, Length: 8192, State: store.ExtentWritten}}; !slices.Equal(got, want) {
				t.Errorf("Extents of the first 8 KiB = %v, want %v", got, want)
			}
		})
	}
}
