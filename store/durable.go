//go:build linux

package store

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
)

// Synced writes made durable by themselves.
//
// A write that asks for SyncData waits, under FsyncGroup, for an
// fdatasync(2) of its file that started after its bytes landed; one such
// sync runs at a time per file. Each sync writes back every page dirtied
// before it and then flushes the device's cache, and while it runs the
// device sees only its writeback and its flush: the writes that arrive
// meanwhile wait for the next one. At 32 durable 4 KiB writes in flight
// that left the device idle much of the time: 11-20k writes a second
// where fio with O_DIRECT|O_DSYNC at the same depth did 29-60k (issue
// 33). FsyncPerCall overlaps the syncs, but each fdatasync still writes
// back and waits for every page dirtied before it, so a sync's cost grows
// with its neighbours' writes, and a stream already brings its synced
// writes to the store in batches, one Wait at a time, so per-call changes
// nothing there. And a buffered 4 KiB overwrite of a file first written
// in large pieces costs the kernel a walk over the buffers of a large
// page-cache folio twice, once to write (ext4_block_write_begin) and once
// to write back (mpage_process_page_bufs): half of the daemon's CPU in a
// profile of that load.
//
// So an aligned write below EOF that asks for SyncData goes to the disk by
// itself, as fio's do: a pwrite(2) on an O_DIRECT|O_DSYNC descriptor of
// the file, which returns once the bytes and what is needed to read them
// are durable (the kernel writes the block and flushes the device's
// cache, merging the flushes of concurrent writers). Many such writes run
// at once, each on its own thread, and nothing else of the file waits for
// them. Measured on the 2-CPU machine with 32 writers in Go (a file
// written in 1 MiB pieces, re-written before each run): 26-27k writes a
// second at 20-24 us of CPU each, where pwrite and a group-commit
// fdatasync did 12-14k at 34-38 us, and fio 21k, in one loaded window.
//
// The contract is unchanged. A synced Write promises its own bytes and
// the size needed to read them, and through the group commit it made
// durable everything written to the file before it as well; the raw PUT
// relies on that (only its last chunk asks for the sync). A direct write
// makes only its own range durable, so it is taken only when nothing
// else is owed: when no change to the file (a buffered or mapped write,
// an append, a truncate, a fallocate) was made since the last successful
// sync of the file started (durableState). Otherwise, and for a new file
// whose directories are still owed a sync, a file whose last sync failed
// (the failure must reach the next batch: fsyncgate), SyncFull (whose
// timestamps a data sync does not cover), unaligned or extending writes,
// PolicyExclusive (the baseline holds its lock across the sync) and
// SyncedWritesFsync, the write waits for the group commit as before.
//
// The kernel drops the page-cache folios the direct write overlaps (and
// writes back any dirty one first), so later reads of that range read the
// disk once; the pages' residency, which mapped writes rely on, is
// forgotten for the folios' span (droppedResident).

// SyncedWriteMode selects how a write that asks for SyncData is made
// durable.
type SyncedWriteMode int

const (
	// SyncedWritesDirect makes an aligned write below EOF durable by
	// itself, on an O_DIRECT|O_DSYNC descriptor, when the file owes no
	// other sync (see above); other synced writes wait for a sync of the
	// file.
	SyncedWritesDirect SyncedWriteMode = iota + 1
	// SyncedWritesFsync waits for a sync of the file (Options.Fsync), as
	// every synced write did before SyncedWritesDirect.
	SyncedWritesFsync
)

// DefaultSyncedWrites is the default of Options.SyncedWrites.
const DefaultSyncedWrites = SyncedWritesFsync

func (m SyncedWriteMode) String() string {
	switch m {
	case 0:
		return "default"
	case SyncedWritesFsync:
		return "fsync"
	case SyncedWritesDirect:
		return "direct"
	}
	return fmt.Sprintf("SyncedWriteMode(%d)", int(m))
}

// ParseSyncedWriteMode is the inverse of SyncedWriteMode.String.
func ParseSyncedWriteMode(s string) (SyncedWriteMode, error) {
	switch s {
	case "fsync":
		return SyncedWritesFsync, nil
	case "direct":
		return SyncedWritesDirect, nil
	}
	return 0, fmt.Errorf("unknown synced-write mode %q (want direct or fsync)", s)
}

// SyncsWritesItself reports whether the store makes a synced write durable
// by itself where it can (SyncedWritesDirect, under a policy other than
// PolicyExclusive): such a write holds its caller for the device's round
// trip, so that a caller applying writes for others (a stream) should run
// as many at once as it wants in flight.
func (h *Handle) SyncsWritesItself() bool {
	return h.s.opts.SyncedWrites == SyncedWritesDirect && h.s.opts.Policy != PolicyExclusive
}

// durableState is what an inode knows for durable direct writes: whether
// the file owes a sync, and the descriptor such writes use. The zero value
// owes one (nothing is known of a file just opened: an inode closed for
// room may have left dirty pages) and has no descriptor.
type durableState struct {
	// changes counts the changes to the file that a sync must cover,
	// each counted once it completed (failed or not); synced is 1 plus
	// the count a successful sync of the file read before it started, 0
	// before any. Every change counted up to synced-1 completed before a
	// sync that succeeded started, so the file owes nothing while
	// synced == changes+1. Both only grow.
	changes atomic.Uint64
	synced  atomic.Uint64

	// openMu serializes the open of file.
	openMu sync.Mutex
	// file is the O_DIRECT|O_DSYNC descriptor, opened at the first
	// durable direct write and closed with the inode's others; nil until
	// then. Written once, under openMu.
	file atomic.Pointer[File]
	// failed is set when file could not be opened (the descriptor limit,
	// a filesystem without O_DIRECT, the file replaced): the inode's
	// synced writes then wait for its syncs, as before.
	failed atomic.Bool
}

// changed counts a change to the file that a sync must cover. The caller
// counts it after the change completed, before it returns.
func (d *durableState) changed() { d.changes.Add(1) }

// syncStarting is what a sync of the file must read before it starts:
// the changes it will cover.
func (d *durableState) syncStarting() uint64 { return d.changes.Load() }

// syncedFrom records that a sync that read covered (syncStarting)
// succeeded.
func (d *durableState) syncedFrom(covered uint64) {
	for {
		s := d.synced.Load()
		if s >= covered+1 || d.synced.CompareAndSwap(s, covered+1) {
			return
		}
	}
}

// owesNothing reports whether every change to the file is covered by a
// successful sync.
func (d *durableState) owesNothing() bool {
	return d.synced.Load() == d.changes.Load()+1
}

// close closes the descriptor, if one was opened.
//
// Preconditions: no write uses it (the inode closes).
func (d *durableState) close() {
	if f := d.file.Load(); f != nil {
		(*f).Close()
	}
}

// durableFile returns the O_DIRECT|O_DSYNC descriptor of ino, opening it
// if need be; nil if it cannot be had.
func (ino *inode) durableFile() File {
	d := &ino.durable
	if f := d.file.Load(); f != nil {
		return *f
	}
	if d.failed.Load() {
		return nil
	}
	d.openMu.Lock()
	defer d.openMu.Unlock()
	if f := d.file.Load(); f != nil {
		return *f
	}
	flags := syscall.O_DIRECT | syscall.O_DSYNC
	if ino.table.opts.Hooks.broken(breakDirectWriteWithoutDSync) {
		flags = syscall.O_DIRECT // the deliberate break: durable in name only
	}
	f, err := ino.openDirect(ino.table.fsys, flags)
	if err != nil {
		d.failed.Store(true)
		return nil
	}
	d.file.Store(&f)
	return f
}

// syncsItself reports whether a write of [off, end) to ino asking for sync
// can be made durable by itself (see above), as far as can be told before
// its lock mode is known: the caller takes it only under a mode below
// exclusive, which makes it a write below EOF.
func (s *Store) syncsItself(ino *inode, off, end int64, sync SyncMode) bool {
	return s.opts.SyncedWrites == SyncedWritesDirect && sync == SyncData && s.opts.Policy != PolicyExclusive &&
		ino.aligned(off, end) && !ino.durable.failed.Load() && ino.pendingDirs.Load() == nil &&
		!ino.unlinked.Load() && ino.durable.owesNothing() && !ino.commit.failurePending()
}

// writeDurable writes data at off through ino's O_DIRECT|O_DSYNC
// descriptor: when it returns without error, the bytes are durable. ok is
// false, with nothing written, if the descriptor cannot be had; the
// caller then writes as usual and waits for a sync.
//
// A failure may have come from the write or from the sync that O_DSYNC
// makes after it, which may report a writeback error of pages other
// writes left; the file's next group-commit batch fails as after a failed
// sync (writebackFailed), and the write reports what a failed write does.
//
// Preconditions: as writeData's; off and len(data) are aligned to the
// block size, and the write ends at or below the size.
func (s *Store) writeDurable(ctx context.Context, ino *inode, off int64, data []byte, mode lockMode, reason string) (n int, ok bool, err error) {
	f := ino.durableFile()
	if f == nil {
		return 0, false, nil
	}
	s.opts.Hooks.insideWrite(ctx, ino, mode, reason)
	end := off + int64(len(data))
	n, err = writeDirect(f, off, data, int(ino.blockSize), maxDirectChunk)
	ino.droppedResident(off, end)
	if err = ino.wroteBlocks(off, n, err); err != nil {
		ino.commit.writebackFailed()
		return n, true, err
	}
	s.opts.Hooks.durableWrite(ino)
	// As a sync does (syncFile): a file left without a name has its bytes
	// durable where nobody can reach them.
	if n, _, err := links(f); err == nil && n == 0 {
		ino.unlinked.Store(true)
	}
	return n, true, nil
}

// droppedResident forgets that the pages of [off, end) are in the page
// cache, as far as a page-cache folio (up to hotRegion) around them
// reaches: a direct write drops those folios from the cache.
func (ino *inode) droppedResident(off, end int64) {
	m := ino.mapping.cur.Load()
	if m == nil {
		return
	}
	lo, hi := off/hotRegion*hotRegion, min((end+hotRegion-1)/hotRegion*hotRegion, int64(len(m.b)))
	for p := lo / pageSize; p*pageSize < hi; p++ {
		m.resident[p/64].And(^(uint64(1) << (p % 64)))
	}
}
