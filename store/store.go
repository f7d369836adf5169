//go:build linux

package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"go.opentelemetry.io/otel/metric"
)

// Store is the file engine: every RPC goes through it. All methods are safe
// for concurrent use.
type Store struct {
	opts  Options
	fsys  FS
	tel   *Telemetry
	table *inodeTable
	// gauges is the registration of the open-files and in-flight gauges
	// with tel's meter, undone by Close.
	gauges metric.Registration
	// unlisted are the names List left out and logged (Options.Logger).
	unlisted unlistedNames
	// appendIDs remembers recent appends by ID (Append).
	appendIDs appendIDWindow
	// digests keeps the checksums Digest computed, by generation.
	digests digestCache
}

// Open opens a store over fsys (see OpenOSFS). The store owns fsys and
// closes it in Close.
//
// Fields of opts left zero take their defaults (WithDefaults); options
// that Validate refuses are an *OptionError, and fsys is left open.
func Open(fsys FS, opts Options) (*Store, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.WithDefaults()
	tel := opts.Telemetry
	if tel == nil {
		tel = noopTelemetry
	}
	s := &Store{opts: opts, fsys: fsys, tel: tel}
	journal, recs := loadAppendJournal(fsys, opts.AppendIDs, opts.Logger)
	s.appendIDs = appendIDWindow{max: opts.AppendIDs, ttl: opts.AppendIDTTL, journal: journal}
	s.appendIDs.loadJournal(recs, time.Now(), func(path string) (int64, bool) {
		if validatePath(path) != nil {
			return 0, false
		}
		fi, err := fsys.Stat(path)
		return fi.Size, err == nil && fi.Type.IsRegular()
	})
	gens, records := openGenClock(fsys, opts.Logger)
	s.table = newInodeTable(fsys, &s.opts, tel, gens, records)
	var err error
	if s.gauges, err = tel.observe(s.table.gauges); err != nil {
		return nil, fmt.Errorf("register gauges: %w", err)
	}
	return s, nil
}

// Options returns the options in force, defaults filled in.
func (s *Store) Options() Options { return s.opts }

// Close waits for running operations, syncs (fsync) and closes every open
// file, syncs the directories of the files it created and closed before a
// sync, syncs and closes the append-ID journal, and closes the FS.
// Operations after Close fail with ErrClosed.
func (s *Store) Close() error {
	err := s.table.closeAll()
	s.table.gens.saveRecords(s.table.genRecords.snapshot())
	jerr := s.appendIDs.journal.close()
	return errors.Join(err, jerr, s.gauges.Unregister(), s.fsys.Close())
}

// syncAll makes everything written to every open file durable (fsync),
// and the names of the files this store created and closed since, for lack
// of descriptors, before a sync (their directories).
//
// It holds one file at a time, taking each reference just before that
// file's sync, so that files it has not reached yet, or has done with, stay
// idle and may be closed to make room meanwhile. A file closed so before
// its sync is reopened for it: fsync of a new descriptor writes back what
// the old one left dirty, and a failed sync of the old one is remembered
// (failedSync).
//
// Nothing in the daemon calls it (Close does the same on its way out);
// the tests use it to reach the table's sync of closed files' directories
// and of files closed for room while the store runs.
func (s *Store) syncAll(ctx context.Context) error {
	var errs []error
	for _, key := range s.table.keys() {
		ino, err := s.table.get(ctx, key, false)
		switch {
		case errors.Is(err, ErrNotFound):
			continue // removed from outside since: nothing left to sync
		case errors.Is(err, ErrClosed):
			return err
		case err != nil:
			errs = append(errs, fmt.Errorf("sync %s: %w", key, err))
			continue
		}
		if err := s.syncChecked(ctx, ino, ino.commit.waitDurable(ctx, SyncFull), false); err != nil {
			errs = append(errs, fmt.Errorf("sync %s: %w", ino.path(), err))
		}
		s.table.put(ino)
	}
	if err := s.table.syncClosedDirs(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Write writes data at off, creating the file and its parent directories if
// missing, and returns the size after. When it returns nil, the data is
// readable by every later Read; with SyncData it is also durable along with
// the size (fdatasync), with SyncFull along with all metadata (fsync); with
// SyncNone nothing is durable yet. On error, BytesWritten says how much
// reached the file. A caller whose ctx ends while it waits for the inode
// lock writes nothing.
//
// It is Handle.Write and Handle.Wait in one call, on a file looked up by
// path for this call only.
func (s *Store) Write(ctx context.Context, path string, off int64, data []byte, sync SyncMode) (WriteResult, error) {
	return s.WriteOpen(ctx, path, OpenCreate, off, data, sync)
}

// WriteOpen is Write with the file opened as open says: with OpenCreate it
// is Write; with OpenMustExist a missing file is ErrNotFound; with
// OpenExclusive a file that exists is ErrExists. Either refusal writes and
// creates nothing. An exclusive write that creates the file holds its lock
// from the create until its bytes are in, so no other caller of the store
// sees the file before them (an empty write creates an empty file).
func (s *Store) WriteOpen(ctx context.Context, path string, open OpenMode, off int64, data []byte, sync SyncMode) (WriteResult, error) {
	return s.WriteIf(ctx, path, open, off, data, sync, Precondition{})
}

// WriteIf is WriteOpen on the condition pre (see Precondition): with one,
// it holds the file's lock exclusively, after the writes in flight, from
// the check to the end of its bytes. A precondition that no file meets
// ("no file may exist") lets it create the file as open allows; any other
// is *GenerationMismatch on a missing file, which is not created.
func (s *Store) WriteIf(ctx context.Context, path string, open OpenMode, off int64, data []byte, sync SyncMode, pre Precondition) (WriteResult, error) {
	if err := validatePath(path); err != nil {
		return WriteResult{}, err
	}
	if err := validateOpenMode(open); err != nil {
		return WriteResult{}, err
	}
	if err := s.validateWrite(off, data, sync); err != nil {
		return WriteResult{}, err
	}
	if err := pre.validate(); err != nil {
		return WriteResult{}, err
	}
	if pre.present() {
		return s.writeIf(ctx, path, open, off, data, sync, pre)
	}
	for {
		ino, created, err := s.openForWrite(ctx, path, open)
		if err != nil {
			return WriteResult{}, err
		}
		w, err := s.applyWrite(ctx, ino, path, created, off, data, sync)
		w.Created = created != nil
		if errors.Is(err, ErrDeleted) || errors.Is(err, errNameMoved) {
			// Deleted, replaced or renamed while this write waited: it
			// comes after that, into whatever file path names now.
			s.table.put(ino)
			continue
		}
		if err == nil {
			one := [1]AppliedWrite{w}
			err = s.waitWrites(ctx, ino, one[:])
		}
		s.table.put(ino)
		return w.WriteResult, err
	}
}

// writeIf is WriteIf with a precondition, after validation.
func (s *Store) writeIf(ctx context.Context, path string, open OpenMode, off int64, data []byte, sync SyncMode, pre Precondition) (WriteResult, error) {
	ino, h, created, err := s.lockIf(ctx, path, open != OpenMustExist, pre, "write")
	if err != nil {
		return WriteResult{}, err
	}
	defer s.table.put(ino)
	if open == OpenExclusive && !created {
		ino.lock.release(h)
		return WriteResult{}, fmt.Errorf("%w: %s (exclusive create)", ErrExists, path)
	}
	w, err := s.applyWrite(ctx, ino, path, h, off, data, sync)
	w.Created = created
	if err == nil {
		one := [1]AppliedWrite{w}
		err = s.waitWrites(ctx, ino, one[:])
	}
	return w.WriteResult, err
}

// openForWrite returns path's inode, opened as open says, with a reference
// held; if this call created the file, the holder of its lock too (see
// getOrCreate).
func (s *Store) openForWrite(ctx context.Context, path string, open OpenMode) (*inode, *holder, error) {
	if open == OpenMustExist {
		ino, err := s.table.get(ctx, path, false)
		return ino, nil, err
	}
	// Any write into a file it creates extends it.
	ino, created, err := s.table.getOrCreate(ctx, path, "write", ReasonExtending)
	if err == nil && open == OpenExclusive && created == nil {
		// Found open, or opened without O_CREAT, or O_EXCL lost to
		// another creator: either way not created by this call.
		s.table.put(ino)
		return nil, nil, fmt.Errorf("%w: %s (exclusive create)", ErrExists, path)
	}
	return ino, created, err
}

// Read returns up to length bytes at off: short at EOF, empty past it. It
// holds the inode lock shared, so it never sees half of a truncate or of a
// locked write.
func (s *Store) Read(ctx context.Context, path string, off, length int64) ([]byte, error) {
	return s.ReadInto(ctx, path, off, length, func(n int) []byte { return make([]byte, n) })
}

// ReadInto is Read into a buffer of the caller's: once the request is
// checked and the bytes there are known, buf is called once with their
// count and returns a slice of that length to read into (a pooled buffer
// of a daemon that sends it on, for one). It is not called when nothing
// is there, or when the request is refused; when it was called and Read
// fails, the slice is the caller's again.
func (s *Store) ReadInto(ctx context.Context, path string, off, length int64, buf func(n int) []byte) ([]byte, error) {
	if err := validatePath(path); err != nil {
		return nil, err
	}
	if err := validateRange(off, length, math.MaxInt64); err != nil {
		return nil, err
	}
	if err := validateRequestLength("length", length, s.opts.MaxRequestBytes); err != nil {
		return nil, err
	}
	ino, h, err := s.lockFile(ctx, path, false, lockShared, "read", ReasonRead)
	if err != nil {
		return nil, err
	}
	defer s.table.put(ino)
	defer ino.lock.release(h)
	size := ino.size.Load()
	if off >= size {
		return []byte{}, nil
	}
	b := buf(int(min(length, size-off)))
	n, err := ino.file.ReadAt(b, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, ioError("read", path, err, 0)
	}
	return b[:n], nil
}

// Fsync makes everything written to path before the call durable: with
// SyncData the data and the size (fdatasync), with SyncFull all metadata
// too (fsync); SyncNone is ErrInvalidMode. Concurrent callers share one
// sync that started after each of them asked.
//
// When path names a directory, Fsync is fsync(2) of the directory: the
// entries created, removed and renamed in it before the call (by Write,
// Delete and Rename without sync) are durable when it returns; the mode
// makes no difference there.
func (s *Store) Fsync(ctx context.Context, path string, mode SyncMode) error {
	if err := validatePath(path); err != nil {
		return err
	}
	if err := validateFsync(mode); err != nil {
		return err
	}
	err := s.fsyncFile(ctx, path, mode)
	if errors.Is(err, ErrIsDirectory) {
		return s.syncDir(path)
	}
	return err
}

// fsyncFile is Fsync of a regular file: ErrIsDirectory if path names a
// directory. A replayed append's sync is one too (syncPath).
func (s *Store) fsyncFile(ctx context.Context, path string, mode SyncMode) error {
	ino, err := s.table.get(ctx, path, false)
	if err != nil {
		return err
	}
	defer s.table.put(ino)
	if err := s.syncChecked(ctx, ino, ino.commit.waitDurable(ctx, mode), false); err != nil {
		return err
	}
	return removedError(ctx, ino, false)
}

// Truncate sets the size of path, creating it if missing. Once it returns,
// no write that started before it can make the file larger than size again
// (it waits for writes in flight). Nothing is durable until a sync. Like
// ext4, truncating to a size at or below the current one also frees blocks
// preallocated past the new end.
func (s *Store) Truncate(ctx context.Context, path string, size int64) error {
	_, err := s.TruncateIf(ctx, path, size, Precondition{})
	return err
}

// TruncateIf is Truncate on the condition pre (see Precondition), and
// returns the file's size and generation after it. A precondition other
// than "no file may exist" does not create a missing file.
func (s *Store) TruncateIf(ctx context.Context, path string, size int64, pre Precondition) (ChangeResult, error) {
	if err := validatePath(path); err != nil {
		return ChangeResult{}, err
	}
	if size < 0 {
		return ChangeResult{}, refuse(ErrInvalidOffset, "size", "size %d is negative", size)
	}
	if size > s.opts.MaxFileSize {
		return ChangeResult{}, refuseLimit(ErrFileTooLarge, "size", s.opts.MaxFileSize, "size %d, the maximum file size is %d bytes", size, s.opts.MaxFileSize)
	}
	if err := pre.validate(); err != nil {
		return ChangeResult{}, err
	}
	ino, h, err := s.lockChange(ctx, path, pre, "truncate", ReasonTruncate)
	if err != nil {
		return ChangeResult{}, err
	}
	defer s.table.put(ino)
	defer ino.lock.release(h)
	if err := waitInflight(ctx, ino, ReasonTruncate); err != nil {
		return ChangeResult{}, err
	}
	if err := ino.truncate(size); err != nil {
		return ChangeResult{}, ioError("truncate", path, err, 0)
	}
	return ChangeResult{Size: size, Generation: ino.bump()}, nil
}

// lockChange is lockFile of path, created if missing, exclusively for op
// (Truncate, Fallocate), or lockIf when pre asks for something.
func (s *Store) lockChange(ctx context.Context, path string, pre Precondition, op, reason string) (*inode, *holder, error) {
	if !pre.present() {
		return s.lockFile(ctx, path, true, lockExclusive, op, reason)
	}
	ino, h, _, err := s.lockIf(ctx, path, true, pre, op)
	return ino, h, err
}

// Fallocate allocates (FallocAllocate, FallocKeepSize), deallocates
// (FallocPunchHole) or zeroes (FallocZeroRange) [off, off+length), creating
// the file if missing, and returns the size after. Only FallocAllocate can
// change the size. Punch and zero wait for writes in flight. Nothing is
// durable until a sync.
func (s *Store) Fallocate(ctx context.Context, path string, mode FallocateMode, off, length int64) (int64, error) {
	res, err := s.FallocateIf(ctx, path, mode, off, length, Precondition{})
	return res.Size, err
}

// FallocateIf is Fallocate on the condition pre (see Precondition), and
// returns the file's size and generation after it. A precondition other
// than "no file may exist" does not create a missing file.
func (s *Store) FallocateIf(ctx context.Context, path string, mode FallocateMode, off, length int64, pre Precondition) (ChangeResult, error) {
	if err := validatePath(path); err != nil {
		return ChangeResult{}, err
	}
	if err := validateFallocate(mode, off, length, s.opts.MaxFileSize); err != nil {
		return ChangeResult{}, err
	}
	if err := pre.validate(); err != nil {
		return ChangeResult{}, err
	}
	ino, h, err := s.lockChange(ctx, path, pre, "fallocate", ReasonFallocate)
	if err != nil {
		return ChangeResult{}, err
	}
	defer s.table.put(ino)
	defer ino.lock.release(h)
	end := off + length
	if mode == FallocPunchHole || mode == FallocZeroRange {
		// Like truncate: no write that started before may land after.
		if err := waitInflight(ctx, ino, ReasonFallocate); err != nil {
			return ChangeResult{}, err
		}
	}
	err = ino.file.Fallocate(fallocateFlags(mode), off, length)
	ino.durable.changed()
	if err != nil {
		// A failed fallocate may have allocated part of the range; the
		// map is rebuilt from the file rather than guessed.
		ino.extentsInDoubt.Store(true)
		s.reloadExtents(ino)
		return ChangeResult{Size: ino.size.Load(), Generation: ino.bump()}, ioError("fallocate", path, err, 0)
	}
	if mode == FallocPunchHole && end > ino.size.Load() {
		// Filesystems disagree past EOF: ext4 punches nothing beyond the
		// page that holds EOF (ext4_punch_hole() clips the range), so
		// blocks preallocated there stay allocated. Take the result from
		// the file rather than guess; punching past EOF is rare.
		s.reloadExtents(ino)
		return ChangeResult{Size: ino.size.Load(), Generation: ino.bump()}, nil
	}
	ino.extentMu.Lock()
	ino.extents.fallocate(mode, off, end)
	ino.extentMu.Unlock()
	if mode == FallocAllocate && end > ino.size.Load() {
		ino.size.Store(end)
	}
	return ChangeResult{Size: ino.size.Load(), Generation: ino.bump()}, nil
}

// reloadExtents rebuilds the map from the file after an error left it
// unknown.
//
// Preconditions: ino.lock is held exclusively.
func (s *Store) reloadExtents(ino *inode) {
	m, err := loadExtentMap(ino.file, ino.blockSize)
	if err != nil {
		return
	}
	ino.extentMu.Lock()
	ino.extents = m
	ino.extentMu.Unlock()
	if fi, err := ino.file.Stat(); err == nil {
		ino.size.Store(fi.Size)
	}
}

// Stat describes path: its size, the bytes allocated to it and the block
// size the extent map uses. An open file that was removed or replaced from
// outside since, or deleted or renamed through the store while Stat ran,
// is looked up again: Stat describes what the path names.
func (s *Store) Stat(ctx context.Context, path string) (FileStat, error) {
	if err := validatePath(path); err != nil {
		return FileStat{}, err
	}
	for {
		var st FileStat
		var unlinked, short bool
		err := s.lookAt(ctx, path, "stat", func(ino *inode) error {
			gen := ino.gen.Load() // before the rest it vouches for
			ino.touch()           // the ctime dates the writes made before this Stat
			fi, err := ino.file.Stat()
			if err == nil && fi.Nlink == 0 {
				// Its fstat is the news: the next get opens the path
				// afresh.
				ino.unlinked.Store(true)
				unlinked = true
				return nil
			}
			if err != nil {
				return ioError("stat", path, err, 0)
			}
			if fi.Size < ino.size.Load() {
				short = true // checked below, with the lock
				return nil
			}
			if err := ino.cutReported(); err != nil {
				return err
			}
			st = FileStat{Size: ino.size.Load(), AllocatedBytes: fi.Blocks512 * 512, BlockSize: int32(ino.blockSize),
				Dev: fi.Dev, Ino: fi.Ino, ChangeTime: fi.Ctime, Generation: gen, ContentType: ino.contentType()}
			return nil
		})
		if short {
			// Cut from outside, or in the middle of a Truncate: only the
			// exclusive lock tells.
			if err := s.checkCutPath(ctx, path); err != nil {
				return FileStat{}, err
			}
			continue
		}
		if !unlinked {
			return st, err
		}
	}
}

// checkCutPath is checkCut of the file path names.
func (s *Store) checkCutPath(ctx context.Context, path string) error {
	ino, h, err := s.lockFile(ctx, path, false, lockExclusive, "check", ReasonChangedOutside)
	if err != nil {
		return err
	}
	defer s.table.put(ino)
	defer func() {
		ino.lock.release(h)
		putHolder(h)
	}()
	return s.checkCut(ctx, ino, true)
}

// Extents lists the hole, unwritten and written ranges of path within
// [off, off+length), in order and merged; length 0 means up to EOF.
func (s *Store) Extents(ctx context.Context, path string, off, length int64) ([]Extent, error) {
	exts, _, err := s.ExtentsPage(ctx, path, off, length, math.MaxInt)
	return exts, err
}

// ExtentsPage is Extents of at most limit extents (none if limit <= 0), and whether
// the range holds more after the last one returned: the next page starts
// at its end. It builds only the extents it returns, however many the file
// has. Pages read at different times may disagree where the file changed
// in between; each is true when it is read.
func (s *Store) ExtentsPage(ctx context.Context, path string, off, length int64, limit int) (exts []Extent, more bool, err error) {
	if err := validatePath(path); err != nil {
		return nil, false, err
	}
	if err := validateRange(off, length, math.MaxInt64); err != nil {
		return nil, false, err
	}
	if limit <= 0 {
		limit = math.MaxInt
	}
	err = s.lookAt(ctx, path, "extents", func(ino *inode) error {
		n := length
		if n == 0 {
			n = max(0, ino.size.Load()-off)
		}
		if n == 0 {
			exts, more = []Extent{}, false
			return nil
		}
		ino.extentMu.Lock()
		exts, more = ino.extents.extentsUpTo(off, n, limit)
		ino.extentMu.Unlock()
		return nil
	})
	return exts, more, err
}

// FileLocks is one open file's lock state, for /debug/locks.
type FileLocks struct {
	Path    string       `json:"path"`
	Size    int64        `json:"size"`
	Holders []HolderInfo `json:"holders"`
	// Waiters are the first callers queued for the lock, the longest
	// waiting first; Waiting is how many there are in all.
	Waiters  []HolderInfo `json:"waiters"`
	Waiting  int          `json:"waiting"`
	Inflight int64        `json:"inflight"`
	// Appending is how many appends have a range reserved that readers
	// do not see yet.
	Appending int64 `json:"appending"`
}

// Locks describes up to limit open files, and up to 16 holders and the
// first 16 waiters of each.
func (s *Store) Locks(limit int) []FileLocks {
	var out []FileLocks
	s.table.each(limit, func(ino *inode) {
		snap := ino.lock.snapshot(16)
		out = append(out, FileLocks{
			Path:      ino.path(),
			Size:      ino.size.Load(),
			Holders:   snap.Holders,
			Waiters:   snap.Waiters,
			Waiting:   snap.Waiting,
			Inflight:  ino.inflight.count(),
			Appending: ino.appends.inFlight.Load(),
		})
	})
	return out
}
