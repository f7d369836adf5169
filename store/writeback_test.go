//go:build linux

package store

import (
	"context"
	"errors"
	"io/fs"
	"syscall"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

// failedWriteBackFS opens files whose writeback fails to start, as
// sync_file_range(2) fails when the kernel cannot queue the pages' I/O.
type failedWriteBackFS struct{ FS }

func (f failedWriteBackFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return failedWriteBackFile{file}, nil
}

type failedWriteBackFile struct{ File }

func (failedWriteBackFile) startWriteBack(off, n int64) error { return syscall.EIO }

var _ writeBackStarter = failedWriteBackFile{}

// TestLargeWriteFailedWriteBackFailsNextSync: a write of WriteBackAfter
// or more whose writeback fails to start is still acknowledged (its bytes
// are in the file), and the file's next sync fails, for the pages it left
// may not reach the disk (fsyncgate: the failure is reported to a sync,
// never dropped); a sync that starts after that one succeeds. A smaller
// write starts no writeback, and its sync succeeds.
func TestLargeWriteFailedWriteBackFailsNextSync(t *testing.T) {
	ctx := context.Background()
	osfs, err := OpenOSFS(testutil.Dir(t))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(failedWriteBackFS{osfs}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	tests := []struct {
		path     string
		n        int
		wantSync []error // of the syncs one after the other
	}{
		{"large", WriteBackAfter, []error{ErrSyncFailed, nil}},
		{"small", WriteBackAfter - 1, []error{nil}},
	}
	for _, tt := range tests {
		if _, err := s.Write(ctx, tt.path, 0, make([]byte, tt.n), SyncNone); err != nil {
			t.Fatalf("write of %d bytes to %s: %v, want nil (written; only its sync owes the failure)", tt.n, tt.path, err)
		}
		for i, want := range tt.wantSync {
			err := s.Fsync(ctx, tt.path, SyncData)
			if (want == nil) != (err == nil) || (want != nil && !errors.Is(err, want)) {
				t.Errorf("sync %d of %s after a write of %d bytes: %v, want %v", i+1, tt.path, tt.n, err, want)
			}
		}
	}
}
