package store

import "errors"

// Sentinel errors. The store wraps them with %w and context (path, limit,
// bytes written so far); callers match them with errors.Is. A request that
// fails with one of the validation errors (ErrInvalidPath ... ErrRequestTooLarge)
// has changed nothing.
var (
	// ErrInvalidPath is returned when a path is empty, absolute, not clean,
	// contains "..", a NUL byte or invalid UTF-8, or names the root itself;
	// and when the filesystem cannot follow it: a parent that is not a
	// directory, a symlink loop, or, for an operation that creates the
	// file, a symlink to a directory that does not exist.
	ErrInvalidPath = errors.New("invalid path")
	// ErrPathTooLong is returned when a path is longer than MaxPathLen
	// bytes, or an element of it longer than MaxNameLen.
	ErrPathTooLong = errors.New("path too long")
	// ErrPathEscapes is returned when a path resolves, through a symlink,
	// outside the root.
	ErrPathEscapes = errors.New("path escapes the root")
	// ErrInvalidOffset is returned for a negative offset, size or length, or
	// when offset+length overflows int64.
	ErrInvalidOffset = errors.New("invalid offset or length")
	// ErrInvalidMode is returned for an unknown sync, fallocate or other mode.
	ErrInvalidMode = errors.New("invalid mode")
	// ErrIsDirectory is returned when a path names a directory.
	ErrIsDirectory = errors.New("is a directory")
	// ErrNotRegular is returned when a path names something that is neither
	// a regular file nor a directory: a FIFO, a socket, a device.
	ErrNotRegular = errors.New("not a regular file")
	// ErrNotFound is returned by Read, Stat, Extents and Fsync for a file that
	// does not exist.
	ErrNotFound = errors.New("file not found")
	// ErrFileTooLarge is returned when an operation would make a file larger
	// than Options.MaxFileSize: a limit on the file, however small the
	// request.
	ErrFileTooLarge = errors.New("file size limit exceeded")
	// ErrRequestTooLarge is returned when one Write or Read moves more than
	// Options.MaxIOBytes: a limit on the request, whatever the file.
	ErrRequestTooLarge = errors.New("request size limit exceeded")
	// ErrTooManyOpenFiles is returned when Options.MaxOpenFiles files are all
	// in use and none can be closed.
	ErrTooManyOpenFiles = errors.New("open file limit reached")
	// ErrTooManyWaiters is returned when Options.MaxWaitersPerFile callers
	// already queue for the file's lock.
	ErrTooManyWaiters = errors.New("per-file waiter limit reached")
	// ErrNoSpace is returned when the filesystem is full (ENOSPC) or the
	// quota is exhausted (EDQUOT).
	ErrNoSpace = errors.New("no space left")
	// ErrUnsupported is returned when the filesystem does not support an
	// operation (EOPNOTSUPP), such as a fallocate mode or O_DIRECT.
	ErrUnsupported = errors.New("not supported by the filesystem")
	// ErrSyncFailed is returned when fdatasync/fsync failed. The file is not
	// reported durable again until a later sync of it succeeds.
	ErrSyncFailed = errors.New("sync failed")
	// ErrClosed is returned once Close has begun.
	ErrClosed = errors.New("store closed")
)

// MaxPathLen is the longest path accepted, in bytes (Linux's PATH_MAX).
const MaxPathLen = 4096

// MaxNameLen is the longest element of a path accepted, in bytes (Linux's
// NAME_MAX, the limit of ext4, XFS, btrfs and tmpfs).
const MaxNameLen = 255
