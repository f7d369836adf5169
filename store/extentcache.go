//go:build linux

package store

import (
	"sync"

	"golang.org/x/sys/unix"
)

// extentCache keeps the extent maps and sizes of files the table closed to
// make room (inodeTable.makeRoomLocked), keyed by device and inode number,
// so that reopening a file that has not changed since costs an open(2)
// and an fstat(2), not a FIEMAP with FIEMAP_FLAG_SYNC, which writes back
// the file's dirty pages first: without it, the set of files in use, not
// the work, sets the cost of a write once it outgrows the descriptors.
//
// An entry is used only when the file is provably as the store left it:
// the same device and inode, the same size and the same ctime as fstat(2)
// gave just before the close. ctime, not mtime, because no caller can set
// it (utimes sets mtime), and every change of data, size or allocation
// moves it: write, ftruncate, fallocate, a reflink, and the unlink and
// rename that make a new file of the same inode number. Its resolution is
// the catch. Before Linux 6.13 a change stamps the inode with the coarse
// clock, which moves once a tick (1 to 10 ms): two changes in one tick,
// one by the store just before the close and one from outside just after,
// share a ctime. So an entry is only made when the ctime is older than the
// close by more than a tick (settledAt), and then any later change, which
// reads the clock after the close, gets a later ctime. From 6.13 ext4,
// XFS, btrfs and tmpfs give a fine-grained ctime to the first change after
// a stat (multigrain timestamps), and the store's fstat at the close is
// such a stat; the rule then only costs the entries of files changed in
// the last tick before their close. A clock set backwards between a close
// and a change from outside could give that change the old ctime to the
// nanosecond; nothing here guards against that.
//
// The map itself is what the store kept while the file was open, trusted
// as it was then: the store assumes that nothing but itself changes the
// allocation of a file it holds open, and the FIEMAP comparison tests
// check that its map follows the kernel's. A file whose map is in doubt
// (an I/O error, a failed sync) is not cached.
//
// The cache is bounded by Options.ExtentCacheBytes. Past it, the entries
// of the files closed longest ago are dropped, and their next open
// rebuilds the map from FIEMAP, as every open did before. The records that
// guard durability (inodeTable.failedSync, inodeTable.unsyncedDirs) are
// not entries: they live apart and are never dropped for room.
type extentCache struct {
	// maxBytes bounds bytes; 0 turns the cache off.
	maxBytes int64
	// tick is the resolution of the clock that stamps ctime before 6.13
	// (CLOCK_REALTIME_COARSE), and now reads that clock; both are fixed at
	// open (tests set them).
	tick int64
	now  func() int64

	// mu guards the fields below. It is a leaf, taken alone or under
	// inodeTable.mu, and never held across a syscall.
	mu    sync.Mutex
	bytes int64
	// The entries live in one slice, linked by index, and byID maps a
	// file to its slot: neither holds a pointer, so the garbage collector
	// never scans them, where a node per entry cost every collection a
	// walk of the whole cache (100,000 closed files: a fifth of the
	// daemon's CPU went to marking). The slice keeps the most slots it
	// ever held; freed ones are reused first.
	entries []closedFile
	byID    map[fileID]int32
	free    []int32
	// spilled holds the runs of the entries that have more than one, by
	// slot: few files are that fragmented, and the rest keep their one
	// run inline.
	spilled map[int32][]extentRun
	// head is the slot of the most recently closed file, tail the next to
	// drop; noSlot when empty.
	head, tail int32
}

// noSlot ends the list of entries.
const noSlot = -1

// closedFile is what the cache keeps of one closed file.
type closedFile struct {
	id        fileID
	size      int64
	ctime     int64
	blockSize int64
	// runs counts the map's runs (extentMap.appendRuns); one holds it if
	// there is one, spilled the slice if there are more.
	runs int32
	one  extentRun
	// prev is the slot of the entry closed more recently, next of the one
	// closed before.
	prev, next int32
}

// closedFileCost approximates what an entry holds in memory besides its
// runs: its slot with one run inline, its key in byID and its place in the
// free list.
const closedFileCost = 160

func (e *closedFile) cost() int64 {
	if e.runs > 1 {
		return closedFileCost + int64(e.runs)*extentRunSize
	}
	return closedFileCost + extentRunSize
}

// extentRunSize is the size of an extentRun: two int64s and a state.
const extentRunSize = 24

func newExtentCache(maxBytes int64) *extentCache {
	return &extentCache{
		maxBytes: max(0, maxBytes), now: coarseNow, tick: coarseTick(),
		byID: make(map[fileID]int32), spilled: make(map[int32][]extentRun), head: noSlot, tail: noSlot,
	}
}

// coarseNow reads CLOCK_REALTIME_COARSE: the clock the kernel stamps ctime
// with (current_time(), ktime_get_coarse_real_ts64()), in nanoseconds
// since the epoch.
func coarseNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_REALTIME_COARSE, &ts); err != nil {
		return 0 // then nothing settles and nothing is cached
	}
	return ts.Nano()
}

// coarseTick is the resolution of CLOCK_REALTIME_COARSE (a jiffy), or 10 ms,
// the longest tick Linux has (HZ=100), if the kernel does not say.
func coarseTick() int64 {
	var ts unix.Timespec
	if err := unix.ClockGetres(unix.CLOCK_REALTIME_COARSE, &ts); err != nil || ts.Nano() <= 0 {
		return 10e6
	}
	return ts.Nano()
}

// settled reports whether a file stamped with ctime, closed when the
// coarse clock read closedAt (after the fstat that gave ctime), will show
// any later change as a different ctime. The margin is a tick, or the
// filesystem's timestamp granularity where that is coarser: a filesystem
// truncates ctime to its granularity (whole seconds for ext4 with 128-byte
// inodes), so the largest power of ten that ctime is a multiple of bounds
// it (a nanosecond ctime is one by chance only once in ten, and then costs
// a few more nanoseconds of margin).
func (c *extentCache) settled(ctime, closedAt int64) bool {
	return ctimeSettled(ctime, closedAt, c.tick)
}

// ctimeSettled is settled with the clock's tick given.
func ctimeSettled(ctime, closedAt, tick int64) bool {
	if ctime <= 0 || closedAt <= 0 {
		return false
	}
	grain := int64(1)
	for grain < 1e9 && ctime%(grain*10) == 0 {
		grain *= 10
	}
	return ctime+max(tick, grain) <= closedAt
}

// put keeps the map of a file being closed, described by fi (its fstat
// just now), unless the cache is off, its ctime has not settled, or its
// runs alone would take more than an eighth of the cache. It replaces any
// entry of the same file and drops the oldest entries past the bound.
//
// Preconditions: no one can change m (the file is idle, about to be
// closed), and m is what the store knows of the file whose fstat is fi.
func (c *extentCache) put(fi FileInfo, m *extentMap) {
	if c.maxBytes == 0 || int64(m.runs())*extentRunSize > c.maxBytes/8 {
		return
	}
	if !c.settled(fi.Ctime, c.now()) {
		return
	}
	e := closedFile{id: fileID{fi.Dev, fi.Ino}, size: fi.Size, ctime: fi.Ctime, blockSize: m.blockSize, runs: int32(m.runs())}
	var runs []extentRun
	if e.runs > 1 {
		runs = m.appendRuns(nil)
	} else if e.runs == 1 {
		var one [1]extentRun
		e.one = m.appendRuns(one[:0])[0]
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.byID[e.id]; ok {
		c.removeLocked(old)
	}
	var i int32
	if n := len(c.free); n > 0 {
		i, c.free = c.free[n-1], c.free[:n-1]
	} else {
		i = int32(len(c.entries))
		c.entries = append(c.entries, closedFile{})
	}
	e.prev, e.next = noSlot, c.head
	c.entries[i] = e
	if runs != nil {
		c.spilled[i] = runs
	}
	c.byID[e.id] = i
	if c.head != noSlot {
		c.entries[c.head].prev = i
	} else {
		c.tail = i
	}
	c.head = i
	c.bytes += e.cost()
	for c.bytes > c.maxBytes && c.tail != noSlot {
		c.removeLocked(c.tail)
	}
}

// take removes the entry of the file fi describes (its fstat at open) and
// returns its map if the file is unchanged since the entry was made, or nil
// if the cache has none or the file changed; the caller then rebuilds the
// map from the file. blockSize is the block size the map must have.
func (c *extentCache) take(fi FileInfo, blockSize int64) *extentMap {
	if c.maxBytes == 0 {
		return nil
	}
	c.mu.Lock()
	i, ok := c.byID[fileID{fi.Dev, fi.Ino}]
	if !ok {
		c.mu.Unlock()
		return nil
	}
	e, runs := c.entries[i], c.spilled[i]
	c.removeLocked(i)
	c.mu.Unlock()
	if e.size != fi.Size || e.ctime != fi.Ctime || e.blockSize != blockSize {
		return nil
	}
	if e.runs == 1 {
		runs = []extentRun{e.one}
	}
	return extentMapOfRuns(runs, blockSize)
}

// forget drops the entry of id, if any: the file is open again under
// another name, or gone.
func (c *extentCache) forget(id fileID) {
	c.mu.Lock()
	if i, ok := c.byID[id]; ok {
		c.removeLocked(i)
	}
	c.mu.Unlock()
}

// removeLocked drops the entry in slot i.
//
// Preconditions: c.mu is held and slot i holds an entry.
func (c *extentCache) removeLocked(i int32) {
	e := &c.entries[i]
	if e.prev != noSlot {
		c.entries[e.prev].next = e.next
	} else {
		c.head = e.next
	}
	if e.next != noSlot {
		c.entries[e.next].prev = e.prev
	} else {
		c.tail = e.prev
	}
	delete(c.byID, e.id)
	if e.runs > 1 {
		delete(c.spilled, i)
	}
	c.bytes -= e.cost()
	*e = closedFile{}
	c.free = append(c.free, i)
}

// size reports the entries and the bytes they are counted as (gauges).
func (c *extentCache) size() (entries int, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byID), c.bytes
}
