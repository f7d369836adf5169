//go:build linux

package store

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// reopener is a File that can open its file again for reading, on a new
// open file description (osFile).
type reopener interface {
	reopen() (*os.File, error)
}

// reopen opens f's file again, read-only, through /proc/self/fd: the same
// inode whatever has become of its name since (renamed, or removed), with
// an offset of its own, so that a download can hand it to sendfile(2),
// which reads from the descriptor's offset.
func (f *osFile) reopen() (*os.File, error) {
	for {
		fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(f.fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, f.pathError("reopen", err)
		}
		return os.NewFile(uintptr(fd), f.name), nil
	}
}

// OpenReader opens the Handle's file for reading on a descriptor of its
// own, for a download that copies ranges of it to a socket without
// copying them through memory (net/http sends an *os.File with
// sendfile(2)). Its reads see every write the store made to the file
// before them, as Read's do (one page cache), and, like a long Read, no
// one moment of the file: a write below EOF during the download may or
// may not be in it. It reads the file the Handle holds even after a
// Rename, or a Delete; a caller that must stop when the file is deleted
// watches Gone between pieces. The caller closes it, before the Handle.
//
// The size to read is Size, read before: bytes past it may belong to an
// append still in flight, which readers must not see.
func (h *Handle) OpenReader() (*os.File, error) {
	r, ok := h.ino.file.(reopener)
	if !ok {
		return nil, fmt.Errorf("%s: %w", h.ino.path(), ErrNoReader)
	}
	return r.reopen()
}
