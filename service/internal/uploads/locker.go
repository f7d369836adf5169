package uploads

import (
	"context"
	"sync"

	tusd "github.com/tus/tusd/v2/pkg/handler"
)

// locker is tusd's Locker for uploads served by this process: one request
// at a time per upload. A request that asks for an upload's lock while
// another holds it asks the holder to let go (tusd then ends the holder's
// body early: its PATCH keeps what it wrote, synced), and waits, as tusd's
// memorylocker does; the sweeper only takes a lock that is free
// (tryLock), so that it never interrupts a request.
type locker struct {
	// mu guards held.
	mu sync.Mutex
	// held are the locks taken, by upload ID.
	held map[string]*heldLock
}

// heldLock is one lock taken.
type heldLock struct {
	released       chan struct{} // closed by Unlock
	requestRelease func()        // the holder's, nil for the sweeper's
}

var _ tusd.Locker = (*locker)(nil)

func newLocker() *locker { return &locker{held: map[string]*heldLock{}} }

func (l *locker) NewLock(id string) (tusd.Lock, error) { return &lock{l: l, id: id}, nil }

// tryLock takes id's lock if no one holds it.
func (l *locker) tryLock(id string) (*lock, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held[id] != nil {
		return nil, false
	}
	lk := &lock{l: l, id: id, h: &heldLock{released: make(chan struct{})}}
	l.held[id] = lk.h
	return lk, true
}

// lock is one request's hold on an upload.
type lock struct {
	l  *locker
	id string
	h  *heldLock // set while held
}

// Lock takes the lock, asking its holder to let go; tusd.ErrLockTimeout
// if ctx ends first.
func (lk *lock) Lock(ctx context.Context, requestRelease func()) error {
	for {
		lk.l.mu.Lock()
		cur := lk.l.held[lk.id]
		if cur == nil {
			lk.h = &heldLock{released: make(chan struct{}), requestRelease: requestRelease}
			lk.l.held[lk.id] = lk.h
			lk.l.mu.Unlock()
			return nil
		}
		lk.l.mu.Unlock()
		if cur.requestRelease != nil {
			cur.requestRelease()
		}
		select {
		case <-ctx.Done():
			return tusd.ErrLockTimeout
		case <-cur.released:
		}
	}
}

// Unlock releases the lock; a lock not held is no error.
func (lk *lock) Unlock() error {
	lk.l.mu.Lock()
	defer lk.l.mu.Unlock()
	if lk.h == nil || lk.l.held[lk.id] != lk.h {
		return nil
	}
	delete(lk.l.held, lk.id)
	close(lk.h.released)
	lk.h = nil
	return nil
}
