package nbd

import (
	"context"
	"sync"
)

// localBudget is the Budget of a server given none: a weighted semaphore
// that serves its waiters in arrival order.
type localBudget struct {
	capacity int64
	// mu guards free and waiters.
	mu      sync.Mutex
	free    int64
	waiters []*budgetWaiter
}

type budgetWaiter struct {
	n     int64
	ready chan struct{} // closed once granted, under mu
}

func newLocalBudget(capacity int64) *localBudget {
	return &localBudget{capacity: capacity, free: capacity}
}

// Acquire takes n bytes (at most the capacity: a larger request is
// granted the whole budget), waiting for them in turn.
func (b *localBudget) Acquire(ctx context.Context, n int64) error {
	n = min(n, b.capacity)
	b.mu.Lock()
	if len(b.waiters) == 0 && b.free >= n {
		b.free -= n
		b.mu.Unlock()
		return nil
	}
	w := &budgetWaiter{n: n, ready: make(chan struct{})}
	b.waiters = append(b.waiters, w)
	b.mu.Unlock()
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
		b.mu.Lock()
		defer b.mu.Unlock()
		select {
		case <-w.ready:
			// Granted meanwhile: give it back.
			b.free += n
			b.grantLocked()
		default:
			for i, x := range b.waiters {
				if x == w {
					b.waiters = append(b.waiters[:i], b.waiters[i+1:]...)
					break
				}
			}
			// The waiters behind it may fit now.
			b.grantLocked()
		}
		return ctx.Err()
	}
}

// Release gives back n bytes taken by Acquire.
func (b *localBudget) Release(n int64) {
	n = min(n, b.capacity)
	b.mu.Lock()
	b.free += n
	b.grantLocked()
	b.mu.Unlock()
}

// grantLocked grants the waiters at the head of the queue that fit.
//
// Preconditions: b.mu is held.
func (b *localBudget) grantLocked() {
	for len(b.waiters) > 0 && b.waiters[0].n <= b.free {
		w := b.waiters[0]
		b.waiters = b.waiters[1:]
		b.free -= w.n
		close(w.ready)
	}
}
