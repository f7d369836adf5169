//go:build linux

package store

import (
	"context"

	"golang.org/x/sys/unix"
)

// writeBackStarter is a File that can start the writeback of a range
// without waiting for it (osFile).
type writeBackStarter interface {
	startWriteBack(off, n int64) error
}

// startWriteBack is sync_file_range(2) with SYNC_FILE_RANGE_WRITE alone:
// the kernel starts writing the range's dirty pages and returns.
func (f *osFile) startWriteBack(off, n int64) error {
	return f.retry("sync_file_range", func() error { return unix.SyncFileRange(f.fd, off, n, unix.SYNC_FILE_RANGE_WRITE) })
}

// StartWriteBack starts writing [off, off+n) of path to the disk, and
// returns without waiting: a writer of a large file that will sync it at
// the end (a raw PUT with sync=data) calls it for each piece it wrote, so
// that the disk works while the next pieces arrive and the final sync has
// little left. It makes nothing durable and changes nothing a reader sees.
// A path that names no open-able file, or a file layer that cannot start a
// writeback, is no error: there is nothing to hurry.
//
// A failure to start is recorded like a failed writeback (the file's next
// sync fails: groupCommit.writebackFailed): the pages may not have been
// written, and the sync that should have found them dirty may not.
func (s *Store) StartWriteBack(ctx context.Context, path string, off, n int64) error {
	if err := validatePath(path); err != nil {
		return err
	}
	ino, err := s.table.get(ctx, path, false)
	if err != nil {
		return err
	}
	defer s.table.put(ino)
	return ino.startWriteBack(off, n)
}

// WriteBackAfter is the size from which a write starts its own writeback
// once it is written (Store.write): a write that large is bulk (a
// Writer's or a checkpoint's piece, a PUT's), whose pages the kernel would
// otherwise leave dirty until the file's sync, or for half a minute,
// and then write all at once. Started as each piece lands, the disk works
// while the next ones arrive, and the sync at the end finds little left
// to write. Smaller writes leave the timing to the kernel: a random
// writer may write the same pages again before they would be written.
const WriteBackAfter = 1 << 20

// startWriteBack is StartWriteBack of an inode held: nothing to do for a
// file layer that cannot start a writeback, or a file open for direct
// I/O, whose pages are not left dirty.
func (ino *inode) startWriteBack(off, n int64) error {
	w, ok := ino.file.(writeBackStarter)
	if !ok || ino.direct != nil {
		return nil
	}
	if err := w.startWriteBack(off, n); err != nil {
		ino.commit.writebackFailed()
		return ioError("sync_file_range", ino.path(), err, 0)
	}
	return nil
}

// StartWriteBack is Store.StartWriteBack of the Handle's file.
func (h *Handle) StartWriteBack(off, n int64) error {
	w, ok := h.ino.file.(writeBackStarter)
	if !ok || h.ino.direct != nil {
		return nil
	}
	if err := w.startWriteBack(off, n); err != nil {
		h.ino.commit.writebackFailed()
		return ioError("sync_file_range", h.path, err, 0)
	}
	return nil
}
