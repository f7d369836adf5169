//go:build linux

package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Sentinel errors. The store wraps them with %w and context (path, limit,
// bytes written so far); callers match them with errors.Is. A request that
// fails with one of the validation errors (ErrInvalidPath ... ErrRequestTooLarge)
// has changed nothing.
var (
	// ErrInvalidPath is returned when a path is empty, absolute, not clean,
	// contains "..", a NUL byte or invalid UTF-8, names the root itself,
	// or lies in StateDir;
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
	// ErrInvalidOffset is returned for a negative offset, size, length or
	// generation (Precondition), or when offset+length overflows int64.
	ErrInvalidOffset = errors.New("invalid offset or length")
	// ErrArgumentTooLong is returned when an argument that is neither a
	// path nor data is longer than its limit: an append ID over
	// MaxAppendIDLen bytes.
	ErrArgumentTooLong = errors.New("argument too long")
	// ErrInvalidMode is returned for an unknown sync, fallocate or other mode.
	ErrInvalidMode = errors.New("invalid mode")
	// ErrIsDirectory is returned when a path names a directory.
	ErrIsDirectory = errors.New("is a directory")
	// ErrNotRegular is returned when a path names something that is neither
	// a regular file nor a directory: a FIFO, a socket, a device.
	ErrNotRegular = errors.New("not a regular file")
	// ErrNotFound is returned by Read, Stat, Extents, Fsync, Delete and
	// Rename for a file that does not exist, by WriteOpen and OpenHandle
	// with OpenMustExist for one that does not, and by List for a
	// directory that does not.
	ErrNotFound = errors.New("file not found")
	// ErrExists is returned by Rename with noReplace when the new name is
	// taken, and by WriteOpen and OpenHandle with OpenExclusive when the
	// file exists.
	ErrExists = errors.New("file exists")
	// ErrInvalidPage is returned by List for a page size below 0 or above
	// MaxListPageSize, or a page token that no List returned.
	ErrInvalidPage = errors.New("invalid page size or token")
	// ErrFileTooLarge is returned when an operation would make a file larger
	// than Options.MaxFileSize: a limit on the file, however small the
	// request.
	ErrFileTooLarge = errors.New("file size limit exceeded")
	// ErrRequestTooLarge is returned when one Write or Read moves more than
	// Options.MaxRequestBytes: a limit on the request, whatever the file.
	ErrRequestTooLarge = errors.New("request size limit exceeded")
	// ErrTooManyOpenFiles is returned when Options.MaxOpenFiles files are all
	// in use and none can be closed.
	ErrTooManyOpenFiles = errors.New("open file limit reached")
	// ErrNoDescriptors is returned when a file or directory could not be
	// opened for lack of file descriptors: the process has as many open as
	// its RLIMIT_NOFILE allows (EMFILE), connections included, or the
	// system's table of open files is full (ENFILE). Nothing was created.
	// Files already open are not affected, and it passes once descriptors
	// are closed; Options.MaxOpenFiles, kept below the limit, is what keeps
	// the store's own files from causing it.
	ErrNoDescriptors = errors.New("out of file descriptors")
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
	// ErrFileRemoved is returned by a sync (Fsync, a synced Write) of a
	// file that was removed, or replaced by another, from outside the store
	// while the store held it open: what was written to it since its last
	// sync is in a file that no name reaches. The next request for the path
	// opens what it names then.
	ErrFileRemoved = errors.New("file removed or replaced from outside")
	// ErrChangedOutside is returned when the store finds a file it holds
	// open shorter than it made it: cut short (truncated) from outside the
	// store. What the store acknowledged past the new end is gone, and a
	// write through the file's mapping into the page that held the new end
	// may have been lost as well (docs/guarantees.md). The call that finds
	// it gets it: a Stat, a sync (Fsync, a synced Write or Append, Close),
	// a write whose store through the file's mapping checks the file, or,
	// for a file found so when it was closed for room, the next Stat or
	// sync of it. The store then takes the file's size and extents as they
	// are, and stops writing it through a mapping until it is opened again;
	// a write that finds it was made all the same (its bytes are in the
	// file). Later calls succeed.
	ErrChangedOutside = errors.New("file changed from outside")
	// ErrAppendOffsetMismatch is returned (as an *AppendMismatch) by a
	// conditional Append that found the file's end elsewhere.
	ErrAppendOffsetMismatch = errors.New("the file ends elsewhere")
	// ErrAppendIDReused is returned by an Append whose ID the store
	// remembers for an append of other data.
	ErrAppendIDReused = errors.New("append id reused with other data")
	// ErrAppendAborted is returned by an Append reserved above one that
	// failed: its bytes were given back with the failed one's, so that no
	// reader sees a hole. Nothing of it was kept; send it again.
	ErrAppendAborted = errors.New("append aborted")
	// ErrClosed is returned once Close has begun.
	ErrClosed = errors.New("store closed")
	// ErrNoReader is returned by Handle.OpenReader when the file layer
	// gives no descriptor of its own to read (a wrapping FS, as the
	// tests' are): the caller reads through Read instead.
	ErrNoReader = errors.New("the file layer gives no reader of its own")
)

// A Refusal is the error of a request that the store refused before it
// changed anything, carrying what a caller needs to report it in a
// structured form (the service's google.rpc.ErrorInfo and BadRequest):
// which argument was refused, and which limit was reached. errors.Is
// matches its sentinel; its message is the sentinel's, then Detail.
// Messages name no daemon flag: which flag sets a limit is the daemon's
// business, not the store's.
type Refusal struct {
	// Err is the sentinel: ErrInvalidPath, ErrPathTooLong, ErrInvalidOffset,
	// ErrArgumentTooLong, ErrInvalidMode, ErrInvalidPage, ErrFileTooLarge,
	// ErrRequestTooLarge, ErrTooManyOpenFiles or ErrTooManyWaiters.
	Err error
	// Arg is the argument refused, by the API's name for it ("path",
	// "new_path", "offset", "length", "size", "data", "sync", "mode",
	// "page_size", "page_token", "append_id"); empty when no one argument is at fault
	// (a busy file).
	Arg string
	// Limit is the limit reached (Options.MaxFileSize, MaxPathLen, ...) in
	// its unit (bytes, files, callers); 0 when the refusal is of no limit.
	Limit int64
	// Detail says what was refused, naming the values.
	Detail string
}

func (r *Refusal) Error() string { return r.Err.Error() + ": " + r.Detail }

func (r *Refusal) Unwrap() error { return r.Err }

// refuse returns a *Refusal of arg by sentinel, with no limit.
func refuse(sentinel error, arg, format string, a ...any) error {
	return &Refusal{Err: sentinel, Arg: arg, Detail: fmt.Sprintf(format, a...)}
}

// refuseLimit returns a *Refusal by the limit of sentinel.
func refuseLimit(sentinel error, arg string, limit int64, format string, a ...any) error {
	return &Refusal{Err: sentinel, Arg: arg, Limit: limit, Detail: fmt.Sprintf(format, a...)}
}

// ErrDeleted is returned by Handle.Write once the file was deleted, or
// replaced by a Rename over it, through the store: no name reaches it any
// more. It is an ErrNotFound. (An operation that came by path does not see
// it: it looks the path up again and acts on what the path names then.)
var ErrDeleted = fmt.Errorf("%w: the file was deleted, or replaced by a rename", ErrNotFound)

// errNameMoved says that a path no longer names the file the caller
// locked: a Rename moved it between the lookup and the lock, and the
// caller must look the path up again.
var errNameMoved = errors.New("the name moved while waiting for the lock")

// MaxPathLen is the longest path accepted, in bytes (Linux's PATH_MAX).
const MaxPathLen = 4096

// MaxNameLen is the longest element of a path accepted, in bytes (Linux's
// NAME_MAX, the limit of ext4, XFS, btrfs and tmpfs).
const MaxNameLen = 255

// ioError maps a failed syscall to the store's sentinels, naming the path
// and the bytes that reached the file.
func ioError(op, path string, err error, written int) error {
	// The file layer's *os.PathError says op and path again: keep its errno.
	if pe, ok := err.(*os.PathError); ok {
		err = pe.Err
	}
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("%w: %s %s: %d bytes written before: %w", ErrNoSpace, op, path, written, err)
	case errors.Is(err, syscall.EFBIG):
		return fmt.Errorf("%w: %s %s: %w", ErrFileTooLarge, op, path, err)
	case errors.Is(err, unix.EOPNOTSUPP):
		return fmt.Errorf("%w: %s %s: %w", ErrUnsupported, op, path, err)
	}
	return fmt.Errorf("%s %s: %d bytes written before: %w", op, path, written, err)
}

// noDescriptors maps EMFILE and ENFILE, which any call that opens a
// descriptor may meet (os.Root opens each directory on a path), to
// ErrNoDescriptors naming the limit that was reached; nil for any other
// error.
func noDescriptors(op, name string, err error) error {
	switch {
	case errors.Is(err, syscall.EMFILE):
		return fmt.Errorf("%w: %s %s: the process has as many descriptors open as its limit allows "+
			"(RLIMIT_NOFILE %d, connections included): raise it, or lower the bound on open files: %w",
			ErrNoDescriptors, op, name, NoFileLimit(), syscall.EMFILE)
	case errors.Is(err, syscall.ENFILE):
		return fmt.Errorf("%w: %s %s: the system's table of open files is full (sysctl fs.file-max): %w",
			ErrNoDescriptors, op, name, syscall.ENFILE)
	}
	return nil
}

// mapOpenErr turns open(2)/os.Root errors into the store's sentinels.
func mapOpenErr(name string, err error) error {
	if nd := noDescriptors("open", name, err); nd != nil {
		return nd
	}
	switch {
	case errors.Is(err, ErrInvalidPath):
		return err // createFile's own verdict
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %s", ErrNotFound, name)
	case errors.Is(err, syscall.EISDIR):
		return fmt.Errorf("%w: %s", ErrIsDirectory, name)
	case errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("%w: a parent of %s is not a directory", ErrInvalidPath, name)
	case errors.Is(err, syscall.ENAMETOOLONG):
		// validatePath bounds the whole path; the filesystem bounds each
		// element too (NAME_MAX, 255 bytes on ext4).
		return fmt.Errorf("%w: an element of %s is longer than the filesystem allows", ErrPathTooLong, name)
	case errors.Is(err, syscall.ELOOP):
		// os.Root says ELOOP for a chain of symlinks too long to be
		// anything but a loop; one that leads out is isEscape.
		return fmt.Errorf("%w: %s: too many levels of symbolic links (a symlink loop?)", ErrInvalidPath, name)
	case isEscape(err):
		return fmt.Errorf("%w: %s", ErrPathEscapes, name)
	case errors.Is(err, syscall.ENXIO):
		// open(2) of a unix socket, or of a device with no driver.
		return fmt.Errorf("%w: %s is a socket or a device", ErrNotRegular, name)
	case errors.Is(err, syscall.EINVAL) || errors.Is(err, unix.EOPNOTSUPP):
		return fmt.Errorf("%w: open %s: %w", ErrUnsupported, name, err)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("%w: create %s: %w", ErrNoSpace, name, err)
	}
	return fmt.Errorf("open %s: %w", name, err)
}

// nameError maps a failed unlink(2) or renameat2(2) to the store's
// sentinels. op says what was asked ("delete", "rename OLD to") and name
// the path the error is about.
func nameError(op, name string, err error) error {
	if nd := noDescriptors(op, name, err); nd != nil {
		return nd
	}
	switch {
	case errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTEMPTY):
		// ENOTEMPTY: the new name is a directory above the old one. (Go's
		// fs.ErrExist matches it too, so it comes first.)
		return fmt.Errorf("%w: %s %s", ErrIsDirectory, op, name)
	case errors.Is(err, fs.ErrExist):
		// RENAME_NOREPLACE found the new name taken.
		return fmt.Errorf("%w: %s %s", ErrExists, op, name)
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %s %s", ErrNotFound, op, name)
	case errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("%w: %s %s: a parent is not a directory", ErrInvalidPath, op, name)
	case errors.Is(err, syscall.ENAMETOOLONG):
		return fmt.Errorf("%w: %s %s: an element is longer than the filesystem allows", ErrPathTooLong, op, name)
	case errors.Is(err, syscall.ELOOP):
		return fmt.Errorf("%w: %s %s: too many levels of symbolic links (a symlink loop?)", ErrInvalidPath, op, name)
	case isEscape(err):
		return fmt.Errorf("%w: %s %s", ErrPathEscapes, op, name)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("%w: %s %s: %w", ErrNoSpace, op, name, err)
	case errors.Is(err, syscall.EXDEV):
		return fmt.Errorf("%w: %s %s: the names are on different mounts: %w", ErrUnsupported, op, name, err)
	case errors.Is(err, syscall.EINVAL):
		// RENAME_NOREPLACE on a filesystem without it.
		return fmt.Errorf("%w: %s %s: %w", ErrUnsupported, op, name, err)
	}
	return fmt.Errorf("%s %s: %w", op, name, err)
}

// listError maps the errors of opening and reading a directory.
func listError(dir string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: directory %s", ErrNotFound, dir)
	case errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("%w: %s, or a parent of it, is not a directory", ErrInvalidPath, dir)
	}
	return mapOpenErr(dir, err)
}

// isEscape recognises os.Root's refusal of a path that leaves the root. It
// has no exported sentinel, and MkdirAll wraps it in several PathErrors.
func isEscape(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if err.Error() == "path escapes from parent" {
			return true
		}
	}
	return false
}
