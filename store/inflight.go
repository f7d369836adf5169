//go:build linux

package store

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sys/cpu"

	"github.com/filewrite/filewrite/internal/invariants"
)

// inflightCounter counts writes running without the inode lock, so that
// truncate, punch-hole, zero-range, Delete, Rename and extending or
// unaligned-direct writes can wait for them. Compare Linux's
// inode_dio_begin()/inode_dio_end()/inode_dio_wait().
//
// One shared atomic would put every parallel writer on one cache line (the
// direct-io i_dio_count wall), so the count is striped over padded shards,
// and each processor keeps to its own: a shard index lives in a sync.Pool,
// whose Get and Put stay on the calling P's private slot, so a goroutine
// finds the index its processor used last and the shard's cache line stays
// in that core's cache (picking shards at random or by offset made every
// core touch every line, slower than one atomic). The pool (shardHints) is
// one for all counters: a pool per inode cost every open file a pool the
// runtime registers and the collector empties each cycle, so that with
// 10,000 files most begins missed it and allocated. begin returns the shard
// for end, so a shard's own count never goes negative. Only the sum
// matters, and it is read only by a waiter.
//
// Protocol: begin is called while the inode lock is held (any mode), and
// wait while it is held exclusively, so once a waiter holds the lock no new
// write can begin and the sum only falls. There is at most one waiter.
type inflightCounter struct {
	shards []inflightShard
	mask   uint32
	// waiting is set by the waiter before it reads the shards; end reads it
	// after decrementing. Both are sequentially consistent atomics, so
	// either the waiter sees the decrement or end sees the flag (Dekker).
	waiting atomic.Bool
	// wake carries end's signal to the waiter without spinning.
	wake chan struct{}
}

// shardHints hands out per-processor shard indexes (*uint32), taken modulo
// a counter's shards; nextShardHint numbers new ones, round robin.
var (
	shardHints    sync.Pool
	nextShardHint atomic.Uint32
)

type inflightShard struct {
	n atomic.Int64
	// span is the span context of one write in flight on this shard, so
	// that a waiter's span can link to the writes it waits for; nil when no
	// traced write has claimed it. It shares the shard's cache line, which
	// the writer's core already owns, so tracking costs no extra sharing.
	span atomic.Pointer[trace.SpanContext]
	_    cpu.CacheLinePad
}

// newInflightCounter returns a counter with no write in flight: a recycled
// one if there is one (recycle).
func newInflightCounter() *inflightCounter {
	if c, _ := recycledInflightCounters.Get().(*inflightCounter); c != nil {
		return c
	}
	n := 1
	for n < 4*runtime.GOMAXPROCS(0) && n < 64 {
		n <<= 1
	}
	return &inflightCounter{
		shards: make([]inflightShard, n),
		mask:   uint32(n - 1),
		wake:   make(chan struct{}, 1),
	}
}

// recycledInflightCounters holds the counters of inodes closed for room,
// for the next inodes to open (newInflightCounter): a store with more
// files than descriptors opens a file for most writes, and a counter is a
// slice of padded shards, a channel and a sync.Pool of its own, which the
// runtime registers on first use. A sync.Pool, so that the collector
// bounds it.
var recycledInflightCounters sync.Pool

// recycle gives c to newInflightCounter, if no write is in flight (a
// shard's count returns to zero with each end, and a span slot to nil with
// each untrack), with no wake-up left for a waiter that is gone.
//
// Preconditions: no write can begin and no one waits: the inode has no
// reference left and is out of the table.
func (c *inflightCounter) recycle() {
	if c.count() != 0 {
		return
	}
	select {
	case <-c.wake:
	default:
	}
	c.waiting.Store(false)
	recycledInflightCounters.Put(c)
}

// begin registers one write; pass the result to end. Like inode_dio_begin().
//
// Preconditions: the inode lock is held, shared or exclusive.
func (c *inflightCounter) begin() uint32 {
	p, _ := shardHints.Get().(*uint32)
	if p == nil {
		p = new(uint32)
		*p = nextShardHint.Add(1)
	}
	i := *p & c.mask
	c.shards[i].n.Add(1)
	shardHints.Put(p)
	return i
}

// end unregisters a write begun on shard i. Like inode_dio_end(); it needs
// no lock.
func (c *inflightCounter) end(i uint32) {
	if n := c.shards[i].n.Add(-1); invariants.Enabled && n < 0 {
		panic(fmt.Sprintf("store: in-flight shard %d counts %d writes: an end without its begin", i, n))
	}
	if c.waiting.Load() {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// track remembers sc as a write in flight on shard i (begin's result), if
// no other write holds the shard's slot: the slots are a bounded sample of
// the writes in flight, one per shard, for the links of a waiter's span. It
// reports whether sc took the slot; if so, call untrack before end.
//
// Preconditions: the inode lock is held (any mode), as for begin, so that
// no slot is claimed once a waiter holds it exclusively.
func (c *inflightCounter) track(i uint32, sc *trace.SpanContext) bool {
	return c.shards[i].span.CompareAndSwap(nil, sc)
}

// untrack frees the slot that track gave sc.
func (c *inflightCounter) untrack(i uint32, sc *trace.SpanContext) {
	c.shards[i].span.CompareAndSwap(sc, nil)
}

// spans returns the span contexts of up to limit tracked writes in flight.
//
// Preconditions: the inode lock is held exclusively, so slots only empty.
func (c *inflightCounter) spans(limit int) []trace.SpanContext {
	var out []trace.SpanContext
	for i := range c.shards {
		if len(out) == limit {
			break
		}
		if sc := c.shards[i].span.Load(); sc != nil {
			out = append(out, *sc)
		}
	}
	return out
}

// count is the number of writes in flight; exact only while no write can
// begin.
func (c *inflightCounter) count() int64 {
	var sum int64
	for i := range c.shards {
		sum += c.shards[i].n.Load()
	}
	return sum
}

// wait returns once no write is in flight, or with ctx's error. Like
// inode_dio_wait().
//
// Preconditions: the inode lock is held exclusively.
func (c *inflightCounter) wait(ctx context.Context) error {
	if c.count() == 0 {
		return nil
	}
	defer c.waiting.Store(false)
	for {
		c.waiting.Store(true)
		if c.count() == 0 {
			return nil
		}
		select {
		case <-c.wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// waitInflight waits for writes running without the lock, traced when it
// has to wait. reason is the waiter's own (truncate, fallocate, delete,
// rename, extending, unaligned);
// its span links to up to maxLinks of the traced writes it waits for.
//
// Once it returns nil no writer can hold a mapping of the file that a
// longer one replaced, and those are unmapped (mapped.go).
//
// Preconditions: ino.lock is held exclusively.
func waitInflight(ctx context.Context, ino *inode, reason string) error {
	if ino.inflight.count() != 0 {
		span := ino.wait.tel.startWait(ctx, SpanInflightWait, lockExclusive, reason, ino.wait.policy, ino.wait.path(), ino.inflight.spans(maxLinks))
		err := ino.inflight.wait(ctx)
		span.end(ctx, err)
		if err != nil {
			return err
		}
	}
	ino.unmapRetired()
	return nil
}
