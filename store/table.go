//go:build linux

package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/trace"
)

// inodeTable maps paths to open inodes with reference counts, and closes
// idle ones beyond the descriptor bound.
type inodeTable struct {
	fsys      FS
	opts      *Options
	telemetry *Telemetry
	// recordBatch is telemetry.recordBatch, bound once rather than at
	// every open (groupCommit.onBatch).
	recordBatch func(callers int)
	// mappedBytes is the address space the open files' mappings take
	// (mapped.go), bounded by maxMappedBytes. Atomic.
	mappedBytes atomic.Int64
	// maxMappings bounds the mappings of the process's stores, counted
	// together (liveMappings): mappingBound, or less where a test says
	// (Hooks.maxMappings). Immutable.
	maxMappings int64

	// mu guards every field below and the table fields of each inode. No
	// one waits for an inode lock while holding it; Delete and Rename take
	// it under their inode locks (remove, rename; the lock order is in
	// doc.go). It is never held across I/O, except the
	// fstat(2) that dates an evicted file's extent map (keepExtentsLocked),
	// with the futimens(2) before it of a file whose mapped writes still
	// owe their timestamps (inode.touch), the close(2) and munmap(2) of a
	// file left without a name or of an alias's descriptors (putLocked,
	// getInode), and Close's final syncs (closeAll).
	// An evicted file is closed after mu is dropped (makeRoomLocked).
	mu     sync.Mutex
	byPath map[string]*inode
	byID   map[fileID]*inode
	// idleHead/idleTail: inodes with refs == 0, most recently used first.
	idleHead, idleTail *inode
	// open counts inodes holding descriptors or being opened.
	open   int
	closed bool
	// failedSync holds the files closed while idle whose last sync failed
	// with no later batch yet told (groupCommit.poisoned), by ID, with the
	// path they were closed under. A new descriptor never sees the old
	// writeback error, so the inode that reopens one starts poisoned.
	failedSync map[fileID]string
	// closedExtents keeps the extent maps of files closed while idle, to be
	// reused when they reopen unchanged. Unlike failedSync and
	// unsyncedDirs it may forget anything for room: it saves work, it
	// guards nothing. It has its own lock, taken under mu or alone.
	closedExtents *extentCache
	// dirs merges the syncs of directories (created files' pendingDirs,
	// and the closed ones' unsyncedDirs). It has its own lock.
	dirs *dirSyncs
	// unsyncedDirs holds, by ID, the pending directory records
	// (inode.pendingDirs) of the files this store created and closed while
	// idle before a sync made their names durable. It is kept apart from
	// the inodes, like failedSync, and never evicted: the inode that
	// reopens one takes its record back, and syncAll and Close sync what
	// is left.
	//
	// failedSync and unsyncedDirs outlive a file's descriptors but not its
	// last name: when the store removes that (Delete, or a Rename over
	// it), their records of the file go too (forgetClosedLocked), because
	// the kernel may give its inode number to the next file created, which
	// must not start poisoned or syncing directories it was never in.
	unsyncedDirs *closedDirs
	// cutFiles holds, by ID, the files closed while idle that their fstat
	// found shorter than the store made them (cut from outside; cut.go),
	// with the path they were closed under: the inode that reopens one
	// reports it (inode.cutPending), and Close reports those left. Like
	// failedSync, never dropped for room, and forgotten with the file's
	// last name.
	cutFiles map[fileID]string
	// gens hands out the files' generations (generation.go), and
	// genRecords keeps those of the files closed while idle, to be taken
	// back when they reopen unchanged. Each has its own lock.
	gens       *genClock
	genRecords *genRecords
	// drained is signalled when the last reference is dropped after close.
	drained *sync.Cond
}

func newInodeTable(fsys FS, opts *Options, tel *Telemetry, gens *genClock, records map[fileID]genRecord) *inodeTable {
	t := &inodeTable{
		gens:        gens,
		genRecords:  newGenRecords(records),
		fsys:        fsys,
		opts:        opts,
		telemetry:   tel,
		recordBatch: tel.recordBatch,
		byPath:      make(map[string]*inode),
		byID:        make(map[fileID]*inode),
		maxMappings: mappingBound(),
	}
	if h := opts.Hooks; h != nil && h.maxMappings > 0 {
		t.maxMappings = min(t.maxMappings, h.maxMappings)
	}
	t.failedSync = make(map[fileID]string)
	t.cutFiles = make(map[fileID]string)
	t.closedExtents = newExtentCache(opts.ExtentCacheBytes)
	t.dirs = newDirSyncs(fsys, opts, tel)
	t.unsyncedDirs = newClosedDirs()
	t.drained = sync.NewCond(&t.mu)
	return t
}

// get returns the inode for name with a reference held; put it back with
// put. create opens with O_CREATE and makes missing parent directories.
func (t *inodeTable) get(ctx context.Context, name string, create bool) (*inode, error) {
	return t.getInode(ctx, name, create, nil)
}

// getOrCreate is get(ctx, name, true) for an operation op that takes the
// inode lock exclusively (for reason). If this call creates the file, it
// returns the inode with its lock already held exclusively for op, taken
// before anyone else could reach the inode: a Write, Truncate or Fallocate
// that creates a file is then one step to the store's other callers, who
// never see the file empty before that operation (directory listings and
// other processes can). Otherwise the holder is nil and the caller locks
// as usual. A caller that keeps the inode for long, a Handle, uses get.
func (t *inodeTable) getOrCreate(ctx context.Context, name, op, reason string) (*inode, *holder, error) {
	// From holderPool, like lockInode's: most calls find the file, and
	// then nothing refers to h (acquireNew never ran with it).
	h := holderPool.Get().(*holder)
	*h = holder{mode: lockExclusive, op: op, reason: reason, span: trace.SpanContextFromContext(ctx)}
	ino, err := t.getInode(ctx, name, true, h)
	if err != nil || !ino.lock.createdBy(h) {
		putHolder(h)
		return ino, nil, err
	}
	return ino, h, nil
}

// getInode is get; if it creates the file and creator is not nil, creator
// gets the inode lock before the inode is ready.
func (t *inodeTable) getInode(ctx context.Context, name string, create bool, creator *holder) (*inode, error) {
	for {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return nil, ErrClosed
		}
		if ino := t.knownLocked(name); ino != nil {
			opened, err := t.awaitKnownLocked(ctx, ino)
			switch {
			case err != nil:
				return nil, err
			case opened:
				return ino, nil
			case errors.Is(ino.openErr, errAlias) || (create && errors.Is(ino.openErr, ErrNotFound)):
				continue // the opener did not create it; this caller may
			}
			return nil, ino.openErr
		}
		// One file is evicted at a time but at most: its slot lives in
		// this frame, not the heap.
		var room [1]*inode
		evicted, err := t.makeRoomLocked(room[:0])
		if err != nil {
			t.mu.Unlock()
			closeAllFiles(evicted)
			return nil, err
		}
		ino := &inode{refs: 1, ready: make(chan struct{}), openedAs: name}
		ino.name.Store(&ino.openedAs)
		t.byPath[name] = ino
		t.open++
		t.mu.Unlock()
		closeAllFiles(evicted)

		err = ino.open(t, create)

		t.mu.Lock()
		if err == nil {
			id := fileID{ino.dev, ino.ino}
			if other := t.byID[id]; other != nil && other.openErr == nil {
				// Another name for an open file: share its inode.
				t.open--
				delete(t.byPath, name)
				t.refLocked(other)
				ino.closeFiles()
				ino.openErr = errAlias
				close(ino.ready)
				t.putLocked(ino)
				t.mu.Unlock()
				return other, nil
			}
			t.byID[id] = ino
			// A close of another name of the file may have kept its map
			// while this open ran: the open inode is the truth now.
			t.closedExtents.forget(id)
			if _, ok := t.failedSync[id]; ok {
				delete(t.failedSync, id)
				ino.commit.poison()
			}
			if _, ok := t.cutFiles[id]; ok {
				delete(t.cutFiles, id)
				ino.cutPending.Store(true)
			}
			if rec := t.unsyncedDirs.take(id); rec != nil {
				if p := ino.pendingDirs.Load(); p != nil {
					// This open made a record too (a file created
					// with the number of one removed from outside):
					// both, made before now, whenever that was.
					rec = &dirRecord{dirs: append(slices.Clip(p.dirs), rec.dirs...), since: t.dirs.now()}
				}
				ino.pendingDirs.Store(rec)
			}
		} else {
			ino.openErr = err
			delete(t.byPath, name)
			t.open--
		}
		if err == nil && ino.created && creator != nil {
			ino.lock.acquireNew(creator)
		}
		close(ino.ready)
		if err != nil {
			t.putLocked(ino)
			t.mu.Unlock()
			return nil, err
		}
		t.mu.Unlock()
		return ino, nil
	}
}

// goneChan returns ino.gone, made now if no Handle asked before: closed
// already if ino was deleted meanwhile.
func (t *inodeTable) goneChan(ino *inode) <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if ino.gone == nil {
		ino.gone = make(chan struct{})
		if ino.deleted.Load() {
			close(ino.gone)
		}
	}
	return ino.gone
}

// errAlias marks a throw-away inode that found its file already open, and
// a name Rename reserved while rename(2) ran: either way, a caller waiting
// for it looks the name up again.
var errAlias = errors.New("alias of an open inode")

// lookup returns, with a reference held, the inode the table knows by
// name, or nil if none: unlike get it opens nothing. It waits for an inode
// being opened by that name, and for a name a Rename has reserved.
func (t *inodeTable) lookup(ctx context.Context, name string) (*inode, error) {
	for {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return nil, ErrClosed
		}
		ino := t.knownLocked(name)
		if ino == nil {
			t.mu.Unlock()
			return nil, nil
		}
		opened, err := t.awaitKnownLocked(ctx, ino)
		if err != nil {
			return nil, err
		}
		if !opened {
			// It failed to open or was a reservation: the name is out of
			// the table now, or names another inode.
			continue
		}
		return ino, nil
	}
}

// knownLocked is the inode the table knows by name, or nil. One whose file
// a sync or Stat found removed from outside (inode.unlinked) is forgotten
// first, so that the name reaches what it names now.
//
// Preconditions: t.mu is held.
func (t *inodeTable) knownLocked(name string) *inode {
	if ino := t.byPath[name]; ino != nil && ino.unlinked.Load() {
		t.forgetLocked(ino)
	}
	return t.byPath[name]
}

// awaitKnownLocked takes a reference to ino, found in the table, drops
// t.mu, and waits until ino's open has finished (ino.ready). It reports
// whether the open succeeded; if not, or if ctx ends first (its error),
// the reference is put back, and ino.openErr says why the open failed.
//
// Preconditions: t.mu is held; it is not on return.
func (t *inodeTable) awaitKnownLocked(ctx context.Context, ino *inode) (opened bool, err error) {
	t.refLocked(ino)
	t.mu.Unlock()
	select {
	case <-ino.ready:
	case <-ctx.Done():
		t.put(ino)
		return false, ctx.Err()
	}
	if ino.openErr != nil {
		t.put(ino)
		return false, nil
	}
	return true, nil
}

// refLocked takes a reference.
//
// Preconditions: t.mu is held.
func (t *inodeTable) refLocked(ino *inode) {
	if ino.refs == 0 {
		t.unlinkIdleLocked(ino)
	}
	ino.refs++
}

// put drops a reference taken by get.
func (t *inodeTable) put(ino *inode) {
	t.mu.Lock()
	t.putLocked(ino)
	t.mu.Unlock()
}

// Preconditions: t.mu is held.
func (t *inodeTable) putLocked(ino *inode) {
	ino.refs--
	if ino.refs > 0 || ino.openErr != nil {
		if t.closed {
			t.drained.Broadcast()
		}
		return
	}
	if ino.unlinked.Load() || ino.deleted.Load() {
		// Its file has no name: close it now, so that the kernel can free
		// it, unless a sync that every caller gave up on still runs (then
		// it waits on the idle list like any file).
		t.forgetLocked(ino)
		if idle, _ := ino.commit.idle(); idle {
			t.open--
			ino.closeFiles()
			if t.closed {
				t.drained.Broadcast()
			}
			return
		}
	}
	// Most recently used first.
	ino.idlePrev = nil
	ino.idleNext = t.idleHead
	if t.idleHead != nil {
		t.idleHead.idlePrev = ino
	} else {
		t.idleTail = ino
	}
	t.idleHead = ino
	if t.closed {
		t.drained.Broadcast()
	}
}

// forgetLocked takes ino out of the table, so that the next request for
// its name opens what the name reaches then. References still held keep
// ino, and the last put closes it.
//
// Preconditions: t.mu is held.
func (t *inodeTable) forgetLocked(ino *inode) {
	if t.byPath[ino.path()] == ino {
		delete(t.byPath, ino.path())
	}
	if id := (fileID{ino.dev, ino.ino}); t.byID[id] == ino {
		delete(t.byID, id)
	}
}

// deleteLocked forgets ino, whose name a Delete or a Rename over it has
// removed, and marks it deleted.
//
// Preconditions: t.mu is held, and ino.lock is held exclusively with no
// write in flight.
func (t *inodeTable) deleteLocked(ino *inode) {
	t.forgetLocked(ino)
	// An open file has no record apart from its inode (its open took them
	// back), but forget them all the same: that the open took them is not
	// what should keep a new file with this inode number from them.
	t.forgetClosedLocked(ino.id(), 1)
	if !ino.deleted.Swap(true) && ino.gone != nil {
		close(ino.gone)
	}
}

// forgetClosedLocked drops what the table keeps apart from the inodes of
// the file id (its extent cache entry, failedSync and unsyncedDirs
// records), now that the store removed one of its names and nlink were
// left before: with none left (nlink 1), the kernel frees the inode once no
// descriptor holds it and may give its number to the next file created.
// The extent cache would tell that file by its ctime, but not where the
// clock went back, and the sync records would not at all. A file that
// keeps another name keeps its sync records; its cache entry goes anyway,
// since the removal moved its ctime.
//
// Preconditions: t.mu is held.
func (t *inodeTable) forgetClosedLocked(id fileID, nlink uint64) {
	t.closedExtents.forget(id)
	if nlink <= 1 {
		delete(t.failedSync, id)
		delete(t.cutFiles, id)
		t.unsyncedDirs.forget(id)
		t.genRecords.forget(id)
	}
}

// remove runs unlink, which removes name, and then forgets ino if name is
// the name the table knows it by. Any other name of the file (an alias: a
// hard link, or a symlink to it) is only unlinked: the file keeps the name
// the table knows.
//
// Preconditions: ino.lock is held exclusively with no write in flight, and
// name names ino's file.
func (t *inodeTable) remove(ino *inode, name string, unlink func() error) error {
	// A get of name meanwhile finds ino and queues for its lock, which the
	// caller holds, and looks again once it sees ino deleted: no one opens
	// a new inode by name before ino is forgotten, so unlink runs without
	// t.mu.
	if err := unlink(); err != nil {
		return err
	}
	if ino.path() != name {
		return nil
	}
	t.mu.Lock()
	t.deleteLocked(ino)
	t.mu.Unlock()
	return nil
}

// errNameTaken is rename's answer when a file was opened by the new name
// since the caller looked: it must look and lock again.
var errNameTaken = errors.New("the new name was opened meanwhile")

// rename runs move, which gives the file of inode a, named oldName, the name
// newName, and then re-keys the table in one step under t.mu: a moves from
// oldName to newName (unless oldName is only an alias of its file), and
// the inode of the file newName named before, dst, is forgotten.
//
// dst is nil when no inode is known by newName. newName is reserved for
// the length of move, in dst's place if there is one: a get of newName
// waits for the reservation, and then finds a (or, if move failed, dst or
// nothing). Without dst, no get can open or create a file there that move
// would replace under it. With dst, no get reaches a by newName before the
// table knows it by that name: once rename(2) is done, an fstat(2) of dst
// (Stat, a sync) finds it unlinked, and a lookup that forgot dst for that
// would open newName afresh and find a, while oldName still found it too.
// If the table's entry for newName is not what the caller found (a file
// was opened by newName since, or dst was forgotten as removed from
// outside), nothing is done and errNameTaken is returned.
//
// Preconditions: a.lock and, if dst != nil, dst.lock are held exclusively
// with no write in flight; oldName names a's file; dst is known by newName.
func (t *inodeTable) rename(a, dst *inode, oldName, newName string, move func() error) error {
	t.mu.Lock()
	if t.byPath[newName] != dst {
		t.mu.Unlock()
		return errNameTaken
	}
	// Never ready, so a get waits for it; not counted in t.open, for it
	// holds no descriptor; refs 1 (ours), so it is never idle. dst stays
	// in byID: the kernel keeps its inode number while its descriptor is
	// open.
	reserved := &inode{refs: 1, ready: make(chan struct{})}
	reserved.name.Store(&newName)
	t.byPath[newName] = reserved
	t.mu.Unlock()

	// A file newName names that the table has closed is replaced without
	// being opened: while newName is reserved no operation of the store
	// changes what it names, so this is the file move replaces.
	var replaced FileInfo
	if dst == nil {
		if fi, err := t.fsys.Lstat(newName); err == nil && fi.Type == 0 && !fi.IsDir && (fileID{fi.Dev, fi.Ino}) != a.id() {
			replaced = fi
		}
	}

	err := move()

	t.mu.Lock()
	defer t.mu.Unlock()
	if err == nil {
		if dst != nil {
			t.deleteLocked(dst)
		} else if replaced.Nlink > 0 {
			t.forgetClosedLocked(fileID{replaced.Dev, replaced.Ino}, replaced.Nlink)
		}
		if a.path() == oldName {
			delete(t.byPath, oldName)
			a.name.Store(&newName)
			t.byPath[newName] = a
			// A new file's name is durable once the directories above it
			// are synced: now those above newName, and still those above
			// oldName, which hold the create's entry and the rename's
			// other half (a rename is durable once both its directories
			// are synced after it). Unless a sync made the old name
			// durable meanwhile; then, like any Rename, the new one is
			// durable once its directories are synced.
			if p := a.pendingDirs.Load(); p != nil {
				dirs := slices.Concat(p.dirs, dirsAbove(newName))
				slices.Sort(dirs)
				a.pendingDirs.CompareAndSwap(p, &dirRecord{dirs: slices.Compact(dirs), since: t.dirs.now()})
			}
		}
	}
	if t.byPath[newName] == reserved {
		// Not re-keyed. Either move failed, and newName names what it did
		// before (dst, or a file the table has not opened), or oldName was
		// an alias, and newName is now another name of a's file, which a
		// get of it finds as it finds any alias.
		delete(t.byPath, newName)
		if err != nil && dst != nil {
			t.byPath[newName] = dst
		}
	}
	reserved.openErr = errAlias
	close(reserved.ready)
	t.putLocked(reserved)
	return err
}

// Preconditions: t.mu is held and ino is on the idle list.
func (t *inodeTable) unlinkIdleLocked(ino *inode) {
	if ino.idlePrev != nil {
		ino.idlePrev.idleNext = ino.idleNext
	} else {
		t.idleHead = ino.idleNext
	}
	if ino.idleNext != nil {
		ino.idleNext.idlePrev = ino.idlePrev
	} else {
		t.idleTail = ino.idlePrev
	}
	ino.idlePrev, ino.idleNext = nil, nil
}

// makeRoomLocked takes least recently used idle files out of the table
// until one more may open, and returns them, appended to evicted, for the
// caller to close once it has dropped t.mu (closeAllFiles): close(2) need
// not hold up every other lookup, and until it runs the table counts one
// descriptor fewer than are open, by at most one file per caller doing
// this at once. An idle file has no reference, so no operation holds its
// lock, and one whose group commit still runs (for callers who gave up
// waiting) is skipped. Its state is rebuilt on the next open, from the
// extent cache (closedExtents) if the file is unchanged by then, else from
// the file; except what the file cannot tell, which is kept apart and
// never dropped: a failed sync not yet reported (failedSync) and
// directories not yet synced (unsyncedDirs).
//
// Preconditions: t.mu is held.
func (t *inodeTable) makeRoomLocked(evicted []*inode) ([]*inode, error) {
	for ino := t.idleTail; t.open >= t.opts.MaxOpenFiles && ino != nil; {
		prev := ino.idlePrev
		if t.closeIdleLocked(ino) {
			evicted = append(evicted, ino)
		}
		ino = prev
	}
	if t.open >= t.opts.MaxOpenFiles {
		return evicted, refuseLimit(ErrTooManyOpenFiles, "", int64(t.opts.MaxOpenFiles), "%d files are in use, the limit is %d", t.open, t.opts.MaxOpenFiles)
	}
	return evicted, nil
}

// closeIdleLocked takes ino out of the table for room, unless a sync of it
// still runs, and reports whether it did; the caller then closes its
// descriptors (closeFiles), after dropping t.mu if it likes.
//
// Preconditions: t.mu is held and ino is on the idle list.
func (t *inodeTable) closeIdleLocked(ino *inode) bool {
	idle, poisoned := ino.commit.idle()
	if !idle {
		return false
	}
	t.unlinkIdleLocked(ino)
	t.forgetLocked(ino)
	// A file without a name has nothing left to report, sync or reuse.
	if !ino.unlinked.Load() && !ino.deleted.Load() {
		id := ino.id()
		if poisoned {
			t.failedSync[id] = ino.path()
		}
		if p := ino.pendingDirs.Load(); p != nil {
			t.unsyncedDirs.put(id, p)
		}
		ino.touch() // so that the fstat dates the last mapped write too
		fi, err := ino.file.Stat()
		if err == nil && fi.Size < ino.size.Load() || ino.cutPending.Load() {
			t.cutFiles[id] = ino.path()
		} else if err == nil {
			t.genRecords.put(fi, ino.gen.Load())
		}
		if !poisoned && !ino.extentsInDoubt.Load() && err == nil {
			t.keepExtentsLocked(ino, fi)
		}
	}
	// Nothing reaches ino's counter and map any more (no reference, out of
	// the table): the next inodes to open reuse them. nil, so that a bug
	// that reached them would fault rather than count or map another file.
	ino.inflight.recycle()
	ino.extents.recycle()
	ino.inflight, ino.extents = nil, nil
	t.open--
	t.telemetry.recordClose()
	return true
}

// keepExtentsLocked offers the extent map of ino, which is being closed,
// to the extent cache, with fi, the fstat that dates it, made after the
// file's timestamps were set (touch). A file whose size is not the one
// the store knows changed behind its back, and one removed from outside
// will never be reopened: neither is kept.
//
// Preconditions: t.mu is held, and ino is idle and leaving the table: no
// operation holds a reference, so nothing changes its map or its file
// (ino.extentMu is not needed, and not taken, being below no table lock).
func (t *inodeTable) keepExtentsLocked(ino *inode, fi FileInfo) {
	if fi.Dev != ino.dev || fi.Ino != ino.ino || fi.Size != ino.size.Load() || fi.Nlink == 0 {
		return
	}
	t.closedExtents.put(fi, ino.extents)
}

// closeAll syncs and closes every inode once no reference is left.
func (t *inodeTable) closeAll() error {
	t.mu.Lock()
	t.closed = true
	for t.open > t.idleCount() {
		t.drained.Wait()
	}
	var errs []error
	for ino := t.idleHead; ino != nil; ino = ino.idleNext {
		if ino.deleted.Load() {
			// No name is left to make durable, nor anyone to tell.
			ino.closeFiles()
			continue
		}
		// Through the group commit, not straight to fsync: a sync that
		// failed before must make this one fail too (see groupCommit), or
		// Close would call data durable that the kernel dropped.
		err := ino.commit.waitDurable(context.Background(), SyncFull)
		// No reference is left: nothing changes the file meanwhile. Its
		// sync set its timestamps.
		fi, serr := ino.file.Stat()
		switch {
		case err == errCutSuspected:
			err = nil
			if serr == nil && fi.Size < ino.size.Load() {
				err = ino.cutError(fi.Size, "at close")
			}
		case err == nil && serr == nil && !ino.unlinked.Load():
			t.genRecords.put(fi, ino.gen.Load())
		}
		if err == nil {
			err = ino.cutReported()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("sync %s: %w", ino.path(), err))
		}
		ino.closeFiles()
	}
	for _, key := range t.failedSync {
		errs = append(errs, fmt.Errorf("sync %s: %w: a sync failed and the file was closed before a later one could report it", key, ErrSyncFailed))
	}
	for _, key := range t.cutFiles {
		errs = append(errs, fmt.Errorf("%w: %s was found shorter than the store made it when it was closed for lack of descriptors: it was cut short from outside the store", ErrChangedOutside, key))
	}
	if err := t.syncDirs(t.unsyncedDirs.dirLists()); err != nil {
		errs = append(errs, err)
	}
	// The directories the store made whose entries no sync covered yet
	// (a Rename without sync into new ones): a Rename with sync after a
	// restart takes every directory it did not make in this run as
	// durable (dirSyncs.notDurable). One that is gone since needs nothing.
	since := t.dirs.now()
	for _, dir := range t.dirs.allMade() {
		if err := t.dirs.sync(dir, since); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("%w: sync directory %s: %w", ErrSyncFailed, dir, err))
		}
	}
	t.idleHead, t.idleTail = nil, nil
	t.byPath, t.byID, t.open, t.failedSync, t.cutFiles, t.unsyncedDirs = nil, nil, 0, nil, nil, newClosedDirs()
	t.mu.Unlock()
	return errors.Join(errs...)
}

// syncClosedDirs syncs the directories of the files closed while idle
// before their first sync (unsyncedDirs), and forgets the records it made
// durable.
func (t *inodeTable) syncClosedDirs() error {
	t.mu.Lock()
	lists, records := t.unsyncedDirs.snapshot()
	t.mu.Unlock()
	if len(records) == 0 {
		return nil
	}
	if err := t.syncDirs(lists); err != nil {
		return err
	}
	t.mu.Lock()
	t.unsyncedDirs.forgetIf(records)
	t.mu.Unlock()
	return nil
}

// syncDirs syncs each directory named in lists once.
func (t *inodeTable) syncDirs(lists [][]string) error {
	since := t.dirs.now() // the entries were made before
	synced := make(map[string]bool)
	var errs []error
	for _, dirs := range lists {
		for _, dir := range dirs {
			if synced[dir] {
				continue
			}
			synced[dir] = true
			if err := t.dirs.sync(dir, since); err != nil {
				errs = append(errs, fmt.Errorf("%w: sync directory %s: %w", ErrSyncFailed, dir, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Preconditions: t.mu is held.
func (t *inodeTable) idleCount() int {
	n := 0
	for ino := t.idleHead; ino != nil; ino = ino.idleNext {
		n++
	}
	return n
}

// keys lists the paths of the open inodes, busy ones first, then idle ones
// least recently used first: a caller that gets and puts each in this order
// (syncAll) leaves the idle ones in the LRU order it found, as put moves an
// inode to the front of the idle list.
func (t *inodeTable) keys() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var keys []string
	for key, ino := range t.byPath {
		if ino.refs > 0 {
			keys = append(keys, key)
		}
	}
	for ino := t.idleTail; ino != nil; ino = ino.idlePrev {
		if !ino.deleted.Load() {
			keys = append(keys, ino.path())
		}
	}
	return keys
}

// each calls fn for up to limit open inodes, with a reference held, busy
// ones first. Its references are not uses: idle inodes keep their place in
// the LRU list, so that looking at the table (/debug/locks) does not change
// which file is closed next. It holds every reference until fn has seen
// all of them: fn must be quick.
func (t *inodeTable) each(limit int, fn func(*inode)) {
	t.mu.Lock()
	var inos []*inode
	for _, ino := range t.byPath {
		if len(inos) == limit {
			break
		}
		if ino.refs == 0 {
			continue // idle: taken below, in LRU order
		}
		select {
		case <-ino.ready:
			if ino.openErr == nil {
				t.refLocked(ino)
				inos = append(inos, ino)
			}
		default:
		}
	}
	busy := len(inos)
	for ino := t.idleHead; ino != nil && len(inos) < limit; ino = ino.idleNext {
		if !ino.deleted.Load() {
			inos = append(inos, ino)
		}
	}
	// put moves an inode to the front of the idle list, so putting these
	// back least recently used first leaves their order as it was.
	slices.Reverse(inos[busy:])
	for _, ino := range inos[busy:] {
		t.refLocked(ino)
	}
	t.mu.Unlock()
	for _, ino := range inos {
		fn(ino)
		t.put(ino)
	}
}

// tableGauges are the figures the store's gauges observe.
type tableGauges struct {
	open     int   // files open or being opened
	inflight int64 // writes in flight in all of them
	// cached and cachedBytes are the extent cache's entries and size.
	cached      int
	cachedBytes int64
}

// gauges counts the open files and the writes in flight in all of them,
// and reads the extent cache's size, for the gauges. It holds t.mu while
// it sums, which delays opens and closes (not operations on open files) by
// a few atomic loads per file.
func (t *inodeTable) gauges() tableGauges {
	t.mu.Lock()
	defer t.mu.Unlock()
	g := tableGauges{open: t.open}
	for _, ino := range t.byPath {
		select {
		case <-ino.ready:
			if ino.openErr == nil {
				g.inflight += ino.inflight.count()
			}
		default: // still opening: nothing in flight yet
		}
	}
	g.cached, g.cachedBytes = t.closedExtents.size()
	return g
}

// visibleSizes lowers the Size of entries[i], for each i in regular (the
// regular files of directory dir, sized as List found them), to what
// readers may see: while appends are in flight (appendQueue) a file's size
// may take in ranges not yet published. It takes t.mu once per
// visibleSizeBatch entries rather than once each; not once for the whole
// page, which would hold every get and put of the store back for up to
// MaxListPageSize lookups.
func (t *inodeTable) visibleSizes(dir string, entries []DirEntry, regular []int) {
	for len(regular) > 0 {
		batch := regular[:min(len(regular), visibleSizeBatch)]
		regular = regular[len(batch):]
		t.mu.Lock()
		for _, i := range batch {
			e := &entries[i]
			ino := t.byPath[path.Join(dir, e.Name)]
			if ino != nil && ino.appends.inFlight.Load() != 0 {
				e.Size = min(e.Size, ino.size.Load())
			}
		}
		t.mu.Unlock()
	}
}

// visibleSizeBatch is how many of a List page's files visibleSizes looks
// up per hold of inodeTable.mu.
const visibleSizeBatch = 128
