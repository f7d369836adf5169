//go:build linux

package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"sync/atomic"
	"syscall"
)

// inode is the store's per-file state; see doc.go for the lock order.
type inode struct {
	// name is the path the file is known by, its key in the table: the
	// path it was opened by (openedAs) until a Rename moves it. Read it
	// with path(), without locks; Rename stores it with inodeTable.mu held
	// and lock held exclusively.
	name atomic.Pointer[string]
	// openedAs is the path the inode was opened by: name points here
	// first, so that an open allocates no string header of its own.
	openedAs string

	// Immutable after open.
	table     *inodeTable // that opened it
	file      File        // buffered descriptor; reads always use it
	direct    File        // O_DIRECT descriptor in IODirect mode, else nil
	blockSize int64
	dev, ino  uint64
	created   bool      // this open created the file
	wait      waitTrace // where the waits on this inode are reported

	// lock is the rwsem; see the policy table in doc.go.
	lock inodeLock
	// deleted is set once a Delete, or a Rename over the file, removed the
	// name the table knew it by: the table has forgotten the inode. It is
	// set with both lock (exclusively) and inodeTable.mu held, so a holder
	// of either reads it stably; others read it atomically. An operation
	// that finds it set once it holds lock acts on nothing: one that came
	// by path looks the path up again (lockFile), and one that holds the
	// inode itself, a Handle, fails with ErrDeleted.
	deleted atomic.Bool
	// gone is closed when deleted is set, for a Handle's holder to learn of
	// it without writing (Handle.Gone). It is made for the first Handle
	// (inodeTable.goneChan): most inodes never have one. Guarded by
	// inodeTable.mu.
	gone chan struct{}
	// size is the file size that readers see. Read without locks (like
	// i_size_read()); written with lock held exclusively, or by an append
	// publishing its range with appends.mu held (completeAppend), or by
	// the last of a failure's appends giving its range back (storing the
	// size it already has), which happen only while appends are counted
	// in flight, so never while an exclusive holder that changes the
	// size runs.
	size atomic.Int64
	// appends orders the appends in flight (see appendQueue).
	appends appendQueue
	// inflight counts writes below EOF that run without lock. It and
	// extents are recycled, and set to nil, when the table closes the
	// inode for room (inodeTable.closeIdleLocked).
	inflight *inflightCounter

	// extentMu guards extents: the i_data_sem analogue. Taken after lock
	// (in any mode, or none for unlocked writes), never held across I/O.
	extentMu sync.Mutex
	extents  *extentMap
	// extentsInDoubt is set once an I/O error may have left extents
	// unlike the file (a short write, a failed truncate or fallocate): the
	// map is still the store's best guess, but it is not kept for the next
	// open (extentCache).
	extentsInDoubt atomic.Bool

	// mapping is the file's memory mapping for overwrites (mapped.go).
	mapping inodeMap

	// commit merges syncs of this file.
	commit groupCommit
	// durable is what durable direct writes need of the file (durable.go).
	durable durableState
	// unlinked is set when an fstat(2) of the descriptor, made by a sync or
	// a Stat, found that the file has no name left (st_nlink 0): it was
	// removed, or replaced by another, from outside the store; and when a
	// Rename found that the name the table knows it by names another file
	// or nothing (it was moved away from outside). From then
	// on a sync of it fails with ErrFileRemoved, and the table forgets it at
	// the next lookup of its name or when its last reference is put
	// (forgetLocked), so that the name reaches whatever it names now.
	unlinked atomic.Bool
	// gen is the file's generation (generation.go): moved by every
	// mutation (bump) while it holds the lock in some mode or is counted
	// in flight; read without locks.
	gen atomic.Int64
	// cutPending is set when the inode opens a file that the table found
	// shorter than the store made it when it closed it for room
	// (inodeTable.cutFiles), and cleared by the Stat or sync that reports
	// it (cutReported).
	cutPending atomic.Bool
	// pendingDirs, for a file this store created, are the directories to
	// sync once so that its name is as durable as its data: every
	// directory above the name the table knows it by. It is nil for a file
	// that existed before, and once a sync made them durable. Read it
	// without locks. A Rename replaces it, while it is not nil, with the
	// directories above the old name and the new (inodeTable.rename, with
	// inodeTable.mu held); a sync clears it only if it still holds the
	// record that sync synced, so that a Rename while the sync ran leaves
	// the new name pending.
	pendingDirs atomic.Pointer[dirRecord]

	// The fields below are guarded by inodeTable.mu.
	refs     int
	idlePrev *inode // LRU of idle inodes (refs == 0)
	idleNext *inode
	// ready is closed once the open finished; openErr is its outcome.
	ready   chan struct{}
	openErr error
}

// path is the name the table knows the file by (see name).
func (ino *inode) path() string { return *ino.name.Load() }

// id is the file's identity (immutable after open).
func (ino *inode) id() fileID { return fileID{ino.dev, ino.ino} }

// fileID identifies a file across paths (hard links, symlinks inside the
// root), so that two names never get two locks for one file. It also
// orders inode locks where two are held (Rename): the kernel does not
// reuse an inode number while a descriptor keeps the file, deleted or
// not, so no two inodes in the store share one.
type fileID struct{ dev, ino uint64 }

// less orders IDs for taking two inode locks (doc.go).
func (a fileID) less(b fileID) bool {
	return a.dev < b.dev || (a.dev == b.dev && a.ino < b.ino)
}

// aligned reports whether [off, end) starts and ends on block boundaries.
func (ino *inode) aligned(off, end int64) bool {
	return off%ino.blockSize == 0 && end%ino.blockSize == 0
}

// truncate sets the file's length to size (ftruncate) and the store's view
// with it: the size readers see becomes size and, when size is at or below
// the old size, the extent map forgets every block from size on (like
// ext4, which frees the blocks preallocated past the new end then; a
// larger size keeps them).
//
// If ftruncate fails, the size and the map are left as they were and the
// map is marked in doubt (extentsInDoubt: not kept for the next open), and
// the error is returned for the caller to report. An ftruncate mostly
// fails before it changes anything (EPERM, EFBIG, an I/O error reading
// metadata), so the view left as it was is the file's; where it did cut
// the file, the map is rebuilt from the file at the next open instead of
// trusted. A caller that gives back a failed append's range stores the
// size at its offset first, so that readers never see that range whatever
// ftruncate does; the file then holds bytes past the size until a later
// write covers them or a truncate cuts them.
//
// Preconditions: nothing else changes the size or the file's length
// meanwhile: ino.lock is held exclusively with no write in flight, or the
// caller is the last of a failure's appends, still counted in flight
// (completeAppend), which keeps those out.
func (ino *inode) truncate(size int64) error {
	defer ino.durable.changed()
	if err := ino.file.Truncate(size); err != nil {
		ino.extentsInDoubt.Store(true)
		return err
	}
	if size <= ino.size.Load() {
		ino.extentMu.Lock()
		ino.extents.truncate(size)
		ino.extentMu.Unlock()
	}
	ino.size.Store(size)
	return nil
}

// open opens the descriptors and rebuilds the size and the extent map
// from the file, or takes the map from t's extent cache if the file is
// unchanged since the table closed it. A file or directories it created for
// a file it then refuses are taken back.
func (ino *inode) open(t *inodeTable, create bool) (err error) {
	f, err := t.fsys.OpenFile(ino.path(), openFlags, 0)
	var made creation
	if create && errors.Is(err, fs.ErrNotExist) {
		if f, made, err = createFile(t.fsys, t.dirs, ino.path()); err == nil {
			ino.created = made.file
			ino.pendingDirs.Store(&dirRecord{dirs: dirsAbove(ino.path()), since: t.dirs.now()})
		}
	}
	if err != nil {
		return mapOpenErr(ino.path(), err)
	}
	defer func() {
		if err != nil {
			made.undo(t.fsys) // the descriptors are closed by now
		}
	}()
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("stat %s: %w", ino.path(), err)
	}
	switch {
	case fi.IsDir:
		f.Close()
		return fmt.Errorf("%w: %s", ErrIsDirectory, ino.path())
	case fi.Type != 0:
		f.Close()
		return fmt.Errorf("%w: %s is a %s", ErrNotRegular, ino.path(), fileKind(fi.Type))
	}
	ino.table, ino.file = t, f
	ino.dev, ino.ino = fi.Dev, fi.Ino
	ino.blockSize = fi.BlockSize
	if ino.blockSize <= 0 {
		ino.blockSize = 4096
	}
	if t.opts.IO == IODirect {
		df, err := ino.openDirect(t.fsys, syscall.O_DIRECT)
		if err != nil {
			f.Close()
			return err
		}
		ino.direct = df
	}
	m := t.closedExtents.take(fi, ino.blockSize)
	t.telemetry.recordOpen(m != nil)
	if m == nil {
		if m, err = loadExtentMap(f, ino.blockSize); err != nil {
			ino.closeFiles()
			return fmt.Errorf("rebuild extent map of %s: %w", ino.path(), err)
		}
	}
	ino.extents = m
	ino.size.Store(fi.Size)
	ino.initGen(t, fi)
	ino.initMapping(t)
	ino.inflight = newInflightCounter()
	ino.wait = waitTrace{tel: t.telemetry, policy: t.opts.Policy, name: &ino.name}
	ino.lock.wait, ino.lock.maxWaiters = ino.wait, t.opts.MaxWaitersPerFile
	ino.commit = groupCommit{
		mode:    t.opts.Fsync,
		delay:   t.opts.FsyncTimerDelay,
		sync:    ino,
		onBatch: t.recordBatch,
		wait:    ino.wait,

		ackFromRunning: t.opts.Hooks.broken(breakAckFromRunningSync),
		durable:        &ino.durable,
	}
	if h := t.opts.Hooks; h != nil && h.WaitingForSync != nil {
		ino.commit.onWait = func() { h.WaitingForSync(ino.path()) }
	}
	return nil
}

// openDirect opens another descriptor of ino with the open(2) flags
// flags besides openFlags (O_DIRECT, and O_DSYNC for durable.go's), by
// name again, and checks that it reached the file the buffered one did.
func (ino *inode) openDirect(fsys FS, flags int) (File, error) {
	df, err := fsys.OpenFile(ino.path(), openFlags|flags, 0)
	if err != nil {
		return nil, mapOpenErr(ino.path(), err)
	}
	fi, err := df.Stat()
	if err == nil && (fi.Dev != ino.dev || fi.Ino != ino.ino) {
		err = errors.New("the file was replaced while it was being opened")
	}
	if err != nil {
		df.Close()
		return nil, fmt.Errorf("open %s for direct I/O: %w", ino.path(), err)
	}
	return df, nil
}

// fileKind names a file type that is not a regular file's.
func fileKind(t fs.FileMode) string {
	switch {
	case t&fs.ModeNamedPipe != 0:
		return "FIFO"
	case t&fs.ModeSocket != 0:
		return "socket"
	case t&fs.ModeCharDevice != 0:
		return "character device"
	case t&fs.ModeDevice != 0:
		return "block device"
	}
	return "special file"
}

// syncFile is the file's fdatasync/fsync for its group commit. The first
// sync after the store created the file also syncs the directories above
// it, so that the name is as durable as the data (fsync(2) of a file does
// not promise its directory entry).
//
// It then checks, with one statx(2) of the link count and size for the
// whole batch (links), that the file
// still has a name (inode.unlinked): a sync of a file removed from outside
// makes its data durable in a file that nobody can reach; and that it is
// not shorter than the store's size, or it returns errCutSuspected, which
// is no failure of the sync (groupCommit.issue).
func (ino *inode) syncFile(mode SyncMode) error {
	t := ino.table
	ino.touch() // a mapped write's timestamps, made durable with it
	ino.mapping.syncs.Add(1)
	if err := ino.file.Sync(mode); err != nil {
		return err
	}
	var cut error
	if n, size, err := links(ino.file); err == nil {
		if n == 0 {
			ino.unlinked.Store(true)
		}
		if size < ino.size.Load() {
			cut = errCutSuspected // for each caller to check (cut.go)
		}
	}
	p := ino.pendingDirs.Load()
	if p == nil {
		return cut
	}
	if t.opts.Hooks.broken(breakSkipNewFileDirSync) {
		ino.pendingDirs.CompareAndSwap(p, nil) // the deliberate break
		return nil
	}
	// All at once, each shared with the first syncs of other new files in
	// the same directory (dirSyncs).
	errs := make([]error, len(p.dirs))
	var wg sync.WaitGroup
	for i, dir := range p.dirs {
		wg.Go(func() { errs[i] = t.dirs.sync(dir, p.since) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	ino.pendingDirs.CompareAndSwap(p, nil)
	return cut
}

// removedError is ErrFileRemoved if a sync found that ino's file has no
// name left (inode.unlinked) and the store did not remove that name itself,
// else nil.
//
// A Delete of the file, or a Rename over it, through the store leaves it
// without a name too, and a write or Fsync that raced it is not in the
// wrong: its write was applied, or its Fsync asked, before the Delete
// returned, so one order of the calls puts it first, and its data was as
// durable as any data a Delete then removes (OK). Such a Delete holds the
// lock exclusively from before its unlink(2) until it marks the inode
// deleted; so, unless held says the caller holds the lock exclusively
// (then no Delete runs), removedError takes the lock shared, after the
// Delete, to tell the two apart. That wait comes only after a sync found
// the file unlinked.
func removedError(ctx context.Context, ino *inode, held bool) error {
	if !ino.unlinked.Load() || ino.deleted.Load() {
		return nil
	}
	if !held {
		h, err := lockInode(ctx, ino, lockShared, "sync", ReasonRead)
		if err != nil {
			return err
		}
		ino.lock.release(h)
		putHolder(h)
		if ino.deleted.Load() {
			return nil
		}
	}
	return fmt.Errorf("%w: %s: what was written to it since its last sync is in a file that no name reaches; the next request opens what the path names now", ErrFileRemoved, ino.path())
}

func (ino *inode) closeFiles() {
	ino.unmapAll()
	ino.durable.close()
	if ino.direct != nil {
		ino.direct.Close()
	}
	if ino.file != nil {
		ino.file.Close()
	}
}

// closeAllFiles closes the descriptors of inodes taken out of the table.
func closeAllFiles(inos []*inode) {
	for _, ino := range inos {
		ino.closeFiles()
	}
}
