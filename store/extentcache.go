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
	byID  map[fileID]*closedFile
	// head is the most recently closed file, tail the next to drop.
	head, tail *closedFile
}

// closedFile is what the cache keeps of one closed file.
type closedFile struct {
	id        fileID
	size      int64
	ctime     int64
	blockSize int64
	// runs are the map's runs (extentMap.appendRuns): in one, most
	// often, for a file of one run spares an allocation.
	runs []extentRun
	one  [1]extentRun
	// prev is the entry closed more recently, next the one closed before.
	prev, next *closedFile
}

// closedFileCost approximates what an entry holds in memory besides its
// runs: the struct, less its run held inline, and its slot in the map.
const closedFileCost = 160

func (c *closedFile) cost() int64 {
	n := closedFileCost + int64(len(c.one))*extentRunSize
	if cap(c.runs) > len(c.one) {
		n += int64(cap(c.runs)) * extentRunSize // spilled out of one
	}
	return n
}

// extentRunSize is the size of an extentRun: two int64s and a state.
const extentRunSize = 24

func newExtentCache(maxBytes int64) *extentCache {
	c := &extentCache{maxBytes: max(0, maxBytes), now: coarseNow, tick: coarseTick(), byID: make(map[fileID]*closedFile)}
	return c
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
	if ctime <= 0 || closedAt <= 0 {
		return false
	}
	grain := int64(1)
	for grain < 1e9 && ctime%(grain*10) == 0 {
		grain *= 10
	}
	return ctime+max(c.tick, grain) <= closedAt
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
	e := &closedFile{id: fileID{fi.Dev, fi.Ino}, size: fi.Size, ctime: fi.Ctime, blockSize: m.blockSize}
	e.runs = m.appendRuns(e.one[:0])
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.byID[e.id]; old != nil {
		c.removeLocked(old)
	}
	c.byID[e.id] = e
	e.next = c.head
	if c.head != nil {
		c.head.prev = e
	} else {
		c.tail = e
	}
	c.head = e
	c.bytes += e.cost()
	for c.bytes > c.maxBytes && c.tail != nil {
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
	e := c.byID[fileID{fi.Dev, fi.Ino}]
	if e != nil {
		c.removeLocked(e)
	}
	c.mu.Unlock()
	if e == nil || e.size != fi.Size || e.ctime != fi.Ctime || e.blockSize != blockSize {
		return nil
	}
	return extentMapOfRuns(e.runs, blockSize)
}

// forget drops the entry of id, if any: the file is open again under
// another name, or gone.
func (c *extentCache) forget(id fileID) {
	c.mu.Lock()
	if e := c.byID[id]; e != nil {
		c.removeLocked(e)
	}
	c.mu.Unlock()
}

// Preconditions: c.mu is held and e is in the cache.
func (c *extentCache) removeLocked(e *closedFile) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		c.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		c.tail = e.prev
	}
	e.prev, e.next = nil, nil
	delete(c.byID, e.id)
	c.bytes -= e.cost()
}

// size reports the entries and the bytes they are counted as (gauges).
func (c *extentCache) size() (entries int, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byID), c.bytes
}
