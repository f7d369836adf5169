//go:build linux

package store

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Handle is a file held open for a caller that writes to it many times,
// such as a WriteStream. The path is validated and looked up once, in
// OpenHandle; the file then stays open until Close (it counts against
// Options.MaxOpenFiles and is never closed to make room), and each write
// skips the path's validation and the table lookup. Everything else is as
// for Write: the same validation, limits, lock decision, tracing and
// durability, through the same code.
//
// A Handle is safe for concurrent use. Close it once, after every other
// call on it has returned.
//
// The handle holds the file, not its path: a Rename moves the file under
// the handle, which goes on writing to it under its new name; a Delete (or
// a Rename over the file) ends it: Write fails with ErrDeleted, and Gone
// is closed.
type Handle struct {
	s      *Store
	ino    *inode
	path   string          // opened by
	gone   <-chan struct{} // the inode's, made for the first Handle (inodeTable.goneChan)
	closed atomic.Bool
}

// OpenHandle opens path for writing as open says: creating it and its
// missing parent directories like Write (OpenCreate), only if it exists
// (OpenMustExist: ErrNotFound otherwise, nothing created), or only if this
// call creates it (OpenExclusive: ErrExists otherwise). It fails like
// Write would before writing: ErrInvalidPath and its kin,
// ErrTooManyOpenFiles when every open file is in use, ErrClosed.
func (s *Store) OpenHandle(ctx context.Context, path string, open OpenMode) (*Handle, error) {
	if err := validatePath(path); err != nil {
		return nil, err
	}
	if err := validateOpenMode(open); err != nil {
		return nil, err
	}
	return s.openHandle(ctx, path, open)
}

// openHandle is OpenHandle of a validated path, or of a staged file's
// (OpenStaged).
func (s *Store) openHandle(ctx context.Context, path string, open OpenMode) (*Handle, error) {
	var ino *inode
	var err error
	switch open {
	case OpenExclusive:
		// getOrCreate tells whether this call created the file: O_EXCL
		// decided it, and callers of the store racing for the path wait
		// for that one open. The lock it hands the creator is of no use
		// to a handle, which writes later.
		var created *holder
		ino, created, err = s.table.getOrCreate(ctx, path, "open", ReasonExtending)
		if err == nil {
			if created == nil {
				s.table.put(ino)
				return nil, fmt.Errorf("%w: %s (exclusive create)", ErrExists, path)
			}
			ino.lock.release(created)
		}
	default:
		ino, err = s.table.get(ctx, path, open == OpenCreate)
	}
	if err != nil {
		return nil, err
	}
	return &Handle{s: s, ino: ino, path: path, gone: s.table.goneChan(ino)}, nil
}

// OpenHandleIf is OpenHandle on the condition pre (see Precondition),
// checked once, as the file is opened: with its lock held exclusively,
// after the writes in flight. The writes made through the Handle later are
// not conditional. "No file may exist" opens as OpenExclusive does (open
// may not be OpenMustExist then: no file could meet both); any other
// condition needs a file, and opens as OpenMustExist. A condition that
// does not hold opens nothing, creates nothing and is a
// *GenerationMismatch.
func (s *Store) OpenHandleIf(ctx context.Context, path string, open OpenMode, pre Precondition) (*Handle, error) {
	if !pre.present() {
		return s.OpenHandle(ctx, path, open)
	}
	if err := pre.validate(); err != nil {
		return nil, err
	}
	if pre.missingHolds() {
		if open == OpenMustExist {
			return nil, refuse(ErrInvalidMode, "open_mode", "a file that must exist, and a generation condition that no file may exist: no file meets both")
		}
		h, err := s.OpenHandle(ctx, path, OpenExclusive)
		if errors.Is(err, ErrExists) {
			err = &GenerationMismatch{Path: path, Precondition: pre, Current: s.generationOf(ctx, path)}
		}
		return h, err
	}
	h, err := s.OpenHandle(ctx, path, OpenMustExist)
	if errors.Is(err, ErrNotFound) {
		if cerr := pre.check(path, 0); cerr != nil {
			return nil, cerr
		}
	}
	if err != nil {
		return nil, err
	}
	if err := h.Check(ctx, pre); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// generationOf is the generation of the file path names now, 0 if none:
// for the error of a condition found failed another way.
func (s *Store) generationOf(ctx context.Context, path string) int64 {
	ino, err := s.table.get(ctx, path, false)
	if err != nil {
		return 0
	}
	defer s.table.put(ino)
	return ino.gen.Load()
}

// Check checks pre on the Handle's file now, with its lock held
// exclusively after the writes in flight, and changes nothing: a
// *GenerationMismatch if it does not hold, ErrDeleted if the file was
// deleted.
func (h *Handle) Check(ctx context.Context, pre Precondition) error {
	if err := pre.validate(); err != nil {
		return err
	}
	held, err := h.lockIf(ctx, pre, "check")
	if err != nil {
		return err
	}
	h.ino.lock.release(held)
	putHolder(held)
	return nil
}

// Path is the path the handle was opened by, whatever a Rename made of it
// since.
func (h *Handle) Path() string { return h.path }

// Gone is closed once the file was deleted, or replaced by a Rename over
// it, through the store, so that a holder can stop without waiting for its
// next Write to fail.
func (h *Handle) Gone() <-chan struct{} { return h.gone }

// Size is the file's size now (like i_size_read(): no lock taken).
func (h *Handle) Size() int64 { return h.ino.size.Load() }

// Generation is the file's generation now (see FileStat.Generation; no
// lock taken).
func (h *Handle) Generation() int64 { return h.ino.gen.Load() }

// Write writes data at off and returns once the bytes reached the file:
// every later Read sees them. The sync the write asked for may still be
// owed (AppliedWrite.Owed); Wait settles it. Until then another write can
// be made: its bytes do not wait for the earlier write's sync, except under
// PolicyExclusive, where a synced write syncs before it drops the lock and
// Write returns with nothing owed. On error nothing is owed, BytesWritten
// says how much reached the file and Size is the size after. Once the file
// is deleted, Write writes nothing and fails with ErrDeleted.
func (h *Handle) Write(ctx context.Context, off int64, data []byte, sync SyncMode) (AppliedWrite, error) {
	if err := h.s.validateWrite(off, data, sync); err != nil {
		return AppliedWrite{WriteResult: WriteResult{Size: h.Size()}}, err
	}
	return h.s.applyWrite(ctx, h.ino, "", nil, off, data, sync)
}

// WriteIf is Write on the condition pre (see Precondition), checked on
// the Handle's file with its lock held exclusively, after the writes in
// flight, until the bytes are in: nothing lands between the check and
// the write. A PUT of several pieces makes each conditional on the
// generation the one before returned, so that an interleaved writer stops
// it.
func (h *Handle) WriteIf(ctx context.Context, off int64, data []byte, sync SyncMode, pre Precondition) (AppliedWrite, error) {
	if !pre.present() {
		return h.Write(ctx, off, data, sync)
	}
	err := h.s.validateWrite(off, data, sync)
	if err == nil {
		err = pre.validate()
	}
	var held *holder
	if err == nil {
		held, err = h.lockIf(ctx, pre, "write")
	}
	if err != nil {
		return AppliedWrite{WriteResult: WriteResult{Size: h.Size(), Generation: h.Generation()}}, err
	}
	return h.s.applyWrite(ctx, h.ino, "", held, off, data, sync)
}

// lockIf takes the Handle's file's lock exclusively for op once pre holds
// for it: ErrDeleted if the file was deleted.
func (h *Handle) lockIf(ctx context.Context, pre Precondition, op string) (*holder, error) {
	held, err := lockInode(ctx, h.ino, lockExclusive, op, ReasonPrecondition)
	if err != nil {
		return nil, err
	}
	if err = h.s.checkNamed(h.ino, ""); err == nil {
		err = h.s.checkLocked(ctx, h.ino, h.ino.path(), false, pre)
	}
	if err != nil {
		h.ino.lock.release(held)
		putHolder(held)
		return nil, err
	}
	return held, nil
}

// TryWrite makes a write of data at off with no sync, as Write does, if it
// can do so at once: without waiting for the inode lock, and as a copy
// into the file's mapping (mapped.go), with no syscall. It reports false,
// having changed nothing, otherwise (the write is refused, extends the
// file, must wait for the lock, or would be a pwrite), and the caller
// makes the write with Write. A caller that must not block on one file
// (a stream's reader, which serves many) tries this first.
func (h *Handle) TryWrite(ctx context.Context, off int64, data []byte) (AppliedWrite, bool) {
	if len(data) == 0 || h.s.validateWrite(off, data, SyncNone) != nil {
		return AppliedWrite{}, false
	}
	return h.s.tryWrite(ctx, h.ino, off, data)
}

// Append appends data to the Handle's file, as Store.Append does, and
// returns once it is as durable as sync asks. Appends made one after
// another through a Handle get increasing offsets. Append IDs are
// remembered by the path the Handle was opened by.
func (h *Handle) Append(ctx context.Context, data []byte, sync SyncMode, opts AppendOptions) (AppendResult, error) {
	if err := h.s.validateAppend(data, sync, opts); err != nil {
		return AppendResult{}, err
	}
	// No refusal before the lock, as Store.Append makes: that one is there
	// so that a refused append creates no file, and the Handle's file
	// exists. The check at the reserved end refuses it, as ApplyAppend's.
	return h.appendOnce(ctx, data, sync, opts)
}

// appendOnce is Store.appendOnce for the Handle's file: IDs remembered by
// the path it was opened by, the bytes appended to its inode, and a
// replayed append synced on it.
func (h *Handle) appendOnce(ctx context.Context, data []byte, sync SyncMode, opts AppendOptions) (AppendResult, error) {
	return h.s.appendOnce(ctx, h.path, data, sync, opts, func() (AppendResult, error) {
		return h.s.appendTo(ctx, h.ino, "", nil, data, sync, opts)
	}, func() error { return h.s.syncWrite(ctx, h.ino, sync, false) })
}

// ApplyAppend is Append for a caller that settles durability apart, as
// Write and Wait do: it returns once data is appended and every append
// below it completed, with the sync still owed (settle it with Wait), and
// where data landed. Under PolicyExclusive it syncs under the lock, and
// owes nothing. opts.ID makes it idempotent as for Append, remembered by
// the path the Handle was opened by: a resend with a remembered ID writes
// nothing and returns the first one's offset, still owing its own sync.
func (h *Handle) ApplyAppend(ctx context.Context, data []byte, sync SyncMode, opts AppendOptions) (AppliedWrite, int64, error) {
	w := AppliedWrite{sync: sync, start: time.Now()}
	if err := h.s.validateAppend(data, sync, opts); err != nil {
		return w, 0, err
	}
	owed := sync
	if h.s.opts.Policy == PolicyExclusive {
		owed = SyncNone
	} else {
		sync = SyncNone // owed, for Wait
	}
	// appendOnce syncs a replayed append as sync says: under
	// PolicyExclusive now, as the first did; under the others sync is
	// SyncNone here, and the sync owed covers the first as it would have
	// covered a new one.
	res, err := h.appendOnce(ctx, data, sync, opts)
	w.Size, w.Generation = res.Size, res.Generation
	if err != nil {
		return w, res.Offset, err
	}
	w.BytesWritten, w.Owed = len(data), owed
	if owed == SyncNone {
		h.s.recordWrite(ctx, w.start, w.sync)
	}
	return w, res.Offset, nil
}

// Wait makes the writes ws, each returned by Write on h, as durable as
// each asked: one group-commit sync that started after Wait was called
// covers all of them (fsync when any asked for SyncFull, else fdatasync).
// Writes that owe nothing cost nothing. When it returns nil, what the
// durability contract promises for each write's SyncMode holds. ctx bounds
// only the wait: the sync runs on for the other callers it covers.
func (h *Handle) Wait(ctx context.Context, ws ...AppliedWrite) error {
	return h.s.waitWrites(ctx, h.ino, ws)
}

// Close gives the file back to the store, which may then close it to make
// room. A second Close does nothing.
func (h *Handle) Close() {
	if h.closed.CompareAndSwap(false, true) {
		h.s.table.put(h.ino)
	}
}
