//go:build linux

package store

import (
	"context"
	"errors"
	"math/bits"
	"sync"
	"time"
	"unsafe"

	"go.opentelemetry.io/otel/trace"
)

// Reasons recorded with each lock decision (traces, metrics, /debug/locks).
const (
	ReasonExtending = "extending" // the write ends past EOF: it changes the size
	ReasonPolicy    = "policy"    // the exclusive policy locks every write
	ReasonBelowEOF  = "below-eof" // unlocked-below-eof: counted in flight
	ReasonHole      = "hole"      // the write allocates blocks
	ReasonUnwritten = "unwritten" // shared-written: converting unwritten blocks
	ReasonUnaligned = "unaligned" // partial blocks over unwritten ones, or unaligned direct I/O
	ReasonOverwrite = "overwrite" // every block is allocated: shared
	ReasonTruncate  = "truncate"
	ReasonFallocate = "fallocate"
	ReasonRead      = "read"
	ReasonDelete    = "delete"
	ReasonRename    = "rename"
	// ReasonChangedOutside: a check that the file is as long as the store
	// made it, after a sign that it was cut from outside (cut.go).
	ReasonChangedOutside = "changed-outside"
)

// rangeClass says which block states a range touches.
type rangeClass struct{ holes, unwritten, written bool }

// writeLockMode is the lock-mode table of doc.go: the mode, and its reason,
// for a write of [off, end) into a file of the given size whose touched
// blocks are c. aligned says whether off and end fall on block boundaries.
func writeLockMode(p Policy, io IOMode, size, end int64, aligned bool, c rangeClass) (lockMode, string) {
	switch {
	case end > size:
		return lockExclusive, ReasonExtending
	case io == IODirect && !aligned:
		// Goes through the page cache and must not interleave with direct
		// writes to the same blocks: exclusive, after in-flight writes.
		return lockExclusive, ReasonUnaligned
	}
	switch p {
	case PolicyUnlockedBelowEOF:
		return lockNone, ReasonBelowEOF
	case PolicySharedWritten:
		switch {
		case c.holes:
			return lockExclusive, ReasonHole
		case c.unwritten:
			return lockExclusive, ReasonUnwritten
		}
		return lockShared, ReasonOverwrite
	case PolicySharedOverwrite:
		switch {
		case c.holes:
			return lockExclusive, ReasonHole
		case c.unwritten && !aligned:
			// Zeroing the rest of a partial unwritten block races with a
			// neighbour converting it (ext4's rule).
			return lockExclusive, ReasonUnaligned
		}
		return lockShared, ReasonOverwrite
	}
	return lockExclusive, ReasonPolicy
}

// writeLockModeOf looks up in the table the mode a write of [off, end) to
// ino needs now, from its size and extent map. Read without the inode lock,
// the answer is a guess the caller re-checks under the lock.
func (s *Store) writeLockModeOf(ino *inode, off, end int64) (lockMode, string) {
	size := ino.size.Load()
	if end > size {
		return lockExclusive, ReasonExtending
	}
	var c rangeClass
	if s.opts.Policy == PolicySharedWritten || s.opts.Policy == PolicySharedOverwrite {
		ino.extentMu.Lock()
		c.holes, c.unwritten, c.written = ino.extents.classify(ino.extents.blocksTouched(off, end))
		ino.extentMu.Unlock()
	}
	return writeLockMode(s.opts.Policy, s.opts.IO, size, end, ino.aligned(off, end), c)
}

// AppliedWrite is a write whose bytes reached the file: every later Read
// sees them. The durability it asked for may still be owed; Handle.Wait
// (or Write, which waits itself) settles it.
type AppliedWrite struct {
	WriteResult
	// Owed is the sync still owed: the write's SyncMode, or SyncNone when
	// it asked for none or the exclusive policy synced it before dropping
	// the lock. A write of no bytes owes the sync it asked for too.
	Owed SyncMode
	// sync is the mode the write asked for and start when it began: its
	// latency is recorded under sync once nothing is owed.
	sync  SyncMode
	start time.Time
}

// validateWrite checks everything about a write but its path: the sync
// mode, the length against MaxRequestBytes, the range against MaxFileSize. A
// write it refuses changes nothing.
func (s *Store) validateWrite(off int64, data []byte, sync SyncMode) error {
	if err := validateSync(sync); err != nil {
		return err
	}
	n := int64(len(data))
	if err := validateRequestLength("data", n, s.opts.MaxRequestBytes); err != nil {
		return err
	}
	return validateRange(off, n, s.opts.MaxFileSize)
}

// applyWrite is the one write path of Write and Handle.Write, after
// validation: the policy's decision, the lock, the bytes, and under
// PolicyExclusive the sync. What it leaves owed is for waitWrites, so that
// a caller with more writes to make (a stream) can go on writing while
// earlier ones wait for their group commit. name and held are write's.
func (s *Store) applyWrite(ctx context.Context, ino *inode, name string, held *holder, off int64, data []byte, sync SyncMode) (AppliedWrite, error) {
	w := AppliedWrite{sync: sync, start: time.Now()}
	if len(data) == 0 {
		// Nothing to place and no lock to take, but the sync asked for
		// is owed like any other: it makes durable what was written
		// before, and a file this call created with its directories.
		// Under every policy it is the group commit's (there is no lock
		// to hold across it).
		if held != nil {
			ino.lock.release(held)
			putHolder(held)
		}
		w.Size, w.Generation = ino.size.Load(), ino.gen.Load()
		w.Owed = sync
		if sync == SyncNone {
			s.recordWrite(ctx, w.start, sync)
		}
		return w, nil
	}
	var err error
	w.WriteResult, w.Owed, err = s.write(ctx, ino, name, held, off, data, sync)
	if err != nil {
		w.Owed = SyncNone
		return w, err
	}
	if w.Owed == SyncNone {
		s.recordWrite(ctx, w.start, sync)
	}
	return w, nil
}

// waitWrites makes the writes ws, all applied to ino, as durable as each
// owes, with one group-commit sync (fsync if any owes SyncFull, else
// fdatasync) that started after the call and so covers every write applied
// before it, and records their latency. ctx bounds only the wait.
func (s *Store) waitWrites(ctx context.Context, ino *inode, ws []AppliedWrite) error {
	owed := SyncNone
	for _, w := range ws {
		owed = max(owed, w.Owed)
	}
	if err := s.syncWrite(ctx, ino, owed, false); err != nil {
		return err
	}
	for _, w := range ws {
		if w.Owed != SyncNone {
			s.recordWrite(ctx, w.start, w.sync)
		}
	}
	return nil
}

// write places data at off under the policy's lock mode and returns the
// bytes written, the size and generation after, and the sync still owed.
//
// Under PolicyExclusive the sync runs before the lock is dropped, and
// nothing is owed: that policy is the naive baseline of the experiments,
// one lock around each whole operation, so synced writes cannot share a
// sync (like a direct O_DSYNC write, whose completion runs under the
// kernel's inode lock), and a writer behind it waits for the sync too.
// Every other policy leaves its lock mode first and owes the sync, which
// the caller settles through the group commit.
//
// name is the path the caller looked ino up by: if, once the lock is held,
// the file was deleted or renamed away from name meanwhile, write returns
// ErrDeleted or errNameMoved without writing, and the caller looks name up
// again. A caller that holds the inode rather than a path (a Handle)
// passes "" and follows the file through renames; it gets ErrDeleted once
// the file is deleted. held, if not nil, is the lock held exclusively
// already, by a caller whose getOrCreate created the file.
func (s *Store) write(ctx context.Context, ino *inode, name string, held *holder, off int64, data []byte, sync SyncMode) (WriteResult, SyncMode, error) {
	end := off + int64(len(data))
	for attempt := 0; ; attempt++ {
		mode, reason := s.writeLockModeOf(ino, off, end)
		if attempt > 0 || held != nil {
			// The file changed under an optimistic decision once already:
			// stop guessing. (Or the lock is held exclusively already.)
			mode = lockExclusive
		}
		h := held
		var err error
		if h == nil {
			if h, err = lockInode(ctx, ino, max(mode, lockShared), "write", reason); err != nil {
				return WriteResult{}, SyncNone, err
			}
			if err = s.checkNamed(ino, name); err != nil {
				ino.lock.release(h)
				putHolder(h)
				return WriteResult{}, SyncNone, err
			}
		}
		if mode != lockExclusive {
			// The size and blocks cannot change while we hold the lock
			// in any mode: re-check the decision made without it.
			if again, _ := s.writeLockModeOf(ino, off, end); again > mode {
				ino.lock.release(h)
				putHolder(h)
				continue
			}
		}
		// The size after the write is read while the write still holds
		// its lock mode or is still counted in flight, so that no
		// truncate can have shrunk the file below the write's end since
		// (a size no order of the operations gives); the generation moves
		// then too (bump).
		var res WriteResult
		asked := sync
		switch mode {
		case lockNone:
			// Like btrfs: register in flight, drop the lock, write.
			u := beginUnlocked(ino, h)
			res.BytesWritten, sync, err = s.writeBelowEOF(ctx, ino, off, data, mode, reason, sync)
			res.Size, res.Generation = ino.size.Load(), ino.genAfter(res.BytesWritten)
			u.end(ino)
		case lockShared:
			res.BytesWritten, sync, err = s.writeBelowEOF(ctx, ino, off, data, mode, reason, sync)
			res.Size, res.Generation = ino.size.Load(), ino.genAfter(res.BytesWritten)
			ino.lock.release(h)
		default:
			res.BytesWritten, err = s.writeExclusive(ctx, ino, off, data, reason)
			res.Generation = ino.genAfter(res.BytesWritten)
			if ino.direct != nil && !ino.aligned(off, end) && s.opts.Hooks.broken(breakAckUnalignedDirectWriteBack) {
				sync = SyncNone // the deliberate break: written back, never synced
			}
			if err == nil && s.opts.Policy == PolicyExclusive {
				err = s.syncWrite(ctx, ino, sync, true)
				sync = SyncNone
			}
			res.Size = ino.size.Load()
			ino.lock.release(h)
		}
		putHolder(h)
		if err == errCutSuspected {
			// Made with pwrite after the mapping faulted: was the file
			// cut from outside?
			if err = s.checkCut(ctx, ino, false); err != nil {
				sync = SyncNone
			}
		}
		if err == nil && mode != lockExclusive && sync != asked {
			// Made durable by itself: checked for a name as a sync is.
			err = removedError(ctx, ino, false)
		}
		if err == nil && res.BytesWritten >= WriteBackAfter {
			// With no lock held: starting may wait for room in the
			// disk's queue. A failure to start fails the file's next
			// sync (startWriteBack), not this write, which is written.
			_ = ino.startWriteBack(off, int64(res.BytesWritten))
		}
		return res, sync, err
	}
}

// writeBelowEOF is writeData for a write that holds its lock mode below
// exclusive (or none, counted in flight), and so ends at or below EOF: a
// synced write that can be made durable by itself is (durable.go), and
// owes no sync. It returns the bytes written and the sync still owed.
func (s *Store) writeBelowEOF(ctx context.Context, ino *inode, off int64, data []byte, mode lockMode, reason string, sync SyncMode) (int, SyncMode, error) {
	if s.syncsItself(ino, off, off+int64(len(data)), sync) {
		if n, ok, err := s.writeDurable(ctx, ino, off, data, mode, reason); ok {
			return n, SyncNone, err
		}
	}
	n, err := s.writeData(ctx, ino, off, data, mode, reason)
	return n, sync, err
}

// tryWrite is Handle.TryWrite's write: write's steps where none waits,
// the lock taken only if it is free (tryLocked) and the bytes stored only
// through the mapping (writeMapped with try). A step that would wait or
// call the kernel gives up, having changed nothing.
func (s *Store) tryWrite(ctx context.Context, ino *inode, off int64, data []byte) (AppliedWrite, bool) {
	var w AppliedWrite
	if ino.mapping.cur.Load() == nil {
		return w, false // most writes to a file reopened for each are refused here
	}
	end := off + int64(len(data))
	mode, reason := s.writeLockModeOf(ino, off, end)
	if mode == lockExclusive || ino.deleted.Load() {
		return w, false
	}
	w.start = time.Now()
	h := tryLockInode(ctx, ino, lockShared, "write", reason)
	if h == nil {
		return w, false
	}
	// Under the lock, as write re-checks: the size and blocks cannot
	// change now, nor can a Delete have begun.
	if again, _ := s.writeLockModeOf(ino, off, end); again > mode || ino.deleted.Load() {
		ino.lock.release(h)
		putHolder(h)
		return w, false
	}
	s.opts.Hooks.insideWrite(ctx, ino, mode, reason)
	var did mapOutcome
	if mode == lockNone {
		u := beginUnlocked(ino, h)
		did = ino.writeMapped(off, data, true)
		w.Size = ino.size.Load()
		if did == mappedDone {
			w.Generation = ino.bump()
		}
		u.end(ino)
	} else {
		did = ino.writeMapped(off, data, true)
		w.Size = ino.size.Load()
		if did == mappedDone {
			w.Generation = ino.bump()
		}
		ino.lock.release(h)
	}
	putHolder(h)
	if did != mappedDone {
		return w, false
	}
	ino.durable.changed()
	s.opts.Hooks.mappedWrite(ino)
	w.BytesWritten = len(data)
	s.recordWrite(ctx, w.start, SyncNone)
	return w, true
}

// unlockedWrite is a write registered in flight by beginUnlocked.
type unlockedWrite struct {
	token   uint32
	tracked *trace.SpanContext
}

// beginUnlocked registers a write in ino's in-flight count and releases
// h, the lock it registered under (the lockNone mode's steps). A traced
// write leaves its span where a truncate waiting for it can link to it;
// untraced writes (tracing off) skip this. The holder's span field is
// immutable, so its address serves.
func beginUnlocked(ino *inode, h *holder) unlockedWrite {
	u := unlockedWrite{token: ino.inflight.begin()}
	if h.span.IsSampled() && ino.inflight.track(u.token, &h.span) {
		u.tracked = &h.span
	}
	ino.lock.release(h)
	return u
}

// end withdraws the write from ino's in-flight count.
func (u unlockedWrite) end(ino *inode) {
	if u.tracked != nil {
		ino.inflight.untrack(u.token, u.tracked)
	}
	ino.inflight.end(u.token)
}

// lockFile returns the inode of path, with a reference held and its lock
// held in mode (lockShared or lockExclusive) for op; release both with
// ino.lock.release and s.table.put. An inode found deleted once the lock is
// held (a Delete or a Rename over the file held it first), or no longer
// named path (a Rename moved it), is let go and path looked up again: the
// operation then acts on what path names after that Delete or Rename, never
// on a file without a name. With create, a missing file is created, and
// when mode is exclusive (getOrCreate) no one sees the new file before the
// caller releases the lock.
func (s *Store) lockFile(ctx context.Context, path string, create bool, mode lockMode, op, reason string) (*inode, *holder, error) {
	for {
		var ino *inode
		var err error
		if create && mode == lockExclusive {
			var h *holder
			ino, h, err = s.table.getOrCreate(ctx, path, op, reason)
			if h != nil {
				return ino, h, nil // created, and locked before anyone could look
			}
			// Found, not created: lock the inode found. Looking path up
			// again with get would open a new inode, unlocked, if a Delete
			// forgot this one meanwhile, creating a file that anyone could
			// see empty before this operation; the Delete is seen below
			// instead, and the next turn creates the file locked.
		} else {
			ino, err = s.table.get(ctx, path, create)
		}
		if err != nil {
			return nil, nil, err
		}
		h, err := lockInode(ctx, ino, mode, op, reason)
		if err != nil {
			s.table.put(ino)
			return nil, nil, err
		}
		err = s.checkNamed(ino, path)
		if err == nil {
			return ino, h, nil
		}
		ino.lock.release(h)
		s.table.put(ino)
		if !errors.Is(err, ErrDeleted) && !errors.Is(err, errNameMoved) {
			return nil, nil, err
		}
	}
}

// checkNamed returns ErrDeleted if ino's file was deleted or replaced, and
// errNameMoved if it no longer has the name name (unless name is ""): a
// Delete or Rename held the lock while the caller waited for it. Acting on
// the inode then would be acting after the Delete or Rename returned on
// what name named before it, which no order of the calls explains.
//
// Preconditions: ino.lock is held, in any mode; or (lookAt) the caller has
// read what it will return, so that a Delete or Rename that came before
// that read is seen (the deleted flag and the name are atomics written
// before the Delete or Rename releases the lock, and so before any later
// change to the file that the read could have seen).
func (s *Store) checkNamed(ino *inode, name string) error {
	if ino.deleted.Load() {
		return ErrDeleted
	}
	if name == "" || ino.path() == name {
		return nil
	}
	// name is another name of the file (a hard link, or a symlink to it),
	// or the file was renamed away from it: only the filesystem can tell.
	// Aliases are rare, so the common case costs no system call.
	return s.namesFile(name, ino, s.fsys.Stat)
}

// lookAt runs read on path's inode without taking its lock (Stat,
// Extents), and runs it again on what path names then if a Delete or
// Rename had moved the file away from path first. It takes the lock shared
// for op while the operation that created the file holds it (fresh), so
// that no one sees a file before that operation.
func (s *Store) lookAt(ctx context.Context, path, op string, read func(*inode) error) error {
	for {
		ino, err := s.table.get(ctx, path, false)
		if err != nil {
			return err
		}
		var h *holder
		if ino.lock.fresh() {
			if h, err = lockInode(ctx, ino, lockShared, op, ReasonRead); err != nil {
				s.table.put(ino)
				return err
			}
		}
		err = read(ino)
		if err == nil {
			err = s.checkNamed(ino, path)
		}
		if h != nil {
			ino.lock.release(h)
		}
		s.table.put(ino)
		if !errors.Is(err, ErrDeleted) && !errors.Is(err, errNameMoved) {
			return err
		}
	}
}

// syncWrite makes a written range durable as sync asks. held says whether
// the caller holds ino.lock exclusively (PolicyExclusive's write).
func (s *Store) syncWrite(ctx context.Context, ino *inode, sync SyncMode, held bool) error {
	if sync == SyncNone {
		return nil
	}
	if err := s.syncChecked(ctx, ino, ino.commit.waitDurable(ctx, sync), held); err != nil {
		return err
	}
	return removedError(ctx, ino, held)
}

// writeExclusive writes with the inode lock held exclusively and moves the
// size.
//
// Preconditions: ino.lock is held exclusively.
func (s *Store) writeExclusive(ctx context.Context, ino *inode, off int64, data []byte, reason string) (int, error) {
	end := off + int64(len(data))
	// Like ext4's inode_dio_wait() before an extending or unaligned
	// write. An extending write waits for the writes in flight (the lock
	// keeps new ones out): one of them that read the size before this
	// write stored it, but landed its bytes over this write's, would
	// come both before and after it. An unaligned direct write goes
	// through the page cache, which reads the edge blocks and writes them
	// back whole: an unlocked direct write to the rest of such a block
	// must not land in between, whether this write extends the file or
	// not. Only unlocked-below-eof counts writes in flight; under other
	// policies the count is 0 and the wait returns at once.
	if end > ino.size.Load() || ino.direct != nil && !ino.aligned(off, end) {
		if err := waitInflight(ctx, ino, reason); err != nil {
			return 0, err
		}
	}
	n, err := s.writeData(ctx, ino, off, data, lockExclusive, reason)
	end = off + int64(n)
	switch {
	case err != nil && err != errCutSuspected:
		// A short or failed write may still have moved the file's size:
		// take it from the file so the size stays true.
		if fi, serr := ino.file.Stat(); serr == nil {
			ino.size.Store(fi.Size)
		}
	case end > ino.size.Load():
		ino.size.Store(end)
	}
	return n, err
}

// writeData moves the bytes and marks their blocks written. It returns
// errCutSuspected, with every byte written, when the file's mapping
// faulted and the bytes went by pwrite instead: the caller checks the
// file (checkCut) once it holds no lock.
func (s *Store) writeData(ctx context.Context, ino *inode, off int64, data []byte, mode lockMode, reason string) (int, error) {
	s.opts.Hooks.insideWrite(ctx, ino, mode, reason)
	defer ino.durable.changed() // a sync owes it, written or failed
	end := off + int64(len(data))
	var n int
	var err error
	did := mappedNot
	if ino.direct == nil && reason != ReasonAppend {
		did = ino.writeMapped(off, data, false)
	}
	switch {
	case did == mappedDone:
		s.opts.Hooks.mappedWrite(ino)
		return len(data), nil // the blocks were written already: the map stands
	case ino.direct != nil && ino.aligned(off, end):
		n, err = writeDirect(ino.direct, off, data, int(ino.blockSize), maxDirectChunk)
	default:
		n, err = ino.file.WriteAt(data, off)
		if n > 0 {
			ino.wroteResident(off, off+int64(n))
		}
		if err == nil && ino.direct != nil {
			// Later direct I/O must see these bytes.
			if err = ino.file.WriteBack(off, int64(n)); err != nil {
				// sync_file_range waits on ino.file, the descriptor the
				// group commit fsyncs, and so consumes a writeback error
				// that fsync would otherwise have reported.
				ino.commit.writebackFailed()
			}
		}
	}
	if err = ino.wroteBlocks(off, n, err); err != nil {
		return n, err
	}
	if did == mappedFaulted {
		return n, errCutSuspected
	}
	return n, nil
}

// wroteBlocks marks the n bytes a write put at off as written in the
// extent map and, if the write failed (err), the map as in doubt; it
// returns err as a write's error.
func (ino *inode) wroteBlocks(off int64, n int, err error) error {
	if n > 0 {
		ino.extentMu.Lock()
		ino.extents.markWritten(off, off+int64(n))
		ino.extentMu.Unlock()
	}
	if err != nil {
		ino.extentsInDoubt.Store(true)
		return ioError("write", ino.path(), err, n)
	}
	return nil
}

// recordWrite records a write's latency by sync mode.
func (s *Store) recordWrite(ctx context.Context, start time.Time, sync SyncMode) {
	s.tel.writeTime.Record(ctx, time.Since(start).Seconds(), syncRecordOpts[sync]...)
}

// maxDirectChunk bounds one O_DIRECT pwrite, and so the aligned buffer a
// direct write copies its data into: a write of any length (MaxRequestBytes may
// be set past 2 GiB) holds at most this much more memory, and the buffer
// pools need size classes only up to it (8 MiB).
const (
	maxDirectChunkClass = 23
	maxDirectChunk      = 1 << maxDirectChunkClass
)

// writeDirect writes data at off through the O_DIRECT descriptor f, in
// chunks of at most chunk bytes, each copied into an aligned buffer. It
// returns how many bytes reached the file.
//
// Preconditions: off and len(data) are multiples of align, and chunk is a
// positive multiple of align, so that every chunk is aligned too.
func writeDirect(f File, off int64, data []byte, align, chunk int) (int, error) {
	written := 0
	for written < len(data) {
		n := min(len(data)-written, chunk)
		buf := getAligned(n, align)
		copy(buf.b, data[written:written+n])
		m, err := f.WriteAt(buf.b, off+int64(written))
		putAligned(buf)
		written += m
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

// alignedBuf is a buffer whose start is aligned for O_DIRECT.
type alignedBuf struct {
	b     []byte
	class int
}

// alignedPools hold aligned buffers by power-of-two size class, so direct
// writes do not allocate per request.
var alignedPools [maxDirectChunkClass + 1]sync.Pool

// getAligned returns a buffer of n bytes aligned to align.
//
// Preconditions: 0 < n <= maxDirectChunk.
func getAligned(n, align int) *alignedBuf {
	class := bits.Len(uint(n - 1))
	if v := alignedPools[class].Get(); v != nil {
		ab := v.(*alignedBuf)
		ab.b = ab.b[:n]
		return ab
	}
	raw := make([]byte, 1<<class+align)
	shift := (align - int(uintptr(unsafe.Pointer(&raw[0])))%align) % align
	return &alignedBuf{b: raw[shift : shift+n : shift+1<<class], class: class}
}

func putAligned(ab *alignedBuf) {
	alignedPools[ab.class].Put(ab)
}
