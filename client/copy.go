package client

import (
	"errors"
	"io"
	"sync/atomic"

	"google.golang.org/grpc/mem"

	"github.com/filewrite/filewrite/internal/bufpool"
)

// Copies at stream speed. A loop of WriteAt waits for each write's ack
// before it sends the next (io.Copy through io.NewOffsetWriter does just
// that, 32 KiB at a time); a Writer sends a piece and goes on, keeping up
// to writerWindow bytes on their way, so the stream stays full. A Reader
// keeps readAhead pieces asked for ahead of the one it hands out.

// writerWindow bounds the bytes a Writer has sent and not yet seen
// acknowledged: the stream's flow-control window on the wire, and as much
// again queued behind it, so the sender always has a next message ready.
const writerWindow = 2 * streamWindow

// readAhead is how many pieces a Reader has asked for at once.
const readAhead = 4

// Writer writes a File sequentially from an offset, pipelined: Write
// copies its bytes, sends them and returns without waiting for their ack
// unless writerWindow bytes are already waiting. A failure is reported by
// a later Write, by ReadFrom, or by Flush or Close, which wait for every
// ack. Its writes use the File's SyncMode, and each wait is bounded by the
// File's WithTimeout. A Writer is for one goroutine at a time; closing it
// does not close the File.
type Writer struct {
	f       *File
	off     int64    // where the next byte goes
	waiting []*write // sent, in order, not yet waited for
	bytes   int      // data of waiting
	err     error    // the first failure: every later call returns it
	closed  bool
}

var (
	_ io.WriteCloser = (*Writer)(nil)
	_ io.ReaderFrom  = (*Writer)(nil)
)

// NewWriter returns a Writer that writes f from off on.
func (f *File) NewWriter(off int64) *Writer { return &Writer{f: f, off: off} }

// Write copies p and sends it at the Writer's offset, in pieces (see
// WithMaxMessageBytes). n is len(p) unless an earlier failure stops it:
// bytes it returned for may still fail, which a later call reports.
func (w *Writer) Write(p []byte) (int, error) {
	if err := w.usable(); err != nil {
		return 0, err
	}
	n := 0
	for n < len(p) {
		bp := bufpool.Shared.Get(min(len(p)-n, w.f.c.opts.piece))
		k := copy(*bp, p[n:])
		if err := w.send(newPieceBuf(bp)); err != nil {
			return n, err
		}
		n += k
	}
	return n, nil
}

// ReadFrom reads r until io.EOF straight into the pieces it sends, then
// waits for every ack (Flush), so that io.Copy into a Writer reports every
// failure. n counts the bytes read from r and sent.
func (w *Writer) ReadFrom(r io.Reader) (int64, error) {
	if err := w.usable(); err != nil {
		return 0, err
	}
	var n int64
	for {
		bp := bufpool.Shared.Get(w.f.c.opts.piece)
		k, rerr := io.ReadFull(r, *bp)
		if k > 0 {
			*bp = (*bp)[:k]
			if err := w.send(newPieceBuf(bp)); err != nil {
				return n, err
			}
			n += int64(k)
		} else {
			bufpool.Shared.Put(bp)
		}
		switch {
		case errors.Is(rerr, io.EOF), errors.Is(rerr, io.ErrUnexpectedEOF):
			return n, w.Flush()
		case rerr != nil:
			return n, rerr
		}
	}
}

// usable returns the error that stops the Writer, if any.
func (w *Writer) usable() error {
	w.reap()
	switch {
	case w.err != nil:
		return w.err
	case w.closed:
		return errFileClosed(w.f.path + " (its Writer)")
	}
	return w.f.check()
}

// send sends the bytes of pb, which the write owns until its ack, at
// w.off, after waiting for the oldest writes while the window is full.
func (w *Writer) send(pb *pieceBuf) error {
	n := len(*pb.bp)
	for w.bytes > 0 && w.bytes+n > writerWindow {
		if err := w.waitOldest(); err != nil {
			pb.release()
			return err
		}
	}
	ws := w.f.pieces(nil, *pb.bp, w.off, w.f.sync)
	ws[0].buf = pb // one piece: pb is at most one
	if err := w.f.s.enqueue(ws); err != nil {
		putWrite(ws[0])
		pb.release()
		w.err = err
		return err
	}
	w.waiting = append(w.waiting, ws[0])
	w.bytes += n
	w.off += int64(n)
	return nil
}

// waitOldest waits for the oldest write's ack, bounded by WithTimeout.
func (w *Writer) waitOldest() error {
	wr := w.waiting[0]
	ctx, cancel := w.f.callContext()
	defer cancel()
	select {
	case <-wr.done:
	case <-ctx.Done():
		// Its bytes stay with it: it may still be sent (or resent).
		w.f.s.giveUp(w.waiting)
		w.waiting, w.bytes = nil, 0
		w.err = wrapErr(ctx.Err())
		return w.err
	}
	return w.finished()
}

// reap takes the outcomes of the oldest writes that are done, without
// waiting, so that a failure is reported by the next call.
func (w *Writer) reap() {
	for len(w.waiting) > 0 {
		select {
		case <-w.waiting[0].done:
			w.finished()
		default:
			return
		}
	}
}

// finished takes the outcome of the oldest write, whose done signal its
// caller received.
func (w *Writer) finished() error {
	wr := w.waiting[0]
	w.waiting = w.waiting[1:]
	w.bytes -= len(wr.data)
	err := wrapErr(wr.err)
	if err == nil && int(wr.n) != len(wr.data) {
		err = wrapErr(io.ErrShortWrite)
	}
	wr.buf.release()
	putWrite(wr)
	if err != nil && w.err == nil {
		w.err = err
	}
	return w.err
}

// Flush waits for the acks of every write sent, and returns the first
// failure of the Writer's writes, if any.
func (w *Writer) Flush() error {
	for len(w.waiting) > 0 {
		w.waitOldest() // a failure is kept in w.err; wait for the rest
	}
	return w.err
}

// Close flushes the Writer and returns what Flush does; later calls fail.
// It leaves the File open.
func (w *Writer) Close() error {
	if w.closed {
		return errFileClosed(w.f.path + " (its Writer)")
	}
	err := w.Flush()
	w.closed = true
	return err
}

// pieceBuf is the pooled buffer of a Writer's piece, shared by its write
// and the messages that carry it (a resend is a second message), so that
// its bytes are sent from it instead of being copied into each message
// (encodeWrites). It goes back to the pool once the write has its outcome
// and gRPC has let go of every message that held it; a write given up on
// keeps it, and the collector takes it.
type pieceBuf struct {
	bp   *[]byte
	refs atomic.Int32 // the write's hold and each message's
}

var _ mem.BufferPool = (*pieceBuf)(nil)

// newPieceBuf returns bp, a buffer of the pool, held by one write.
func newPieceBuf(bp *[]byte) *pieceBuf {
	pb := &pieceBuf{bp: bp}
	pb.refs.Store(1)
	return pb
}

// shareable reports whether a message can hold pb instead of a copy of
// its bytes: gRPC copies buffers below its pooling threshold (and never
// frees them), so those are copied here. pb may be nil (not a Writer's).
func (pb *pieceBuf) shareable() bool {
	return pb != nil && !mem.IsBelowBufferPoolingThreshold(cap(*pb.bp))
}

// hold returns pb's bytes as a buffer for one message, which gRPC frees
// (Put) once it has written them.
func (pb *pieceBuf) hold() mem.Buffer {
	pb.refs.Add(1)
	return mem.NewBuffer(pb.bp, pb)
}

// release lets go of one hold; the last gives the buffer back.
func (pb *pieceBuf) release() {
	if pb.refs.Add(-1) == 0 {
		bufpool.Shared.Put(pb.bp)
	}
}

// Get is not used: a pieceBuf is a mem.BufferPool only to be told when
// gRPC has let go of a message's hold.
func (pb *pieceBuf) Get(int) *[]byte { panic("filewrite client: pieceBuf.Get") }

// Put is gRPC letting go of a message's hold (hold).
func (pb *pieceBuf) Put(*[]byte) { pb.release() }

// Reader reads a File sequentially from an offset, asking for the next
// pieces (see WithMaxMessageBytes) before they are needed. Each read
// checks its data's CRC-32C, and each wait is bounded by the File's
// WithTimeout. It returns io.EOF at the end of the file as it was when
// that piece was read. A Reader is for one goroutine at a time.
type Reader struct {
	f    *File
	next int64          // offset of the next piece to ask for
	eof  bool           // a short piece came: ask for no more
	ask  []*readPending // asked for, in offset order
	cur  []byte         // the current piece's bytes not yet handed out
	buf  *[]byte        // the pooled buffer cur lies in
	err  error          // the first failure, or io.EOF: every later call returns it
}

// readPending is one piece asked for, read into buf, a buffer of the
// pool; done is closed once data or err is set.
type readPending struct {
	off  int64
	buf  *[]byte
	data []byte
	err  error
	done chan struct{}
}

var (
	_ io.Reader   = (*Reader)(nil)
	_ io.WriterTo = (*Reader)(nil)
)

// NewReader returns a Reader that reads f from off on.
func (f *File) NewReader(off int64) *Reader { return &Reader{f: f, next: off} }

// Read reads up to len(p) bytes from the Reader's offset.
func (r *Reader) Read(p []byte) (int, error) {
	if len(r.cur) == 0 {
		if err := r.fill(); err != nil {
			return 0, err
		}
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

// WriteTo writes to w every byte from the Reader's offset to the end of
// the file, a piece at a time while the next pieces are on their way.
func (r *Reader) WriteTo(w io.Writer) (int64, error) {
	var n int64
	for {
		if len(r.cur) == 0 {
			if err := r.fill(); err != nil {
				if err == io.EOF {
					err = nil
				}
				return n, err
			}
		}
		k, err := w.Write(r.cur)
		n += int64(k)
		r.cur = r.cur[k:]
		if err != nil {
			return n, err
		}
	}
}

// fill makes the next piece current, asking for those after it.
func (r *Reader) fill() error {
	if r.err != nil {
		return r.err
	}
	if err := r.f.check(); err != nil {
		return err
	}
	if r.buf != nil {
		// Handed out: Read copied it, WriteTo's writer may not keep it.
		bufpool.Shared.Put(r.buf)
		r.buf, r.cur = nil, nil
	}
	piece := r.f.c.opts.piece
	for !r.eof && len(r.ask) < readAhead {
		p := &readPending{off: r.next, buf: bufpool.Shared.Get(piece), done: make(chan struct{})}
		r.next += int64(piece)
		r.ask = append(r.ask, p)
		go func() {
			defer close(p.done)
			ctx, cancel := r.f.callContext()
			defer cancel()
			n, err := r.f.readPiece(r.f.c.outgoing(ctx, r.f.path), p.off, *p.buf)
			p.data, p.err = (*p.buf)[:n], err
		}()
	}
	if len(r.ask) == 0 {
		r.err = io.EOF
		return r.err
	}
	p := r.ask[0]
	<-p.done // bounded by WithTimeout in the goroutine
	r.ask = r.ask[1:]
	if p.err != nil {
		r.err = p.err
		return r.err
	}
	if len(p.data) < piece {
		// The end of the file: the pieces asked for after it find
		// nothing, or what was written since, which a reader that saw
		// the end here must not return after it.
		r.eof = true
		r.ask = nil // still being read into: theirs, not the pool's
	}
	if len(p.data) == 0 {
		bufpool.Shared.Put(p.buf)
		r.err = io.EOF
		return r.err
	}
	r.cur, r.buf = p.data, p.buf
	return nil
}
