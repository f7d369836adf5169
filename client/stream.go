package client

import (
	"context"
	"errors"
	"hash/crc32"
	"io"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/internal/streamwire"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// writeOverhead is what a write adds to a message besides its data: its
// tag, id, offset, length, sync mode and CRC, rounded up.
const writeOverhead = 48

// maxWritesPerMessage bounds the writes of one message, so that their acks
// fit in one response too.
const maxWritesPerMessage = streamwire.MaxWritesPerMessage

// write is one write on its way: queued, then in flight on a stream, then
// done.
type write struct {
	f    *File
	off  int64
	data []byte
	sync SyncMode
	crc  uint32
	// append: it goes at the end of the file (off is 0), with appendID
	// if not empty (File.Append).
	append   bool
	appendID []byte
	// buf is the pooled buffer data lies in, for a Writer's writes: the
	// Writer lets go of it once the write is done, and the messages
	// that carry it once gRPC has written them.
	buf *pieceBuf

	// The fields below are guarded by fileStream.mu.
	state    writeState
	attempts int  // resends after a stream broke
	gaveUp   bool // the caller returned before done: report an error to Close
	// n, size, landed and err are the outcome, set before done is
	// signalled; landed is where its data begins (an append's, where
	// the daemon put it).
	n, size, landed int64
	err             error
	// done gets one signal when the write finishes; its one slot keeps
	// it for a caller not yet waiting.
	done chan struct{}
}

// writePool recycles writes with their done channels: a caller takes one
// per piece of its write and gives it back once it has its outcome (not
// if it gave up: the write is still on its way).
var writePool = sync.Pool{New: func() any { return &write{done: make(chan struct{}, 1)} }}

func getWrite() *write { return writePool.Get().(*write) }

// putWrite gives w back; its caller has taken its signal and outcome.
func putWrite(w *write) {
	*w = write{done: w.done}
	writePool.Put(w)
}

// wire is w as the id'th write of a message to file.
func (w *write) wire(file uint32, id uint64) streamwire.Write {
	return streamwire.Write{ID: id, Offset: w.off, Data: w.data, Sync: int32(w.sync.proto()), CRC: w.crc, HasCRC: true,
		Append: w.append, File: file, AppendID: w.appendID}
}

// wireSize is what w adds to a message, near enough to fill one.
func (w *write) wireSize() int { return len(w.data) + len(w.appendID) + writeOverhead }

type writeState int8

const (
	queued       writeState = iota
	beingEncoded            // the sender reads its bytes: its caller must wait
	inFlight
	finished
)

// fileStream is the WriteStream of one path, shared by the Files of one
// Client open on it. Callers queue their writes; one sender goroutine
// sends whatever queued while it was busy as the next message, so that
// concurrent callers share messages without waiting on a timer; each
// stream (a new one after each break) has a receiver goroutine that
// matches acks to writes by id.
type fileStream struct {
	c    *Client
	path string
	// refs counts the Files open on it; guarded by Client.mu.
	refs int

	// openMu serialises opening a stream (the handshake of the first
	// message); it is taken before mu.
	openMu sync.Mutex

	// mu guards the fields below and every write's guarded fields.
	mu sync.Mutex
	// conn is the stream writes go on; nil before the first and after a
	// break, until the next write opens one.
	conn *streamConn
	// queue holds the writes waiting to be sent, in the order they came.
	queue []*write
	// pending counts the writes queued or in flight; idle is signalled
	// when a write finishes.
	pending int
	idle    sync.Cond
	// sending: the sender goroutine runs; closed: no File is left, the
	// sender exits once the queue is empty. On a Client of many paths it
	// also exits once nothing is queued or in flight (idleSender).
	sending, closed bool
	// wake has one slot: the sender has work.
	wake chan struct{}
	// batch is the sender's own: the writes of the message it builds.
	batch []*write
	// senderDone is closed when the current sender goroutine exits.
	senderDone chan struct{}
	// gone is the NOT_FOUND a stream ended with because the daemon
	// deleted the file (or a Rename replaced it), or that a re-open got:
	// every later write fails with it at once.
	gone error
	// mode is the open mode of the first stream; opened says one was
	// opened, after which a new stream (after a break) must find the file
	// (OPEN_MODE_MUST_EXIST): it never creates one, and never sends an
	// exclusive create twice.
	mode   filewritev1.OpenMode
	opened bool
	// cond is the condition on the file's generation of the first open
	// (WithIfGeneration; nil: none). A later open, after a break, has
	// none: the File's own writes moved the generation since.
	cond *int64
	// failures counts the streams that broke or failed to open since an
	// ack last arrived: the sender waits backoff(failures) before the
	// next open.
	failures int
	// connecting cancels the open in progress, which close does: with
	// WaitForReady it would wait for a daemon that may never come back.
	connecting context.CancelFunc
	// stopped is closed by close: the sender stops waiting to retry.
	stopped chan struct{}
	// gen is the file's generation as the daemon last reported it: when
	// a stream opened the file, and in the ack of each synced write
	// (File.Generation).
	gen atomic.Int64
}

// streamConn is one WriteStream of a fileStream, or its file's index on a
// shared one (mux, index: see mux.go).
type streamConn struct {
	stream grpc.BidiStreamingClient[filewritev1.WriteStreamRequest, filewritev1.WriteStreamResponse]
	mux    *muxStream
	index  uint32
	s      *fileStream
	cancel context.CancelFunc
	// inflight, nextID and broken are guarded by fileStream.mu.
	inflight map[uint64]*write
	nextID   uint64
	broken   bool
	// done is closed when its receiver has returned; err says why.
	done chan struct{}
	err  error
}

func newFileStream(c *Client, path string, mode filewritev1.OpenMode, cond *int64) *fileStream {
	s := &fileStream{c: c, path: path, mode: mode, cond: cond, wake: make(chan struct{}, 1), stopped: make(chan struct{})}
	s.idle.L = &s.mu
	return s
}

// shareable reports whether a new File of the path may use the stream:
// only while it is open on a file not known to be deleted. A stream
// without a connection would re-open by path, and must find a file there
// (it never creates one), which an Open that may create must not depend
// on.
func (s *fileStream) shareable() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conn != nil && s.gone == nil
}

// ensureOpen opens a stream unless one is open, waiting for the daemon's
// answer to the first message (bounded by ctx): the file is open. With
// WithRetry, an open that found no daemon is tried again, but an
// exclusive one: the daemon may have created the file before the answer
// was lost.
func (s *fileStream) ensureOpen(ctx context.Context) error {
	retries := s.c.opts.retries
	if s.mode == filewritev1.OpenMode_OPEN_MODE_EXCLUSIVE || s.cond != nil {
		retries = 0 // the daemon may have opened it, and the condition no longer hold
	}
	return wrapErr(retry(ctx, s.stopped, retries, func(int) error {
		_, err := s.connect(ctx)
		return err
	}))
}

// connect returns the stream to send on, opening one if there is none.
func (s *fileStream) connect(ctx context.Context) (*streamConn, error) {
	s.openMu.Lock()
	defer s.openMu.Unlock()
	s.mu.Lock()
	if conn := s.conn; conn != nil {
		s.mu.Unlock()
		return conn, nil // another File of the path opened it
	}
	if s.closed {
		s.mu.Unlock()
		return nil, errFileClosed(s.path)
	}
	mode, cond := s.mode, s.cond
	if s.opened {
		mode, cond = filewritev1.OpenMode_OPEN_MODE_MUST_EXIST, nil
	}
	sctx, cancel := context.WithCancel(s.c.outgoing(s.c.ctx, s.path))
	// Set under the lock that close takes to set closed: either close
	// sees it and cancels, or this open sees closed.
	s.connecting = cancel
	s.mu.Unlock()
	// ctx bounds the handshake only; the stream lives until the last
	// File is closed.
	stop := context.AfterFunc(ctx, cancel)
	conn, err := s.handshake(sctx, cancel, mode, cond)
	if !stop() && err != nil {
		err = wrapErr(ctx.Err())
	}
	s.mu.Lock()
	s.connecting = nil
	if err == nil {
		s.conn, s.opened = conn, true
	}
	s.mu.Unlock()
	if err != nil {
		cancel()
		return nil, err
	}
	if conn.mux == nil {
		go s.receive(conn) // a shared stream has its own receiver
	}
	return conn, nil
}

func (s *fileStream) handshake(ctx context.Context, cancel context.CancelFunc, mode filewritev1.OpenMode, cond *int64) (*streamConn, error) {
	if s.c.sharing() {
		// ctx bounds the declaration only: the shared stream has its own
		// context.
		defer cancel()
		conn, answer, err := s.c.declareShared(ctx, s, mode, cond)
		if err != nil {
			return nil, err
		}
		return conn.mux.await(ctx, conn, answer)
	}
	stream, err := s.c.api.WriteStream(ctx, s.c.streamCallOptions()...)
	if err != nil {
		return nil, wrapErr(err)
	}
	if err := stream.Send(&filewritev1.WriteStreamRequest{Path: s.path, OpenMode: mode, IfGenerationMatch: cond}); err != nil && !errors.Is(err, io.EOF) {
		return nil, wrapErr(err)
	}
	// io.EOF from Send means the daemon ended the stream: Recv says why.
	first, err := stream.Recv()
	for _, f := range first.GetFiles() {
		if f.GetIndex() == 0 && f.GetStatus() == nil {
			s.gen.Store(f.GetGeneration())
		}
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = status.Error(codes.Unavailable, "the daemon ended the stream before it opened the file")
		}
		return nil, wrapErr(err)
	}
	return &streamConn{stream: stream, s: s, cancel: cancel, inflight: make(map[uint64]*write), done: make(chan struct{})}, nil
}

// streamCallOptions are the options of every WriteStream the Client
// opens, its own or a shared one: its codec, and under WithRetry waiting
// for the connection rather than failing while the daemon is away (only
// the open waits: nothing was sent yet).
func (c *Client) streamCallOptions() []grpc.CallOption {
	opts := []grpc.CallOption{grpc.ForceCodecV2(newStreamCodec())}
	if c.opts.retries > 0 {
		opts = append(opts, grpc.WaitForReady(true))
	}
	return opts
}

// enqueue queues ws, in order, and wakes the sender.
func (s *fileStream) enqueue(ws []*write) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || ws[0].f.closed.Load() {
		return errFileClosed(s.path)
	}
	if s.gone != nil {
		return s.gone
	}
	for _, w := range ws {
		w.state = queued
		w.f.outstanding++
	}
	s.queue = append(s.queue, ws...)
	s.pending += len(ws)
	if !s.sending {
		s.sending = true
		s.senderDone = make(chan struct{})
		go s.send(s.senderDone)
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return nil
}

// send is the sender: while writes are queued it sends them, as many to a
// message as fit, on the current stream (opening one if needed).
func (s *fileStream) send(done chan struct{}) {
	defer close(done)
	for {
		select {
		case <-s.wake:
		case <-s.c.ctx.Done():
			s.mu.Lock()
			s.failQueuedLocked(errClientClosed)
			s.mu.Unlock()
			return
		}
		runtime.Gosched()
		for s.sendOne() {
		}
		s.mu.Lock()
		exit := s.closed && len(s.queue) == 0
		if !exit && s.idleSenderLocked() {
			s.sending = false // the next write starts another
			exit = true
		}
		s.mu.Unlock()
		if exit {
			return
		}
	}
}

// manyPaths is how many paths with open Files a Client has before their
// senders exit when idle: 100,000 open Files would otherwise keep as many
// goroutines parked, some 4 KiB of stack each, while a Client of few
// files keeps its senders, which a write wakes sooner than it starts one.
const manyPaths = 64

// idleSenderLocked reports whether the sender should exit: nothing queued
// or in flight, on a Client of more than manyPaths paths.
//
// Preconditions: s.mu is held.
func (s *fileStream) idleSenderLocked() bool {
	return len(s.queue) == 0 && s.pending == 0 && s.c.paths.Load() > manyPaths
}

// sendOne sends one message of queued writes and reports whether it sent
// anything.
func (s *fileStream) sendOne() bool {
	// One hold of mu, on the common path, takes the batch off an open
	// stream; only a missing stream lets go of it, to open one.
	s.mu.Lock()
	if len(s.queue) == 0 {
		s.mu.Unlock()
		return false
	}
	conn := s.conn
	if conn == nil {
		failures := s.failures
		s.mu.Unlock()
		if failures > 0 && !sleep(s.c.ctx, s.stopped, backoff(failures)) {
			return false // the sender's loop sees why
		}
		var err error
		conn, err = s.connect(s.c.ctx)
		s.mu.Lock()
		if err != nil {
			s.failures++
			if s.opened && status.Code(err) == codes.NotFound {
				// The re-open found no file: it was deleted while no
				// stream was open.
				s.gone = err
			}
			// No stream to send on: the queued writes that may try
			// again stay queued; the others fail with why.
			s.queue = s.retryOrFailLocked(s.queue, err, false)
			more := len(s.queue) > 0
			s.mu.Unlock()
			return more
		}
		if len(s.queue) == 0 {
			// Given up on, or failed by close, while mu was let go: no
			// empty message.
			s.mu.Unlock()
			return false
		}
	}
	if conn.broken {
		s.mu.Unlock()
		return true // its receiver has requeued what it held; go again
	}
	size := 0
	batch := s.batch[:0]
	for _, w := range s.queue {
		if len(batch) > 0 && (size+w.wireSize() > s.c.opts.maxMessageBytes || len(batch) == maxWritesPerMessage) {
			break
		}
		conn.inflight[conn.nextID+uint64(len(batch))] = w
		w.state = beingEncoded
		batch = append(batch, w)
		size += w.wireSize()
	}
	firstID := conn.nextID
	conn.nextID += uint64(len(batch))
	// Move the rest down rather than reslice past the batch, so that the
	// queue keeps its capacity instead of reallocating as it refills.
	rest := copy(s.queue, s.queue[len(batch):])
	clear(s.queue[rest:])
	s.queue = s.queue[:rest]
	s.mu.Unlock()
	req := encodeWrites(batch, conn.index, firstID)
	s.mu.Lock()
	for _, w := range batch {
		if w.state == beingEncoded {
			w.state = inFlight
		}
	}
	s.idle.Broadcast() // callers giving up wait for encoding to end
	s.mu.Unlock()
	clear(batch)
	s.batch = batch[:0]
	if conn.mux != nil {
		conn.mux.send(req) // which breaks the shared stream if it fails
	} else if err := conn.stream.SendMsg(req); err != nil && !errors.Is(err, io.EOF) {
		// The stream is broken; its receiver fails (or requeues) what
		// it held once Recv returns, which cancelling makes sure of.
		// io.EOF says the daemon ended the stream: its receiver gets
		// why from Recv, which cancelling could turn into CANCELLED.
		conn.cancel()
	}
	return true
}

// acked takes acks of conn, its own stream's (receive) or a file's index
// on a shared stream (mux.go). There a deleted file's writes are acked
// NOT_FOUND (FILE_DELETED) and the stream goes on: the file is gone, as
// when its own stream ends so (which the daemon does instead of acking).
func (s *fileStream) acked(conn *streamConn, acks []ack) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures = 0
	for i := range acks {
		w := s.ackLocked(conn, &acks[i])
		if w == nil {
			continue
		}
		if status.Code(w.err) == codes.NotFound && s.gone == nil {
			s.gone = wrapErr(w.err)
			s.failQueuedLocked(s.gone)
		}
		s.finishLocked(w)
	}
}

// ackLocked gives a's figures to its write of conn, which it takes out
// of conn's writes in flight, and returns it; nil when conn has no write
// by a's id (not ours: ignored rather than guessed at).
//
// Preconditions: s.mu is held.
func (s *fileStream) ackLocked(conn *streamConn, a *ack) *write {
	w := conn.inflight[a.id]
	if w == nil {
		return nil
	}
	delete(conn.inflight, a.id)
	w.n, w.size, w.landed, w.err = a.written, a.size, a.offset, a.err
	if a.gen != 0 {
		s.gen.Store(a.gen)
	}
	return w
}

// receive matches the acks of conn to their writes until conn ends.
func (s *fileStream) receive(conn *streamConn) {
	var resp ackResponse
	for {
		if err := conn.stream.RecvMsg(&resp); err != nil {
			s.ended(conn, err)
			return
		}
		s.acked(conn, resp.acks)
	}
}

// ended handles the end of conn: its writes still in flight are resent
// (WithRetry, or unread) or fail with the stream's error, and the next
// write opens a new stream.
func (s *fileStream) ended(conn *streamConn, err error) {
	// A stream the daemon ended with OK, or with STREAM_IDLE (it closes
	// streams that stay idle), had every write it read acked: those still
	// in flight were never read.
	cleanEnd := errors.Is(err, io.EOF)
	unread := cleanEnd || errorinfo.Reason(err) == filewritev1.ErrorReason_STREAM_IDLE.String()
	if cleanEnd {
		err = status.Error(codes.Unavailable, "the daemon ended the stream before acknowledging the write")
	}
	err = wrapErr(err)
	conn.cancel()
	s.mu.Lock()
	conn.broken = true
	conn.err = err
	if !unread {
		// A daemon that ends a stream this way is not failing: the next
		// write opens a new one at once.
		s.failures++
	}
	if status.Code(err) == codes.NotFound {
		// The file was deleted under the stream (nothing else ends one
		// with NOT_FOUND once it is open): resending, or writing on,
		// would create a new file.
		s.gone = err
		s.failQueuedLocked(err)
	}
	if s.conn == conn {
		s.conn = nil
	}
	ids := make([]uint64, 0, len(conn.inflight))
	for id, w := range conn.inflight {
		// The sender may still be reading its bytes: its caller must not
		// have it back before that ends.
		for w.state == beingEncoded {
			s.idle.Wait()
		}
		ids = append(ids, id)
	}
	slices.Sort(ids) // the order they were sent in
	sent := make([]*write, len(ids))
	for i, id := range ids {
		sent[i] = conn.inflight[id]
	}
	resend := s.retryOrFailLocked(sent, err, unread)
	conn.inflight = nil
	if len(resend) > 0 {
		s.queue = append(resend, s.queue...)
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
	s.mu.Unlock()
	close(conn.done)
}

// retryOrFailLocked keeps, of ws (writes that failed with err before they
// were acked), those that may be sent again (mayRetryLocked), counting the
// attempt and marking them queued, and finishes the others with err. It
// returns the kept ones in ws's order, in ws's array.
//
// Preconditions: s.mu is held.
func (s *fileStream) retryOrFailLocked(ws []*write, err error, unread bool) []*write {
	keep := ws[:0]
	for _, w := range ws {
		if s.mayRetryLocked(w, err, unread) {
			w.attempts++
			w.state = queued
			keep = append(keep, w)
			continue
		}
		w.err = err
		s.finishLocked(w)
	}
	clear(ws[len(keep):])
	return keep
}

// mayRetryLocked reports whether w, which failed with err before it was
// acked, may be sent again on a new stream. When w is unread (the daemon
// ended the stream with OK or STREAM_IDLE, having applied and acked every
// write it read) sending it again is its first delivery, so it goes once
// whatever WithRetry says. Otherwise only under WithRetry, with attempts
// left, for an error that says the daemon was not reached (retryable).
// Never once the file is gone, the Client or stream is closed, or w's
// caller gave up on it.
//
// Preconditions: s.mu is held.
func (s *fileStream) mayRetryLocked(w *write, err error, unread bool) bool {
	switch {
	case w.gaveUp || s.gone != nil || s.closed || s.c.ctx.Err() != nil:
		return false
	case unread:
		return w.attempts < max(1, s.c.opts.retries)
	}
	return w.attempts < s.c.opts.retries && retryable(err)
}

// finishLocked ends w: its caller, if still waiting, gets the outcome;
// if it gave up, a failure is kept for its File's Close.
//
// Preconditions: s.mu is held and w is not finished.
func (s *fileStream) finishLocked(w *write) {
	w.state = finished
	s.pending--
	w.f.outstanding--
	if s.sending && s.idleSenderLocked() {
		select {
		case s.wake <- struct{}{}: // to exit
		default:
		}
	}
	if w.gaveUp && w.err != nil && w.f.unreported == nil {
		w.f.unreported = w.err
	}
	s.idle.Broadcast()
	// Last: once signalled, w belongs to its caller again.
	w.done <- struct{}{}
}

// failQueuedLocked fails every queued write with err.
//
// Preconditions: s.mu is held.
func (s *fileStream) failQueuedLocked(err error) {
	for _, w := range s.queue {
		w.err = err
		s.finishLocked(w)
	}
	clear(s.queue)
	s.queue = s.queue[:0]
}

// giveUp is called for writes whose caller's context ended before they
// finished. Those still queued are taken out: never sent, never written.
// Those being encoded are waited for (briefly: encoding does not block),
// so that the caller may reuse its buffer once giveUp returns; those in
// flight will report a failure to their File's Close, and are not resent.
func (s *fileStream) giveUp(ws []*write) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range ws {
		for w.state == beingEncoded {
			s.idle.Wait()
		}
		switch w.state {
		case queued:
			if i := slices.Index(s.queue, w); i >= 0 {
				s.queue = slices.Delete(s.queue, i, i+1)
			}
			w.err = context.Canceled
			s.finishLocked(w)
		case inFlight:
			w.gaveUp = true
		}
	}
}

// waitIdle waits until f has no write queued or in flight, or ctx ends.
func (s *fileStream) waitIdle(ctx context.Context, f *File) error {
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.idle.Broadcast()
		s.mu.Unlock()
	})
	defer stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for f.outstanding > 0 {
		if err := ctx.Err(); err != nil {
			return wrapErr(err)
		}
		s.idle.Wait()
	}
	return nil
}

// close ends the stream once its last File is closed and nothing is
// pending: it half-closes, and the daemon ends the stream once it has
// acked everything.
func (s *fileStream) close() error {
	s.mu.Lock()
	s.closed = true
	close(s.stopped)
	// Queued writes are those of Files whose Close stopped waiting: the
	// stream is ending, they will not be sent.
	s.failQueuedLocked(errFileClosed(s.path))
	if s.connecting != nil {
		s.connecting()
	}
	sending, senderDone := s.sending, s.senderDone
	select {
	case s.wake <- struct{}{}:
	default:
	}
	s.mu.Unlock()
	if sending {
		<-senderDone
	}
	s.openMu.Lock()
	defer s.openMu.Unlock()
	s.mu.Lock()
	conn := s.conn
	s.conn = nil
	s.mu.Unlock()
	if conn == nil {
		return nil
	}
	if conn.mux != nil {
		// Wait for the acks of the writes in flight, then close the
		// file on the shared stream.
		s.mu.Lock()
		for len(conn.inflight) > 0 && !conn.broken {
			s.idle.Wait()
		}
		broken := conn.broken
		s.mu.Unlock()
		if !broken {
			conn.mux.detach(conn)
		}
		return nil
	}
	conn.stream.CloseSend()
	<-conn.done // the receiver saw the stream's end
	return nil
}
