package client

import (
	"context"
	"fmt"
	"hash/crc32"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// File is a file open through a Client. Its methods are safe for
// concurrent use. Calls that take no context (WriteAt, ReadAt, Close) are
// bounded by the context given to Open.
//
// Its writes go to the file its stream holds open: after a Rename of the
// file, to the file under its new name; once the file is deleted (or
// replaced by a Rename over it), every write fails with NOT_FOUND and the
// File is done. The File's other calls (ReadAt, Stat, Sync, Truncate...)
// name the path it was opened by, and so does the stream that a write
// opens after a broken one: after a Rename, they reach whatever that path
// names then.
type File struct {
	c    *Client
	path string
	ctx  context.Context
	sync SyncMode
	s    *fileStream

	// The fields below are guarded by s.mu.

	// outstanding counts the File's writes queued or in flight.
	outstanding int
	// unreported is the first failure of a write whose caller had given
	// up waiting; Close returns it.
	unreported error
	closed     bool
}

// Name is the path the File was opened by.
func (f *File) Name() string { return f.path }

var _ io.WriterAt = (*File)(nil)
var _ io.ReaderAt = (*File)(nil)

// WriteAt writes p at off with the File's SyncMode (WithSync) and returns
// once the write is acknowledged (see the package doc). It implements
// io.WriterAt: n < len(p) comes with an error.
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	n, _, err := f.Write(f.ctx, p, off, f.sync)
	return n, err
}

// Write writes p at off with the given durability and returns once the
// daemon acknowledged it: the bytes written and the file's size after. A
// write larger than a piece (see WithMaxMessageBytes) goes as several,
// which may be applied in any order; n then counts the bytes of the leading
// pieces that succeeded and of the first that failed, and err is that
// piece's error.
func (f *File) Write(ctx context.Context, p []byte, off int64, sync SyncMode) (n int, size int64, err error) {
	chunk := f.c.opts.piece
	var one [1]*write
	ws := one[:0]
	for i := 0; i < len(p) || i == 0; i += chunk {
		w := getWrite()
		w.f, w.off, w.data, w.sync = f, off+int64(i), p[i:min(len(p), i+chunk)], sync
		w.crc = crc32.Checksum(w.data, castagnoli)
		ws = append(ws, w)
	}
	if err := f.s.enqueue(ws); err != nil {
		return 0, 0, err
	}
	for i, w := range ws {
		select {
		case <-w.done:
		case <-ctx.Done():
			f.s.giveUp(ws[i:])
			return n, size, asStatus(ctx.Err())
		}
		// Done: its fields are final.
		size = max(size, w.size)
		if err == nil {
			n += int(w.n)
			err = w.err
		}
		putWrite(w)
	}
	return n, size, err
}

// ReadAt reads len(p) bytes at off, in pieces (see WithMaxMessageBytes), and checks each piece against the CRC-32C the daemon sends with
// it (DATA_LOSS on a mismatch). It implements io.ReaderAt: at the end of
// the file it returns the bytes there were and io.EOF.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	ctx := f.c.outgoing(f.ctx, f.path)
	n := 0
	for n < len(p) {
		want := min(len(p)-n, f.c.opts.piece)
		resp, err := f.c.api.Read(ctx, &filewritev1.ReadRequest{Path: f.path, Offset: off + int64(n), Length: int64(want)})
		if err != nil {
			return n, asStatus(err)
		}
		data := resp.GetData()
		if resp.Crc32C != nil {
			if sum := crc32.Checksum(data, castagnoli); sum != resp.GetCrc32C() {
				return n, status.Errorf(codes.DataLoss, "filewrite client: read of %s at %d: CRC-32C of the data is %#08x, the daemon sent %#08x", f.path, off+int64(n), sum, resp.GetCrc32C())
			}
		}
		if len(data) > want {
			return n, status.Errorf(codes.Internal, "filewrite client: read of %s at %d: %d bytes for %d asked", f.path, off+int64(n), len(data), want)
		}
		n += copy(p[n:], data)
		if len(data) < want {
			return n, io.EOF
		}
	}
	return n, nil
}

// Sync makes every write acknowledged before the call durable: its data
// and the size (fdatasync) when dataOnly, all metadata too (fsync) if not.
func (f *File) Sync(ctx context.Context, dataOnly bool) error {
	_, err := f.c.api.Fsync(f.c.outgoing(ctx, f.path), &filewritev1.FsyncRequest{Path: f.path, DataOnly: dataOnly})
	return asStatus(err)
}

// Truncate sets the file's size. No write acknowledged before the call
// lands after it. Nothing is durable until a Sync.
func (f *File) Truncate(ctx context.Context, size int64) error {
	_, err := f.c.api.Truncate(f.c.outgoing(ctx, f.path), &filewritev1.TruncateRequest{Path: f.path, Size: size})
	return asStatus(err)
}

// Allocate allocates storage for [off, off+n); unless keepSize, it grows
// the size to off+n if that is larger.
func (f *File) Allocate(ctx context.Context, off, n int64, keepSize bool) error {
	mode := filewritev1.FallocateMode_FALLOCATE_MODE_ALLOCATE
	if keepSize {
		mode = filewritev1.FallocateMode_FALLOCATE_MODE_KEEP_SIZE
	}
	return f.fallocate(ctx, mode, off, n)
}

// PunchHole frees the storage of [off, off+n), which then reads as zeros;
// the size does not change.
func (f *File) PunchHole(ctx context.Context, off, n int64) error {
	return f.fallocate(ctx, filewritev1.FallocateMode_FALLOCATE_MODE_PUNCH_HOLE, off, n)
}

// ZeroRange makes [off, off+n) read as zeros; the size does not change.
func (f *File) ZeroRange(ctx context.Context, off, n int64) error {
	return f.fallocate(ctx, filewritev1.FallocateMode_FALLOCATE_MODE_ZERO_RANGE, off, n)
}

func (f *File) fallocate(ctx context.Context, mode filewritev1.FallocateMode, off, n int64) error {
	_, err := f.c.api.Fallocate(f.c.outgoing(ctx, f.path), &filewritev1.FallocateRequest{Path: f.path, Mode: mode, Offset: off, Length: n})
	return asStatus(err)
}

// Stat describes the file.
func (f *File) Stat(ctx context.Context) (Stat, error) {
	resp, err := f.c.api.Stat(f.c.outgoing(ctx, f.path), &filewritev1.StatRequest{Path: f.path})
	if err != nil {
		return Stat{}, asStatus(err)
	}
	return Stat{Size: resp.GetSize(), AllocatedBytes: resp.GetAllocatedBytes(), BlockSize: resp.GetBlockSize()}, nil
}

// Extents lists the hole, unwritten and written ranges of [off, off+n), in
// order; n 0 means up to the end of the file. It asks for as many pages as
// the daemon needs.
func (f *File) Extents(ctx context.Context, off, n int64) ([]Extent, error) {
	ctx = f.c.outgoing(ctx, f.path)
	var out []Extent
	token := ""
	for {
		resp, err := f.c.api.Extents(ctx, &filewritev1.ExtentsRequest{Path: f.path, Offset: off, Length: n, PageToken: token})
		if err != nil {
			return nil, asStatus(err)
		}
		for _, e := range resp.GetExtents() {
			out = append(out, Extent{Offset: e.GetOffset(), Length: e.GetLength(), State: extentStateFromProto(e.GetState())})
		}
		if token = resp.GetNextPageToken(); token == "" {
			return out, nil
		}
	}
}

// Close waits for the acks of the File's writes still in flight (bounded
// by Open's context), ends its stream if no other File of the Client uses
// it (half-closing it: the daemon acks what it has and ends it), and
// returns the first failure of a write that its caller did not see (one
// whose context ended before its ack), if any. Later calls return an
// error.
func (f *File) Close() error {
	f.s.mu.Lock()
	if f.closed {
		f.s.mu.Unlock()
		return status.Error(codes.FailedPrecondition, fmt.Sprintf("filewrite client: %s already closed", f.path))
	}
	f.closed = true
	f.s.mu.Unlock()
	waitErr := f.s.waitIdle(f.ctx, f)
	closeErr := f.c.release(f.s)
	f.s.mu.Lock()
	err := f.unreported
	f.s.mu.Unlock()
	if err == nil {
		err = waitErr
	}
	if err == nil {
		err = closeErr
	}
	return err
}
