//go:build linux

package store

import (
	"fmt"
	"math"
	"path"
	"strings"
	"unicode/utf8"
)

// validatePath checks name before anything touches the filesystem. The
// rules are os.Root's plus those that make a path one canonical key in the
// inode table: relative, clean, no "..", no NUL, valid UTF-8 (the only
// names the API's strings can carry), at most MaxPathLen bytes and
// MaxNameLen bytes an element, and not the root itself. An element too long
// for the filesystem is refused here rather than by open(2), which would
// see it only once the directories above it were made. Symlinks are
// os.Root's to refuse.
func validatePath(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty", ErrInvalidPath)
	case len(name) > MaxPathLen:
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrPathTooLong, len(name), MaxPathLen)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("%w: contains a NUL byte", ErrInvalidPath)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: %q is not valid UTF-8", ErrInvalidPath, name)
	case strings.HasPrefix(name, "/"):
		return fmt.Errorf("%w: %q is absolute, want a path relative to the root", ErrInvalidPath, name)
	case name == ".":
		return fmt.Errorf("%w: %q names the root itself, want a file below it", ErrInvalidPath, name)
	}
	for elem := range strings.SplitSeq(name, "/") {
		if elem == ".." {
			return fmt.Errorf("%w: %q contains \"..\"", ErrInvalidPath, name)
		}
		if len(elem) > MaxNameLen {
			return fmt.Errorf("%w: an element of %d bytes (%.16q...), the limit is %d", ErrPathTooLong, len(elem), elem, MaxNameLen)
		}
	}
	if clean := path.Clean(name); clean != name {
		return fmt.Errorf("%w: %q is not clean (want %q)", ErrInvalidPath, name, clean)
	}
	return nil
}

// validateRange checks that [off, off+length) is a valid byte range whose
// end stays within maxEnd (the file size limit).
func validateRange(off, length, maxEnd int64) error {
	if off < 0 {
		return fmt.Errorf("%w: offset %d is negative", ErrInvalidOffset, off)
	}
	if length < 0 {
		return fmt.Errorf("%w: length %d is negative", ErrInvalidOffset, length)
	}
	if off > math.MaxInt64-length {
		return fmt.Errorf("%w: offset %d + length %d overflows int64", ErrInvalidOffset, off, length)
	}
	if end := off + length; end > maxEnd {
		return fmt.Errorf("%w: range ends at %d, the maximum file size is %d bytes", ErrFileTooLarge, end, maxEnd)
	}
	return nil
}

// validateRequestLength bounds the bytes moved by one Write or Read.
func validateRequestLength(length, maxRequest int64) error {
	if length > maxRequest {
		return fmt.Errorf("%w: %d bytes, the maximum per request is %d", ErrRequestTooLarge, length, maxRequest)
	}
	return nil
}

func validateSync(m SyncMode) error {
	if m < SyncNone || m > SyncFull {
		return fmt.Errorf("%w: sync mode %d (want none, data or full)", ErrInvalidMode, int(m))
	}
	return nil
}

func validateFsync(m SyncMode) error {
	if m != SyncData && m != SyncFull {
		return fmt.Errorf("%w: fsync mode %v (want data or full)", ErrInvalidMode, m)
	}
	return nil
}

func validateFallocate(m FallocateMode, off, length, maxSize int64) error {
	if m < FallocAllocate || m > FallocZeroRange {
		return fmt.Errorf("%w: fallocate mode %d (want allocate, keep-size, punch-hole or zero-range)", ErrInvalidMode, int(m))
	}
	if length <= 0 {
		return fmt.Errorf("%w: fallocate length %d must be positive", ErrInvalidOffset, length)
	}
	return validateRange(off, length, maxSize)
}

func validateOpenMode(m OpenMode) error {
	if m < OpenCreate || m > OpenExclusive {
		return fmt.Errorf("%w: open mode %d (want create, must-exist or exclusive)", ErrInvalidMode, int(m))
	}
	return nil
}
