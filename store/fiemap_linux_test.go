package store

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/filewrite/filewrite/internal/testutil"
)

// fiemapFile creates an empty file in a test directory on the project
// filesystem and returns it with the filesystem's block size. It skips the
// test where FIEMAP is missing, and, when ext4Only, where the filesystem is
// not ext4: the expected layouts below are ext4's, other filesystems are
// free to allocate differently.
func fiemapFile(t *testing.T, flag int, ext4Only bool) (*os.File, int64) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(testutil.Dir(t), "f"), os.O_RDWR|os.O_CREATE|os.O_EXCL|flag, 0o644)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &sfs); err != nil {
		t.Fatalf("fstatfs: %v", err)
	}
	if _, err := readFiemap(f.Fd(), int64(sfs.Bsize)); errors.Is(err, ErrUnsupported) {
		t.Skipf("FIEMAP is not supported on the filesystem of the package directory (type %#x): %v", sfs.Type, err)
	} else if err != nil {
		t.Fatalf("readFiemap of an empty file: %v", err)
	}
	if ext4Only && sfs.Type != unix.EXT4_SUPER_MAGIC {
		t.Skipf("expected layouts are ext4's; the package directory is on filesystem type %#x", sfs.Type)
	}
	return f, int64(sfs.Bsize)
}

// alignedBytes returns n bytes of 0xAB aligned for O_DIRECT.
func alignedBytes(n int) []byte {
	const align = 4096
	b := make([]byte, n+align)
	off := (align - int(uintptr(unsafe.Pointer(&b[0]))%align)) % align
	b = b[off : off+n]
	for i := range b {
		b[i] = 0xAB
	}
	return b
}

// fileOps are the file operations of the real-file tests; each fails the
// test on error.
type fileOps struct {
	t *testing.T
	f *os.File
}

func (o fileOps) fd() int { return int(o.f.Fd()) }

func (o fileOps) pwrite(off, n int64) {
	o.t.Helper()
	if _, err := unix.Pwrite(o.fd(), alignedBytes(int(n)), off); err != nil {
		o.t.Fatalf("pwrite(%d, %d): %v", off, n, err)
	}
}

func (o fileOps) fallocate(mode uint32, off, n int64) {
	o.t.Helper()
	if err := unix.Fallocate(o.fd(), mode, off, n); err != nil {
		o.t.Fatalf("fallocate(%#x, %d, %d): %v", mode, off, n, err)
	}
}

func (o fileOps) truncate(size int64) {
	o.t.Helper()
	if err := unix.Ftruncate(o.fd(), size); err != nil {
		o.t.Fatalf("ftruncate(%d): %v", size, err)
	}
}

func (o fileOps) fdatasync() {
	o.t.Helper()
	if err := unix.Fdatasync(o.fd()); err != nil {
		o.t.Fatalf("fdatasync: %v", err)
	}
}

func (o fileOps) size() int64 {
	o.t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(o.fd(), &st); err != nil {
		o.t.Fatalf("fstat: %v", err)
	}
	return st.Size
}

const (
	keepSize  = unix.FALLOC_FL_KEEP_SIZE
	punchHole = unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE
	zeroRange = unix.FALLOC_FL_ZERO_RANGE
)

// TestReadFiemapExt4 records, as expected layouts, what ext4 reports after
// each kind of operation the store performs, read back with FIEMAP_FLAG_SYNC.
// The store's own map must track these rules. Observed on Linux 6.18, ext4
// with 4 KiB blocks and default mount options (dioread_nolock):
//
//   - A write into unwritten blocks converts exactly the blocks it touches,
//     whole blocks even for an unaligned write, even in a preallocation
//     smaller than extent_max_zeroout_kb (32 KiB): with dioread_nolock the
//     conversion happens at I/O completion and never zeroes neighbours. This
//     holds for buffered writes once written back and for O_DIRECT at once.
//   - FALLOC_FL_ZERO_RANGE converts the whole blocks inside the range to
//     unwritten. Partial blocks at unaligned edges are zeroed in place: a
//     written edge block stays written, a hole edge block becomes unwritten
//     (ext4 preallocates the range rounded out before zeroing), an unwritten
//     one stays unwritten. A range inside a single block changes no state.
//     The result is the same whether or not the data was synced first.
//     Without KEEP_SIZE it grows the size to off+len like fallocate mode 0.
//   - FALLOC_FL_PUNCH_HOLE frees only whole blocks; partial edge blocks are
//     zeroed and keep their state.
//   - ftruncate to the size the file already has drops every block past
//     EOF, including FALLOC_FL_KEEP_SIZE preallocation ("Call
//     ext4_truncate() even if i_size didn't change", fs/ext4/inode.c). The
//     block holding an unaligned EOF is kept.
//   - ftruncate growing the file allocates nothing and keeps KEEP_SIZE
//     blocks, even those still past the new size. Shrinking drops every
//     block wholly past the new size and keeps the block holding EOF in
//     its state (an unwritten one is not zeroed into written).
//   - fallocate mode 0 and KEEP_SIZE round out to whole blocks and leave
//     written blocks written.
func TestReadFiemapExt4(t *testing.T) {
	type run = extentRun
	tests := []struct {
		name     string
		direct   bool
		ops      func(o fileOps, b int64)
		want     func(b int64) []run // b is the block size
		wantSize func(b int64) int64
	}{
		{
			name:     "fallocate allocates unwritten blocks and grows the size",
			ops:      func(o fileOps, b int64) { o.fallocate(0, 0, 8*b) },
			want:     func(b int64) []run { return []run{{0, 8, unw}} },
			wantSize: func(b int64) int64 { return 8 * b },
		},
		{
			name:     "fallocate rounds an unaligned range out to blocks",
			ops:      func(o fileOps, b int64) { o.fallocate(0, 100, 2*b) },
			want:     func(b int64) []run { return []run{{0, 3, unw}} },
			wantSize: func(b int64) int64 { return 2*b + 100 },
		},
		{
			name: "fallocate KEEP_SIZE maps blocks past EOF",
			ops: func(o fileOps, b int64) {
				o.pwrite(0, b)
				o.fallocate(keepSize, 0, 8*b)
			},
			want:     func(b int64) []run { return []run{{0, 1, wr}, {1, 8, unw}} },
			wantSize: func(b int64) int64 { return b },
		},
		{
			name: "fallocate leaves written blocks written",
			ops: func(o fileOps, b int64) {
				o.pwrite(3*b, b)
				o.fdatasync()
				o.fallocate(0, 0, 10*b)
			},
			want:     func(b int64) []run { return []run{{0, 3, unw}, {3, 4, wr}, {4, 10, unw}} },
			wantSize: func(b int64) int64 { return 10 * b },
		},
		{
			name: "fallocate over dirty page-cache data in a hole",
			ops: func(o fileOps, b int64) {
				o.pwrite(3*b, b)
				o.fallocate(0, 0, 10*b)
			},
			want:     func(b int64) []run { return []run{{0, 3, unw}, {3, 4, wr}, {4, 10, unw}} },
			wantSize: func(b int64) int64 { return 10 * b },
		},
		{
			name: "buffered write converts one block of a preallocation",
			ops: func(o fileOps, b int64) {
				o.fallocate(0, 0, 64*b)
				o.pwrite(8*b, b)
			},
			want:     func(b int64) []run { return []run{{0, 8, unw}, {8, 9, wr}, {9, 64, unw}} },
			wantSize: func(b int64) int64 { return 64 * b },
		},
		{
			name: "a preallocation below extent_max_zeroout is split exactly too",
			ops: func(o fileOps, b int64) {
				o.fallocate(0, 0, 6*b)
				o.pwrite(2*b, b)
			},
			want:     func(b int64) []run { return []run{{0, 2, unw}, {2, 3, wr}, {3, 6, unw}} },
			wantSize: func(b int64) int64 { return 6 * b },
		},
		{
			name:   "O_DIRECT write converts one block of a preallocation",
			direct: true,
			ops: func(o fileOps, b int64) {
				o.fallocate(0, 0, 6*b)
				o.pwrite(2*b, b)
			},
			want:     func(b int64) []run { return []run{{0, 2, unw}, {2, 3, wr}, {3, 6, unw}} },
			wantSize: func(b int64) int64 { return 6 * b },
		},
		{
			name: "an unaligned write converts the whole block",
			ops: func(o fileOps, b int64) {
				o.fallocate(0, 0, 64*b)
				o.pwrite(8*b+50, 100)
			},
			want:     func(b int64) []run { return []run{{0, 8, unw}, {8, 9, wr}, {9, 64, unw}} },
			wantSize: func(b int64) int64 { return 64 * b },
		},
		{
			name: "write past EOF into KEEP_SIZE preallocation",
			ops: func(o fileOps, b int64) {
				o.fallocate(keepSize, 0, 64*b)
				o.pwrite(30*b, b)
			},
			want:     func(b int64) []run { return []run{{0, 30, unw}, {30, 31, wr}, {31, 64, unw}} },
			wantSize: func(b int64) int64 { return 31 * b },
		},
		{
			name: "sparse file",
			ops: func(o fileOps, b int64) {
				o.pwrite(0, b)
				o.pwrite(100*b, 2*b)
				o.truncate(1000 * b)
			},
			want:     func(b int64) []run { return []run{{0, 1, wr}, {100, 102, wr}} },
			wantSize: func(b int64) int64 { return 1000 * b },
		},
		{
			name: "punch hole, aligned",
			ops: func(o fileOps, b int64) {
				o.pwrite(0, 10*b)
				o.fallocate(punchHole, 2*b, 3*b)
			},
			want:     func(b int64) []run { return []run{{0, 2, wr}, {5, 10, wr}} },
			wantSize: func(b int64) int64 { return 10 * b },
		},
		{
			name: "punch hole keeps partial edge blocks",
			ops: func(o fileOps, b int64) {
				o.pwrite(0, 10*b)
				o.fallocate(punchHole, b+100, 6*b)
			},
			want:     func(b int64) []run { return []run{{0, 2, wr}, {7, 10, wr}} },
			wantSize: func(b int64) int64 { return 10 * b },
		},
		{
			name: "zero range, aligned, over written blocks",
			ops: func(o fileOps, b int64) {
				o.pwrite(0, 10*b)
				o.fdatasync()
				o.fallocate(zeroRange, b, 6*b)
			},
			want:     func(b int64) []run { return []run{{0, 1, wr}, {1, 7, unw}, {7, 10, wr}} },
			wantSize: func(b int64) int64 { return 10 * b },
		},
		{
			name: "zero range, unaligned, over written blocks: edge blocks stay written",
			ops: func(o fileOps, b int64) {
				o.pwrite(0, 10*b)
				o.fdatasync()
				o.fallocate(zeroRange, b+100, 6*b) // blocks 1 and 7 partial
			},
			want:     func(b int64) []run { return []run{{0, 2, wr}, {2, 7, unw}, {7, 10, wr}} },
			wantSize: func(b int64) int64 { return 10 * b },
		},
		{
			name: "zero range, unaligned, over dirty unsynced data: same result",
			ops: func(o fileOps, b int64) {
				o.pwrite(0, 10*b)
				o.fallocate(zeroRange, b+100, 6*b)
			},
			want:     func(b int64) []run { return []run{{0, 2, wr}, {2, 7, unw}, {7, 10, wr}} },
			wantSize: func(b int64) int64 { return 10 * b },
		},
		{
			name: "zero range inside one written block changes nothing",
			ops: func(o fileOps, b int64) {
				o.pwrite(0, 10*b)
				o.fdatasync()
				o.fallocate(zeroRange, b+100, 200)
			},
			want:     func(b int64) []run { return []run{{0, 10, wr}} },
			wantSize: func(b int64) int64 { return 10 * b },
		},
		{
			name: "zero range, unaligned, over a hole: edge blocks become unwritten too",
			ops: func(o fileOps, b int64) {
				o.truncate(20 * b)
				o.fallocate(zeroRange, b+100, 6*b)
			},
			want:     func(b int64) []run { return []run{{1, 8, unw}} },
			wantSize: func(b int64) int64 { return 20 * b },
		},
		{
			name:     "zero range past EOF grows the size",
			ops:      func(o fileOps, b int64) { o.fallocate(zeroRange, b+100, 6*b) },
			want:     func(b int64) []run { return []run{{1, 8, unw}} },
			wantSize: func(b int64) int64 { return 7*b + 100 },
		},
		{
			name: "zero range over unwritten blocks",
			ops: func(o fileOps, b int64) {
				o.fallocate(0, 0, 10*b)
				o.fallocate(zeroRange, b+100, 6*b)
			},
			want:     func(b int64) []run { return []run{{0, 10, unw}} },
			wantSize: func(b int64) int64 { return 10 * b },
		},
		{
			name: "truncate shrinking keeps the unwritten block holding EOF",
			ops: func(o fileOps, b int64) {
				o.fallocate(0, 0, 10*b)
				o.truncate(3*b + 10)
			},
			want:     func(b int64) []run { return []run{{0, 4, unw}} },
			wantSize: func(b int64) int64 { return 3*b + 10 },
		},
		{
			name: "truncate shrinking keeps the written block holding EOF",
			ops: func(o fileOps, b int64) {
				o.pwrite(0, 10*b)
				o.truncate(3*b + 10)
			},
			want:     func(b int64) []run { return []run{{0, 4, wr}} },
			wantSize: func(b int64) int64 { return 3*b + 10 },
		},
		{
			name: "truncate growing allocates nothing",
			ops: func(o fileOps, b int64) {
				o.pwrite(0, b)
				o.truncate(100 * b)
			},
			want:     func(b int64) []run { return []run{{0, 1, wr}} },
			wantSize: func(b int64) int64 { return 100 * b },
		},
		{
			name: "truncate to the same size drops KEEP_SIZE blocks past EOF",
			ops: func(o fileOps, b int64) {
				o.pwrite(0, 2*b)
				o.fallocate(keepSize, 0, 10*b)
				o.truncate(2 * b)
			},
			want:     func(b int64) []run { return []run{{0, 2, wr}} },
			wantSize: func(b int64) int64 { return 2 * b },
		},
		{
			name: "truncate to the same unaligned size keeps the block holding EOF",
			ops: func(o fileOps, b int64) {
				o.pwrite(0, b+10)
				o.fallocate(keepSize, 0, 10*b)
				o.truncate(b + 10)
			},
			want:     func(b int64) []run { return []run{{0, 2, wr}} },
			wantSize: func(b int64) int64 { return b + 10 },
		},
		{
			name: "truncate growing keeps KEEP_SIZE blocks, even past the new size",
			ops: func(o fileOps, b int64) {
				o.pwrite(0, 2*b)
				o.fallocate(keepSize, 0, 10*b)
				o.truncate(5 * b)
			},
			want:     func(b int64) []run { return []run{{0, 2, wr}, {2, 10, unw}} },
			wantSize: func(b int64) int64 { return 5 * b },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			flag := 0
			if tt.direct {
				flag = unix.O_DIRECT
			}
			f, b := fiemapFile(t, flag, true)
			o := fileOps{t, f}
			tt.ops(o, b)
			m, err := readFiemap(f.Fd(), b)
			if err != nil {
				t.Fatalf("readFiemap: %v", err)
			}
			if got, want := dumpRuns(m), tt.want(b); !slices.Equal(got, want) {
				t.Errorf("runs: got %v, want %v", got, want)
			}
			if got, want := o.size(), tt.wantSize(b); got != want {
				t.Errorf("size: got %d, want %d", got, want)
			}
			// loadExtentMap must agree where FIEMAP works.
			loaded, err := loadExtentMap(newOSFile(f, "f"), b)
			if err != nil {
				t.Fatalf("loadExtentMap: %v", err)
			}
			if !loaded.equal(m) {
				t.Errorf("loadExtentMap: got %v, want %v", loaded, m)
			}
		})
	}
}

// TestFiemapWithoutSync records why readFiemap passes FIEMAP_FLAG_SYNC: on
// ext4 a buffered write is not visible in the extent tree until writeback.
// Dirty data over a hole shows as DELALLOC|UNKNOWN (so readFiemapFlags maps
// it to written), but dirty data over unwritten blocks, and data written
// into a hole and then covered by fallocate, still show as plain UNWRITTEN,
// without any DELALLOC flag. Without the sync the map would call written
// blocks unwritten.
func TestFiemapWithoutSync(t *testing.T) {
	f, b := fiemapFile(t, 0, true)
	o := fileOps{t, f}
	o.pwrite(8*b, b)

	req := &fiemapRequest{hdr: fiemapHeader{length: ^uint64(0), extentCount: fiemapBatch}}
	if err := ioctlFiemap(f.Fd(), req); err != nil {
		t.Fatalf("FIEMAP: %v", err)
	}
	if got, want := req.hdr.mappedExtents, uint32(1); got != want {
		t.Fatalf("extents of a file with one dirty block: got %d, want %d", got, want)
	}
	const want = fiemapExtentDelalloc | fiemapExtentUnknown | fiemapExtentLast
	if got := req.extents[0].flags; got != want {
		t.Errorf("flags of a dirty block in a hole: got %#x, want %#x", got, want)
	}

	o.fallocate(0, 0, 64*b) // covers the dirty block
	o.pwrite(20*b, b)       // dirty block over unwritten
	tests := []struct {
		name  string
		flags uint32
		want  []extentRun
	}{
		{"without FLAG_SYNC", 0, []extentRun{{0, 64, unw}}},
		{"with FLAG_SYNC", fiemapFlagSync, []extentRun{{0, 8, unw}, {8, 9, wr}, {9, 20, unw}, {20, 21, wr}, {21, 64, unw}}},
	}
	for _, tt := range tests {
		m, err := readFiemapFlags(f.Fd(), b, tt.flags)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if got := dumpRuns(m); !slices.Equal(got, tt.want) {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestReadFiemapManyExtents makes the reader page: alternating written and
// unwritten blocks cannot merge, so the file has several batches of extents.
func TestReadFiemapManyExtents(t *testing.T) {
	f, b := fiemapFile(t, unix.O_DIRECT, false)
	o := fileOps{t, f}
	const blocks = 3*fiemapBatch + 101
	o.fallocate(0, 0, blocks*b)
	want := newExtentMap(b)
	want.set(0, blocks, unw)
	for i := int64(0); i < blocks; i += 2 {
		o.pwrite(i*b, b)
		want.set(i, i+1, wr)
	}
	got, err := readFiemap(f.Fd(), b)
	if err != nil {
		t.Fatalf("readFiemap: %v", err)
	}
	if !got.equal(want) {
		t.Errorf("got %d runs %v\nwant %d runs %v", got.runs(), got, want.runs(), want)
	}
}

// TestReadFiemapLargePreallocation checks that the several extents ext4
// needs for 1 GiB (an unwritten extent holds at most 32767 blocks) come
// back as one run.
func TestReadFiemapLargePreallocation(t *testing.T) {
	f, b := fiemapFile(t, 0, false)
	fileOps{t, f}.fallocate(0, 0, 1<<30)
	m, err := readFiemap(f.Fd(), b)
	if err != nil {
		t.Fatalf("readFiemap: %v", err)
	}
	want := []extentRun{{0, (1 << 30) / b, unw}}
	if got := dumpRuns(m); !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestLoadExtentMapSeekData covers the fallback on the project filesystem: data is
// found, and unwritten blocks, which read as zeros, are holes to SEEK_DATA.
func TestLoadExtentMapSeekData(t *testing.T) {
	f, b := fiemapFile(t, 0, true)
	o := fileOps{t, f}
	o.fallocate(0, 0, 16*b)
	o.pwrite(2*b, b)
	o.pwrite(5*b+10, 2*b) // blocks 5..7
	o.truncate(20 * b)
	o.pwrite(19*b, 10)
	o.fdatasync()
	m, err := seekDataMap(f.Fd(), o.size(), b)
	if err != nil {
		t.Fatalf("seekDataMap: %v", err)
	}
	want := []extentRun{{2, 3, wr}, {5, 8, wr}, {19, 20, wr}}
	if got := dumpRuns(m); !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestLoadExtentMapFallback runs loadExtentMap where FIEMAP is missing:
// tmpfs, whose SEEK_DATA works, and a pipe, which has neither.
func TestLoadExtentMapFallback(t *testing.T) {
	t.Run("tmpfs", func(t *testing.T) {
		var sfs unix.Statfs_t
		if err := unix.Statfs("/dev/shm", &sfs); err != nil || sfs.Type != unix.TMPFS_MAGIC {
			t.Skip("no tmpfs at /dev/shm")
		}
		dir, err := os.MkdirTemp("/dev/shm", "filewrite-test-")
		if err != nil {
			t.Skipf("cannot create a directory on tmpfs: %v", err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		f, err := os.Create(filepath.Join(dir, "f"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		const b = 4096 // tmpfs works in pages
		o := fileOps{t, f}
		o.pwrite(3*b, b)
		o.truncate(10 * b)
		if _, err := readFiemap(f.Fd(), b); !errors.Is(err, ErrUnsupported) {
			t.Fatalf("readFiemap on tmpfs: got error %v, want ErrUnsupported", err)
		}
		m, err := loadExtentMap(newOSFile(f, "f"), b)
		if err != nil {
			t.Fatalf("loadExtentMap: %v", err)
		}
		if got, want := dumpRuns(m), []extentRun{{3, 4, wr}}; !slices.Equal(got, want) {
			t.Errorf("got %v, want %v", got, want)
		}
	})
	t.Run("pipe", func(t *testing.T) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		defer w.Close()
		m, err := loadExtentMap(newOSFile(r, "r"), 4096)
		if err != nil {
			t.Fatalf("loadExtentMap: %v", err)
		}
		if got := m.runs(); got != 0 {
			t.Errorf("runs: got %d, want 0", got)
		}
	})
}
