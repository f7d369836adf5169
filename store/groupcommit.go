//go:build linux

package store

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/filewrite/filewrite/internal/invariants"
)

// groupCommit merges concurrent syncs of one file (and, for dirSyncs, of
// one directory), like bbolt's DB.Batch merges transactions: callers that
// arrive while a sync runs join the next batch, and that batch starts the
// moment the running one ends, never sleeping to gather more (the btrfs
// fsync unplug patch). A caller is only released by a sync that started
// after it asked, so every write it made before asking is covered.
//
// A failed sync poisons the file: Linux reports a writeback error once per
// descriptor and then forgets it, so the next fdatasync may succeed although
// pages written before the failure were lost (PostgreSQL's fsyncgate). The
// batch that follows a failure therefore fails too, whatever its syscall
// says, and only a sync that started after that is believed again. Under
// FsyncPerCall syncs overlap, and the kernel reports the error to only one
// of those running, so a sync that was running when another failed is not
// believed either.
//
// FsyncTimer keeps the old behaviour for experiments: a batch starts no
// earlier than delay after its first caller arrived. FsyncPerCall bypasses
// batching.
type groupCommit struct {
	mode  FsyncMode
	delay time.Duration
	// sync is the file's fdatasync (SyncData) or fsync (SyncFull): the
	// inode itself, which an interface holds without allocating, where a
	// closure over it would cost each open an allocation.
	sync syncer
	// onBatch reports how many callers one sync covered.
	onBatch func(callers int)
	// wait says where the callers' waits are reported.
	wait waitTrace
	// ackFromRunning is the deliberate break breakAckFromRunningSync,
	// read only under invariants.Enabled (compiled out without the tag).
	ackFromRunning bool
	// onWait is Hooks.WaitingForSync; nil in production.
	onWait func()
	// durable learns of each batch that succeeded what it covered, so
	// that a synced write knows when the file owes no sync (durable.go);
	// nil for none.
	durable *durableState

	// syncs counts issued syncs, for tests and benchmarks.
	syncs atomic.Int64

	// mu guards the fields below. It is taken alone or under
	// inodeTable.mu (evicting, reopening and closing files), never with
	// inode.extentMu (doc.go).
	mu sync.Mutex
	// running is true while a batch's sync is being issued.
	running bool
	// runningBatch is that batch, for ackFromRunning only.
	runningBatch *syncBatch
	// pending is the batch gathering callers; nil when none waits.
	pending *syncBatch
	// poisoned is set by a failed sync and cleared by the next batch.
	poisoned bool
	// failures counts failed syncs and writebacks, so that a batch can
	// tell whether one failed while its own ran (a sync only under
	// FsyncPerCall; a writeback under any mode).
	failures int64
	// runningSpan is the span of the caller whose request opened the
	// running batch: waiters link to it.
	runningSpan trace.SpanContext
}

// syncer makes a file's writes durable (groupCommit.sync).
type syncer interface {
	syncFile(mode SyncMode) error
}

// syncBatch is one sync and the callers it covers.
type syncBatch struct {
	// callers, mode, ready and span are guarded by groupCommit.mu until the
	// batch is taken off pending; after that only the runner reads them.
	callers int
	mode    SyncMode // the strongest mode a caller asked for
	ready   bool     // FsyncTimer: the delay has passed
	span    trace.SpanContext
	// poisoned and failuresBefore are copied from groupCommit when the
	// batch starts.
	poisoned       bool
	failuresBefore int64
	// err is written by the runner before done is closed.
	err  error
	done chan struct{}
}

// waitDurable makes every write to the file made before the call durable,
// as mode (SyncData or SyncFull) says, sharing a sync with concurrent
// callers, and returns once it is. A batch syncs in the strongest mode one
// of its callers asked for. ctx only bounds the caller's wait: a sync that
// started runs to its end for the other callers it covers.
func (g *groupCommit) waitDurable(ctx context.Context, mode SyncMode) error {
	if g.mode == FsyncPerCall {
		b := &syncBatch{callers: 1, mode: mode, done: make(chan struct{})}
		g.mu.Lock()
		g.startLocked(b)
		g.mu.Unlock()
		g.issue(b)
		return b.err
	}
	span := trace.SpanContextFromContext(ctx)
	g.mu.Lock()
	if invariants.Enabled && g.ackFromRunning && g.runningBatch != nil {
		// The deliberate break: released by a sync that started before
		// this caller asked.
		b := g.runningBatch
		g.mu.Unlock()
		g.waiting()
		select {
		case <-b.done:
			return b.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	b := g.pending
	if b == nil {
		b = &syncBatch{done: make(chan struct{}), ready: g.mode == FsyncGroup, span: span}
		g.pending = b
		if g.mode == FsyncTimer {
			time.AfterFunc(g.delay, func() { g.timerFired(b) })
		}
	}
	b.callers++
	b.mode = max(b.mode, mode)
	lead := b.ready && !g.running
	var links []trace.SpanContext
	if lead {
		g.startLocked(b)
	} else if g.runningSpan.IsValid() {
		links = []trace.SpanContext{g.runningSpan}
	}
	g.mu.Unlock()
	if lead {
		// Nothing runs: sync now, on this goroutine.
		g.run(b)
		return b.err
	}
	ws := g.wait.tel.startWait(ctx, SpanFsyncWait, lockNone, g.mode.String(), g.wait.policy, g.wait.path(), links)
	g.waiting()
	select {
	case <-b.done:
		ws.end(ctx, b.err)
		return b.err
	case <-ctx.Done():
		ws.end(ctx, ctx.Err())
		return ctx.Err()
	}
}

// waiting runs the WaitingForSync hook, if any, as a caller starts to
// wait for another's sync.
func (g *groupCommit) waiting() {
	if g.onWait != nil {
		g.onWait()
	}
}

// startLocked takes b off pending and makes it the running batch.
//
// Preconditions: g.mu is held.
func (g *groupCommit) startLocked(b *syncBatch) {
	if g.pending == b {
		g.pending = nil
	}
	g.running = g.mode != FsyncPerCall
	if g.running {
		g.runningBatch = b
	}
	g.runningSpan = b.span
	b.poisoned = g.poisoned
	b.failuresBefore = g.failures
	g.poisoned = false
}

// issue runs b's syscall and publishes its outcome.
func (g *groupCommit) issue(b *syncBatch) {
	g.syncs.Add(1)
	g.onBatch(b.callers)
	var covered uint64
	if g.durable != nil {
		covered = g.durable.syncStarting()
	}
	err := g.sync.syncFile(b.mode)
	cut := err == errCutSuspected
	if cut {
		err = nil // the sync succeeded; each caller checks the file
	}
	g.mu.Lock()
	overlapped := g.failures != b.failuresBefore
	if err != nil {
		g.failures++
		g.poisoned = true
	}
	g.mu.Unlock()
	switch {
	case err != nil:
		b.err = fmt.Errorf("%w: %w", ErrSyncFailed, err)
	case b.poisoned:
		b.err = fmt.Errorf("%w: an earlier sync of this file failed, so data written before it may be lost although this sync succeeded", ErrSyncFailed)
	case overlapped:
		b.err = fmt.Errorf("%w: another sync or a writeback of this file failed while this one ran, so data written before it may be lost although this sync succeeded", ErrSyncFailed)
	case cut:
		b.err = errCutSuspected
	}
	if b.err == nil || b.err == errCutSuspected {
		// The sync succeeded: what the direct path wrote before it
		// started is covered (durable.go).
		if g.durable != nil {
			g.durable.syncedFrom(covered)
		}
	}
	close(b.done)
}

// timerFired marks b ready and starts it unless a sync is running (the
// runner will start it then).
func (g *groupCommit) timerFired(b *syncBatch) {
	g.mu.Lock()
	b.ready = true
	start := g.pending == b && !g.running
	if start {
		g.startLocked(b)
	}
	g.mu.Unlock()
	if start {
		g.run(b)
	}
}

// run issues b's sync, then hands the lock-free "running" role to the next
// ready batch on a new goroutine, so that b's own callers return at once.
//
// Preconditions: g.running was set for b.
func (g *groupCommit) run(b *syncBatch) {
	g.issue(b)
	g.mu.Lock()
	next := g.pending
	if next != nil && next.ready {
		g.startLocked(next)
		go g.run(next)
	} else {
		g.running = false
		g.runningBatch = nil
		g.runningSpan = trace.SpanContext{}
	}
	g.mu.Unlock()
}

// idle reports whether no sync runs or waits, so the file may be closed,
// and whether a failed sync has not yet been reported to a later batch, so
// that whoever reopens the file must poison its group commit.
func (g *groupCommit) idle() (idle, poisoned bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.running && g.pending == nil, g.poisoned
}

// writebackFailed records a writeback error of the file that another call
// on the sync's descriptor saw and so consumed (sync_file_range after an
// unaligned direct write): Linux reports it there and not to the next
// fsync. Like a failed sync, it makes the next batch fail, and a batch
// running now, which may have missed the error.
func (g *groupCommit) writebackFailed() {
	g.mu.Lock()
	g.failures++
	g.poisoned = true
	g.mu.Unlock()
}

// failurePending reports whether a failed sync or writeback of the file
// has yet to be reported to a later batch.
func (g *groupCommit) failurePending() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.poisoned
}

// poison makes the next batch fail, as if the sync before it had failed:
// for a file reopened after a failed sync (see inodeTable.failedSync).
func (g *groupCommit) poison() {
	g.mu.Lock()
	g.poisoned = true
	g.mu.Unlock()
}
