package rpc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	grpcstatus "google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/internal/streamwire"
	"github.com/filewrite/filewrite/service/internal/admit"
	"github.com/filewrite/filewrite/service/internal/auth"
	"github.com/filewrite/filewrite/service/internal/status"
	"github.com/filewrite/filewrite/store"
)

// WriteStream carries many writes to one file, or to many files declared
// on it (see the RPC's contract in the proto). The handler only checks
// what the stream carries and calls the store; writeStream runs it.
func (s *FileServer) WriteStream(ss grpc.BidiStreamingServer[filewritev1.WriteStreamRequest, filewritev1.WriteStreamResponse]) error {
	return newWriteStream(s, ss).serve()
}

// maxAcksPerResponse bounds one response (an ack is at most ~40 bytes on
// the wire): acks ready beyond it go in the next one.
const maxAcksPerResponse = 8192

// streamWorkers is how many writes of one stream may be applied at once:
// more than the CPUs only helps writes that wait for a lock.
var streamWorkers = max(2, runtime.GOMAXPROCS(0))

// streamFile is one file of a stream: the file of its first message's
// path (index 0), or one declared by index. Its fields but index, path
// and h are guarded by writeStream.mu.
type streamFile struct {
	index uint32
	path  string
	// h is the file, nil if it could not be opened; immutable once the
	// file is on the stream.
	h *store.Handle
	// err, once set, is what the file's writes read from then on are
	// acked with: why it could not be opened, or was deleted, or its
	// scope revoked. Writes already handed out are applied as usual.
	err error
	// order keeps the file's overlapping writes in arrival order; writes
	// to different files never wait for each other.
	order writeOrder
	// ready holds its writes free to apply, in arrival order; running
	// counts those being applied. queued: it is in writeStream.runnable.
	ready   fifo[*streamWrite]
	running int
	queued  bool
	// owing holds its writes applied and waiting for their sync; syncer:
	// its syncer runs.
	owing  []*streamWrite
	syncer bool
	// syncBatch and syncApplied are the syncer's scratch, kept from one
	// syncer to the next so that a sync round allocates nothing; only
	// the goroutine that set syncer uses them.
	syncBatch   []*streamWrite
	syncApplied []store.AppliedWrite
	// writes counts its writes handed out and not yet acked; closing:
	// the client closed it (or the stream ends), and h is given back
	// once writes is 0.
	writes  int
	closing bool
}

// size is the file's size now, 0 if it is not open.
func (f *streamFile) size() int64 {
	if f.h == nil {
		return 0
	}
	return f.h.Size()
}

// releaseLocked gives the file back once it is closed and its last write
// is acked. Handle.Close only moves the file to the store's idle list (or
// closes a deleted one's descriptor): no I/O is waited for under ws.mu.
//
// Preconditions: ws.mu is held.
func (f *streamFile) releaseLocked() {
	if f.closing && f.writes == 0 && f.h != nil {
		f.h.Close()
	}
}

// fifo is a queue that keeps its capacity: read from head, reset once
// empty, and moved down rather than grown when full with taken items at
// its start, so that one that never empties stays the size of what it
// holds.
type fifo[T any] struct {
	items []T
	head  int
}

func (q *fifo[T]) len() int { return len(q.items) - q.head }

func (q *fifo[T]) push(v T) {
	if q.head > 0 && len(q.items) == cap(q.items) {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	q.items = append(q.items, v)
}

// pop takes the first item; the queue is not empty.
func (q *fifo[T]) pop() T {
	var zero T
	v := q.items[q.head]
	q.items[q.head] = zero
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
	return v
}

// streamWrite is one write of a stream, from the message that carried it
// to its ack.
type streamWrite struct {
	// As decoded (streamwire.go); data aliases req's bytes until the
	// write has been applied.
	id      uint64
	off     int64
	data    []byte
	syncRaw filewritev1.SyncMode
	crc     uint32
	hasCRC  bool
	append  bool // an append: off is 0, and landed says where it went
	// appendID is an append's id (store.AppendOptions.ID), aliasing req's
	// bytes as data does; empty for none.
	appendID []byte
	fileIdx  uint32
	req      *streamRequest
	// file is the file it goes to, set when it is handed out.
	file *streamFile

	// landed is where the write's bytes begin, for its ack: off, or
	// where an append landed. Written as res is.
	landed int64

	sync store.SyncMode
	cost int64 // against the budgets, given back once acked
	// order is guarded by writeStream.mu: the writes of its file it waits
	// for and that wait for it (writeOrder).
	order orderState
	// res and err are written by the goroutine that applies the write (or
	// waits for its sync), then read by the sender once it is in acks.
	res store.AppliedWrite
	err error
	// status is err as its ack carries it, encoded by the sender.
	status []byte
}

// writeStream is one WriteStream. Four kinds of goroutine share it:
//
//   - the handler's (serve) sends the acks and decides when the stream
//     ends;
//   - the reader (read) alone calls Recv: it opens the files, checks each
//     message and hands its writes to their file's writeOrder; a write
//     free to apply at once that the store can make without waiting or a
//     syscall (Handle.TryWrite: a copy into the file's mapping) it
//     applies itself (applyInline), saving a worker's wake-up;
//   - up to streamWorkers workers (work) apply the writes that the orders
//     free, taking files in turn (runnable); with more than one file on
//     the stream, at most streamWorkers-1 of them work on one file, so
//     that a file whose writes wait for a lock leaves a worker to the
//     others;
//   - a syncer per file (syncLoop), started when one of its writes owes a
//     sync and gone once none does, waits for the group commit of every
//     write of its file applied and owing one since its last wait, so
//     that such a write's ack waits for its sync while the writes behind
//     it, and the other files' acks, go on. It sends the acks of each
//     round itself, unless another goroutine is sending: they are all
//     ready at once, and a durable write's ack should not wait for one
//     more goroutine to be woken.
//
// One goroutine at a time sends (sending), and none after the handler
// returns (sendClosed).
//
// The files still held are closed by whichever of the handler and the
// reader is done last (users); the reader waits for the workers and the
// syncers first. A file closed by a message is given back once its last
// write is acked.
type writeStream struct {
	files  *FileServer
	ss     grpc.BidiStreamingServer[filewritev1.WriteStreamRequest, filewritev1.WriteStreamResponse]
	ctx    context.Context
	budget *admit.StreamBudget
	// stopped is ctx, also cancelled by stop: the reader reads no further
	// message, and stops waiting for the budgets. cancelStop is its
	// cancel.
	stopped    context.Context
	cancelStop context.CancelFunc

	// main is the file of the first message's path, set by the reader
	// once it opened it and before it hands out a write; immutable after.
	// It is nil on a stream that only declares files.
	main *streamFile
	// users counts the handler and the reader: the last to finish closes
	// h and the budget.
	users atomic.Int32
	// idleWatch ends the stream once idle (streamidle.go); its timer is
	// guarded by mu.
	idleWatch idleWatch
	// wake has one slot: something for the sender (an ack, the answer to
	// the first message, the end).
	wake chan struct{}
	// helpers counts the workers and the syncer, for the reader to wait.
	helpers sync.WaitGroup
	// inline holds the writes of the message being read that queue found
	// free to apply and fit for TryWrite, for applyInline. The reader's
	// alone.
	inline []*streamWrite
	// resp and acked are the response being sent and the writes it acks,
	// owned by whoever set sending.
	resp  encodedMessage
	acked []*streamWrite

	// mu guards the fields below, and every streamWrite's order.
	// It is never held across a Send or a Recv, nor a store call but
	// Handle.Close (releaseLocked) and Handle.Size, which wait for no
	// write (lock order: the package doc).
	mu sync.Mutex
	// workCond wakes workers (runnable grew, or the reader is done);
	// sentCond wakes the handler waiting for a syncer to finish sending.
	workCond, sentCond sync.Cond
	// opened: the stream's first message was read, its file open or its
	// files declared; answered: the reply to it went out.
	opened, answered bool
	// declared holds the declared files by index, until the client
	// closes them; statuses the reports of declarations not yet sent.
	declared map[uint32]*streamFile
	statuses []fileStatus
	// stopping is set by stop; end is then the stream's outcome.
	stopping bool
	end      error
	// readerDone: the reader returned and hands out no more writes.
	readerDone bool
	// unacked holds the ids read whose ack has not been taken to be sent.
	unacked map[uint64]struct{}
	// pending counts the writes read and not yet taken to be sent.
	pending int
	// ordered counts the writes in a file's order (handed out and not yet
	// applied).
	ordered int
	// runnable holds the files with writes free to apply and a worker to
	// spare, in turn.
	runnable fifo[*streamFile]
	acks     []*streamWrite // to be sent
	// workers started, and those of them waiting for work.
	workers, idle int
	// sending: the handler or the syncer is sending acks (sendAcks),
	// and only it may call Send until it clears sending. sendClosed: the
	// handler returns, and nobody may send any more. sendErr is the
	// syncer's failed Send, for the handler to return.
	sending, sendClosed bool
	sendErr             error
}

func newWriteStream(files *FileServer, ss grpc.BidiStreamingServer[filewritev1.WriteStreamRequest, filewritev1.WriteStreamResponse]) *writeStream {
	ws := &writeStream{
		files:   files,
		ss:      ss,
		ctx:     ss.Context(),
		budget:  admit.NewStreamBudget(files.maxStreamBytes, &files.streamHeld, files.budget),
		wake:    make(chan struct{}, 1),
		unacked: make(map[uint64]struct{}),
	}
	ws.stopped, ws.cancelStop = context.WithCancel(ws.ctx)
	ws.workCond.L = &ws.mu
	ws.sentCond.L = &ws.mu
	return ws
}

// serve runs the stream until it ends, on the handler's goroutine: it
// sends acks as they become ready, several per response, and returns once
// every write read has been acked after the stream was told to stop (by
// the client's half-close, a stream error, or the daemon's shutdown).
func (ws *writeStream) serve() error {
	ws.files.streamMetrics.opened(ws.ctx)
	ws.users.Store(2)
	defer ws.release()
	ws.startIdleTimer()
	go ws.read()
	draining := ws.files.draining
	for {
		select {
		case <-ws.wake:
			// Let the workers that are already runnable finish first, so
			// that their acks go in this response: a yield, not a wait.
			runtime.Gosched()
		case <-draining:
			draining = nil
			ws.stop(status.Refusal(filewritev1.ErrorReason_SHUTTING_DOWN, nil, "the daemon is shutting down: writes read before are acked, resend the others"))
		case <-ws.ctx.Done():
			ws.stop(ws.ctx.Err())
			ws.closeSends()
			return status.Of(ws.ctx.Err())
		}
		ws.mu.Lock()
		if err := ws.sendErr; err != nil {
			ws.mu.Unlock()
			ws.closeSends()
			return err
		}
		if ws.sending {
			// The syncer sends what is ready, and wakes the handler
			// once done if the stream is stopping.
			ws.mu.Unlock()
			continue
		}
		ws.sending = true
		ws.mu.Unlock()
		if done, end := ws.sendAcks(true); done {
			ws.closeSends()
			return end
		}
	}
}

// sendAcks sends the acks ready, up to maxAcksPerResponse a response,
// until none is left (collect then clears sending). handler says the
// caller is serve, for which it reports whether the stream is over, with
// its outcome; a failed Send is its outcome too. The syncer's failure is
// left in sendErr for the handler.
//
// Preconditions: the caller set sending; ws.mu is not held.
func (ws *writeStream) sendAcks(handler bool) (done bool, end error) {
	for {
		var send bool
		var cost int64
		var acked []*streamWrite
		var statuses []fileStatus
		acked, statuses, send, cost, done, end = ws.collect(ws.acked[:0])
		if !send {
			return done && handler, end
		}
		ws.acked = acked
		encodeAcks(acked, statuses, &ws.resp)
		if err := ws.ss.SendMsg(&ws.resp); err != nil {
			ws.stop(err)
			ws.mu.Lock()
			ws.sending = false
			ws.sentCond.Broadcast()
			if !handler {
				ws.sendErr = err
				ws.wakeSenderLocked()
			}
			ws.mu.Unlock()
			return handler, err
		}
		ws.budget.Give(cost)
		ws.logFailures(acked)
		clear(acked)
	}
}

// collect appends to acked up to maxAcksPerResponse writes whose acks are
// ready, and reports whether to send a response (also when it is the empty
// answer to the first message), the budget those acks give back, and
// whether the stream is over, with its outcome. When there is nothing to
// send it clears sending, in the same hold of mu in which it found nothing,
// so that an ack queued after it finds nobody sending.
//
// Preconditions: the caller set sending.
func (ws *writeStream) collect(acked []*streamWrite) (_ []*streamWrite, statuses []fileStatus, send bool, cost int64, done bool, end error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if len(ws.statuses) > 0 {
		// Rare (a declaration): reported before the acks of the file's
		// writes, in the same response.
		statuses = ws.statuses
		ws.statuses = nil
	}
	n := min(len(ws.acks), maxAcksPerResponse)
	for _, w := range ws.acks[:n] {
		acked = append(acked, w)
		cost += w.cost
		delete(ws.unacked, w.id)
	}
	// Keep the slice's start, so that its capacity serves the next acks
	// instead of being lost one response at a time.
	rest := copy(ws.acks, ws.acks[n:])
	clear(ws.acks[rest:])
	ws.acks = ws.acks[:rest]
	ws.pending -= n
	if n > 0 && ws.pending == 0 {
		ws.idleWatch.acked()
	}
	send = n > 0 || len(statuses) > 0 || (ws.opened && !ws.answered)
	if send {
		ws.answered = true
		return acked, statuses, true, cost, false, nil
	}
	ws.sending = false
	ws.sentCond.Broadcast()
	if ws.stopping {
		// Only the handler ends the stream: if the syncer was sending,
		// the handler must look again.
		ws.wakeSenderLocked()
	}
	done = ws.stopping && ws.pending == 0 && len(ws.acks) == 0
	return acked, nil, false, cost, done, ws.end
}

// closeSends is called by the handler before it returns: nobody sends
// after it, and it waits for the syncer if it is sending (its Send fails
// at once once the stream's context ends, as it does when the handler
// returns with an error).
func (ws *writeStream) closeSends() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.sendClosed = true
	for ws.sending {
		ws.sentCond.Wait()
	}
}

// logFailures logs the writes acked with a code that means the server or
// the disk failed, as logRPC logs such a unary Write.
func (ws *writeStream) logFailures(acked []*streamWrite) {
	for _, w := range acked {
		if w.err == nil {
			continue
		}
		code := grpcstatus.Code(status.Of(w.err))
		if status.FailureLevel(code) != slog.LevelError {
			continue
		}
		ws.files.log.LogAttrs(ws.ctx, slog.LevelError, "stream write",
			slog.String("path", w.file.path),
			slog.Uint64("id", w.id),
			slog.String("code", code.String()),
			slog.String("error", w.err.Error()))
	}
}

// ackStatus is a write's outcome as its ack carries it: nil on success.
func ackStatus(err error) *spb.Status {
	if err == nil {
		return nil
	}
	return grpcstatus.Convert(status.Of(err)).Proto()
}

// stop ends the stream once every write read has been acked; the first
// cause given is its outcome (nil: OK). The reader reads nothing more.
func (ws *writeStream) stop(end error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.stopLocked(end)
}

// stopLocked is stop.
//
// Preconditions: ws.mu is held.
func (ws *writeStream) stopLocked(end error) {
	if ws.stopping {
		return
	}
	ws.stopping = true
	ws.end = end
	ws.cancelStop()
	ws.wakeSenderLocked()
}

// watchDelete ends the stream with NOT_FOUND once the file of its path is
// deleted (or replaced by a Rename over it), after the writes read before
// are acked: they fail with NOT_FOUND too, having nowhere to go. A Rename
// of the file itself changes nothing: the stream writes to it under its
// new name. It returns when the stream stops, for whatever reason. A
// declared file has no watcher: its deletion fails its own writes
// (fileDeletedLocked), and the stream goes on.
func (ws *writeStream) watchDelete() {
	select {
	case <-ws.main.h.Gone():
		ws.stop(deletedStatus(ws.main))
	case <-ws.stopped.Done():
	}
}

// watchAuth looks again at the stream's files at each reload of
// --auth-token-file. One that removes the credential, or narrows its scope
// away from the file of the stream's path, ends the stream
// (UNAUTHENTICATED, PERMISSION_DENIED) as stop does: the writes read
// before the reload are acked, none after. A declared file the new scope
// leaves out fails its writes read from then on with the refusal, and the
// stream goes on. It returns when the stream stops.
func (ws *writeStream) watchAuth(changed <-chan struct{}) {
	var files []*streamFile
	for {
		select {
		case <-changed:
			changed = ws.files.auth.Changed()
			if ws.main != nil {
				if err := ws.files.auth.Authorize(ws.ctx, auth.AccessWrite, ws.main.path); err != nil {
					ws.stop(err)
					return
				}
			}
			ws.mu.Lock()
			files = files[:0]
			for _, f := range ws.declared {
				if f.err == nil {
					files = append(files, f)
				}
			}
			ws.mu.Unlock()
			for _, f := range files {
				if err := ws.files.auth.Authorize(ws.ctx, auth.AccessWrite, f.path); err != nil {
					ws.mu.Lock()
					if f.err == nil {
						f.err = err
					}
					ws.mu.Unlock()
				}
			}
			clear(files)
		case <-ws.stopped.Done():
			return
		}
	}
}

func deletedStatus(f *streamFile) error {
	return status.Refusal(filewritev1.ErrorReason_FILE_DELETED, nil, "%s was deleted or replaced while the stream wrote to it: writes read before are acked", f.path)
}

// wakeSenderLocked tells the sender to look again.
//
// Preconditions: ws.mu is held (or the caller owns what it signals).
func (ws *writeStream) wakeSenderLocked() {
	select {
	case ws.wake <- struct{}{}:
	default:
	}
}

// release is called once by the handler and once by the reader; the
// last closes the file and gives back what is still held.
func (ws *writeStream) release() {
	if ws.users.Add(-1) > 0 {
		return
	}
	// Every write was acked or dropped: the reader waited for the workers
	// and syncers, and the handler is done. watchAuth may still look at
	// the files until cancelStop, hence the lock.
	if ws.main != nil && ws.main.h != nil {
		ws.main.h.Close()
	}
	ws.mu.Lock()
	for _, f := range ws.declared {
		f.closing = true
		f.writes = 0
		f.releaseLocked()
	}
	ws.mu.Unlock()
	ws.cancelStop()
	ws.stopIdleTimer()
	ws.budget.Close()
	ws.files.streamMetrics.closed(context.Background())
}

// read is the reader: it reads messages while the stream is below its
// byte bound and not stopping, and hands their writes out.
func (ws *writeStream) read() {
	defer ws.release()
	defer ws.readerExit()
	for ws.budget.Wait(ws.stopped) {
		req := new(streamRequest)
		err := ws.ss.RecvMsg(req)
		if errors.Is(err, io.EOF) {
			ws.stop(nil) // half-closed: ack what was read, then OK
			return
		}
		if err == nil {
			ws.idleWatch.receiving()
			err = ws.accept(req)
			ws.idleWatch.handled()
		}
		if err != nil {
			ws.stop(err)
			return
		}
	}
}

// readerExit tells the workers and the syncer that no write comes any
// more, and waits for them.
func (ws *writeStream) readerExit() {
	ws.mu.Lock()
	ws.readerDone = true
	ws.workCond.Broadcast()
	ws.mu.Unlock()
	ws.helpers.Wait()
}

// accept checks one message, opening the file on the first, takes its
// cost from the budgets, and hands its writes out. An error ends the
// stream; the message's writes are then refused, all of them, and the
// writes of earlier messages are still applied and acked.
//
// While the daemon's budget is short, accept waits for it before the
// message's writes are handed out, and the reader reads no further. If the
// stream is told to stop meanwhile (shutdown, its file deleted, an ack it
// could not send), the message is dropped, as one read after the stop is:
// neither applied nor acked. If the stream's context ends, that is its end.
func (ws *writeStream) accept(req *streamRequest) error {
	if err := ws.check(req); err != nil {
		req.release()
		return err
	}
	if req.msg.Writes == 0 {
		if len(req.msg.Closes) > 0 {
			ws.mu.Lock()
			ws.closeFilesLocked(req.msg.Closes)
			ws.mu.Unlock()
		}
		return nil
	}
	// The cost counts a record per write: it is taken before they are
	// made.
	cost := req.cost()
	if err := ws.budget.Take(ws.stopped, cost); err != nil {
		req.release()
		if ws.ctx.Err() != nil {
			// take's error says the stream's deadline passed while it
			// waited for the budget (INFLIGHT_BUDGET), not a bare
			// DEADLINE_EXCEEDED.
			return status.Of(err)
		}
		return nil // stopped while waiting
	}
	req.decodeWrites()
	for i := range req.writes {
		w := &req.writes[i]
		w.cost = admit.WriteCost(len(w.data))
		var err error
		if w.sync, err = status.SyncModeFromProto(w.syncRaw); err == nil && w.hasCRC {
			err = status.CheckCRC32C(w.data, w.crc, "writes.crc32c")
		}
		if err == nil && w.append && w.off != 0 {
			err = status.Refusal(filewritev1.ErrorReason_RANGE_INVALID, map[string]string{errorinfo.KeyField: "offset"},
				"a write with append takes no offset (it goes at the end of the file), this one has offset %d", w.off)
		}
		if err == nil && !w.append && len(w.appendID) > 0 {
			err = status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: "append_id"},
				"append_id is for an append: a positional write (append not set) takes none")
		}
		w.err = err
	}
	queued, err := ws.queue(req)
	if !queued {
		ws.budget.Give(cost)
		req.release()
	}
	ws.applyInline()
	return err
}

// applyInline tries the writes queue left in inline with TryWrite, and
// completes those it made as a worker does; it hands the others to the
// workers. Each of them is in its file's order, free to apply, and
// counted in ordered, so none of its file's later overlapping writes can
// start meanwhile, and the workers do not exit.
func (ws *writeStream) applyInline() {
	if len(ws.inline) == 0 {
		return
	}
	for _, w := range ws.inline {
		// A write TryWrite made has bytes written (it makes no empty
		// one); one it did not make is left with none, for the worker.
		var made bool
		if w.res, made = w.file.h.TryWrite(ws.ctx, w.off, w.data); made {
			w.landed = w.off
		} else {
			w.res = store.AppliedWrite{}
		}
	}
	ws.mu.Lock()
	for i, w := range ws.inline {
		ws.inline[i] = nil
		if w.res.BytesWritten == 0 {
			ws.readyLocked(w)
			continue
		}
		ws.appliedLocked(w)
		ws.doneLocked(w)
	}
	ws.inline = ws.inline[:0]
	ws.mu.Unlock()
}

// queue hands out the writes of req, whose cost the stream has taken, and
// reports whether it did: not if the stream is stopping (no error: the
// message is dropped), nor if it reuses an id not yet acked or names a
// file not on the stream (the error that ends the stream). The files the
// message closes are closed after its writes are handed out.
func (ws *writeStream) queue(req *streamRequest) (bool, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.stopping {
		return false, nil // read, but neither applied nor acked
	}
	for i := range req.writes {
		w := &req.writes[i]
		w.file = ws.fileLocked(w.fileIdx)
		err := error(nil)
		if w.file == nil {
			err = status.UnknownStreamFile(w.fileIdx)
		} else if _, dup := ws.unacked[w.id]; dup {
			err = status.WriteIDInUse(w.id)
		}
		if err != nil {
			for _, v := range req.writes[:i] {
				delete(ws.unacked, v.id)
			}
			return false, err
		}
		ws.unacked[w.id] = struct{}{}
	}
	ws.pending += len(req.writes)
	for i := range req.writes {
		w := &req.writes[i]
		f := w.file
		f.writes++
		if w.err == nil && f.err != nil {
			w.err = f.err
		}
		if w.err != nil {
			// Refused before anything was written.
			w.res.Size = f.size()
			w.req.applied()
			ws.doneLocked(w)
			continue
		}
		ws.ordered++
		if f.order.add(w) {
			if w.sync == store.SyncNone && !w.append {
				ws.inline = append(ws.inline, w)
			} else {
				ws.readyLocked(w)
			}
		}
	}
	ws.closeFilesLocked(req.msg.Closes)
	return true, nil
}

// fileLocked is the file that a write naming index goes to, nil if the
// stream has none by that index.
//
// Preconditions: ws.mu is held.
func (ws *writeStream) fileLocked(index uint32) *streamFile {
	if index == 0 {
		return ws.main
	}
	return ws.declared[index]
}

// closeFilesLocked closes the declared files of indexes: the index is free
// at once, and the file is given back once its last write is acked.
// Closing an index that names no file does nothing, so that a client may
// close a file whose declaration failed without tracking it.
//
// Preconditions: ws.mu is held.
func (ws *writeStream) closeFilesLocked(indexes []uint32) {
	for _, i := range indexes {
		f := ws.declared[i]
		if f == nil {
			continue
		}
		delete(ws.declared, i)
		f.closing = true
		f.releaseLocked()
	}
}

// check checks what a message says before any of its writes is looked
// at, opening the file of its path on the first, and the files it
// declares.
func (ws *writeStream) check(req *streamRequest) error {
	ws.files.streamMetrics.message(ws.ctx, req.msg.Writes, ws.budget.Held())
	if req.err != nil {
		var many *streamwire.TooManyWritesError
		if errors.As(req.err, &many) {
			return status.Refusal(filewritev1.ErrorReason_TOO_MANY_WRITES_IN_MESSAGE, map[string]string{errorinfo.KeyField: "writes", errorinfo.KeyLimit: strconv.Itoa(many.Limit)},
				"a message of more than %d writes: the limit is %d writes per message; send the rest in the next message", many.Limit, many.Limit)
		}
		return status.Malformed(req.err.Error())
	}
	if int64(req.size) > ws.files.maxMessageBytes {
		return status.MessageTooLarge(req.size, ws.files.maxMessageBytes)
	}
	first := !ws.opened
	if first {
		// The channel is taken before the first check, so that a reload
		// after it is not missed.
		var authChanged <-chan struct{}
		if ws.files.auth != nil {
			authChanged = ws.files.auth.Changed()
		}
		// The routing header names the first file: the path's, or the
		// first declared (see pathheader.go).
		header := req.msg.Path
		if header == "" && len(req.msg.Files) > 0 {
			header = req.msg.Files[0].Path
		}
		if err := checkPathHeader(ws.ctx, header, false); err != nil {
			return err
		}
		if req.msg.Path != "" || len(req.msg.Files) == 0 {
			if err := ws.openMain(req); err != nil {
				return err
			}
			go ws.watchDelete()
		}
		if ws.files.auth != nil {
			go ws.watchAuth(authChanged)
		}
	} else if req.msg.Path != "" && (ws.main == nil || req.msg.Path != ws.main.path) {
		main := ""
		if ws.main != nil {
			main = ws.main.path
		}
		return status.Refusal(filewritev1.ErrorReason_STREAM_PATH_CHANGED, map[string]string{errorinfo.KeyField: "path"}, "the message names %q but the stream's path is %q: only the first message may name it; declare other files (files)", req.msg.Path, main)
	}
	if err := ws.declare(req.msg.Files, req.msg.Closes); err != nil {
		return err
	}
	if first {
		ws.mu.Lock()
		ws.opened = true
		ws.wakeSenderLocked()
		ws.mu.Unlock()
	}
	return nil
}

// openMain opens the file of the first message's path, whose failure
// ends the stream.
func (ws *writeStream) openMain(req *streamRequest) error {
	h, err := ws.openFile(req.msg.Path, filewritev1.OpenMode(req.msg.OpenMode))
	if err != nil {
		return err
	}
	ws.mu.Lock()
	ws.main = &streamFile{path: req.msg.Path, h: h}
	ws.mu.Unlock()
	return nil
}

// declare opens the files a message declares, each checked as a unary
// Write of its path would be (the routing header aside: see
// pathheader.go), and queues its report. A file that cannot be opened
// takes its index all the same, its writes acked with the reason, until
// the client closes it; only an index that cannot be declared (0, or one
// in use) ends the stream.
func (ws *writeStream) declare(files []streamwire.File, closes []uint32) error {
	if len(files) == 0 {
		return nil
	}
	// The files the same message closes do not count against the bound:
	// a client at the bound closes an idle file and declares the next in
	// one message. (They are closed once the message's writes are handed
	// out, so that writes sent with the close still reach them.)
	ws.mu.Lock()
	closing := 0
	for i, c := range closes {
		if _, ok := ws.declared[c]; ok && !slices.Contains(closes[:i], c) {
			closing++
		}
	}
	ws.mu.Unlock()
	for i := range files {
		d := &files[i]
		ws.mu.Lock()
		_, inUse := ws.declared[d.Index]
		held := len(ws.declared) - closing
		ws.mu.Unlock()
		if d.Index == 0 || inUse {
			return status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: "files.index", "index": strconv.FormatUint(uint64(d.Index), 10)},
				"file index %d is 0 or already on the stream: declare an index of 1 or more, and close it before declaring it again", d.Index)
		}
		limit := ws.files.maxFilesPerStream
		if held >= 2*limit {
			// Declarations refused past the bound take an index too, for
			// the writes sent with them to be acked with the refusal; a
			// client that goes on declaring without closing any is not
			// reading the refusals.
			return status.TooManyFilesOnStream(limit)
		}
		f := &streamFile{index: d.Index, path: d.Path}
		if held >= limit {
			f.err = status.TooManyFilesOnStream(limit)
		} else {
			f.h, f.err = ws.openFile(d.Path, filewritev1.OpenMode(d.OpenMode))
		}
		ws.mu.Lock()
		if ws.declared == nil {
			ws.declared = make(map[uint32]*streamFile)
		}
		ws.declared[d.Index] = f
		ws.statuses = append(ws.statuses, fileStatus{index: d.Index, err: f.err})
		ws.wakeSenderLocked()
		ws.mu.Unlock()
	}
	return nil
}

// openFile checks a file's open mode and the caller's access to it, and
// opens it: the path's file of the first message, or a declared one.
func (ws *writeStream) openFile(path string, mode filewritev1.OpenMode) (*store.Handle, error) {
	open, err := status.OpenModeFromProto(mode)
	if err != nil {
		return nil, status.Of(err)
	}
	if err := ws.files.auth.Authorize(ws.ctx, auth.AccessWrite, path); err != nil {
		return nil, err
	}
	h, err := ws.files.store.OpenHandle(ws.ctx, path, open)
	if err != nil {
		return nil, status.Of(err)
	}
	return h, nil
}

// readyLocked queues w, free to apply, for a worker, starting one if none
// is idle.
//
// Preconditions: ws.mu is held.
func (ws *writeStream) readyLocked(w *streamWrite) {
	w.file.ready.push(w)
	ws.runnableLocked(w.file)
	if ws.idle == 0 && ws.workers < streamWorkers {
		ws.workers++
		ws.helpers.Add(1)
		go ws.work()
		return
	}
	ws.workCond.Signal()
}

// runnableLocked puts f in runnable if it has writes free to apply and
// may have one more applied at once: streamWorkers-1 at most when the
// stream has declared files, so that one file waiting for a lock leaves
// a worker to the others.
//
// Preconditions: ws.mu is held.
func (ws *writeStream) runnableLocked(f *streamFile) {
	if f.queued || f.ready.len() == 0 {
		return
	}
	perFile := streamWorkers
	if ws.declared != nil {
		perFile = max(1, streamWorkers-1)
	}
	if f.running >= perFile {
		return
	}
	f.queued = true
	ws.runnable.push(f)
}

// popReadyLocked takes the first write free to apply of the first file in
// runnable, which is not empty, and puts the file back at the end of
// runnable if it has more: files take turns.
//
// Preconditions: ws.mu is held.
func (ws *writeStream) popReadyLocked() *streamWrite {
	f := ws.runnable.pop()
	f.queued = false
	w := f.ready.pop()
	f.running++
	ws.runnableLocked(f)
	return w
}

// doneLocked queues w's ack and wakes the sender.
//
// Preconditions: ws.mu is held.
func (ws *writeStream) doneLocked(w *streamWrite) {
	ws.ackLocked(w)
	ws.wakeSenderLocked()
}

// ackLocked queues w's ack, and gives its file back if it was closed and
// this was its last write.
//
// Preconditions: ws.mu is held.
func (ws *writeStream) ackLocked(w *streamWrite) {
	ws.acks = append(ws.acks, w)
	w.file.writes--
	w.file.releaseLocked()
}

// fileDeletedLocked is called when a write found f deleted (or replaced
// by a Rename over it). The stream's path's file ends the stream, as
// watchDelete would a moment later; a declared file fails its writes read
// from then on, and the stream goes on.
//
// Preconditions: ws.mu is held.
func (ws *writeStream) fileDeletedLocked(f *streamFile) {
	if f == ws.main {
		ws.stopLocked(deletedStatus(f))
		return
	}
	if f.err == nil {
		f.err = deletedStatus(f)
	}
}

// appliedLocked takes w, whose bytes reached the file (or whose write
// failed), out of its file's order, freeing the writes that waited for
// it, and gives its message's bytes back once the message's last write is
// done with them.
//
// Preconditions: ws.mu is held.
func (ws *writeStream) appliedLocked(w *streamWrite) {
	ws.ordered--
	w.file.order.remove(w, ws.readyLocked)
	// Its bytes go back to gRPC's pool with the message's last write.
	w.data, w.appendID = nil, nil
	w.req.applied()
}

// work is a worker: it applies the writes that the files' orders free
// until the reader is done and every write read has been applied.
func (ws *writeStream) work() {
	defer ws.helpers.Done()
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for {
		for ws.runnable.len() == 0 && !(ws.readerDone && ws.ordered == 0) {
			ws.idle++
			ws.workCond.Wait()
			ws.idle--
		}
		if ws.runnable.len() == 0 {
			return
		}
		w := ws.popReadyLocked()
		f := w.file
		ws.mu.Unlock()
		if w.append {
			// The store checks the id's length, as for a unary Append.
			opts := store.AppendOptions{ID: string(w.appendID)}
			w.res, w.landed, w.err = f.h.ApplyAppend(ws.ctx, w.data, w.sync, opts)
		} else {
			w.res, w.err = f.h.Write(ws.ctx, w.off, w.data, w.sync)
			w.landed = w.off
		}
		ws.mu.Lock()
		if errors.Is(w.err, store.ErrDeleted) {
			ws.fileDeletedLocked(f)
		}
		f.running--
		ws.appliedLocked(w)
		ws.runnableLocked(f)
		if w.res.Owed != store.SyncNone {
			f.owing = append(f.owing, w)
			if !f.syncer {
				f.syncer = true
				ws.helpers.Add(1)
				go ws.syncLoop(f)
			}
		} else {
			ws.doneLocked(w)
		}
		if ws.runnable.len() > 0 {
			ws.workCond.Signal()
		}
		if ws.readerDone && ws.ordered == 0 {
			ws.workCond.Broadcast()
		}
	}
}

// syncLoop is f's syncer: each round waits, with one group-commit sync,
// for every write of f that was applied and owed a sync when the round
// began, then queues their acks. Writes applied meanwhile join the next
// round; once a round finds none, it returns, and the next write that
// owes a sync starts another.
func (ws *writeStream) syncLoop(f *streamFile) {
	defer ws.helpers.Done()
	batch, applied := f.syncBatch, f.syncApplied
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for {
		if len(f.owing) == 0 {
			f.syncBatch, f.syncApplied = batch[:0], applied[:0]
			f.syncer = false
			return
		}
		batch = append(batch[:0], f.owing...)
		clear(f.owing)
		f.owing = f.owing[:0]
		ws.mu.Unlock()
		applied = applied[:0]
		for _, w := range batch {
			applied = append(applied, w.res)
		}
		err := f.h.Wait(ws.ctx, applied...)
		ws.mu.Lock()
		for _, w := range batch {
			w.err = err
			ws.ackLocked(w)
		}
		clear(batch)
		switch {
		case ws.sending:
			// The sender takes them with the acks it is sending.
		case ws.sendClosed || ws.sendErr != nil:
			ws.wakeSenderLocked()
		default:
			ws.sending = true
			ws.mu.Unlock()
			ws.sendAcks(false)
			ws.mu.Lock()
		}
	}
}
