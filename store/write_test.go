//go:build linux

package store

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"unsafe"
)

// chunkFile is a File that records the positional writes it gets, and
// fails the one at failAt, if set, after writing half of it.
type chunkFile struct {
	File
	align   int
	content []byte
	calls   []string
	failAt  int64
	failErr error
}

func (f *chunkFile) WriteAt(p []byte, off int64) (int, error) {
	f.calls = append(f.calls, fmt.Sprintf("%d+%d", off, len(p)))
	if uintptr(unsafe.Pointer(&p[0]))%uintptr(f.align) != 0 {
		return 0, fmt.Errorf("buffer at %p is not aligned to %d", &p[0], f.align)
	}
	n := len(p)
	var err error
	if f.failErr != nil && off == f.failAt {
		n, err = n/2, f.failErr
	}
	if end := int(off) + n; end > len(f.content) {
		f.content = append(f.content, make([]byte, end-len(f.content))...)
	}
	copy(f.content[off:], p[:n])
	return n, err
}

// TestWriteDirectChunks: a direct write goes out in aligned chunks of at
// most the chunk size, from aligned buffers, and a chunk that fails stops
// it with the bytes that reached the file counted.
func TestWriteDirectChunks(t *testing.T) {
	const align = 512
	data := make([]byte, 5*align)
	for i := range data {
		data[i] = byte(i * 7)
	}
	tests := []struct {
		name      string
		off       int64
		chunk     int
		failAt    int64 // the file offset of the pwrite that fails halfway; -1 for none
		wantCalls []string
		wantN     int
		wantErr   bool
	}{
		{"one chunk", 0, 8 * align, -1, []string{"0+2560"}, 5 * align, false},
		{"exact chunks", align, align, -1, []string{"512+512", "1024+512", "1536+512", "2048+512", "2560+512"}, 5 * align, false},
		{"last chunk short", 0, 2 * align, -1, []string{"0+1024", "1024+1024", "2048+512"}, 5 * align, false},
		{"second chunk fails", 0, 2 * align, 2 * align, []string{"0+1024", "1024+1024"}, 3 * align, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &chunkFile{align: align}
			if tt.failAt >= 0 {
				f.failAt, f.failErr = tt.failAt, syscall.EIO
			}
			n, err := writeDirect(f, tt.off, data, align, tt.chunk)
			if got, want := fmt.Sprint(f.calls), fmt.Sprint(tt.wantCalls); got != want {
				t.Errorf("pwrites = %v, want %v", got, want)
			}
			if n != tt.wantN || (err != nil) != tt.wantErr {
				t.Errorf("writeDirect = %d, %v; want %d, error %v", n, err, tt.wantN, tt.wantErr)
			}
			if got, want := f.content[tt.off:], data[:n]; !bytes.Equal(got, want) {
				t.Errorf("file content differs from the data written (%d bytes, want %d)", len(got), len(want))
			}
		})
	}
}

// TestDirectWriteOver2GiB writes 2 GiB + 4 KiB in one direct Write, which
// once indexed past the aligned buffer pools. It needs 2 GiB of memory and
// of disk, so it runs only with FILEWRITE_BIG_TESTS=1.
func TestDirectWriteOver2GiB(t *testing.T) {
	if os.Getenv("FILEWRITE_BIG_TESTS") != "1" {
		t.Skip("needs 2 GiB of memory and disk: set FILEWRITE_BIG_TESTS=1")
	}
	const size = 2<<30 + 4096
	ctx := context.Background()
	s, _ := newTestStore(t, Options{IO: IODirect, MaxRequestBytes: size})
	data := make([]byte, size)
	data[0], data[size-1] = 'a', 'z'
	res, err := s.Write(ctx, "big", 0, data, SyncNone)
	if err != nil {
		t.Fatal(err)
	}
	if res.BytesWritten != size || res.Size != size {
		t.Errorf("Write = %+v, want %d bytes written and size %d", res, size, size)
	}
	for _, off := range []int64{0, size - 1} {
		b, err := s.Read(ctx, "big", off, 1)
		if err != nil || len(b) != 1 || b[0] != data[off] {
			t.Errorf("Read at %d = %q, %v; want %q", off, b, err, data[off:off+1])
		}
	}
}
