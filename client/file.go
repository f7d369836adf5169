package client

import (
	"context"
	"hash/crc32"
	"io"
	"iter"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// File is a file open through a Client, from Open until Close. Its methods
// are safe for concurrent use. Each call that can block takes a context,
// but WriteAt, ReadAt and Close, whose signatures are io's: they are
// bounded by the File's WithTimeout. After Close, every call (a second
// Close too) fails with an error wrapping fs.ErrClosed.
//
// Its writes go to the file its stream holds open: after a Rename of the
// file, to the file under its new name; once the file is deleted (or
// replaced by a Rename over it), every write fails with NOT_FOUND and the
// File is done (a new Open of the path opens the new file, if any). The
// File's other calls (ReadAt, Stat, Sync, Truncate...) name the path it
// was opened by, and so does the stream that a write opens after a broken
// one, which must find a file there (it never creates one): after a
// Rename, they reach whatever that path names then.
type File struct {
	c       *Client
	path    string
	sync    SyncMode
	timeout time.Duration
	s       *fileStream
	// closed is set by the first Close.
	closed atomic.Bool

	// The fields below are guarded by s.mu.

	// outstanding counts the File's writes queued or in flight.
	outstanding int
	// unreported is the first failure of a write whose caller had given
	// up waiting; Close returns it.
	unreported error
}

// Name is the path the File was opened by.
func (f *File) Name() string { return f.path }

var _ io.WriterAt = (*File)(nil)
var _ io.ReaderAt = (*File)(nil)

// callContext is the context of a call that takes none: WithTimeout's
// bound, ended early by the Client's Close.
func (f *File) callContext() (context.Context, context.CancelFunc) {
	if f.timeout > 0 {
		return context.WithTimeout(f.c.ctx, f.timeout)
	}
	return f.c.ctx, func() {}
}

// check returns the error of a call on a closed File or Client.
func (f *File) check() error {
	if f.closed.Load() {
		return errFileClosed(f.path)
	}
	return f.c.checkOpen()
}

// WriteAt writes p at off with the File's SyncMode (WithSync), bounded by
// WithTimeout, and returns once the write is acknowledged (see the package
// doc). It implements io.WriterAt: n < len(p) comes with an error.
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	ctx, cancel := f.callContext()
	defer cancel()
	n, _, err := f.Write(ctx, p, off, f.sync)
	return n, err
}

// Write writes p at off with the given durability and returns once the
// daemon acknowledged it: the bytes written and the file's size after. A
// write larger than a piece (see WithMaxMessageBytes) goes as several,
// which may be applied in any order; n then counts the bytes of the leading
// pieces that succeeded and of the first that failed, and err is that
// piece's error. If ctx ends first, Write returns its error at once, and
// pieces already sent may land while others do not (see the package doc).
func (f *File) Write(ctx context.Context, p []byte, off int64, sync SyncMode) (n int, size int64, err error) {
	if err := f.check(); err != nil {
		return 0, 0, err
	}
	if err := ctx.Err(); err != nil {
		// Not sent: otherwise its ack and ctx's end would race, and a
		// write under an ended context could succeed.
		return 0, 0, wrapErr(err)
	}
	// Most writes are one piece: its slot lives in this frame.
	var one [1]*write
	ws := f.pieces(one[:0], p, off, sync)
	if err := f.s.enqueue(ws); err != nil {
		for _, w := range ws {
			putWrite(w) // never queued: nothing else refers to them
		}
		return 0, 0, err
	}
	for i, w := range ws {
		select {
		case <-w.done:
		case <-ctx.Done():
			f.s.giveUp(ws[i:])
			return n, size, wrapErr(ctx.Err())
		}
		// Done: its fields are final.
		size = max(size, w.size)
		if err == nil {
			n += int(w.n)
			err = wrapErr(w.err)
		}
		putWrite(w)
	}
	return n, size, err
}

// pieces appends to ws the writes of at most a piece each that a write of
// p at off is cut into.
func (f *File) pieces(ws []*write, p []byte, off int64, sync SyncMode) []*write {
	chunk := f.c.opts.piece
	for i := 0; i < len(p) || i == 0; i += chunk {
		w := getWrite()
		w.f, w.off, w.data, w.sync = f, off+int64(i), p[i:min(len(p), i+chunk)], sync
		w.crc = crc32.Checksum(w.data, castagnoli)
		ws = append(ws, w)
	}
	return ws
}

// ReadAt reads len(p) bytes at off, bounded by WithTimeout; see Read. It
// implements io.ReaderAt.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	ctx, cancel := f.callContext()
	defer cancel()
	return f.Read(ctx, p, off)
}

// Read reads len(p) bytes at off, in pieces (see WithMaxMessageBytes), and
// checks each piece against the CRC-32C the daemon sends with it
// (DATA_LOSS on a mismatch). At the end of the file it returns the bytes
// there were and io.EOF, as io.ReaderAt does.
func (f *File) Read(ctx context.Context, p []byte, off int64) (int, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	ctx = f.c.outgoing(ctx, f.path)
	n := 0
	for n < len(p) {
		want := min(len(p)-n, f.c.opts.piece)
		k, err := f.readPiece(ctx, off+int64(n), p[n:n+want])
		n += k
		if err != nil {
			return n, err
		}
		if k < want {
			return n, io.EOF
		}
	}
	return n, nil
}

// readPiece reads up to len(dst) bytes at off into dst in one call,
// checked against their CRC-32C. ctx carries the outgoing metadata.
func (f *File) readPiece(ctx context.Context, off int64, dst []byte) (int, error) {
	r := readReply{dst: dst}
	req := &filewritev1.ReadRequest{Path: f.path, Offset: off, Length: int64(len(dst))}
	if err := f.c.cc.Invoke(ctx, filewritev1.FileService_Read_FullMethodName, req, &r, grpc.ForceCodecV2(newStreamCodec())); err != nil {
		return 0, wrapErr(err)
	}
	if r.tooLong > 0 {
		return 0, newError(codes.Internal, nil, "read of %s at %d: %d bytes for %d asked", f.path, off, r.tooLong, len(dst))
	}
	if r.hasCRC && r.sum != r.crc {
		return 0, newError(codes.DataLoss, nil, "read of %s at %d: CRC-32C of the data is %#08x, the daemon sent %#08x", f.path, off, r.sum, r.crc)
	}
	return r.n, nil
}

// Sync makes every write acknowledged before the call durable, with the
// data all of the file's metadata (fsync).
func (f *File) Sync(ctx context.Context) error { return f.fsync(ctx, false) }

// SyncData makes every write acknowledged before the call durable, with
// the size needed to read it back but not the rest of the metadata
// (fdatasync).
func (f *File) SyncData(ctx context.Context) error { return f.fsync(ctx, true) }

func (f *File) fsync(ctx context.Context, dataOnly bool) error {
	if err := f.check(); err != nil {
		return err
	}
	_, err := f.c.api.Fsync(f.c.outgoing(ctx, f.path), &filewritev1.FsyncRequest{Path: f.path, DataOnly: dataOnly})
	return wrapErr(err)
}

// Truncate sets the file's size. No write acknowledged before the call
// lands after it. Nothing is durable until a Sync. It is not retried: see
// WithRetry.
func (f *File) Truncate(ctx context.Context, size int64) error {
	if err := f.check(); err != nil {
		return err
	}
	resp, err := f.c.api.Truncate(f.c.outgoing(ctx, f.path), &filewritev1.TruncateRequest{Path: f.path, Size: size})
	f.learned(resp.GetGeneration())
	return wrapErr(err)
}

// Allocate allocates storage for [off, off+n), which reads as zeros where
// nothing was written, and grows the size to off+n if that is larger.
func (f *File) Allocate(ctx context.Context, off, n int64) error {
	return f.fallocate(ctx, filewritev1.FallocateMode_FALLOCATE_MODE_ALLOCATE, off, n)
}

// AllocateKeepSize allocates storage for [off, off+n) as Allocate does,
// without changing the size: blocks past the end are reserved for later
// writes.
func (f *File) AllocateKeepSize(ctx context.Context, off, n int64) error {
	return f.fallocate(ctx, filewritev1.FallocateMode_FALLOCATE_MODE_KEEP_SIZE, off, n)
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
	if err := f.check(); err != nil {
		return err
	}
	resp, err := f.c.api.Fallocate(f.c.outgoing(ctx, f.path), &filewritev1.FallocateRequest{Path: f.path, Mode: mode, Offset: off, Length: n})
	f.learned(resp.GetGeneration())
	return wrapErr(err)
}

// Stat describes the file.
func (f *File) Stat(ctx context.Context) (FileInfo, error) {
	if err := f.check(); err != nil {
		return FileInfo{}, err
	}
	fi, err := f.c.Stat(ctx, f.path)
	f.learned(fi.Generation)
	return fi, err
}

// Generation is the file's generation as the daemon last told this File:
// when it was opened, then in the reply to each of its synced writes
// (a SyncMode other than SyncNone), appends, Truncate, the Allocate
// family and Stat. A write without a sync moves the file's generation
// without saying so (its ack carries none, to keep acks small), nor does
// another writer's change: Stat asks.
func (f *File) Generation() int64 { return f.s.gen.Load() }

// learned records gen, a generation a reply about the File's file
// carried (0: none).
func (f *File) learned(gen int64) {
	if gen != 0 {
		f.s.gen.Store(gen)
	}
}

// Digest asks the daemon for the checksum of [off, off+n) of the file (n
// 0: up to its end), algorithm "crc32c" (the default, for "") or
// "sha-256", as the file is at one generation: no write lands in the file
// while it is read. The daemon keeps it by generation, so asking again
// before the next change costs nothing. Nothing is sent over the network
// but the answer.
func (f *File) Digest(ctx context.Context, off, n int64, algorithm string) (Digest, error) {
	if err := f.check(); err != nil {
		return Digest{}, err
	}
	resp, err := f.c.api.Digest(f.c.outgoing(ctx, f.path), &filewritev1.DigestRequest{Path: f.path, Offset: off, Length: n, Algorithm: algorithm})
	if err != nil {
		return Digest{}, wrapErr(err)
	}
	return Digest{Algorithm: resp.GetAlgorithm(), Offset: resp.GetOffset(), Length: resp.GetLength(), Sum: resp.GetDigest(), Generation: resp.GetGeneration()}, nil
}

// Extents lists the hole, unwritten and written ranges of [off, off+n), in
// order; n 0 means up to the end of the file. It asks the daemon for a
// page at a time as the loop goes, as Client.List does:
//
//	for e, err := range f.Extents(ctx, 0, 0) {
//		if err != nil {
//			return err
//		}
//		fmt.Println(e.Offset, e.Length, e.State)
//	}
//
// An error ends the sequence.
func (f *File) Extents(ctx context.Context, off, n int64) iter.Seq2[Extent, error] {
	return func(yield func(Extent, error) bool) {
		if err := f.check(); err != nil {
			yield(Extent{}, err)
			return
		}
		ctx := f.c.outgoing(ctx, f.path)
		token := ""
		for {
			resp, err := f.c.api.Extents(ctx, &filewritev1.ExtentsRequest{Path: f.path, Offset: off, Length: n, PageToken: token})
			if err != nil {
				yield(Extent{}, wrapErr(err))
				return
			}
			for _, e := range resp.GetExtents() {
				if !yield(Extent{Offset: e.GetOffset(), Length: e.GetLength(), State: extentStateFromProto(e.GetState())}, nil) {
					return
				}
			}
			if token = resp.GetNextPageToken(); token == "" {
				return
			}
		}
	}
}

// Close is CloseContext bounded by WithTimeout.
func (f *File) Close() error {
	ctx, cancel := f.callContext()
	defer cancel()
	return f.CloseContext(ctx)
}

// CloseContext waits for the acks of the File's writes still in flight
// (bounded by ctx), ends its stream if no other File of the Client uses it
// (half-closing it: the daemon acks what it has and ends it), and returns
// the first failure of a write that its caller did not see (one whose
// context ended before its ack), if any: a failed write is never lost
// unreported. The File is closed whatever it returns; later calls fail
// with an error wrapping fs.ErrClosed.
func (f *File) CloseContext(ctx context.Context) error {
	if !f.closed.CompareAndSwap(false, true) {
		return errFileClosed(f.path)
	}
	waitErr := f.s.waitIdle(ctx, f)
	closeErr := f.c.release(f.s)
	f.s.mu.Lock()
	err := wrapErr(f.unreported)
	f.s.mu.Unlock()
	if err == nil {
		err = waitErr
	}
	if err == nil {
		err = closeErr
	}
	return err
}
