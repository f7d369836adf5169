//go:build linux

package store

import (
	"math"
	"path"
	"strings"
	"unicode/utf8"
)

// validatePath checks name before anything touches the filesystem. The
// rules are os.Root's plus those that make a path one canonical key in the
// inode table: relative, clean, no "..", no NUL, valid UTF-8 (the only
// names the API's strings can carry), at most MaxPathLen bytes and
// MaxNameLen bytes an element, not the root itself, and not below
// StateDir (the store's own state, such as the append-ID journal). An
// element too long
// for the filesystem is refused here rather than by open(2), which would
// see it only once the directories above it were made. Symlinks are
// os.Root's to refuse.
func validatePath(name string) error { return validatePathArg(name, "path") }

// ValidatePath is the check every call that takes a path makes first: for
// a door that learns a path long before it uses it (a tus upload's
// target), so that a bad one is refused when it is given.
func ValidatePath(name string) error { return validatePath(name) }

// validatePathArg is validatePath for the argument arg (a Rename's
// "new_path"), which its refusals name.
func validatePathArg(name, arg string) error {
	switch {
	case name == "":
		return refuse(ErrInvalidPath, arg, "empty")
	case len(name) > MaxPathLen:
		return refuseLimit(ErrPathTooLong, arg, MaxPathLen, "%d bytes, the limit is %d", len(name), MaxPathLen)
	case strings.IndexByte(name, 0) >= 0:
		return refuse(ErrInvalidPath, arg, "contains a NUL byte")
	case !utf8.ValidString(name):
		return refuse(ErrInvalidPath, arg, "%q is not valid UTF-8", name)
	case strings.HasPrefix(name, "/"):
		return refuse(ErrInvalidPath, arg, "%q is absolute, want a path relative to the root", name)
	case name == ".":
		return refuse(ErrInvalidPath, arg, "%q names the root itself, want a file below it", name)
	case name == StateDir || strings.HasPrefix(name, StateDir+"/"):
		return refuse(ErrInvalidPath, arg, "%q is in %s, the name at the root that the store keeps its own state under", name, StateDir)
	}
	for elem := range strings.SplitSeq(name, "/") {
		if elem == ".." {
			return refuse(ErrInvalidPath, arg, "%q contains \"..\"", name)
		}
		if len(elem) > MaxNameLen {
			return refuseLimit(ErrPathTooLong, arg, MaxNameLen, "an element of %d bytes (%.16q...), the limit is %d", len(elem), elem, MaxNameLen)
		}
	}
	if clean := path.Clean(name); clean != name {
		return refuse(ErrInvalidPath, arg, "%q is not clean (want %q)", name, clean)
	}
	return nil
}

// StateDir is the directory at the root where the store keeps its own
// state (the append-ID journal, appendjournal.go). No path the store
// accepts reaches it, and List of the root leaves it out.
const StateDir = ".filewrite"

// validateRange checks that [off, off+length) is a valid byte range whose
// end stays within maxEnd (the file size limit).
func validateRange(off, length, maxEnd int64) error {
	if off < 0 {
		return refuse(ErrInvalidOffset, "offset", "offset %d is negative", off)
	}
	if length < 0 {
		return refuse(ErrInvalidOffset, "length", "length %d is negative", length)
	}
	if off > math.MaxInt64-length {
		return refuse(ErrInvalidOffset, "offset", "offset %d + length %d overflows int64", off, length)
	}
	if end := off + length; end > maxEnd {
		return refuseLimit(ErrFileTooLarge, "offset", maxEnd, "range ends at %d, the maximum file size is %d bytes", end, maxEnd)
	}
	return nil
}

// validateRequestLength bounds the bytes moved by one Write or Read; arg
// is the argument that says how many ("data", "length").
func validateRequestLength(arg string, length, maxRequest int64) error {
	if length > maxRequest {
		return refuseLimit(ErrRequestTooLarge, arg, maxRequest, "%d bytes, the maximum per request is %d", length, maxRequest)
	}
	return nil
}

func validateSync(m SyncMode) error {
	if m < SyncNone || m > SyncFull {
		return refuse(ErrInvalidMode, "sync", "sync mode %d (want none, data or full)", int(m))
	}
	return nil
}

func validateFsync(m SyncMode) error {
	if m != SyncData && m != SyncFull {
		return refuse(ErrInvalidMode, "data_only", "fsync mode %v (want data or full)", m)
	}
	return nil
}

func validateFallocate(m FallocateMode, off, length, maxSize int64) error {
	if m < FallocAllocate || m > FallocZeroRange {
		return refuse(ErrInvalidMode, "mode", "fallocate mode %d (want allocate, keep-size, punch-hole or zero-range)", int(m))
	}
	if length <= 0 {
		return refuse(ErrInvalidOffset, "length", "fallocate length %d must be positive", length)
	}
	return validateRange(off, length, maxSize)
}

func validateOpenMode(m OpenMode) error {
	if m < OpenCreate || m > OpenExclusive {
		return refuse(ErrInvalidMode, "open_mode", "open mode %d (want create, must-exist or exclusive)", int(m))
	}
	return nil
}
