//go:build linux

package store

import (
	"path"
	"sync"
	"sync/atomic"
)

// dirSyncs merges the fsyncs of directories that the first syncs of new
// files ask for (inode.pendingDirs: every directory above a file the store
// created, so that its name is as durable as its data). A thousand files
// created at once in one directory, each synced, would otherwise fsync
// that directory, and the root, a thousand times.
//
// An fsync of a directory makes durable every entry made in it before the
// fsync started, so a caller names when its entries were made (a stamp of
// dirClock, taken after the create returned) and is released by any fsync
// of the directory that started later: one that already finished (then it
// returns at once), the one running, or else the next, which starts the
// moment the running one ends and covers every caller that queued for it.
// Nothing sleeps to gather company. This is the rule the kernel applies to
// a directory's journal transaction (ext4 waits for the commit of the
// transaction that holds the change), kept in userspace so that callers
// whose change a commit already covers make no system call at all. Under
// FsyncPerCall every caller issues its own fsync; FsyncTimer's delay is a
// file experiment and does not apply here.
//
// A directory's state lives while someone waits on it and is dropped when
// the last leaves, so the store keeps nothing for every directory it ever
// synced: a caller that comes later makes its own fsync, which the kernel
// answers at once when nothing in the directory changed since the last. A
// failed fsync is reported to the callers it would have covered, whose
// files keep their directories pending and sync them again with their next
// sync; unlike a file's, it is not remembered past those callers (on a
// journaling filesystem a failed commit of directory changes aborts the
// journal, and every later sync fails anyway).
type dirSyncs struct {
	fsys    FS
	perCall bool
	onBatch func(callers int)

	// clock orders entries made against fsyncs started: stamps are taken
	// from it when a create returned (now) and when an fsync starts.
	clock atomic.Int64

	// mu guards byDir and each entry's users. It is a leaf, never held
	// across a sync.
	mu    sync.Mutex
	byDir map[string]*dirSync
}

// dirRecord is what a file the store created needs synced for its name to
// be durable (inode.pendingDirs): the directories above the name, and when
// their entries were made, a stamp of dirSyncs.now that an fsync of them
// started later covers. It is immutable: a change is a new record.
type dirRecord struct {
	dirs  []string
	since int64
}

// dirsAbove lists every directory above name up to the root, nearest
// first: any of them may be new, made by the create or Rename that gave
// the name, or by one running beside it.
func dirsAbove(name string) []string {
	var dirs []string
	for dir := path.Dir(name); ; dir = path.Dir(dir) {
		dirs = append(dirs, dir)
		if dir == "." {
			return dirs
		}
	}
}

// dirSync is one directory's fsyncs.
type dirSync struct {
	users int // guarded by dirSyncs.mu

	// mu guards the fields below; it is a leaf, never held across a sync.
	mu sync.Mutex
	// synced is the start stamp of the latest fsync that succeeded.
	synced int64
	// running is the fsync in progress, pending the callers waiting for
	// the next one; each nil when there is none.
	running, pending *dirBatch
}

// dirBatch is one fsync of a directory and the callers it covers.
type dirBatch struct {
	start   int64 // the clock when it started; 0 until then
	callers int   // guarded by dirSync.mu
	err     error // written before done is closed
	done    chan struct{}
}

func newDirSyncs(fsys FS, opts *Options, tel *Telemetry) *dirSyncs {
	return &dirSyncs{fsys: fsys, perCall: opts.Fsync == FsyncPerCall, onBatch: tel.recordDirBatch, byDir: make(map[string]*dirSync)}
}

// now is a stamp for entries made before the call: an fsync that starts
// later covers them.
func (d *dirSyncs) now() int64 { return d.clock.Add(1) }

// sync makes durable the entries made in dir before since (a stamp of
// now), with an fsync of dir that started after since.
func (d *dirSyncs) sync(dir string, since int64) error {
	if d.perCall {
		d.onBatch(1)
		return d.fsys.SyncDir(dir)
	}
	d.mu.Lock()
	ds := d.byDir[dir]
	if ds == nil {
		ds = &dirSync{}
		d.byDir[dir] = ds
	}
	ds.users++
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		ds.users--
		if ds.users == 0 && d.byDir[dir] == ds {
			delete(d.byDir, dir)
		}
		d.mu.Unlock()
	}()

	ds.mu.Lock()
	if ds.synced > since {
		ds.mu.Unlock()
		return nil
	}
	b := ds.running
	if b == nil || b.start <= since {
		// Nothing runs that started after the entries: queue for the
		// next, and run it now if nothing runs at all.
		if b = ds.pending; b == nil {
			b = &dirBatch{done: make(chan struct{})}
			ds.pending = b
		}
	}
	b.callers++
	lead := ds.running == nil
	if lead {
		d.startLocked(ds)
	}
	ds.mu.Unlock()
	if lead {
		d.run(dir, ds, b)
	}
	<-b.done
	return b.err
}

// startLocked makes the pending batch the running one and stamps its
// start, before its fsync is issued.
//
// Preconditions: ds.mu is held, nothing runs, and a batch is pending.
func (d *dirSyncs) startLocked(ds *dirSync) {
	ds.running, ds.pending = ds.pending, nil
	ds.running.start = d.now()
}

// run issues b's fsync and then, on a goroutine of their own, those of the
// batches that queued meanwhile, so that b's callers return at once.
//
// Preconditions: b is ds.running.
func (d *dirSyncs) run(dir string, ds *dirSync, b *dirBatch) {
	err := d.fsys.SyncDir(dir)
	ds.mu.Lock()
	if err == nil {
		ds.synced = max(ds.synced, b.start)
	}
	b.err = err
	d.onBatch(b.callers) // final: no caller joins a batch that is done
	close(b.done)
	ds.running = nil
	next := ds.pending != nil
	if next {
		d.startLocked(ds)
	}
	nb := ds.running
	ds.mu.Unlock()
	if next {
		go d.run(dir, ds, nb)
	}
}
