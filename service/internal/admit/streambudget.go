package admit

import (
	"context"
	"sync"
	"sync/atomic"
)

// StreamWriteOverhead is what one streamed write costs the daemon besides
// its data: its bookkeeping from read to ack (the write, its place in the
// order, its id, its ack). Counting it makes the bound hold for tiny
// writes too: a million 1-byte synced writes cost 256 MB, not 1 MB.
const StreamWriteOverhead = 256

// WriteCost is what a write of n bytes counts against the budgets.
func WriteCost(n int) int64 { return int64(n) + StreamWriteOverhead }

// StreamBudget is the flow control of one WriteStream: the bytes of the
// writes it has read and not yet acknowledged, bounded by
// --max-stream-bytes for the stream and by --max-inflight-bytes (the
// daemon's Budget) together with every other request. The reader,
// before reading a message, waits until the stream holds less than its
// own bound; once it has read one, it takes the message's cost, waiting
// for the daemon's budget if need be; the sender gives the cost back once
// an ack has gone out. So a stream at either bound reads nothing more
// (HTTP/2 flow control then stops its client), holds at most its bound
// plus one message, and never fails for it.
//
// The stream's messages are decoded by requestCodec into a streamRequest,
// which BudgetStream does not count (it counts proto.Messages): from the
// moment the reader has a message until its acks are sent, this is the
// one count of its bytes. A message aliases the buffers gRPC received it
// into (one copy), and a write's cost counts its data once.
//
// Take, Give and Close are the only places where held bytes are counted.
// The reader takes, and gives back what it took for a message it then
// dropped; the sender gives back what acks went out for; close runs once
// both are done. A Give is always for bytes whose Take has returned.
type StreamBudget struct {
	limit int64
	// held is this stream's bytes; written by Take, Give and Close, read
	// by Wait and the metrics.
	held atomic.Int64
	// daemon is the total over every open stream (the held-bytes gauge).
	daemon *atomic.Int64
	// inflight is --max-inflight-bytes, shared with the other requests;
	// nil: unbounded.
	inflight *Budget

	// mu guards excess: the part of held that inflight did not grant,
	// because a message cost more than the whole of it (Acquire clamps).
	// Give hands that part back first, so that what goes back to inflight
	// never passes what it granted. A leaf lock: nothing is locked or
	// waited for under it.
	mu     sync.Mutex
	excess int64

	// room is signalled (never closed) when Give brings held below limit.
	// Its one slot keeps a signal given before Wait looks, so that none is
	// lost; a stale one costs Wait one more look.
	room chan struct{}
}

// Held is what the stream holds now: the cost of its writes read and not
// yet acked.
func (b *StreamBudget) Held() int64 { return b.held.Load() }

func NewStreamBudget(limit int64, daemon *atomic.Int64, inflight *Budget) *StreamBudget {
	return &StreamBudget{limit: limit, daemon: daemon, inflight: inflight, room: make(chan struct{}, 1)}
}

// Take counts n more bytes held (a message just read), once the daemon's
// budget has them: it waits until then, or until ctx ends, and then
// returns ctx's error holding nothing more.
func (b *StreamBudget) Take(ctx context.Context, n int64) error {
	if err := b.inflight.Acquire(ctx, n); err != nil {
		return err
	}
	if b.inflight != nil && n > b.inflight.capacity {
		b.mu.Lock()
		b.excess += n - b.inflight.capacity
		b.mu.Unlock()
	}
	b.held.Add(n)
	b.daemon.Add(n)
	return nil
}

// Give counts n bytes no longer held (their acks went out, or their
// message was dropped after Take).
func (b *StreamBudget) Give(n int64) {
	b.inflight.Release(n - b.takeExcess(n))
	b.daemon.Add(-n)
	if b.held.Add(-n) < b.limit {
		select {
		case b.room <- struct{}{}:
		default:
		}
	}
}

// takeExcess takes up to n of the ungranted excess, and returns it.
func (b *StreamBudget) takeExcess(n int64) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := min(n, b.excess)
	b.excess -= e
	return e
}

// Wait returns true once the stream holds less than its bound, false if
// ctx ends first.
func (b *StreamBudget) Wait(ctx context.Context) bool {
	for b.held.Load() >= b.limit {
		select {
		case <-b.room:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// Close gives back whatever the stream still holds when it ends (acks
// that could not be sent).
func (b *StreamBudget) Close() {
	if n := b.held.Load(); n > 0 {
		b.Give(n)
	}
}
