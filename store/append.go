//go:build linux

package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/filewrite/filewrite/internal/invariants"
)

// ReasonAppend is recorded with an append's lock decision: under every
// policy but exclusive an append takes the lock shared only to reserve its
// range, then writes counted in flight.
const ReasonAppend = "append"

// AppendOptions are the conditions of one Append.
type AppendOptions struct {
	// ExpectedOffset, if not nil, is where the caller expects the file to
	// end: the append is refused with an *AppendMismatch when it ends
	// elsewhere (appends in flight count: their ranges are taken).
	ExpectedOffset *int64
	// If, if present, makes the append conditional on the file's
	// generation (see Precondition): it then holds the lock exclusively,
	// after the appends and writes in flight, from the check to the
	// end of its bytes. "No file may exist" lets it create the file; any
	// other is *GenerationMismatch on a missing file, not created. A
	// replay (ID) checks nothing: it returns the first append's result.
	If Precondition
	// ID, if not empty, makes the append idempotent: an Append of the same
	// path with an ID the store remembers (Options.AppendIDs, AppendIDTTL)
	// writes nothing and returns the first one's result, or ErrAppendIDReused
	// if its data differ. The IDs are kept in the append-ID journal under
	// StateDir too, so a store opened over the root after its process was
	// killed remembers them (not after a power cut; see the package doc).
	ID string
}

// AppendResult is where an append landed.
type AppendResult struct {
	// Offset is where the bytes begin: they occupy [Offset, Offset+len).
	Offset int64
	// Size is the size readers saw once the append completed: at least
	// Offset+len.
	Size int64
	// Replayed says that the ID was remembered: nothing was written again.
	Replayed bool
	// Generation is the file's generation once the append completed (see
	// FileStat.Generation); a replay's is the first append's.
	Generation int64
}

// AppendMismatch is the error of a conditional append that found the
// file's end elsewhere. It is an ErrAppendOffsetMismatch.
type AppendMismatch struct {
	Expected, End int64
}

func (e *AppendMismatch) Error() string {
	return fmt.Sprintf("%v: expected the file to end at %d, it ends at %d", ErrAppendOffsetMismatch, e.Expected, e.End)
}

func (e *AppendMismatch) Unwrap() error { return ErrAppendOffsetMismatch }

// appendQueue orders one file's appends: reserveLocked hands out ranges
// past the end, and completeAppend moves the size that readers see
// (inode.size, the published end) over them in offset order as they
// finish, so that no reader meets a range still being written. Compare
// ext4's two sizes: i_disksize trails i_size until the data below it is
// on disk, as the published end trails the reserved end here until the
// bytes below it are written.
//
// An append that fails after reserving (ENOSPC, EIO) fails every append
// reserved above it too, so the size never passes its offset: those
// appends are not acknowledged and their bytes are given back. The one
// that completes last truncates the file back to the failed offset before
// it leaves the in-flight count, and new appends wait for that
// (cleared) before they reserve. So a reader never sees a hole, and the
// next append starts where the failed one did.
type appendQueue struct {
	// mu guards the fields below: a leaf, never held across I/O.
	mu sync.Mutex
	// pending are the reservations not yet settled, in offset order: the
	// last one's end is where the next append lands (with none, the end
	// is inode.size).
	pending []*reservation
	// cleared is not nil from an append's failure until its range is
	// given back, and closed then: q is failed while it is not nil.
	cleared chan struct{}
	// failedAt, while failed, is the lowest offset of a failed append.
	failedAt int64
	failErr  error // the failed append's error, for those above it
	// inFlight mirrors len(pending) for readers without mu (List,
	// /debug/locks).
	inFlight atomic.Int64
}

// reservation is one append's range.
type reservation struct {
	off, end int64 // immutable
	// done and err are guarded by appendQueue.mu; err is final once
	// settled is closed, and may be read without it then.
	done bool
	err  error
	// gen is the file's generation once the size passed end (bump),
	// written before settled is closed.
	gen int64
	// settled is closed once the size has passed end, or the append failed.
	settled chan struct{}
}

// reserveLocked takes the n bytes past the end for one append.
//
// Preconditions: q.mu is held, the inode lock is held (shared), and q is
// not failed.
func (q *appendQueue) reserveLocked(start, n int64) *reservation {
	if k := len(q.pending); invariants.Enabled && k > 0 && start != q.pending[k-1].end {
		panic(fmt.Sprintf("store: an append reserves from %d, but the reservations end at %d", start, q.pending[k-1].end))
	}
	r := &reservation{off: start, end: start + n, settled: make(chan struct{})}
	q.pending = append(q.pending, r)
	q.inFlight.Add(1)
	return r
}

// endLocked is where the next append would land: past every reservation.
//
// Preconditions: q.mu is held.
func (q *appendQueue) endLocked(size int64) int64 {
	if len(q.pending) > 0 {
		return q.pending[len(q.pending)-1].end
	}
	return size
}

// completeAppend settles r, whose bytes were written (err nil) or not, and
// publishes the size over every completed append at the head of the
// queue. If r is the last one and an append failed, it gives the failed
// range back before it returns.
//
// Preconditions: r is still counted in flight (so truncates and extending
// writes, which wait for the count, do not run meanwhile).
func (ino *inode) completeAppend(r *reservation, err error) {
	q := &ino.appends
	q.mu.Lock()
	r.done, r.err = true, err
	failed := q.cleared != nil
	if err != nil && (!failed || r.off < q.failedAt) {
		if !failed {
			q.cleared = make(chan struct{})
			failed = true
		}
		q.failedAt, q.failErr = r.off, err
	}
	// The generation moves for each append published, after the size and
	// outside mu (bump may extend the generations' lease, I/O): settled is
	// closed after it, and r still counted in flight keeps conditional
	// mutations from looking meanwhile.
	var settled [4]*reservation
	done := settled[:0]
	for len(q.pending) > 0 && q.pending[0].done {
		head := q.pending[0]
		switch {
		case failed && head.off >= q.failedAt:
			if head.err == nil {
				head.err = fmt.Errorf("%w: an append below it, at offset %d, failed, and nothing of this one was kept: %w", ErrAppendAborted, q.failedAt, q.failErr)
			}
		default:
			if reserved := q.pending[len(q.pending)-1].end; invariants.Enabled && head.end > reserved {
				panic(fmt.Sprintf("store: an append publishes the size %d past the reserved end %d", head.end, reserved))
			}
			ino.size.Store(head.end)
		}
		done = append(done, head)
		q.pending[0] = nil
		q.pending = q.pending[1:]
		q.inFlight.Add(-1)
	}
	giveBack := failed && len(q.pending) == 0
	at := q.failedAt
	q.mu.Unlock()
	for _, r := range done {
		if r.err == nil {
			r.gen = ino.bump()
		}
		close(r.settled)
	}
	if !giveBack {
		return
	}
	// Give the failed range back. The size never passed at (every append
	// below it was published, none above), so readers saw none of it,
	// and stays there if the ftruncate fails; the file's own size may
	// have passed it. The error is the failed append's to report, not
	// this one's.
	_ = ino.truncate(at)
	q.mu.Lock()
	q.failErr = nil
	close(q.cleared)
	q.cleared = nil
	q.mu.Unlock()
}

// Append writes data at the end of path, created if missing, and returns
// where it landed. Concurrent appends to one file never overlap: their
// ranges, sorted, tile the file from its size when they began. The size
// that Read, Stat, List and Extents see advances over an append only once
// every append below it has completed.
//
// Under PolicyExclusive an append holds the lock exclusively throughout
// (and syncs under it): the baseline. Under every other policy it holds
// the lock shared only to reserve its range, then writes counted in
// flight, like a write below EOF; truncates, fallocates and extending
// writes wait for it.
//
// With sync SyncData or SyncFull it returns once every append below it
// has completed and a sync that started after that has finished. A
// zero-length append reserves nothing and returns the size (with sync, it
// still syncs). An append that would pass MaxFileSize is refused before it
// reserves. Once reserved, an append is carried out whatever ctx does;
// ctx bounds the waits for the lock and the sync.
func (s *Store) Append(ctx context.Context, path string, data []byte, sync SyncMode, opts AppendOptions) (AppendResult, error) {
	if err := validatePath(path); err != nil {
		return AppendResult{}, err
	}
	if err := s.validateAppend(data, sync, opts); err != nil {
		return AppendResult{}, err
	}
	return s.appendOnce(ctx, path, data, sync, opts, func() (AppendResult, error) {
		return s.appendPath(ctx, path, data, sync, opts)
	}, func() error { return s.syncPath(ctx, path, sync) })
}

// appendOnce runs do, the append, unless opts.ID names one the window
// remembers for path: then it returns that one's result, after sync (the
// first may not have synced as this one asks). do must append data itself
// (the same slice) with opts: the append-ID journal finds the claim by
// the ID and data when do reserves its range (appendIDWindow.reserved).
//
// A remembered append loaded from the journal at Open is checked first:
// if its range is within the file and holds bytes of its CRC-32C, it is
// replayed; if not (the process was killed after the range was reserved
// and before the bytes were written), it is forgotten and data is
// appended afresh.
func (s *Store) appendOnce(ctx context.Context, path string, data []byte, sync SyncMode, opts AppendOptions, do func() (AppendResult, error), syncAgain func() error) (AppendResult, error) {
	if opts.ID == "" {
		return do()
	}
	for {
		rec, role, err := s.appendIDs.claim(ctx, path, opts.ID, data)
		if err != nil {
			return AppendResult{}, err
		}
		switch role {
		case claimVerify:
			landed, err := s.landed(ctx, path, rec)
			s.appendIDs.verified(rec, landed, err)
			if err != nil {
				return AppendResult{}, err
			}
			continue // replayed if it landed, else appended afresh
		case claimReplay:
			if rec.err != nil {
				continue // the first failed and was forgotten: try again
			}
			res := rec.res
			res.Replayed = true
			if sync != SyncNone {
				if err := syncAgain(); err != nil {
					return res, err
				}
			}
			return res, nil
		}
		res, err := do()
		s.appendIDs.settle(rec, res, err)
		return res, err
	}
}

// syncPath syncs path's file as sync asks (a replayed append's).
func (s *Store) syncPath(ctx context.Context, path string, sync SyncMode) error {
	if sync == SyncNone {
		return nil
	}
	return s.fsyncFile(ctx, path, sync)
}

// validateAppend checks an append's sync mode and length; a refused append
// changes nothing.
func (s *Store) validateAppend(data []byte, sync SyncMode, opts AppendOptions) error {
	if err := validateSync(sync); err != nil {
		return err
	}
	if opts.ExpectedOffset != nil && *opts.ExpectedOffset < 0 {
		return refuse(ErrInvalidOffset, "expected_offset", "expected offset %d is negative", *opts.ExpectedOffset)
	}
	if err := opts.If.validate(); err != nil {
		return err
	}
	if len(opts.ID) > MaxAppendIDLen {
		return refuseLimit(ErrArgumentTooLong, "append_id", MaxAppendIDLen, "append id of %d bytes, the limit is %d", len(opts.ID), MaxAppendIDLen)
	}
	return validateRequestLength("data", int64(len(data)), s.opts.MaxRequestBytes)
}

// MaxAppendIDLen bounds an append id, in bytes.
const MaxAppendIDLen = 128

// appendPath is Append without the ID window.
func (s *Store) appendPath(ctx context.Context, path string, data []byte, sync SyncMode, opts AppendOptions) (AppendResult, error) {
	// Refusals that need no file come before the file is created: a
	// refused append changes nothing.
	if err := s.checkAppend(0, int64(len(data)), AppendOptions{}); err != nil {
		return AppendResult{}, err
	}
	// An append that expects an end past 0 needs the file to exist: it is
	// looked up, never created, so that its refusal leaves no file behind
	// (and a file held open costs no stat).
	mustExist := opts.ExpectedOffset != nil && *opts.ExpectedOffset != 0
	if opts.If.present() {
		ino, h, _, err := s.lockIf(ctx, path, !mustExist, opts.If, "append")
		if err != nil {
			return AppendResult{}, err
		}
		defer s.table.put(ino)
		return s.appendTo(ctx, ino, path, h, data, sync, opts)
	}
	for {
		var ino *inode
		var created *holder
		var err error
		if mustExist {
			ino, err = s.table.get(ctx, path, false)
			if errors.Is(err, ErrNotFound) {
				return AppendResult{}, &AppendMismatch{Expected: *opts.ExpectedOffset, End: 0}
			}
		} else {
			ino, created, err = s.table.getOrCreate(ctx, path, "append", ReasonExtending)
		}
		if err != nil {
			return AppendResult{}, err
		}
		res, err := s.appendTo(ctx, ino, path, created, data, sync, opts)
		s.table.put(ino)
		if errors.Is(err, ErrDeleted) || errors.Is(err, errNameMoved) {
			continue
		}
		return res, err
	}
}

// appendTo appends to ino, found by name ("" for a Handle's), as the
// policy says. created, if not nil, is the lock held exclusively by the
// getOrCreate that made the file, or by lockIf once opts.If held; without
// it, opts.If is checked here, under the lock taken exclusively.
func (s *Store) appendTo(ctx context.Context, ino *inode, name string, created *holder, data []byte, sync SyncMode, opts AppendOptions) (AppendResult, error) {
	if created == nil && opts.If.present() {
		h, err := lockInode(ctx, ino, lockExclusive, "append", ReasonPrecondition)
		if err != nil {
			return AppendResult{}, err
		}
		if err = s.checkNamed(ino, name); err == nil {
			err = s.checkLocked(ctx, ino, ino.path(), false, opts.If)
		}
		if err != nil {
			ino.lock.release(h)
			putHolder(h)
			return AppendResult{}, err
		}
		created = h
	}
	if created != nil || s.opts.Policy == PolicyExclusive {
		return s.appendExclusive(ctx, ino, name, created, data, sync, opts)
	}
	res, err := s.appendReserving(ctx, ino, name, data, opts)
	if err == nil && sync != SyncNone {
		// Every append below this one has completed (its size was
		// published): a sync that starts now covers them.
		err = s.syncWrite(ctx, ino, sync, false)
	}
	return res, err
}

// checkAppend refuses an append of n bytes that would land at end
// when opts expects another end, or that would pass MaxFileSize.
func (s *Store) checkAppend(end, n int64, opts AppendOptions) error {
	if opts.ExpectedOffset != nil && *opts.ExpectedOffset != end {
		return &AppendMismatch{Expected: *opts.ExpectedOffset, End: end}
	}
	if end+n > s.opts.MaxFileSize {
		return refuseLimit(ErrFileTooLarge, "data", s.opts.MaxFileSize, "an append of %d bytes at %d would pass the maximum file size of %d bytes", n, end, s.opts.MaxFileSize)
	}
	return nil
}

// appendExclusive appends with the lock held exclusively: every append
// under PolicyExclusive (syncing under the lock, the baseline), and the
// one that created the file (held) under the others.
func (s *Store) appendExclusive(ctx context.Context, ino *inode, name string, held *holder, data []byte, sync SyncMode, opts AppendOptions) (AppendResult, error) {
	h := held
	if h == nil {
		var err error
		if h, err = lockInode(ctx, ino, lockExclusive, "append", ReasonPolicy); err != nil {
			return AppendResult{}, err
		}
		if err := s.checkNamed(ino, name); err != nil {
			ino.lock.release(h)
			putHolder(h)
			return AppendResult{}, err
		}
	}
	// The holder, held or taken here, goes back to holderPool once
	// released, as write's does: nothing refers to it then.
	locked := true
	defer func() {
		if locked {
			ino.lock.release(h)
		}
		putHolder(h)
	}()
	// Reservations in flight (none under PolicyExclusive) end past the
	// size: wait for them, as an extending write does.
	if err := waitInflight(ctx, ino, ReasonAppend); err != nil {
		return AppendResult{}, err
	}
	off := ino.size.Load()
	n := int64(len(data))
	if err := s.checkAppend(off, n, opts); err != nil {
		return AppendResult{}, err
	}
	res := AppendResult{Offset: off}
	if n > 0 {
		s.appendIDs.reserved(opts.ID, data, off)
		if _, err := s.writeExclusive(ctx, ino, off, data, ReasonPolicy); err != nil {
			// Keep nothing of a failed append, as appendQueue does: a
			// short write moved the size past off, and readers must
			// not see its bytes even if the ftruncate fails.
			ino.size.Store(off)
			_ = ino.truncate(off)
			return res, err
		}
		res.Generation = ino.bump()
	} else {
		res.Generation = ino.gen.Load()
	}
	if s.opts.Policy == PolicyExclusive {
		err := s.syncWrite(ctx, ino, sync, true)
		res.Size = ino.size.Load()
		return res, err
	}
	res.Size = ino.size.Load()
	ino.lock.release(h)
	locked = false
	return res, s.syncWrite(ctx, ino, sync, false)
}

// appendReserving reserves [end, end+len) with the lock held shared, then
// writes it counted in flight and waits until the size has passed it. It
// leaves the sync to its caller.
func (s *Store) appendReserving(ctx context.Context, ino *inode, name string, data []byte, opts AppendOptions) (AppendResult, error) {
	n := int64(len(data))
	q := &ino.appends
	for {
		h, err := lockInode(ctx, ino, lockShared, "append", ReasonAppend)
		if err != nil {
			return AppendResult{}, err
		}
		// Nothing refers to the holder once released (it is not tracked
		// in flight): back to holderPool, as write's.
		unlock := func() {
			ino.lock.release(h)
			putHolder(h)
		}
		if err := s.checkNamed(ino, name); err != nil {
			unlock()
			return AppendResult{}, err
		}
		q.mu.Lock()
		if cleared := q.cleared; cleared != nil {
			// A failed append's range is being given back: reserve after.
			q.mu.Unlock()
			unlock()
			span := ino.wait.tel.startWait(ctx, SpanInflightWait, lockShared, ReasonAppend, ino.wait.policy, ino.wait.path(), nil)
			select {
			case <-cleared:
				span.end(ctx, nil)
			case <-ctx.Done():
				span.end(ctx, ctx.Err())
				return AppendResult{}, ctx.Err()
			}
			continue
		}
		end := q.endLocked(ino.size.Load())
		if err := s.checkAppend(end, n, opts); err != nil || n == 0 {
			q.mu.Unlock()
			unlock()
			return AppendResult{Offset: end, Size: ino.size.Load(), Generation: ino.gen.Load()}, err
		}
		r := q.reserveLocked(end, n)
		token := ino.inflight.begin()
		q.mu.Unlock()
		unlock()

		s.appendIDs.reserved(opts.ID, data, r.off)
		_, err = s.writeData(ctx, ino, r.off, data, lockNone, ReasonAppend)
		ino.completeAppend(r, err)
		ino.inflight.end(token)
		if err == nil && s.opts.Hooks.broken(breakAckAppendUnordered) {
			// The deliberate break: on to the sync, not waiting for the
			// appends below.
			return AppendResult{Offset: r.off, Size: r.end}, nil
		}
		<-r.settled // r.err and r.gen were written before settled was closed
		return AppendResult{Offset: r.off, Size: max(ino.size.Load(), r.end), Generation: r.gen}, r.err
	}
}
