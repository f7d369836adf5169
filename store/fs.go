//go:build linux

package store

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FS is the file layer under the store: the seam through which tests inject
// ENOSPC, EIO and short writes (see package faultfs). Names given to an FS
// are validated, slash-separated and relative to its root.
//
// Implementations must be safe for concurrent use.
type FS interface {
	// OpenFile opens name with the open(2) flags in flag (O_CREATE, O_DIRECT,
	// ...). It never follows a symlink out of the root.
	OpenFile(name string, flag int, perm fs.FileMode) (File, error)
	// MkdirAll creates name and its missing parents inside the root.
	MkdirAll(name string, perm fs.FileMode) error
	// SyncDir is fsync(2) of directory name ("." is the root): when it
	// returns nil, the entries created, removed and renamed in it are
	// durable.
	SyncDir(name string) error
	// Mkdir is mkdir(2) of name; an error matching fs.ErrExist if name
	// exists, whatever it is.
	Mkdir(name string, perm fs.FileMode) error
	// Remove is unlink(2) of a file, or rmdir(2) of an empty directory. A
	// symlink in name's last element is removed, not followed.
	Remove(name string) error
	// Rename is renameat2(2): the entry oldName gets the name newName,
	// replacing what newName named unless noReplace (RENAME_NOREPLACE:
	// then an error matching fs.ErrExist). A symlink in either last
	// element is renamed or replaced, not followed.
	Rename(oldName, newName string, noReplace bool) error
	// Stat is stat(2) of name, following symlinks inside the root.
	Stat(name string) (FileInfo, error)
	// Lstat is lstat(2) of name: a symlink in its last element is
	// described, not followed.
	Lstat(name string) (FileInfo, error)
	// OpenDir opens directory name ("." is the root) to list it.
	OpenDir(name string) (Dir, error)
	// Close releases the root.
	Close() error
}

// Dir is an open directory. Its methods are not safe for concurrent use.
type Dir interface {
	// Names is getdents(2): up to n names of entries (n > 0), in the
	// directory's own order, "." and ".." left out; io.EOF once none is
	// left. An entry added or removed while a listing runs may or may not
	// appear.
	Names(n int) ([]string, error)
	// Lstat describes the entry name (one element) of this directory, a
	// symlink described, not followed.
	Lstat(name string) (FileInfo, error)
	// Close closes the directory.
	Close() error
}

// File is one open descriptor. All methods may be called concurrently;
// ReadAt and WriteAt are positional (pread/pwrite) and do not move an offset.
type File interface {
	// ReadAt is pread(2): a short count at EOF comes with io.EOF.
	ReadAt(p []byte, off int64) (int, error)
	// WriteAt is pwrite(2), repeated until p is written or an error occurs;
	// it returns how many bytes reached the file.
	WriteAt(p []byte, off int64) (int, error)
	// Truncate is ftruncate(2).
	Truncate(size int64) error
	// Fallocate is fallocate(2) with FALLOC_FL_* flags.
	Fallocate(mode uint32, off, length int64) error
	// Sync is fdatasync(2) for SyncData and fsync(2) for SyncFull (mode is
	// never SyncNone). When it returns nil, everything written to the file
	// before the call is durable, with the size (SyncData) or all metadata
	// (SyncFull).
	Sync(mode SyncMode) error
	// WriteBack starts and waits for writeback of the byte range
	// (sync_file_range), so that direct I/O issued later sees the data. It
	// makes nothing durable.
	WriteBack(off, n int64) error
	// Stat is fstat(2).
	Stat() (FileInfo, error)
	// Extents lists the file's allocated ranges in offset order, written
	// and unwritten (preallocated, never written), those past EOF included;
	// a range not listed is a hole. Data not yet written back counts as
	// written. The store rebuilds its extent map from it when it opens a
	// file, so a wrapper that changes what the file holds must answer for
	// it. The operating system's files answer with FIEMAP
	// (FIEMAP_FLAG_SYNC), or where the filesystem has none with
	// SEEK_DATA/SEEK_HOLE, which cannot tell unwritten blocks from holes.
	Extents() ([]Extent, error)
	// Close closes the descriptor.
	Close() error
}

// fallocateFlags is fallocate(2)'s mode argument for mode. Punch and zero
// keep the size, as FallocateMode promises; Linux insists on KEEP_SIZE with
// PUNCH_HOLE anyway.
func fallocateFlags(mode FallocateMode) uint32 {
	switch mode {
	case FallocKeepSize:
		return unix.FALLOC_FL_KEEP_SIZE
	case FallocPunchHole:
		return unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE
	case FallocZeroRange:
		return unix.FALLOC_FL_ZERO_RANGE | unix.FALLOC_FL_KEEP_SIZE
	}
	return 0 // FallocAllocate
}

// FileInfo is the part of fstat(2) the store uses.
type FileInfo struct {
	Size      int64
	Blocks512 int64 // st_blocks: allocated 512-byte units
	BlockSize int64 // st_blksize
	Dev, Ino  uint64
	IsDir     bool
	// Type is the file's type: the fs.ModeType bits of its mode (0 for a
	// regular file).
	Type fs.FileMode
	// Nlink is the number of names the file has (st_nlink): 0 once the
	// last was removed while a descriptor keeps the file.
	Nlink uint64
	// Ctime is st_ctim in nanoseconds since the epoch: the last change of
	// the file's data or metadata, which no caller can set (utimes sets
	// mtime). 0 means the FS cannot say, and then the store trusts
	// nothing it remembered of the file since it closed it (extentCache).
	Ctime int64
}

// OSFS is the operating system's file layer below a directory, opened
// through os.Root so that no path, symlinks included, leaves it.
type OSFS struct {
	root *os.Root
	// beneath is the root directory, for openat2(2) (OpenFile); nil
	// where the kernel has no openat2 (before 5.6) or a sandbox refuses
	// it, and then every open walks the path through root. Immutable.
	beneath *os.File
	// ring writes for the O_DIRECT|O_DSYNC descriptors (aio.go), set up
	// at the first such open; nil if the kernel has none to give.
	ringOnce sync.Once
	ring     *aioRing
}

var _ FS = (*OSFS)(nil)

// OpenOSFS opens dir (creating it if missing) as an FS.
func OpenOSFS(dir string) (*OSFS, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create root %s: %w", dir, err)
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open root %s: %w", dir, err)
	}
	f := &OSFS{root: r}
	if d, err := r.OpenFile(".", os.O_RDONLY|unix.O_DIRECTORY, 0); err == nil {
		if fd, err := openat2(d, ".", os.O_RDONLY|unix.O_DIRECTORY); err == nil {
			unix.Close(fd)
			f.beneath = d
		} else {
			d.Close()
		}
	}
	return f, nil
}

// resolveBeneath are the openat2(2) rules of the fast path: nothing
// resolves outside the root (RESOLVE_BENEATH), and no symlink is followed
// at all (RESOLVE_NO_SYMLINKS, which refuses magic links too). A path
// without symlinks resolves alike in the kernel and in os.Root, and one
// with symlinks is os.Root's to follow, by its rules: inside the root
// only, and at most 8 of them where the kernel would follow 40.
const resolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS

// OpenFile implements FS. An existing file on a path without symlinks
// opens with one openat2(2) that resolves the whole path in the kernel,
// where os.Root opens and closes each directory on the way (four calls
// more for "a/b/f"): a store with more files than descriptors reopens a
// file for most writes. A missing file is ENOENT either way (resolution
// met no symlink before it). Anything else openat2 refuses, a symlink
// above all, and every create go to os.Root, whose verdict is the rule.
func (f *OSFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	if f.beneath != nil && flag&os.O_CREATE == 0 {
		fd, err := openat2(f.beneath, name, flag)
		if err == nil {
			return &osFile{fd: fd, name: name, ring: f.ringFor(flag)}, nil
		}
		if errors.Is(err, unix.ENOENT) {
			return nil, &os.PathError{Op: "openat2", Path: name, Err: err}
		}
	}
	file, err := f.root.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	of := newOSFile(file, name)
	of.ring = f.ringFor(flag)
	return of, nil
}

// ringFor is the ring that a descriptor opened with flag writes through:
// the FS's, for O_DIRECT|O_DSYNC (a durable write's, each durable by
// itself, whose round trip to the device a thread would otherwise sit
// out); nil for the others, which write with pwrite(2).
func (f *OSFS) ringFor(flag int) *aioRing {
	if flag&(syscall.O_DIRECT|syscall.O_DSYNC) != syscall.O_DIRECT|syscall.O_DSYNC {
		return nil
	}
	f.ringOnce.Do(func() { f.ring = newAIORing() })
	return f.ring
}

// openat2 opens name below dir, by resolveBeneath, with the open(2) flags
// in flag and close-on-exec.
func openat2(dir *os.File, name string, flag int) (int, error) {
	how := unix.OpenHow{Flags: uint64(flag | unix.O_CLOEXEC), Resolve: resolveBeneath}
	defer runtime.KeepAlive(dir)
	for {
		fd, err := unix.Openat2(int(dir.Fd()), name, &how)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// MkdirAll implements FS.
func (f *OSFS) MkdirAll(name string, perm fs.FileMode) error {
	return f.root.MkdirAll(name, perm)
}

// Mkdir implements FS.
func (f *OSFS) Mkdir(name string, perm fs.FileMode) error {
	return f.root.Mkdir(name, perm)
}

// Remove implements FS.
func (f *OSFS) Remove(name string) error {
	return f.root.Remove(name)
}

// SyncDir implements FS.
func (f *OSFS) SyncDir(name string) error {
	d, err := f.root.Open(name)
	if err != nil {
		return err
	}
	err = d.Sync()
	return errors.Join(relative(err, name), d.Close())
}

// Rename implements FS with renameat2(2), because os.Root.Rename has no
// RENAME_NOREPLACE. renameat2 given a path of several elements relative to
// the root's descriptor would follow a symlink in a directory element out
// of the root, so each parent directory is opened through os.Root, which
// resolves symlinks only inside the root and refuses the rest, and
// renameat2 gets descriptors of those directories and single last elements,
// which it never follows. Validated names hold no "..", so a last element
// cannot climb out either.
func (f *OSFS) Rename(oldName, newName string, noReplace bool) error {
	oldDir, err := f.root.OpenFile(path.Dir(oldName), os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer oldDir.Close()
	newDir, err := f.root.OpenFile(path.Dir(newName), os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer newDir.Close()
	var flags uint
	if noReplace {
		flags = unix.RENAME_NOREPLACE
	}
	for {
		err = unix.Renameat2(int(oldDir.Fd()), path.Base(oldName), int(newDir.Fd()), path.Base(newName), flags)
		if err == unix.ENOSYS && !noReplace {
			// A kernel before 3.15: plain renameat is the same call.
			err = unix.Renameat(int(oldDir.Fd()), path.Base(oldName), int(newDir.Fd()), path.Base(newName))
		}
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return &os.LinkError{Op: "renameat2", Old: oldName, New: newName, Err: err}
	}
	return nil
}

// Stat implements FS.
func (f *OSFS) Stat(name string) (FileInfo, error) {
	fi, err := f.root.Stat(name)
	if err != nil {
		return FileInfo{}, err
	}
	return fileInfoOf(fi)
}

// Lstat implements FS.
func (f *OSFS) Lstat(name string) (FileInfo, error) {
	fi, err := f.root.Lstat(name)
	if err != nil {
		return FileInfo{}, err
	}
	return fileInfoOf(fi)
}

// OpenDir implements FS. O_DIRECTORY makes a file fail here (ENOTDIR).
func (f *OSFS) OpenDir(name string) (Dir, error) {
	d, err := f.root.OpenFile(name, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	return osDir{d, name}, nil
}

// Close implements FS.
func (f *OSFS) Close() error {
	f.ringOnce.Do(func() {}) // none is set up from now on
	if f.ring != nil {
		f.ring.close()
	}
	var err error
	if f.beneath != nil {
		err = f.beneath.Close()
	}
	return errors.Join(f.root.Close(), err)
}

// osDir adapts an open directory to Dir.
type osDir struct {
	f    *os.File
	name string // below the root, for errors
}

var _ Dir = osDir{}

// Names uses Readdirnames, not ReadDir: on a filesystem without d_type,
// ReadDir lstats every entry, by a path from the root's own, and List
// stats only the entries of its page.
func (d osDir) Names(n int) ([]string, error) {
	names, err := d.f.Readdirnames(n)
	return names, relative(err, d.name)
}

// Lstat is fstatat(2) relative to the directory's descriptor, of one
// element: nothing is resolved on the way, and nothing leaves the root.
func (d osDir) Lstat(name string) (FileInfo, error) {
	var st unix.Stat_t
	var err error
	for {
		if err = unix.Fstatat(int(d.f.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != unix.EINTR {
			break
		}
	}
	runtime.KeepAlive(d.f)
	if err != nil {
		return FileInfo{}, &os.PathError{Op: "fstatat", Path: path.Join(d.name, name), Err: err}
	}
	return fileInfoOfStat(&st), nil
}

// fileInfoOfStat takes what the store uses from a stat(2).
func fileInfoOfStat(st *unix.Stat_t) FileInfo {
	fi := FileInfo{
		Size:      st.Size,
		Blocks512: st.Blocks,
		BlockSize: int64(st.Blksize),
		Dev:       st.Dev,
		Ino:       st.Ino,
		Nlink:     uint64(st.Nlink),
		Ctime:     st.Ctim.Nano(),
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		fi.Type = fs.ModeDir
	case unix.S_IFLNK:
		fi.Type = fs.ModeSymlink
	case unix.S_IFIFO:
		fi.Type = fs.ModeNamedPipe
	case unix.S_IFSOCK:
		fi.Type = fs.ModeSocket
	case unix.S_IFCHR:
		fi.Type = fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		fi.Type = fs.ModeDevice
	}
	fi.IsDir = fi.Type == fs.ModeDir
	return fi
}

func (d osDir) Close() error { return relative(d.f.Close(), d.name) }

// osFile adapts one of the operating system's descriptors to File. It
// holds the descriptor as an int, not as an *os.File: a store with more
// files than descriptors opens a file for most writes, and an os.File
// costs each open an fcntl(2), an attempt to join the network poller
// (epoll_ctl(2), which a regular file refuses), two allocations and a
// finalizer. What an os.File's reference count guards against, a close
// while a call still uses the descriptor, the table rules out: it closes
// a file's descriptors once no reference to its inode is left, and every
// call comes with one (inodeTable).
//
// Its errors name the file by name, its path below the root: the
// root's own path is the daemon's business, not its callers'.
type osFile struct {
	fd   int
	name string
	// owner is the *os.File that owns fd where os.Root opened it (a
	// create, a path through a symlink), which closes fd with it; nil
	// for a descriptor of openat2's.
	owner *os.File
	// ring, if not nil, makes WriteAt's writes (aio.go).
	ring *aioRing
}

var _ File = (*osFile)(nil)

// newOSFile adapts a descriptor os opened. Fd puts it in blocking mode,
// which a regular file's I/O ignores anyway (openFlags).
func newOSFile(f *os.File, name string) *osFile {
	return &osFile{fd: int(f.Fd()), name: name, owner: f}
}

// relative names the file of a *os.PathError by name.
func relative(err error, name string) error {
	if err == nil {
		return nil // before errors.As, whose target would escape
	}
	var pe *os.PathError
	if errors.As(err, &pe) {
		return &os.PathError{Op: pe.Op, Path: name, Err: pe.Err}
	}
	return err
}

// pathError is a syscall's error, naming f.
func (f *osFile) pathError(op string, err error) error {
	return &os.PathError{Op: op, Path: f.name, Err: err}
}

// ReadAt is pread(2), repeated until p is full, as os.File.ReadAt does:
// io.EOF once the file ends first.
func (f *osFile) ReadAt(p []byte, off int64) (int, error) {
	return f.whole("read", unix.Pread, p, off)
}

func (f *osFile) Truncate(size int64) error {
	return f.retry("truncate", func() error { return unix.Ftruncate(f.fd, size) })
}

// Close closes the descriptor once: a second Close is EBADF, or, had
// another open reused the number, would close someone else's.
func (f *osFile) Close() error {
	if f.owner != nil {
		return relative(f.owner.Close(), f.name)
	}
	// Not retried on EINTR: Linux frees the descriptor whatever close(2)
	// returns.
	if err := unix.Close(f.fd); err != nil {
		return f.pathError("close", err)
	}
	return nil
}

// WriteAt is pwrite(2), repeated until p is written. Like os.File.WriteAt it
// goes on after a short write, but it reports the bytes a write cut short by
// an error wrote: os.File.WriteAt's inner loop returns (bytes written,
// ENOSPC) and it reports 0, so the store would neither count nor map data
// that reached the file (seen on a full tmpfs).
func (f *osFile) WriteAt(p []byte, off int64) (int, error) {
	if f.ring != nil {
		return f.whole("write", f.ring.pwrite, p, off)
	}
	return f.whole("write", unix.Pwrite, p, off)
}

// whole repeats call, pread(2) or pwrite(2), until all of p is moved,
// retrying where a signal interrupted it, and returns how many bytes
// moved. A call that moves none ends it: the end of the file for a read
// (io.EOF), an error for a write.
func (f *osFile) whole(op string, call func(fd int, p []byte, off int64) (int, error), p []byte, off int64) (int, error) {
	done := 0
	for done < len(p) {
		n, err := call(f.fd, p[done:], off+int64(done))
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return done, f.pathError(op, err)
		case n == 0 && op == "read":
			return done, io.EOF
		case n == 0:
			return done, f.pathError(op, io.ErrUnexpectedEOF)
		}
		done += n
	}
	return done, nil
}

// retry runs call until it is not interrupted (EINTR), naming f and op in
// its error.
func (f *osFile) retry(op string, call func() error) error {
	for {
		err := call()
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return f.pathError(op, err)
		}
		return nil
	}
}

func (f *osFile) Fallocate(mode uint32, off, length int64) error {
	return f.retry("fallocate", func() error { return unix.Fallocate(f.fd, mode, off, length) })
}

func (f *osFile) Sync(mode SyncMode) error {
	if mode == SyncFull {
		return f.retry("fsync", func() error { return unix.Fsync(f.fd) })
	}
	return f.retry("fdatasync", func() error { return unix.Fdatasync(f.fd) })
}

func (f *osFile) WriteBack(off, n int64) error {
	const flags = unix.SYNC_FILE_RANGE_WAIT_BEFORE | unix.SYNC_FILE_RANGE_WRITE | unix.SYNC_FILE_RANGE_WAIT_AFTER
	return f.retry("sync_file_range", func() error { return unix.SyncFileRange(f.fd, off, n, flags) })
}

func (f *osFile) Extents() ([]Extent, error) {
	list, err := fileExtents(uintptr(f.fd))
	if err != nil {
		return nil, f.pathError("extents", err)
	}
	return list, nil
}

// Stat is fstat(2) into the caller's frame: os.File.Stat allocates its
// answer, and a file reopened for a write is stat twice, at its open and
// at its close.
func (f *osFile) Stat() (FileInfo, error) {
	var st unix.Stat_t
	if err := f.retry("fstat", func() error { return unix.Fstat(f.fd, &st) }); err != nil {
		return FileInfo{}, err
	}
	return fileInfoOfStat(&st), nil
}

var _ linkCounter = (*osFile)(nil)

// Links is statx(2) of the link count and the size alone. Unlike fstat(2) it does not
// read the timestamps, and so does not mark the ctime as seen: with
// multigrain timestamps (Linux 6.13) a seen ctime makes the next write
// take a fine-grained one, dirtying the inode, which an O_DSYNC write
// and ext4's fsync without a journal then write to disk synchronously:
// one more device write per durable write, where a coarse timestamp
// changes once a tick.
func (f *osFile) Links() (uint64, int64, error) {
	var stx unix.Statx_t
	err := f.retry("statx", func() error {
		return unix.Statx(f.fd, "", unix.AT_EMPTY_PATH|unix.AT_STATX_DONT_SYNC, unix.STATX_NLINK|unix.STATX_SIZE, &stx)
	})
	return uint64(stx.Nlink), int64(stx.Size), err
}

// linkCounter is a File that can read its link count and size alone,
// without the timestamps (osFile).
type linkCounter interface {
	Links() (uint64, int64, error)
}

// links is f's link count and size: through Links where f has it, else
// fstat(2).
func links(f File) (uint64, int64, error) {
	if lc, ok := f.(linkCounter); ok {
		return lc.Links()
	}
	fi, err := f.Stat()
	return fi.Nlink, fi.Size, err
}

// fileInfoOf takes what the store uses from an os.FileInfo of Linux.
func fileInfoOf(fi fs.FileInfo) (FileInfo, error) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return FileInfo{}, errors.New("fstat: no syscall.Stat_t")
	}
	return FileInfo{
		Size:      st.Size,
		Blocks512: st.Blocks,
		BlockSize: int64(st.Blksize),
		Dev:       st.Dev,
		Ino:       st.Ino,
		IsDir:     fi.IsDir(),
		Type:      fi.Mode().Type(),
		Nlink:     uint64(st.Nlink),
		Ctime:     st.Ctim.Nano(),
	}, nil
}

var _ mappable = (*osFile)(nil)

// Map is mmap(2) of the first length bytes, shared and writable.
func (f *osFile) Map(length int64) ([]byte, error) {
	b, err := unix.Mmap(f.fd, 0, int(length), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, f.pathError("mmap", err)
	}
	return b, nil
}

// Unmap is munmap(2).
func (f *osFile) Unmap(b []byte) error {
	if err := unix.Munmap(b); err != nil {
		return f.pathError("munmap", err)
	}
	return nil
}

// Resident is mincore(2), which x/sys/unix offers no wrapper for on Linux.
func (f *osFile) Resident(b []byte, vec []byte) error {
	if len(b) == 0 {
		return nil
	}
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0])))
	if errno != 0 {
		return f.pathError("mincore", errno)
	}
	return nil
}

// TouchModified is futimens(2) with mtime UTIME_NOW and atime UTIME_OMIT:
// utimensat(2) on the descriptor itself (a NULL path), which x/sys/unix
// offers no wrapper for.
func (f *osFile) TouchModified() error {
	ts := [2]unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_NOW}}
	for {
		_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(f.fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
		switch errno {
		case 0:
			return nil
		case unix.EINTR:
			continue
		}
		return f.pathError("futimens", errno)
	}
}
