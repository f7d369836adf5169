//go:build linux

package store

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// lockMode is how an operation holds the inode lock.
type lockMode int8

const (
	// lockNone: the write runs without the inode lock, counted in flight.
	// It still takes the lock shared for the moment it registers.
	lockNone lockMode = iota
	lockShared
	lockExclusive
)

func (m lockMode) String() string {
	switch m {
	case lockNone:
		return "none"
	case lockShared:
		return "shared"
	case lockExclusive:
		return "exclusive"
	}
	return fmt.Sprintf("lockMode(%d)", int(m))
}

// holder is one acquisition of an inodeLock: who holds it, how and why. It
// feeds /debug/locks and the links from a waiter's span to the holders'.
type holder struct {
	mode   lockMode // lockShared or lockExclusive
	op     string   // "write", "truncate", ...
	reason string   // why this mode (see writeLockMode)
	span   trace.SpanContext

	// The rest is guarded by inodeLock.mu. since is when the lock was
	// granted; while the holder waits for it, when it began to wait.
	since      time.Time
	prev, next *holder
}

// waiter is a caller queued for an inodeLock.
type waiter struct {
	h     *holder
	ready chan struct{} // closed once h holds the lock
	// granted is guarded by inodeLock.mu.
	granted    bool
	prev, next *waiter
}

// inodeLock is the inode's rwsem: a FIFO reader/writer lock whose waiters
// leave when their context ends. sync.RWMutex cannot be abandoned by a
// waiter, so a request whose deadline passed would stay queued and then
// write after its caller had been told it failed; this lock removes such a
// waiter from the queue instead. Consecutive shared waiters at the head are
// granted together; an exclusive waiter blocks shared requests behind it, so
// neither side starves. Like Linux's rwsem, it is not reentrant: a holder
// must not acquire it again.
type inodeLock struct {
	// wait says where the lock's waits are reported, and maxWaiters > 0
	// bounds its queue. Both are set when the inode opens, before anyone
	// can take the lock, and never change.
	wait       waitTrace
	maxWaiters int

	// mu guards every field below. It is held only for queue bookkeeping,
	// never across I/O.
	mu       sync.Mutex
	readers  int     // shared holders
	writer   bool    // an exclusive holder exists
	holders  *holder // list of current holders, newest first
	head     *waiter // FIFO queue of waiters
	tail     *waiter
	nwaiting int
	// creator is the holder that created the file (acquireNew), until it
	// releases the lock.
	creator *holder
}

// lockSnapshot is the lock's state for /debug/locks.
type lockSnapshot struct {
	Holders []HolderInfo
	// Waiters are the first waiters in the queue, the longest waiting
	// first; Waiting counts them all.
	Waiters []HolderInfo
	Waiting int
}

// HolderInfo describes one holder of an inode lock, or one caller that
// waits for it: then Since is when it began to wait.
type HolderInfo struct {
	Mode    string    `json:"mode"`
	Op      string    `json:"op"`
	Reason  string    `json:"reason"`
	Since   time.Time `json:"since"`
	TraceID string    `json:"trace_id,omitempty"`
	SpanID  string    `json:"span_id,omitempty"`
}

// errTooManyWaiters is the formatted ErrTooManyWaiters for a limit.
func errTooManyWaiters(limit int) error {
	return refuseLimit(ErrTooManyWaiters, "", int64(limit), "%d callers already wait for this file, the limit is %d", limit, limit)
}

// tryLocked grants h at once when nobody queues ahead of it and the mode is
// compatible with the holders.
//
// Preconditions: l.mu is held.
func (l *inodeLock) tryLocked(h *holder) bool {
	if l.head != nil || l.writer {
		return false
	}
	if h.mode == lockExclusive && l.readers > 0 {
		return false
	}
	l.grantLocked(h)
	return true
}

// grantLocked makes h a holder.
//
// Preconditions: l.mu is held and h's mode is compatible with the holders.
func (l *inodeLock) grantLocked(h *holder) {
	if h.mode == lockExclusive {
		l.writer = true
	} else {
		l.readers++
	}
	h.since = time.Now()
	h.prev = nil
	h.next = l.holders
	if l.holders != nil {
		l.holders.prev = h
	}
	l.holders = h
}

// wakeLocked grants waiters from the head of the queue: one exclusive
// waiter, or every shared waiter up to the next exclusive one.
//
// Preconditions: l.mu is held.
func (l *inodeLock) wakeLocked() {
	for w := l.head; w != nil; w = l.head {
		if l.writer || (w.h.mode == lockExclusive && l.readers > 0) {
			return
		}
		l.dequeueLocked(w)
		l.grantLocked(w.h)
		w.granted = true
		close(w.ready)
		if w.h.mode == lockExclusive {
			return
		}
	}
}

// Preconditions: l.mu is held and w is queued.
func (l *inodeLock) dequeueLocked(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		l.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		l.tail = w.prev
	}
	w.prev, w.next = nil, nil
	l.nwaiting--
}

// holderSpansLocked returns the span contexts of up to maxLinks holders.
//
// Preconditions: l.mu is held.
func (l *inodeLock) holderSpansLocked() []trace.SpanContext {
	var out []trace.SpanContext
	for h := l.holders; h != nil && len(out) < maxLinks; h = h.next {
		if h.span.IsValid() {
			out = append(out, h.span)
		}
	}
	return out
}

// waitTrace says where the waits of one inode are reported. Each inode sets
// its own once, when it opens (inode.wait), and hands it to its lock and
// its group commit. The path is read through the inode's name, at each
// wait, for a Rename changes it.
type waitTrace struct {
	tel    *Telemetry
	policy Policy
	name   *atomic.Pointer[string] // inode.name; nil: no path
}

// path is the inode's path now.
func (w waitTrace) path() string {
	if w.name == nil {
		return ""
	}
	return *w.name.Load()
}

// acquire takes the lock in h.mode (lockShared or lockExclusive). If it must
// wait, the wait is traced and abandoned when ctx ends: the caller then gets
// ctx's error and does not hold the lock. l.maxWaiters > 0 bounds the queue.
func (l *inodeLock) acquire(ctx context.Context, h *holder) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l.mu.Lock()
	if l.tryLocked(h) {
		l.mu.Unlock()
		return nil
	}
	if l.maxWaiters > 0 && l.nwaiting >= l.maxWaiters {
		l.mu.Unlock()
		return errTooManyWaiters(l.maxWaiters)
	}
	w := &waiter{h: h, ready: make(chan struct{})}
	h.since = time.Now() // until granted: since when it waits
	w.prev = l.tail
	if l.tail != nil {
		l.tail.next = w
	} else {
		l.head = w
	}
	l.tail = w
	l.nwaiting++
	links := l.holderSpansLocked()
	l.mu.Unlock()

	span := l.wait.tel.startWait(ctx, SpanLockWait, h.mode, h.reason, l.wait.policy, l.wait.path(), links)
	select {
	case <-w.ready:
		span.end(ctx, nil)
		return nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	if w.granted {
		// Granted as the context ended: give it back rather than act on
		// behalf of a caller who has been told it failed.
		l.releaseLocked(h)
	} else {
		l.dequeueLocked(w)
		// Leaving may let shared waiters behind an exclusive one go.
		l.wakeLocked()
	}
	l.mu.Unlock()
	err := ctx.Err()
	span.end(ctx, err)
	return err
}

// acquireNew takes the lock exclusively for h on an inode that no one else
// can reach yet, whose file h's operation has just created: it never waits.
// Until h releases it, fresh reports true.
func (l *inodeLock) acquireNew(h *holder) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.tryLocked(h) {
		panic("store: acquireNew of a lock someone holds")
	}
	l.creator = h
}

// fresh reports whether the operation that created the file still holds
// the lock: readers that do not lock (Stat, Extents) lock then, so that
// they never see a file before its creator's first operation.
func (l *inodeLock) fresh() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.creator != nil
}

// createdBy reports whether h took the lock with acquireNew and holds it.
func (l *inodeLock) createdBy(h *holder) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.creator == h
}

// release gives up h's hold.
func (l *inodeLock) release(h *holder) {
	l.mu.Lock()
	l.releaseLocked(h)
	l.mu.Unlock()
}

// Preconditions: l.mu is held and h holds the lock.
func (l *inodeLock) releaseLocked(h *holder) {
	if l.creator == h {
		l.creator = nil
	}
	if h.mode == lockExclusive {
		l.writer = false
	} else {
		l.readers--
	}
	if h.prev != nil {
		h.prev.next = h.next
	} else {
		l.holders = h.next
	}
	if h.next != nil {
		h.next.prev = h.prev
	}
	h.prev, h.next = nil, nil
	l.wakeLocked()
}

// snapshot copies at most most holders and the first most waiters.
func (l *inodeLock) snapshot(most int) lockSnapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := lockSnapshot{Waiting: l.nwaiting}
	for h := l.holders; h != nil && len(s.Holders) < most; h = h.next {
		s.Holders = append(s.Holders, h.infoLocked())
	}
	for w := l.head; w != nil && len(s.Waiters) < most; w = w.next {
		s.Waiters = append(s.Waiters, w.h.infoLocked())
	}
	return s
}

// infoLocked describes h for /debug/locks.
//
// Preconditions: the inodeLock.mu of the lock h holds or waits for is
// held.
func (h *holder) infoLocked() HolderInfo {
	hi := HolderInfo{Mode: h.mode.String(), Op: h.op, Reason: h.reason, Since: h.since}
	if h.span.HasTraceID() {
		hi.TraceID = h.span.TraceID().String()
	}
	if h.span.HasSpanID() {
		hi.SpanID = h.span.SpanID().String()
	}
	return hi
}

// lockInode takes ino's lock in mode (lockShared or lockExclusive) on
// behalf of op, recording reason and ctx's span for waiters and
// /debug/locks. Release it with ino.lock.release.
//
// The holder comes from holderPool: a caller that knows nothing refers to
// it any more gives it back with putHolder, as write does, so that a write
// allocates nothing on its way through the lock. Others leave it to the
// garbage collector.
func lockInode(ctx context.Context, ino *inode, mode lockMode, op, reason string) (*holder, error) {
	h := holderPool.Get().(*holder)
	*h = holder{mode: mode, op: op, reason: reason, span: trace.SpanContextFromContext(ctx)}
	if err := ino.lock.acquire(ctx, h); err != nil {
		putHolder(h) // acquire left no reference to it
		return nil, err
	}
	return h, nil
}

// tryLockInode is lockInode without the wait: the holder if the lock is
// free for mode now (nobody queued ahead, no conflicting holder), else nil.
func tryLockInode(ctx context.Context, ino *inode, mode lockMode, op, reason string) *holder {
	h := holderPool.Get().(*holder)
	*h = holder{mode: mode, op: op, reason: reason, span: trace.SpanContextFromContext(ctx)}
	ino.lock.mu.Lock()
	ok := ino.lock.tryLocked(h)
	ino.lock.mu.Unlock()
	if !ok {
		putHolder(h)
		return nil
	}
	return h
}

// holderPool recycles holders (see lockInode).
var holderPool = sync.Pool{New: func() any { return new(holder) }}

// putHolder gives h back to holderPool.
//
// Preconditions: h was released, or never granted, and nothing refers to
// it: not the lock, nor the in-flight counter's span slots.
func putHolder(h *holder) {
	*h = holder{}
	holderPool.Put(h)
}
