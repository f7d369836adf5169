package streamengine

import (
	"context"
	"runtime"
	"sync"
	"time"
)

// maxAcksPerResponse bounds one response (an ack is at most ~40 bytes on
// the wire): acks ready beyond it go in the next one.
const maxAcksPerResponse = 8192

// streamWorkers is how many writes of one stream may be applied at once:
// more than the CPUs only helps writes that wait for a lock.
var streamWorkers = max(2, runtime.GOMAXPROCS(0))

// durableWorkers is how many workers a stream may run while its writes
// are made durable by themselves (store.Handle.SyncsWritesItself): each
// such write holds its worker for the device's round trip, and a durable
// writer keeps this many in flight (the bulk scenario's 32, fio's queue
// depth).
const durableWorkers = 32

// Sender sends one response that reports files (the declarations not yet
// reported) and acks (writes done with, each with its outcome). It is
// called by one goroutine at a time, the one whose turn it is to send,
// never with the stream's lock held, and never after CloseSends. The
// slices are the engine's again once it returns. An error ends the stream
// with it (see Deliver).
type Sender func(acks []*Write, files []FileStatus) error

// Stream is the engine of one WriteStream: it takes the writes the reader
// hands out (Queue), applies them to their files in an order that keeps
// overlapping writes in arrival order, waits for the syncs they owe, and
// hands their acks to the framing's Sender. Four kinds of goroutine
// share it:
//
//   - the handler's (the framing's, calling Deliver when Wake says so)
//     sends the acks and decides when the stream ends;
//   - the reader (the framing's, which alone calls Recv) opens the files,
//     checks each message and hands its writes to Queue, which gives them
//     to their file's writeOrder; a write free to apply at once that the
//     store can make without waiting or a syscall (Handle.TryWrite: a
//     copy into the file's mapping) it applies itself (applyInline),
//     saving a worker's wake-up;
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
// returns (sendClosed): the turn to send is the engine's to give, because
// a syncer takes it, but the Send is the framing's.
//
// The framing closes the stream (Close) once both the handler and the
// reader are done; the reader waits for the workers and the syncers first
// (ReaderDone). A file closed by a message is given back once its last
// write is acked.
type Stream struct {
	ctx  context.Context
	send Sender
	// stopped is ctx, also cancelled by Stop: the reader reads no further
	// message, and stops waiting for the budgets. cancelStop is its
	// cancel.
	stopped    context.Context
	cancelStop context.CancelFunc

	// main is the file of the first message's path, set by the reader
	// once it opened it and before it hands out a write; immutable after.
	// It is nil on a stream that only declares files.
	main *File
	// idleTimeout ends the stream once idle that long (0: never), and
	// idleWatch is its clock (idle.go); its timer is guarded by mu.
	idleTimeout time.Duration
	idleWatch   idleWatch
	// wake has one slot: something for the sender (an ack, the answer to
	// the first message, the end).
	wake chan struct{}
	// helpers counts the workers and the syncer, for the reader to wait.
	helpers sync.WaitGroup
	// inline holds the writes of the message being read that queue found
	// free to apply and fit for TryWrite, for applyInline. The reader's
	// alone.
	inline []*Write
	// acked holds the writes of the response being sent, owned by whoever
	// set sending.
	acked []*Write

	// mu guards the fields below, and every Write's order.
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
	declared map[uint32]*File
	statuses []FileStatus
	// stopping is set by Stop; end is then the stream's outcome.
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
	runnable fifo[*File]
	acks     []*Write // to be sent
	// workers started, and those of them waiting for work.
	workers, idle int
	// sending: the handler or the syncer is sending acks (sendAcks),
	// and only it may call send until it clears sending. sendClosed: the
	// handler returns, and nobody may send any more. sendErr is the
	// syncer's failed send, for the handler to return.
	sending, sendClosed bool
	sendErr             error
}

// New is the engine of a stream whose context is ctx: the writes are
// applied under it, and the stream stops when it ends. idleTimeout ends
// the stream once it has been idle that long (0: never); send sends the
// acks.
func New(ctx context.Context, idleTimeout time.Duration, send Sender) *Stream {
	s := &Stream{
		ctx:         ctx,
		send:        send,
		idleTimeout: idleTimeout,
		wake:        make(chan struct{}, 1),
		unacked:     make(map[uint64]struct{}),
	}
	s.stopped, s.cancelStop = context.WithCancel(ctx)
	s.workCond.L = &s.mu
	s.sentCond.L = &s.mu
	return s
}

// Stopped is the stream's context, also cancelled by Stop: the reader
// reads no further message once it is done, nor waits for a budget.
func (s *Stream) Stopped() context.Context { return s.stopped }

// Wake is ready when the handler has something to do: acks to send, the
// answer to the first message, or the end (Deliver).
func (s *Stream) Wake() <-chan struct{} { return s.wake }

// Opened reports whether the stream's first message was read (MarkOpened).
// For the reader, which alone sets it: it reads it without the lock.
func (s *Stream) Opened() bool { return s.opened }

// MarkOpened records that the stream's first message was read, its file
// open or its files declared: a response answers it, acks or none.
func (s *Stream) MarkOpened() {
	s.mu.Lock()
	s.opened = true
	s.wakeSenderLocked()
	s.mu.Unlock()
}

// Deliver is the handler's turn: unless a syncer is sending, it sends the
// acks ready, several per response, until none is left, and reports
// whether the stream is over, with its outcome: once every write read has
// been acked after the stream was told to stop, or at a failed send (its
// own, or a syncer's: then the outcome is that error).
func (s *Stream) Deliver() (done bool, end error) {
	s.mu.Lock()
	if err := s.sendErr; err != nil {
		s.mu.Unlock()
		return true, err
	}
	if s.sending {
		// The syncer sends what is ready, and wakes the handler
		// once done if the stream is stopping.
		s.mu.Unlock()
		return false, nil
	}
	s.sending = true
	s.mu.Unlock()
	return s.sendAcks(true)
}

// sendAcks sends the acks ready, up to maxAcksPerResponse a response,
// until none is left (collect then clears sending). handler says the
// caller is Deliver, for which it reports whether the stream is over, with
// its outcome; a failed send is its outcome too. The syncer's failure is
// left in sendErr for the handler.
//
// Preconditions: the caller set sending; s.mu is not held.
func (s *Stream) sendAcks(handler bool) (done bool, end error) {
	for {
		var send bool
		var acked []*Write
		var statuses []FileStatus
		acked, statuses, send, done, end = s.collect(s.acked[:0])
		if !send {
			return done && handler, end
		}
		s.acked = acked
		if err := s.send(acked, statuses); err != nil {
			s.Stop(err)
			s.mu.Lock()
			s.sending = false
			s.sentCond.Broadcast()
			if !handler {
				s.sendErr = err
				s.wakeSenderLocked()
			}
			s.mu.Unlock()
			return handler, err
		}
		clear(acked)
	}
}

// collect appends to acked up to maxAcksPerResponse writes whose acks are
// ready, and reports whether to send a response (also when it is the empty
// answer to the first message), and whether the stream is over, with its
// outcome. When there is nothing to send it clears sending, in the same
// hold of mu in which it found nothing, so that an ack queued after it
// finds nobody sending.
//
// Preconditions: the caller set sending.
func (s *Stream) collect(acked []*Write) (_ []*Write, statuses []FileStatus, send bool, done bool, end error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.statuses) > 0 {
		// Rare (a declaration): reported before the acks of the file's
		// writes, in the same response.
		statuses = s.statuses
		s.statuses = nil
	}
	n := min(len(s.acks), maxAcksPerResponse)
	for _, w := range s.acks[:n] {
		acked = append(acked, w)
		delete(s.unacked, w.ID)
	}
	// Keep the slice's start, so that its capacity serves the next acks
	// instead of being lost one response at a time.
	rest := copy(s.acks, s.acks[n:])
	clear(s.acks[rest:])
	s.acks = s.acks[:rest]
	s.pending -= n
	if n > 0 && s.pending == 0 {
		s.idleWatch.acked()
	}
	send = n > 0 || len(statuses) > 0 || (s.opened && !s.answered)
	if send {
		s.answered = true
		return acked, statuses, true, false, nil
	}
	s.sending = false
	s.sentCond.Broadcast()
	if s.stopping {
		// Only the handler ends the stream: if the syncer was sending,
		// the handler must look again.
		s.wakeSenderLocked()
	}
	done = s.stopping && s.pending == 0 && len(s.acks) == 0
	return acked, nil, false, done, s.end
}

// CloseSends is called by the handler before it returns: nobody sends
// after it, and it waits for the syncer if it is sending (its send fails
// at once once the stream's context ends, as it does when the handler
// returns with an error).
func (s *Stream) CloseSends() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sendClosed = true
	for s.sending {
		s.sentCond.Wait()
	}
}

// Stop ends the stream once every write read has been acked; the first
// cause given is its outcome (nil: OK). The reader reads nothing more.
func (s *Stream) Stop(end error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked(end)
}

// stopLocked is Stop.
//
// Preconditions: s.mu is held.
func (s *Stream) stopLocked(end error) {
	if s.stopping {
		return
	}
	s.stopping = true
	s.end = end
	s.cancelStop()
	s.wakeSenderLocked()
}

// wakeSenderLocked tells the sender to look again.
//
// Preconditions: s.mu is held (or the caller owns what it signals).
func (s *Stream) wakeSenderLocked() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// ReaderDone is called by the reader as it returns: it tells the workers
// and the syncers that no write comes any more, and waits for them.
func (s *Stream) ReaderDone() {
	s.mu.Lock()
	s.readerDone = true
	s.workCond.Broadcast()
	s.mu.Unlock()
	s.helpers.Wait()
}

// Close gives back the files still held, once the handler and the reader
// are both done (after ReaderDone and CloseSends).
func (s *Stream) Close() {
	// Every write was acked or dropped: the reader waited for the workers
	// and syncers, and the handler is done. The framing's watchers may
	// still look at the files until cancelStop, hence the lock.
	if s.main != nil && s.main.h != nil {
		s.main.h.Close()
	}
	s.mu.Lock()
	for _, f := range s.declared {
		f.closing = true
		f.writes = 0
		f.releaseLocked()
	}
	s.mu.Unlock()
	s.cancelStop()
	s.stopIdleTimer()
}
