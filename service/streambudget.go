package service

import (
	"context"
	"sync/atomic"
)

// streamWriteOverhead is what one streamed write costs the daemon besides
// its data: its bookkeeping from read to ack (the write, its place in the
// order, its id, its ack). Counting it makes the bound hold for tiny
// writes too: a million 1-byte synced writes cost 256 MB, not 1 MB.
const streamWriteOverhead = 256

// DefaultMaxStreamBytes bounds the unacknowledged writes one WriteStream
// holds (--max-stream-bytes): far above the pipeline of the client package
// (32 callers of 4 KiB hold 136 KiB), small enough that a thousand open
// streams cannot hold more than a few GiB.
const DefaultMaxStreamBytes = 4 << 20

// writeCost is what a write of n bytes counts against the budgets.
func writeCost(n int) int64 { return int64(n) + streamWriteOverhead }

// streamBudget is the flow control of one WriteStream: the bytes of the
// writes it has read and not yet acknowledged, bounded by
// --max-stream-bytes. The reader takes a message's cost once it has read
// it and, before reading the next one, waits until the stream holds less
// than the bound; the sender gives the cost back once an ack has gone out.
// So a stream at the bound reads nothing more (HTTP/2 flow control then
// stops its client), holds at most the bound plus one message, and never
// fails for it.
//
// take and give are the only places where held bytes are counted: a
// daemon-wide budget hooks in here (daemon is that total today, read by
// the held-bytes gauge).
type streamBudget struct {
	limit int64
	// held is this stream's bytes; written by take and give, read by wait
	// and the metrics.
	held atomic.Int64
	// daemon is the total over every open stream.
	daemon *atomic.Int64
	// room is signalled (never closed) when give brings held below limit.
	// Its one slot keeps a signal given before wait looks, so that none is
	// lost; a stale one costs wait one more look.
	room chan struct{}
}

func newStreamBudget(limit int64, daemon *atomic.Int64) *streamBudget {
	return &streamBudget{limit: limit, daemon: daemon, room: make(chan struct{}, 1)}
}

// take counts n more bytes held (a message just read).
func (b *streamBudget) take(n int64) {
	b.held.Add(n)
	b.daemon.Add(n)
}

// give counts n bytes no longer held (their acks went out).
func (b *streamBudget) give(n int64) {
	b.daemon.Add(-n)
	if b.held.Add(-n) < b.limit {
		select {
		case b.room <- struct{}{}:
		default:
		}
	}
}

// wait returns true once the stream holds less than its bound, false if
// ctx ends or stop closes first.
func (b *streamBudget) wait(ctx context.Context, stop <-chan struct{}) bool {
	for b.held.Load() >= b.limit {
		select {
		case <-b.room:
		case <-ctx.Done():
			return false
		case <-stop:
			return false
		}
	}
	return true
}

// close gives back whatever the stream still holds when it ends (acks
// that could not be sent).
func (b *streamBudget) close() {
	b.daemon.Add(-b.held.Swap(0))
}
