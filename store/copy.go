//go:build linux

package store

import (
	"context"
	"errors"
	"fmt"
	"io"

	"golang.org/x/sys/unix"
)

// ReasonCopy is the lock reason of CopyFrom.
const ReasonCopy = "copy"

// rangeCopier is a File that copies a range of another of its kind inside
// the kernel: copy_file_range(2), which shares the blocks (a reflink)
// where the filesystem can (btrfs, XFS) and copies them without a trip
// through user space where it cannot (ext4).
type rangeCopier interface {
	// copyRange copies up to n bytes of src at srcOff to dstOff and
	// returns how many it copied: fewer only at src's end, or on error.
	// errCopyUnsupported if it cannot copy from src at all.
	copyRange(src File, srcOff, dstOff, n int64) (int64, error)
}

var _ rangeCopier = (*osFile)(nil)

// errCopyUnsupported: the two files cannot be copied between in the
// kernel (different file layers or mounts, a kernel without the call).
var errCopyUnsupported = errors.New("copy_file_range unsupported")

// copyChunk is how much CopyFrom moves at a time when it copies through
// user space, and the most one copy_file_range call is asked for.
const copyChunk = 1 << 20

// CopyFrom copies n bytes of src's file at srcOff into h's file at dstOff
// (fewer if src ends first) and returns how many it copied. It holds h's
// file exclusively and src's shared meanwhile, as a write and a read do,
// so no write to either lands in the middle of the copy; it takes them in
// the order of their file IDs, as Rename does. The bytes move inside the
// kernel where the file layer allows (copy_file_range(2), a reflink where
// the filesystem has them), else through a buffer. Durable when it
// returns: nothing, until h is synced.
func (h *Handle) CopyFrom(ctx context.Context, src *Handle, srcOff, dstOff, n int64) (int64, error) {
	if err := validateRange(srcOff, n, 1<<62); err != nil {
		return 0, err
	}
	if err := validateRange(dstOff, n, h.s.opts.MaxFileSize); err != nil {
		return 0, err
	}
	if src.ino == h.ino {
		return 0, fmt.Errorf("%w: a copy within one file", ErrInvalidPath)
	}
	hd, hs, err := lockCopy(ctx, h.ino, src.ino)
	if err != nil {
		return 0, err
	}
	defer func() {
		h.ino.lock.release(hd)
		src.ino.lock.release(hs)
		putHolder(hd)
		putHolder(hs)
	}()
	if h.ino.deleted.Load() || src.ino.deleted.Load() {
		return 0, fmt.Errorf("%w: copy %s to %s", ErrDeleted, src.path, h.path)
	}
	// Like truncate: the range may lie past EOF, and a write in flight
	// must not land after the copy.
	if err := waitInflight(ctx, h.ino, ReasonCopy); err != nil {
		return 0, err
	}
	n = max(0, min(n, src.ino.size.Load()-srcOff))
	copied, err := copyFile(ctx, h.ino.file, src.ino.file, srcOff, dstOff, n)
	// The copy may have shared blocks, holes included: the file says what
	// backs the range now.
	h.s.reloadExtents(h.ino)
	if err != nil {
		return copied, ioError("copy", h.path, err, int(copied))
	}
	return copied, nil
}

// lockCopy takes dst's lock exclusively and src's shared, in the order of
// their file IDs.
func lockCopy(ctx context.Context, dst, src *inode) (hd, hs *holder, err error) {
	first, firstMode, second, secondMode := dst, lockExclusive, src, lockShared
	if src.id().less(dst.id()) {
		first, firstMode, second, secondMode = src, lockShared, dst, lockExclusive
	}
	h1, err := lockInode(ctx, first, firstMode, "copy", ReasonCopy)
	if err != nil {
		return nil, nil, err
	}
	h2, err := lockInode(ctx, second, secondMode, "copy", ReasonCopy)
	if err != nil {
		first.lock.release(h1)
		putHolder(h1)
		return nil, nil, err
	}
	if first == dst {
		return h1, h2, nil
	}
	return h2, h1, nil
}

// copyFile copies n bytes of src at srcOff to dst at dstOff, in the
// kernel where it can.
func copyFile(ctx context.Context, dst, src File, srcOff, dstOff, n int64) (int64, error) {
	var done int64
	if rc, ok := dst.(rangeCopier); ok {
		for done < n {
			if err := ctx.Err(); err != nil {
				return done, err
			}
			m, err := rc.copyRange(src, srcOff+done, dstOff+done, min(n-done, copyChunk))
			done += m
			if errors.Is(err, errCopyUnsupported) && done == 0 {
				break // through a buffer, below
			}
			if err != nil {
				return done, err
			}
			if m == 0 {
				return done, nil // src ended
			}
		}
		if done == n {
			return done, nil
		}
	}
	buf := make([]byte, min(n-done, copyChunk))
	for done < n {
		if err := ctx.Err(); err != nil {
			return done, err
		}
		m, err := src.ReadAt(buf[:min(n-done, int64(len(buf)))], srcOff+done)
		if m > 0 {
			w, werr := dst.WriteAt(buf[:m], dstOff+done)
			done += int64(w)
			if werr != nil {
				return done, werr
			}
		}
		if errors.Is(err, io.EOF) {
			return done, nil
		}
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

func (f *osFile) copyRange(src File, srcOff, dstOff, n int64) (int64, error) {
	s, ok := src.(*osFile)
	if !ok {
		return 0, errCopyUnsupported
	}
	for {
		roff, woff := srcOff, dstOff
		m, err := unix.CopyFileRange(s.fd, &roff, f.fd, &woff, int(n), 0)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EXDEV || err == unix.ENOSYS || err == unix.EOPNOTSUPP || err == unix.EINVAL:
			return 0, errCopyUnsupported
		case err != nil:
			return 0, f.pathError("copy_file_range", err)
		}
		return int64(m), nil
	}
}
