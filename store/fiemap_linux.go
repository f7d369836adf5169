package store

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FIEMAP, from Linux's include/uapi/linux/fiemap.h and fs.h. x/sys/unix does
// not define it.
const (
	fsIocFiemap = 0xC020660B // _IOWR('f', 11, struct fiemap)

	fiemapFlagSync = 0x1 // write back dirty pages before mapping

	fiemapExtentLast      = 0x1
	fiemapExtentUnknown   = 0x2
	fiemapExtentDelalloc  = 0x4
	fiemapExtentUnwritten = 0x800

	// fiemapBatch is how many extents one ioctl returns: 28 KiB of buffer,
	// so a file of 260k extents takes ~500 calls rather than 260k.
	fiemapBatch = 512
)

// fiemapHeader is struct fiemap without its flexible array.
type fiemapHeader struct {
	start         uint64 // fm_start: first logical byte to map
	length        uint64 // fm_length: bytes to map from start
	flags         uint32 // fm_flags: FIEMAP_FLAG_*
	mappedExtents uint32 // fm_mapped_extents: filled in by the kernel
	extentCount   uint32 // fm_extent_count: room in the array
	_             uint32 // fm_reserved
}

// fiemapExtent is struct fiemap_extent.
type fiemapExtent struct {
	logical  uint64 // fe_logical: byte offset in the file
	physical uint64 // fe_physical: byte offset on the device
	length   uint64 // fe_length
	_        [2]uint64
	flags    uint32 // fe_flags: FIEMAP_EXTENT_*
	_        [3]uint32
}

// fiemapRequest is the ioctl argument laid out as the kernel expects it: a
// Go struct rather than a byte slice so that the extents are 8-byte aligned
// and the compiler, not pointer arithmetic, knows the size.
type fiemapRequest struct {
	hdr     fiemapHeader
	extents [fiemapBatch]fiemapExtent
}

// The kernel copies exactly these sizes; a layout change here would make it
// read or write past the buffer.
var (
	_ [32]byte                  = [unsafe.Sizeof(fiemapHeader{})]byte{}
	_ [56]byte                  = [unsafe.Sizeof(fiemapExtent{})]byte{}
	_ [32 + 56*fiemapBatch]byte = [unsafe.Sizeof(fiemapRequest{})]byte{}
)

// readFiemap builds the extent map of the open file fd from FS_IOC_FIEMAP
// with FIEMAP_FLAG_SYNC (see fiemapExtents), rounding extents out to whole
// blocks of blockSize (see extentMapOf).
//
// When the filesystem has no FIEMAP (tmpfs, some FUSE and network
// filesystems) the error wraps both ErrUnsupported and the errno.
func readFiemap(fd uintptr, blockSize int64) (*extentMap, error) {
	return readFiemapFlags(fd, blockSize, fiemapFlagSync)
}

// readFiemapFlags is readFiemap with the FIEMAP_FLAG_* bits given, so that
// tests can observe what the kernel reports without a sync.
func readFiemapFlags(fd uintptr, blockSize int64, flags uint32) (*extentMap, error) {
	list, err := fiemapExtents(fd, flags)
	if err != nil {
		return nil, err
	}
	return extentMapOf(list, blockSize)
}

// fiemapExtents lists the allocated extents of the open file fd from
// FS_IOC_FIEMAP with the FIEMAP_FLAG_* bits in flags, in offset order,
// adjacent extents of one state merged. With FIEMAP_FLAG_SYNC dirty
// page-cache data is written back first, so that delayed allocations show
// as real extents. Unwritten extents are ExtentUnwritten, all others
// (including any DELALLOC or UNKNOWN that survive the sync) ExtentWritten.
// Extents past EOF (fallocate with FALLOC_FL_KEEP_SIZE) are included.
func fiemapExtents(fd uintptr, flags uint32) ([]Extent, error) {
	var list []Extent
	req := new(fiemapRequest)
	var next uint64 // first byte not yet mapped
	for {
		req.hdr = fiemapHeader{
			start:       next,
			length:      ^uint64(0) - next, // to the end; the kernel clamps
			flags:       flags,
			extentCount: fiemapBatch,
		}
		if err := ioctlFiemap(fd, req); err != nil {
			return nil, err
		}
		n := req.hdr.mappedExtents
		if n == 0 {
			return list, nil
		}
		if n > fiemapBatch {
			return nil, fmt.Errorf("FS_IOC_FIEMAP: kernel mapped %d extents into room for %d", n, fiemapBatch)
		}
		for _, e := range req.extents[:n] {
			if e.length == 0 {
				continue
			}
			end := e.logical + e.length
			if end < e.logical || end > 1<<63-1 {
				return nil, fmt.Errorf("FS_IOC_FIEMAP: extent [%d, +%d) out of range", e.logical, e.length)
			}
			st := ExtentWritten
			if e.flags&fiemapExtentUnwritten != 0 {
				st = ExtentUnwritten
			}
			list = appendExtent(list, Extent{Offset: int64(e.logical), Length: int64(e.length), State: st})
		}
		lastExt := req.extents[n-1]
		if lastExt.flags&fiemapExtentLast != 0 {
			return list, nil
		}
		// The kernel returns extents that overlap fm_start from their own
		// start, so progress must be checked rather than assumed.
		end := lastExt.logical + lastExt.length
		if end <= next {
			return nil, fmt.Errorf("FS_IOC_FIEMAP: no progress at byte %d", next)
		}
		next = end
	}
}

// appendExtent appends e to list, merged into the last extent when it
// continues it in the same state.
func appendExtent(list []Extent, e Extent) []Extent {
	if n := len(list); n > 0 {
		last := &list[n-1]
		if last.State == e.State && last.Offset+last.Length == e.Offset {
			last.Length += e.Length
			return list
		}
	}
	return append(list, e)
}

func ioctlFiemap(fd uintptr, req *fiemapRequest) error {
	for {
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, fsIocFiemap, uintptr(unsafe.Pointer(req)))
		switch errno {
		case 0:
			return nil
		case unix.EINTR:
			continue
		case unix.EOPNOTSUPP, unix.ENOTTY, unix.EINVAL:
			return fmt.Errorf("FS_IOC_FIEMAP: %w: %w", ErrUnsupported, errno)
		default:
			return fmt.Errorf("FS_IOC_FIEMAP: %w", errno)
		}
	}
}

// fileExtents is File.Extents of the open file fd: from FIEMAP where the
// filesystem has it, else from SEEK_DATA/SEEK_HOLE, else all of [0, size)
// written.
//
// The fallbacks cannot see unwritten extents: SEEK_DATA reports unwritten
// blocks as holes on most filesystems (they read as zeros) and blocks past
// EOF not at all. The list then under-reports allocation, which only costs
// the lock policies some shared-lock opportunities, never correctness: a
// block believed to be a hole takes the exclusive path. The last resort
// (all of [0, size) written) errs the other way: a hole below EOF is taken
// for written, so a write into it may be classed as an overwrite. It is only
// reached where lseek itself fails.
func fileExtents(fd uintptr) ([]Extent, error) {
	list, err := fiemapExtents(fd, fiemapFlagSync)
	if err == nil {
		return list, nil
	}
	if !errors.Is(err, ErrUnsupported) {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(fd), &st); err != nil {
		return nil, fmt.Errorf("fstat: %w", err)
	}
	if list, err := seekDataExtents(fd, st.Size); err == nil {
		return list, nil
	}
	if st.Size == 0 {
		return nil, nil
	}
	return []Extent{{Offset: 0, Length: st.Size, State: ExtentWritten}}, nil
}

// loadExtentMap builds the extent map of f when the store opens it, from
// f.Extents (FIEMAP on the operating system's files, see fileExtents).
//
// Preconditions: no one writes, truncates or fallocates f until it returns
// (the caller holds the inode lock exclusively, or the inode is not yet in
// the table).
func loadExtentMap(f File, blockSize int64) (*extentMap, error) {
	if blockSize <= 0 {
		return nil, fmt.Errorf("load extent map: block size %d", blockSize)
	}
	list, err := f.Extents()
	if err != nil {
		return nil, fmt.Errorf("load extent map: %w", err)
	}
	m, err := extentMapOf(list, blockSize)
	if err != nil {
		return nil, fmt.Errorf("load extent map: %w", err)
	}
	return m, nil
}

// seekDataMap maps the data ranges below size as written (see
// seekDataExtents).
func seekDataMap(fd uintptr, size, blockSize int64) (*extentMap, error) {
	list, err := seekDataExtents(fd, size)
	if err != nil {
		return nil, err
	}
	return extentMapOf(list, blockSize)
}

// seekDataExtents lists the data ranges below size as written. It moves the
// file offset of fd, which the store never uses: all its I/O is positional.
func seekDataExtents(fd uintptr, size int64) ([]Extent, error) {
	var list []Extent
	for pos := int64(0); pos < size; {
		data, err := unix.Seek(int(fd), pos, unix.SEEK_DATA)
		if err == unix.ENXIO {
			break // no data at or after pos
		}
		if err != nil {
			return nil, fmt.Errorf("lseek SEEK_DATA %d: %w", pos, err)
		}
		holeAt, err := unix.Seek(int(fd), data, unix.SEEK_HOLE)
		if err != nil {
			return nil, fmt.Errorf("lseek SEEK_HOLE %d: %w", data, err)
		}
		if holeAt <= data {
			return nil, fmt.Errorf("lseek: hole at %d before data at %d", holeAt, data)
		}
		list = appendExtent(list, Extent{Offset: data, Length: holeAt - data, State: ExtentWritten})
		pos = holeAt
	}
	return list, nil
}
