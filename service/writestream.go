package service

import (
	"context"
	"errors"
	"hash/crc32"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/store"
)

// WriteStream carries many writes to one file (see the RPC's contract in
// the proto). The handler only checks what the stream carries and calls
// the store; writeStream runs it.
func (s *fileServer) WriteStream(ss grpc.BidiStreamingServer[filewritev1.WriteStreamRequest, filewritev1.WriteStreamResponse]) error {
	return newWriteStream(s, ss).serve()
}

// castagnoli is the CRC-32C table (SSE 4.2 on amd64, the ARMv8 CRC
// instructions on arm64).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// maxAcksPerResponse bounds one response (an ack is at most ~40 bytes on
// the wire): acks ready beyond it go in the next one.
const maxAcksPerResponse = 8192

// streamWorkers is how many writes of one stream may be applied at once:
// more than the CPUs only helps writes that wait for a lock.
var streamWorkers = max(2, runtime.GOMAXPROCS(0))

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
	req     *streamRequest

	// landed is where the write's bytes begin, for its ack: off, or
	// where an append landed. Written as res is.
	landed int64

	sync store.SyncMode
	cost int64 // against the budgets, given back once acked
	// order is guarded by writeStream.mu: the writes it waits for and
	// that wait for it (writeOrder).
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
//   - the reader (read) alone calls Recv: it opens the file, checks each
//     message and hands its writes to writeOrder;
//   - up to streamWorkers workers (work) apply the writes that writeOrder
//     frees;
//   - a syncer (syncLoop), started at the first write that owes a sync,
//     waits for the group commit of every write applied and owing one
//     since its last wait, so that such a write's ack waits for its sync
//     while the writes behind it go on. It sends the acks of each round
//     itself, unless the handler is sending: they are all ready at once,
//     and a durable write's ack should not wait for one more goroutine to
//     be woken.
//
// One goroutine at a time sends (sending), and none after the handler
// returns (sendClosed).
//
// The handle is closed by whichever of the handler and the reader is done
// last (users); the reader waits for the workers and the syncer first.
type writeStream struct {
	files  *fileServer
	ss     grpc.BidiStreamingServer[filewritev1.WriteStreamRequest, filewritev1.WriteStreamResponse]
	ctx    context.Context
	budget *streamBudget
	// stopped is ctx, also cancelled by stop: the reader reads no further
	// message, and stops waiting for the budgets. cancelStop is its
	// cancel.
	stopped    context.Context
	cancelStop context.CancelFunc

	// h is the file, set by the reader once it opened it and before it
	// hands out a write; immutable after.
	h *store.Handle
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
	// resp and acked are the response being sent and the writes it acks,
	// owned by whoever set sending.
	resp  encodedMessage
	acked []*streamWrite

	// mu guards the fields below, and every streamWrite's order.
	// It is never held across a store call, a Send or a Recv.
	mu sync.Mutex
	// workCond wakes workers (ready grew, or the reader is done); syncCond
	// wakes the syncer (owing grew, or everything is applied); sentCond
	// wakes the handler waiting for the syncer to finish sending.
	workCond, syncCond, sentCond sync.Cond
	// opened: the file is open; answered: the reply to it went out.
	opened, answered bool
	// stopping is set by stop; end is then the stream's outcome.
	stopping bool
	end      error
	// readerDone: the reader returned and hands out no more writes.
	readerDone bool
	// unacked holds the ids read whose ack has not been taken to be sent.
	unacked map[uint64]struct{}
	// pending counts the writes read and not yet taken to be sent.
	pending int
	order   writeOrder
	// ready holds, from readyHead on, the writes free to apply, in
	// arrival order (popReadyLocked).
	ready     []*streamWrite
	readyHead int
	owing     []*streamWrite // applied, waiting for their sync
	acks      []*streamWrite // to be sent
	// workers started, and those of them waiting for work.
	workers, idle int
	syncer        bool
	// sending: the handler or the syncer is sending acks (sendAcks),
	// and only it may call Send until it clears sending. sendClosed: the
	// handler returns, and nobody may send any more. sendErr is the
	// syncer's failed Send, for the handler to return.
	sending, sendClosed bool
	sendErr             error
}

func newWriteStream(files *fileServer, ss grpc.BidiStreamingServer[filewritev1.WriteStreamRequest, filewritev1.WriteStreamResponse]) *writeStream {
	ws := &writeStream{
		files:   files,
		ss:      ss,
		ctx:     ss.Context(),
		budget:  newStreamBudget(files.maxStreamBytes, &files.streamHeld, files.budget),
		wake:    make(chan struct{}, 1),
		unacked: make(map[uint64]struct{}),
	}
	ws.stopped, ws.cancelStop = context.WithCancel(ws.ctx)
	ws.workCond.L = &ws.mu
	ws.syncCond.L = &ws.mu
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
			ws.stop(refusal(filewritev1.ErrorReason_SHUTTING_DOWN, nil, "the daemon is shutting down: writes read before are acked, resend the others"))
		case <-ws.ctx.Done():
			ws.stop(ws.ctx.Err())
			ws.closeSends()
			return toStatus(ws.ctx.Err())
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
		acked, send, cost, done, end = ws.collect(ws.acked[:0])
		if !send {
			return done && handler, end
		}
		ws.acked = acked
		encodeAcks(acked, &ws.resp)
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
		ws.budget.give(cost)
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
func (ws *writeStream) collect(acked []*streamWrite) (_ []*streamWrite, send bool, cost int64, done bool, end error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
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
	send = n > 0 || (ws.opened && !ws.answered)
	if send {
		ws.answered = true
		return acked, true, cost, false, nil
	}
	ws.sending = false
	ws.sentCond.Broadcast()
	if ws.stopping {
		// Only the handler ends the stream: if the syncer was sending,
		// the handler must look again.
		ws.wakeSenderLocked()
	}
	done = ws.stopping && ws.pending == 0 && len(ws.acks) == 0
	return acked, false, cost, done, ws.end
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
		code := status.Code(toStatus(w.err))
		if failureLevel(code) != slog.LevelError {
			continue
		}
		ws.files.log.LogAttrs(ws.ctx, slog.LevelError, "stream write",
			slog.String("path", ws.h.Path()),
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
	return status.Convert(toStatus(err)).Proto()
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

// watchDelete ends the stream with NOT_FOUND once its file is deleted (or
// replaced by a Rename over it), after the writes read before are acked:
// they fail with NOT_FOUND too, having nowhere to go. A Rename of the file
// itself changes nothing: the stream writes to it under its new name. It
// returns when the stream stops, for whatever reason.
func (ws *writeStream) watchDelete() {
	select {
	case <-ws.h.Gone():
		ws.stop(ws.deletedStatus())
	case <-ws.stopped.Done():
	}
}

// watchAuth ends the stream once a reload of --auth-token-file removes its
// credential (UNAUTHENTICATED) or narrows its scope away from its file
// (PERMISSION_DENIED), as stop does: the writes read before the reload
// are acked, none after. It returns when the stream stops.
func (ws *writeStream) watchAuth(p string, changed <-chan struct{}) {
	for {
		select {
		case <-changed:
			changed = ws.files.auth.changed()
			if err := ws.files.auth.authorize(ws.ctx, accessWrite, p); err != nil {
				ws.stop(err)
				return
			}
		case <-ws.stopped.Done():
			return
		}
	}
}

func (ws *writeStream) deletedStatus() error {
	return refusal(filewritev1.ErrorReason_FILE_DELETED, nil, "%s was deleted or replaced while the stream wrote to it: writes read before are acked", ws.h.Path())
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
	if ws.h != nil {
		ws.h.Close()
	}
	ws.cancelStop()
	ws.stopIdleTimer()
	ws.budget.close()
	ws.files.streamMetrics.closed(context.Background())
}

// read is the reader: it reads messages while the stream is below its
// byte bound and not stopping, and hands their writes out.
func (ws *writeStream) read() {
	defer ws.release()
	defer ws.readerExit()
	for ws.budget.wait(ws.stopped) {
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
	ws.syncCond.Broadcast()
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
		return nil
	}
	// The cost counts a record per write: it is taken before they are
	// made.
	cost := req.cost()
	if err := ws.budget.take(ws.stopped, cost); err != nil {
		req.release()
		if ws.ctx.Err() != nil {
			// take's error says the stream's deadline passed while it
			// waited for the budget (INFLIGHT_BUDGET), not a bare
			// DEADLINE_EXCEEDED.
			return toStatus(err)
		}
		return nil // stopped while waiting
	}
	req.decodeWrites()
	for i := range req.writes {
		w := &req.writes[i]
		w.cost = writeCost(len(w.data))
		var err error
		if w.sync, err = syncModeFromProto(w.syncRaw); err == nil && w.hasCRC {
			if sum := crc32.Checksum(w.data, castagnoli); sum != w.crc {
				err = crcMismatch(sum, w.crc)
			}
		}
		if err == nil && w.append && w.off != 0 {
			err = refusal(filewritev1.ErrorReason_RANGE_INVALID, map[string]string{errorinfo.KeyField: "offset"},
				"a write with append takes no offset (it goes at the end of the file), this one has offset %d", w.off)
		}
		w.err = err
	}
	queued, err := ws.queue(req)
	if !queued {
		ws.budget.give(cost)
		req.release()
	}
	return err
}

// queue hands out the writes of req, whose cost the stream has taken, and
// reports whether it did: not if the stream is stopping (no error: the
// message is dropped), nor if it reuses an id not yet acked (the error
// that ends the stream).
func (ws *writeStream) queue(req *streamRequest) (bool, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.stopping {
		return false, nil // read, but neither applied nor acked
	}
	for i := range req.writes {
		id := req.writes[i].id
		if _, dup := ws.unacked[id]; dup {
			for _, v := range req.writes[:i] {
				delete(ws.unacked, v.id)
			}
			return false, writeIDInUse(id)
		}
		ws.unacked[id] = struct{}{}
	}
	ws.pending += len(req.writes)
	for i := range req.writes {
		w := &req.writes[i]
		switch {
		case w.err != nil:
			// Refused before anything was written.
			w.res.Size = ws.h.Size()
			w.req.applied()
			ws.doneLocked(w)
		case ws.order.add(w):
			ws.readyLocked(w)
		}
	}
	return true, nil
}

// check checks what a message says before any of its writes is looked
// at, opening the file on the first.
func (ws *writeStream) check(req *streamRequest) error {
	ws.files.streamMetrics.message(ws.ctx, req.msg.Writes, ws.budget.held.Load())
	if req.tooMany > 0 {
		return refusal(filewritev1.ErrorReason_TOO_MANY_WRITES_IN_MESSAGE, map[string]string{errorinfo.KeyField: "writes", errorinfo.KeyLimit: strconv.Itoa(req.tooMany)},
			"a message of more than %d writes: the limit is %d writes per message; send the rest in the next message", req.tooMany, req.tooMany)
	}
	if req.bad != "" {
		return malformed(req.bad)
	}
	if int64(req.size) > ws.files.maxMessageBytes {
		return messageTooLarge(req.size, ws.files.maxMessageBytes)
	}
	if ws.h == nil {
		if err := checkPathHeader(ws.ctx, req.path, false); err != nil {
			return err
		}
		open, err := openModeFromProto(req.openMode)
		if err != nil {
			return toStatus(err)
		}
		// The channel is taken before the check, so that a reload after
		// the check is not missed.
		authChanged := ws.files.auth.changed()
		if err := ws.files.auth.authorize(ws.ctx, accessWrite, req.path); err != nil {
			return err
		}
		h, err := ws.files.store.OpenHandle(ws.ctx, req.path, open)
		if err != nil {
			return toStatus(err)
		}
		ws.mu.Lock()
		ws.h = h
		ws.opened = true
		ws.wakeSenderLocked()
		ws.mu.Unlock()
		go ws.watchDelete()
		if ws.files.auth != nil {
			go ws.watchAuth(req.path, authChanged)
		}
		return nil
	}
	if req.path != "" && req.path != ws.h.Path() {
		return refusal(filewritev1.ErrorReason_STREAM_PATH_CHANGED, map[string]string{errorinfo.KeyField: "path"}, "the message names %q but the stream writes %q: a stream writes one file, named in its first message", req.path, ws.h.Path())
	}
	return nil
}

// readyLocked queues w for a worker, starting one if none is idle.
//
// Preconditions: ws.mu is held.
func (ws *writeStream) readyLocked(w *streamWrite) {
	if ws.readyHead > 0 && len(ws.ready) == cap(ws.ready) {
		// Full, with taken writes at its start: move the others down
		// rather than grow, so that a queue that never empties stays
		// the size of what it holds.
		n := copy(ws.ready, ws.ready[ws.readyHead:])
		clear(ws.ready[n:])
		ws.ready, ws.readyHead = ws.ready[:n], 0
	}
	ws.ready = append(ws.ready, w)
	if ws.idle == 0 && ws.workers < streamWorkers {
		ws.workers++
		ws.helpers.Add(1)
		go ws.work()
		return
	}
	ws.workCond.Signal()
}

// popReadyLocked takes the first write of ready, which is not empty.
// ready is a queue read from readyHead, so that taking a write moves
// nothing, and reset once empty, so that its capacity is kept.
//
// Preconditions: ws.mu is held.
func (ws *writeStream) popReadyLocked() *streamWrite {
	w := ws.ready[ws.readyHead]
	ws.ready[ws.readyHead] = nil
	ws.readyHead++
	if ws.readyHead == len(ws.ready) {
		ws.ready, ws.readyHead = ws.ready[:0], 0
	}
	return w
}

// doneLocked queues w's ack.
//
// Preconditions: ws.mu is held.
func (ws *writeStream) doneLocked(w *streamWrite) {
	ws.acks = append(ws.acks, w)
	ws.wakeSenderLocked()
}

// work is a worker: it applies the writes that writeOrder frees until the
// reader is done and every write read has been applied.
func (ws *writeStream) work() {
	defer ws.helpers.Done()
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for {
		for ws.readyHead == len(ws.ready) && !(ws.readerDone && ws.order.empty()) {
			ws.idle++
			ws.workCond.Wait()
			ws.idle--
		}
		if ws.readyHead == len(ws.ready) {
			return
		}
		w := ws.popReadyLocked()
		ws.mu.Unlock()
		if w.append {
			w.res, w.landed, w.err = ws.h.ApplyAppend(ws.ctx, w.data, w.sync)
		} else {
			w.res, w.err = ws.h.Write(ws.ctx, w.off, w.data, w.sync)
			w.landed = w.off
		}
		if errors.Is(w.err, store.ErrDeleted) {
			ws.stop(ws.deletedStatus()) // as watchDelete would, a moment later
		}
		ws.mu.Lock()
		ws.order.remove(w, ws.readyLocked)
		// Its bytes go back to gRPC's pool with the message's last write.
		w.data = nil
		w.req.applied()
		if w.res.Owed != store.SyncNone {
			ws.owing = append(ws.owing, w)
			if !ws.syncer {
				ws.syncer = true
				ws.helpers.Add(1)
				go ws.syncLoop()
			}
			ws.syncCond.Signal()
		} else {
			ws.doneLocked(w)
		}
		if ws.readerDone && ws.order.empty() {
			ws.workCond.Broadcast()
			ws.syncCond.Broadcast()
		}
	}
}

// syncLoop is the syncer: each round waits, with one group-commit sync,
// for every write that was applied and owed a sync when the round began,
// then queues their acks. Writes applied meanwhile join the next round.
func (ws *writeStream) syncLoop() {
	defer ws.helpers.Done()
	var batch []*streamWrite
	var applied []store.AppliedWrite
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for {
		for len(ws.owing) == 0 && !(ws.readerDone && ws.order.empty()) {
			ws.syncCond.Wait()
		}
		if len(ws.owing) == 0 {
			return
		}
		batch = append(batch[:0], ws.owing...)
		clear(ws.owing)
		ws.owing = ws.owing[:0]
		ws.mu.Unlock()
		applied = applied[:0]
		for _, w := range batch {
			applied = append(applied, w.res)
		}
		err := ws.h.Wait(ws.ctx, applied...)
		ws.mu.Lock()
		for _, w := range batch {
			w.err = err
			ws.acks = append(ws.acks, w)
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
