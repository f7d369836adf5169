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

	// mu guards byDir, each entry's users, made, madeCount and
	// madeOverflow. It is a leaf, never held across a sync.
	mu    sync.Mutex
	byDir map[string]*dirSync
	// made are the directories the store made, or is making, (for a
	// file it created, or a Rename) whose entry no fsync of their parent
	// is known to cover yet, by parent. A Rename with sync asks it which
	// directories up its new path are not durable (notDurable). Past
	// maxMade entries a parent's new directories share one entry, under
	// anyDir, that calls every directory in that parent not durable
	// until an fsync of the parent covers them: the precision comes back
	// with that fsync. Past maxMade of those too it stops keeping count
	// (madeOverflow) and calls every directory not durable for good.
	made map[string]map[string]*madeDir
	// madeCount is the number of entries in made, all parents together.
	madeCount int
	// maxMade is maxMadeDirs, set by newDirSyncs and not changed after
	// (tests lower it before the store runs).
	maxMade      int
	madeOverflow bool
}

// maxMadeDirs bounds dirSyncs.made: directories made and never synced
// (Renames without sync into new directories) cost the store no more.
const maxMadeDirs = 1 << 16

// anyDir is the key in dirSyncs.made[parent] that stands for every
// directory made in parent once made was full.
const anyDir = "/"

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
	return &dirSyncs{fsys: fsys, perCall: opts.Fsync == FsyncPerCall, onBatch: tel.recordDirBatch, byDir: make(map[string]*dirSync), maxMade: maxMadeDirs}
}

// now is a stamp for entries made before the call: an fsync that starts
// later covers them.
func (d *dirSyncs) now() int64 { return d.clock.Add(1) }

// making counts dir as not durable from now, before the caller's mkdir(2)
// of it, so that no one finds it on disk and takes it for durable; the
// caller calls the done it returns with whether the mkdir made it. A
// directory made is not durable until an fsync of its parent that starts
// after done covers it; one that the mkdir found there (EEXIST) is
// forgotten again, unless another maker of it is at work.
func (d *dirSyncs) making(dir string) (done func(madeIt bool)) {
	parent := path.Dir(dir)
	d.mu.Lock()
	key := dir
	if d.made[parent][dir] == nil && d.madeCount >= d.maxMade {
		key = anyDir
		if d.made[parent][anyDir] == nil && d.madeCount >= 2*d.maxMade {
			d.madeOverflow = true
			d.mu.Unlock()
			return func(bool) {}
		}
	}
	if d.made == nil {
		d.made = make(map[string]map[string]*madeDir)
	}
	if d.made[parent] == nil {
		d.made[parent] = make(map[string]*madeDir)
	}
	m := d.made[parent][key]
	if m == nil {
		m = &madeDir{}
		d.made[parent][key] = m
		d.madeCount++
	}
	m.making++
	d.mu.Unlock()
	return func(madeIt bool) {
		var since int64
		if madeIt {
			since = d.now() // after the mkdir returned
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		m.making--
		if madeIt {
			m.since = max(m.since, since) // anyDir's: the latest
		}
		if m.making == 0 && m.since == 0 {
			d.forgetMadeLocked(parent, key, m)
		}
	}
}

// madeDir is a directory of dirSyncs.made. Guarded by dirSyncs.mu.
type madeDir struct {
	making int   // mkdir(2)s of it under way
	since  int64 // a stamp taken after a mkdir made it (anyDir: the latest); 0 before
}

// forgetMadeLocked drops dir, a directory of parent, from made if m is
// still its entry.
//
// Preconditions: d.mu is held.
func (d *dirSyncs) forgetMadeLocked(parent, dir string, m *madeDir) {
	if d.made[parent][dir] != m {
		return
	}
	delete(d.made[parent], dir)
	d.madeCount--
	if len(d.made[parent]) == 0 {
		delete(d.made, parent)
	}
}

// synced forgets the directories made in dir before start, the stamp at
// which a successful fsync of dir started: their entries are durable.
func (d *dirSyncs) synced(dir string, start int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for child, m := range d.made[dir] {
		if m.making == 0 && m.since != 0 && m.since < start {
			d.forgetMadeLocked(dir, child, m)
		}
	}
}

// notDurable lists, root first, the directories to fsync so that the
// entry of name (not yet made, or just made) and every directory up its
// path are durable: name's own directory, and the parent of each
// directory up the path that the store made and no fsync has covered yet
// (made). Directories the store did not make (by an earlier run, whose
// Close synced what it made, or from outside) are taken as durable.
func (d *dirSyncs) notDurable(name string) []string {
	above := dirsAbove(name) // nearest first
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for i := len(above) - 1; i >= 0; i-- {
		dir := above[i]
		if i == 0 || d.madeOverflow {
			out = append(out, dir)
			continue
		}
		// above[i-1] is the directory below dir on the path: its entry is in dir.
		_, made := d.made[dir][above[i-1]]
		_, anyMade := d.made[dir][anyDir]
		if made || anyMade {
			out = append(out, dir)
		}
	}
	return out
}

// allMade lists the parents of every directory made and not yet known
// durable, for Close to sync.
func (d *dirSyncs) allMade() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]string, 0, len(d.made))
	for parent := range d.made {
		out = append(out, parent)
	}
	return out
}

// sync makes durable the entries made in dir before since (a stamp of
// now), with an fsync of dir that started after since.
func (d *dirSyncs) sync(dir string, since int64) error {
	if d.perCall {
		d.onBatch(1)
		start := d.now()
		err := d.fsys.SyncDir(dir)
		if err == nil {
			d.synced(dir, start)
		}
		return err
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
	if err == nil {
		d.synced(dir, b.start) // d.mu, then ds.mu: never nested
	}
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
