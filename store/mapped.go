//go:build linux

package store

import (
	"math/bits"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Mapped writes.
//
// A buffered pwrite(2) of 4 KiB over blocks the file already holds costs
// the kernel more than the copy: the syscall, the inode's rwsem (which
// ext4 takes exclusively for every buffered write, so concurrent writers
// of one file queue in the kernel whatever the store's policy lets
// through) and, for a file first written in large pieces, a walk over
// every buffer head of the large page-cache folio the bytes land in
// (ext4_block_write_begin). A store into a shared, writable mapping of the
// file (mmap(2), MAP_SHARED) of a page already mapped writable is a copy
// and nothing else: the page is in the page cache and marked dirty by the
// fault that mapped it, and writeback, Read, fsync and every other
// descriptor of the file see the bytes as they see a pwrite's.
//
// So a file that keeps being overwritten gets a mapping, and an overwrite
// goes through it when all of these hold (writeMapped):
//   - the store writes through the page cache (IOBuffered), and the file
//     is the operating system's (faultfs and crashfs, the test layers,
//     offer no mapping, and their writes stay the pwrites they inject
//     faults into);
//   - the write is not an append, and ends before the page that holds the
//     file's last byte (the EOF page): under the lock or counted in
//     flight, no truncate of the store's can cut the file below it
//     meanwhile, and one from outside is caught (see below);
//   - every block it touches is written (the extent map): a store into a
//     hole or an unwritten block would have the page fault allocate or
//     convert it, and a fault cannot report ENOSPC but as SIGBUS;
//   - every page it touches is known to be in the page cache (resident):
//     a store to a page that is not reads it from the disk inside the page
//     fault, holding its thread where Go's scheduler cannot hand the
//     thread's work on (a pwrite is a syscall, and can), and for a whole
//     page it would read what it then overwrites;
//   - the write's 2 MiB region of the file is hot: it took writes to
//     half its blocks (hotWrites; fewer where the file's end cuts the
//     region short, but never fewer than hotMinWrites) since the file's
//     last sync and within the current hotPeriod, or did so in the period
//     before with no sync since (a region written steadily stays hot
//     across periods; one whose writer turned sparse stays so for one
//     period more at most). The first store to a page after the kernel
//     cleaned it (a sync, writeback) faults, and the fault
//     (block_page_mkwrite) marks every block of the page's folio dirty,
//     up to 2 MiB for a file written in large pieces, where a pwrite
//     marks the blocks it wrote: the next writeback or sync would write
//     the whole folio. In a region that many writes reach between two
//     cleanings, pwrites dirty most of it anyway, and the extra I/O the
//     faults cause stays small; a durable writer, whose syncs clean the
//     pages after a few writes, and a sparse one stay with pwrite. The
//     file is mapped only once a write finds its region hot: the writes
//     are counted (inodeMap.heat) before there is a mapping, so a file
//     written a few times between reopens, or a byte overwritten a few
//     times, never costs one;
//   - the file is not larger than Options.MapFileBytes, and a mapping can
//     be had within the bounds below.
//
// Otherwise the write is a pwrite, as before, which also marks its pages
// resident.
//
// A file cut short from outside the store. Truncating a file drops its
// pages past the new end from the page cache and from every mapping, so
// that a store to them faults (SIGBUS); but the page that holds the new
// end stays, and a store past the end within it lands in memory the file
// no longer reaches: acknowledged, and lost without a fault. So no write
// goes through the mapping into the store's own EOF page, and after each
// store the writer reads the first byte of that page through the mapping
// (the probe; that page is resident, its entry in the page tables is
// there after the first probe, and the read costs a load): if the file
// was cut anywhere below the EOF page, every page from the one after the
// cut on is gone, the EOF page with them, and the probe faults. A fault,
// of the store or of the probe (debug.SetPanicOnFault recovers it), turns
// the mapping off while the file stays open, the write is made again with
// pwrite, and the writer checks the file under the exclusive lock
// (checkCut, cut.go): found shorter than the store made it, the call
// reports ErrChangedOutside. A cut into the EOF page itself loses no
// mapped store (none goes there), and is found by the next Stat or sync.
// A truncate that lands after a write's probe comes after that write.
//
// Timestamps: a pwrite sets the file's mtime and ctime; a store into a
// page already mapped writable sets neither (the kernel sets them when the
// page faults). The store sets them itself (touch), once, before the next
// Stat (whose ctime the service's ETag and Last-Modified are made of),
// sync, or close of a file written through its mapping since, so that
// they move after such writes as they do after pwrites, if later.
//
// Bounds. Each mapping is a VMA of the process, and the kernel allows a
// process vm.max_map_count of them (65,530 by default): past it, every
// mmap(2) fails, the Go runtime's too, and the runtime cannot grow its
// heap (fatal error: runtime: cannot allocate memory). So the mappings of
// all stores of the process together are bounded in number
// (mappingBound: half of vm.max_map_count, read when the first store
// opens; the other half is the runtime's and the rest of the process's),
// and in address space (maxMappedBytes, per store). A file that would pass
// either is written with pwrite until a later write finds room.
//
// Lifetime. A writer that found the mapping goes on storing into it until
// its write returns, so a mapping is unmapped only when no writer can hold
// it: when the inode closes (no reference left), or, for one replaced, by
// whoever next holds the inode lock exclusively with no write in flight
// (unmapRetired: every truncate, Fallocate that waits, Delete, Rename, and
// every write that extends the file). When the file grows past its
// mapping, a longer one replaces it for new writes and the old one is
// retired until then; lengths double, and the file's next extending write
// unmaps the one retired, so a file that grows holds its mapping and at
// most one retired, not one per doubling.

// hotRegion, hotWrites, hotMinWrites and hotPeriod say when a region of a
// file is hot enough to be written through its mapping (see above):
// hotRegion is the largest page-cache folio on x86-64 (PMD_SIZE),
// hotWrites half of its blocks, hotMinWrites the fewest writes that earn a
// mapping (its syscalls and, at close, its unmapping cost about as much as
// this many pwrites save), and hotPeriod the flusher's default wake-up
// interval (dirty_writeback_centisecs).
const (
	hotRegion    = 2 << 20
	hotWrites    = 256
	hotMinWrites = 8
	hotPeriod    = 5 * time.Second
)

// minMapBytes is the shortest mapping made: a small file that grows does
// not remap at every page.
const minMapBytes = 1 << 20

// maxMappedBytes bounds the address space all mappings of a store take
// together (a mapping costs no memory until its pages are touched, but the
// address space is finite): past it, files are written with pwrite.
const maxMappedBytes = 1 << 42

// liveMappings counts the mappings the process's stores hold, retired ones
// included: each is a VMA (see Bounds above).
var liveMappings atomic.Int64

// mappingBound is the most mappings the process's stores hold together:
// half of vm.max_map_count, read once, when the first store opens.
var mappingBound = sync.OnceValue(func() int64 {
	n := int64(defaultMaxMapCount)
	if b, err := os.ReadFile("/proc/sys/vm/max_map_count"); err == nil {
		if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && v > 0 {
			n = v
		}
	}
	return n / 2
})

// defaultMaxMapCount is Linux's default vm.max_map_count
// (DEFAULT_MAX_MAP_COUNT), assumed where /proc does not say.
const defaultMaxMapCount = 65530

// pageSize is the page cache's unit, the unit of residency.
var pageSize = int64(os.Getpagesize())

// mappable is a File whose bytes can be mapped into memory: the operating
// system's files (osFile).
type mappable interface {
	// Map is mmap(2) of the file's first length bytes, shared and
	// writable.
	Map(length int64) ([]byte, error)
	// Unmap is munmap(2) of a mapping Map returned.
	Unmap(b []byte) error
	// Resident sets vec[i] bit 0 for each page i of b in the page cache
	// (mincore(2)); len(vec) is the pages of b.
	Resident(b []byte, vec []byte) error
	// TouchModified sets the file's mtime, and so its ctime, to now and
	// leaves its atime (futimens(2)).
	TouchModified() error
}

// fileMap is one mapping of a file. It is immutable but for the resident
// bits.
type fileMap struct {
	b []byte
	// resident has a bit per page of b, set once the page is known to be
	// in the page cache: by mincore when mapped, or by a pwrite to it
	// since. A page evicted later (clean, and memory short) keeps its bit:
	// a store to it then reads it in inside its page fault.
	resident []atomic.Uint64
}

// regionHeat counts the writes to each hotRegion of a file, up to covers
// bytes (the length a mapping of the file made now would have). A word
// holds the stamp (see inodeMap.stamp) of the period its writes were made
// in, in the high 48 bits (heatStampShift), heatCarried if the region was
// hot in the period before, and the writes made in this one in the low
// 15, counted until the region is hot by its own writes.
type regionHeat struct {
	covers int64
	words  []atomic.Uint64
}

// The fields of a regionHeat word.
const (
	heatStampShift = 16
	heatCarried    = 1 << 15
	heatCount      = heatCarried - 1
)

// hot counts a write at off in the period stamp and reports whether its
// region was hot already: it took writes to half its blocks, hotWrites for
// a whole region, fewer for one that the file's end (size) cuts short,
// whose folios are as short, but at least hotMinWrites (a 64 KiB file is
// hot after 8 writes), in this period or in the one before it, with no
// sync between (stamp is one more: inodeMap.stamp). A write that crosses
// into the next region is judged by the region it starts in. With peek
// (TryWrite, whose write a worker makes again if it is refused) a write is
// counted only where the region is hot, so that none counts twice.
//
// Preconditions: off < h.covers.
func (h *regionHeat) hot(off, size, blockSize int64, stamp uint64, peek bool) bool {
	c := &h.words[off/hotRegion]
	v := c.Load()
	start := off / hotRegion * hotRegion
	need := uint64(max(hotMinWrites, min(hotWrites, (min(size, start+hotRegion)-start)/blockSize/2)))
	if was := v >> heatStampShift; was != stamp {
		// The region's first write of the period, or since a sync.
		carried := was+1 == stamp && v&heatCount >= need
		nv := stamp << heatStampShift
		if carried {
			nv |= heatCarried
		}
		if carried || !peek {
			nv++
		}
		c.CompareAndSwap(v, nv)
		return carried
	}
	hot := v&heatCarried != 0 || v&heatCount >= need
	if v&heatCount < need && (hot || !peek) {
		// Counted on while carried, so that a region written steadily
		// is hot by its own writes at the period's end, and carried on.
		c.Add(1)
	}
	return hot
}

// residentRange reports whether every page of [off, end) has its bit.
func (m *fileMap) residentRange(off, end int64) bool {
	for p := off / pageSize; p*pageSize < end; p++ {
		if m.resident[p/64].Load()&(1<<(p%64)) == 0 {
			return false
		}
	}
	return true
}

// markResident sets the bits of the pages of [off, end) within m.
func (m *fileMap) markResident(off, end int64) {
	end = min(end, int64(len(m.b)))
	for p := off / pageSize; p*pageSize < end; p++ {
		w, bit := &m.resident[p/64], uint64(1)<<(p%64)
		if w.Load()&bit == 0 {
			w.Or(bit)
		}
	}
}

// inodeMap is an inode's mapping state.
type inodeMap struct {
	// limit is the largest file mapped (Options.MapFileBytes), 0 where the
	// file cannot be mapped (IODirect, a file layer without mappable, the
	// option off). Immutable after open.
	limit int64
	// cur is the mapping writes use, nil until a write found its region
	// hot. Stored with mu held; read atomically, by writers that hold the
	// inode lock in some mode or are counted in flight, and by unmapAll
	// once no reference to the inode is left.
	cur atomic.Pointer[fileMap]
	// heat counts the writes to the file's regions (hot), nil until the
	// first write that may go through a mapping. Replaced by a longer one,
	// with mu held, when the file outgrows it; read atomically by writers.
	// A write that counts in one being replaced is lost to the count,
	// which is only a guess.
	heat atomic.Pointer[regionHeat]
	// off is set once the mapping failed (mmap refused, a store or probe
	// faulted, the file was found cut from outside, the timestamps could
	// not be set): writes are pwrites until the file is opened again.
	off atomic.Bool
	// unchecked is set when a TryWrite's store or probe faulted: the next
	// Write (the one that makes the refused write) checks the file
	// (mappedFaulted) and clears it.
	unchecked atomic.Bool
	// stale is set by a store into the mapping, and cleared by touch,
	// which then sets the file's timestamps.
	stale atomic.Bool
	// eager is Hooks.mapEagerly: every region hot. Immutable after open.
	eager bool
	// syncs counts the file's syncs (syncFile), for stamp.
	syncs atomic.Uint32
	// mu guards retired, and serialises making mappings and heat.
	mu sync.Mutex
	// retired are the mappings cur replaced, unmapped once no writer can
	// hold them (unmapRetired, unmapAll). Guarded by mu; hasRetired says
	// whether there are any, for a look without mu.
	retired    []*fileMap
	hasRetired atomic.Bool
}

// stamp names the period in which a region's writes are counted, 48 bits
// of a heat word: the file's syncs in the high 24, the hotPeriods since
// the Unix epoch in the low 24. It changes with every sync of the file and
// every hotPeriod; the stamp of the next period with no sync between is
// one more. Each half wraps (after 16 million syncs, and in 2.6 years),
// which at worst takes one period's heat for another's.
func (mp *inodeMap) stamp() uint64 {
	const half = 1<<24 - 1
	syncs := uint64(mp.syncs.Load()) & half
	return syncs<<24 | uint64(time.Now().UnixNano()/int64(hotPeriod))&half
}

// initMapping sets up ino's mapping state at open.
func (ino *inode) initMapping(t *inodeTable) {
	if t.opts.MapFileBytes > 0 && ino.direct == nil {
		if _, ok := ino.file.(mappable); ok {
			ino.mapping.limit = t.opts.MapFileBytes
		}
	}
	ino.mapping.eager = t.opts.Hooks != nil && t.opts.Hooks.mapEagerly
}

// mapLength is the length of a mapping, or of the heat, made for a file of
// size bytes: the next power of two, and at least minMapBytes.
func mapLength(size int64) int64 {
	return max(minMapBytes, int64(1)<<bits.Len64(uint64(size-1)))
}

// heatFor returns the file's heat, made or made longer now if it does not
// cover size bytes.
func (mp *inodeMap) heatFor(size int64) *regionHeat {
	if h := mp.heat.Load(); h != nil && size <= h.covers {
		return h
	}
	mp.mu.Lock()
	defer mp.mu.Unlock()
	old := mp.heat.Load()
	if old != nil && size <= old.covers {
		return old // another writer made it meanwhile
	}
	covers := mapLength(size)
	h := &regionHeat{covers: covers, words: make([]atomic.Uint64, (covers+hotRegion-1)/hotRegion)}
	if old != nil {
		for i := range old.words {
			h.words[i].Store(old.words[i].Load())
		}
	}
	mp.heat.Store(h)
	return h
}

// mapOutcome is what writeMapped did.
type mapOutcome int

const (
	// mappedNot: the write is no candidate; the caller makes it with
	// pwrite.
	mappedNot mapOutcome = iota
	// mappedDone: the bytes went through the mapping.
	mappedDone
	// mappedFaulted: a store or probe faulted, or a TryWrite's did since
	// the last check (inodeMap.unchecked): the caller makes the write with
	// pwrite and then checks the file (checkCut), which may have been cut
	// short from outside.
	mappedFaulted
)

// writeMapped stores data at off through ino's mapping, if the write
// qualifies (see "Mapped writes" above), and says what it did; if it did
// not store it, the caller writes with pwrite and then calls wroteResident.
// With try (tryWrite, whose caller makes the write again if it is refused)
// it neither counts the write nor makes a mapping: it only uses what is
// there, and a fault is left for the write made again to report.
//
// Preconditions: ino.lock is held in some mode, or the write is counted in
// flight (ino.inflight) having registered under it; the write is not an
// append.
func (ino *inode) writeMapped(off int64, data []byte, try bool) mapOutcome {
	mp := &ino.mapping
	if mp.limit == 0 {
		return mappedNot
	}
	if mp.off.Load() {
		if !try && mp.unchecked.Load() && mp.unchecked.Swap(false) {
			return mappedFaulted
		}
		return mappedNot
	}
	end, size := off+int64(len(data)), ino.size.Load()
	eofPage := (size - 1) / pageSize * pageSize
	if end > eofPage {
		return mappedNot // past the size, or into the EOF page
	}
	m := mp.cur.Load()
	if try && (m == nil || size > int64(len(m.b))) {
		return mappedNot
	}
	if !mp.eager {
		h := mp.heat.Load()
		if h == nil || size > h.covers {
			if try {
				return mappedNot // heatFor may wait for a remap's syscalls
			}
			h = mp.heatFor(size)
		}
		if !h.hot(off, size, ino.blockSize, mp.stamp(), try) {
			return mappedNot
		}
	}
	if m == nil || size > int64(len(m.b)) {
		if m = ino.remap(size); m == nil {
			return mappedNot
		}
	}
	if !m.residentRange(off, end) || !m.residentRange(eofPage, eofPage+1) {
		return mappedNot
	}
	// Last, as the one lock: a write that is no candidate (a durable
	// writer's, a sparse one's) goes to its pwrite without it.
	ino.extentMu.Lock()
	first, last := ino.extents.blocksTouched(off, end)
	written := ino.extents.within(first, last, ExtentWritten)
	ino.extentMu.Unlock()
	if !written {
		return mappedNot
	}
	if _, ok := storeMapped(m.b[off:end], data, &m.b[eofPage]); !ok {
		mp.off.Store(true)
		if try {
			mp.unchecked.Store(true)
			return mappedNot
		}
		return mappedFaulted
	}
	if !mp.stale.Load() {
		mp.stale.Store(true)
	}
	return mappedDone
}

// wroteResident records that a pwrite put [off, end) in the page cache.
func (ino *inode) wroteResident(off, end int64) {
	if m := ino.mapping.cur.Load(); m != nil {
		m.markResident(off, end)
	}
}

// storeMapped copies src to dst, a slice of a mapping, then reads the
// byte at probe, in the same mapping, and returns it (so that the read is
// made); it reports false if a page fault could not be served (SIGBUS:
// the page lies past the file's end, cut from outside the store, or the
// kernel could not back it), which debug.SetPanicOnFault turns into a
// panic recovered here. Part of src may have been stored.
func storeMapped(dst, src []byte, probe *byte) (b byte, ok bool) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	copy(dst, src)
	return *probe, true
}

// remap returns a mapping of ino at least end bytes long, making one if
// the current one is missing or shorter, or nil if none can be made (and
// the file's mapping off, unless a bound refused it for now).
func (ino *inode) remap(end int64) *fileMap {
	mp := &ino.mapping
	if liveMappings.Load() >= ino.table.maxMappings {
		return nil // at the bound: no lock taken, pwrite for now
	}
	mp.mu.Lock()
	defer mp.mu.Unlock()
	old := mp.cur.Load()
	if old != nil && end <= int64(len(old.b)) {
		return old // another writer made it meanwhile
	}
	if mp.off.Load() {
		return nil
	}
	size := ino.size.Load()
	if size > mp.limit || size < end {
		mp.off.Store(true)
		return nil
	}
	length := mapLength(size)
	// Within the bounds, or not now: a later write may find room.
	t := ino.table
	if liveMappings.Add(1) > t.maxMappings {
		liveMappings.Add(-1)
		return nil
	}
	if t.mappedBytes.Add(length) > maxMappedBytes {
		t.mappedBytes.Add(-length)
		liveMappings.Add(-1)
		return nil
	}
	f := ino.file.(mappable)
	b, err := f.Map(length)
	if err != nil {
		t.mappedBytes.Add(-length)
		liveMappings.Add(-1)
		mp.off.Store(true)
		return nil
	}
	pages := (length + pageSize - 1) / pageSize
	m := &fileMap{b: b, resident: make([]atomic.Uint64, (pages+63)/64)}
	// Seed the bits from the page cache as it is now, up to the size
	// (mincore of pages past it says nothing useful).
	upto := (size + pageSize - 1) / pageSize
	vec := make([]byte, upto)
	if err := f.Resident(b[:upto*pageSize], vec); err == nil {
		for p, v := range vec {
			if v&1 != 0 {
				m.resident[p/64].Or(1 << (p % 64))
			}
		}
	}
	if old != nil {
		for i := range old.resident {
			m.resident[i].Or(old.resident[i].Load())
		}
		mp.retired = append(mp.retired, old)
		mp.hasRetired.Store(true)
	}
	mp.cur.Store(m)
	return m
}

// touch sets the file's mtime and ctime to now if a store into its mapping
// changed it since they were last set. If they cannot be set, the mapping
// is not used again (pwrites set them themselves).
func (ino *inode) touch() {
	mp := &ino.mapping
	if !mp.stale.Load() || !mp.stale.Swap(false) {
		return
	}
	if err := ino.file.(mappable).TouchModified(); err != nil {
		mp.off.Store(true)
	}
}

// unmapAll unmaps every mapping of ino, setting its timestamps first if
// they are owed and the file still has a name.
//
// Preconditions: no write can be using a mapping: no reference to ino is
// left, or ino.lock is held exclusively with no write in flight.
func (ino *inode) unmapAll() {
	mp := &ino.mapping
	cur := mp.cur.Load()
	if cur == nil {
		return
	}
	if !ino.deleted.Load() && !ino.unlinked.Load() {
		ino.touch()
	}
	mp.mu.Lock()
	maps := append(mp.retired, cur)
	mp.retired = nil
	mp.hasRetired.Store(false)
	mp.cur.Store(nil)
	mp.mu.Unlock()
	ino.unmap(maps)
}

// unmapRetired unmaps the mappings that replaced ones retired, if any.
//
// Preconditions: ino.lock is held exclusively and no write is in flight,
// so no writer can be storing into a retired mapping.
func (ino *inode) unmapRetired() {
	mp := &ino.mapping
	if !mp.hasRetired.Load() {
		return
	}
	mp.mu.Lock()
	maps := mp.retired
	mp.retired = nil
	mp.hasRetired.Store(false)
	mp.mu.Unlock()
	ino.unmap(maps)
}

// unmap unmaps maps, which no writer can hold any more, and gives their
// room back to the bounds.
func (ino *inode) unmap(maps []*fileMap) {
	f := ino.file.(mappable)
	for _, m := range maps {
		f.Unmap(m.b)
		ino.table.mappedBytes.Add(-int64(len(m.b)))
		liveMappings.Add(-1)
	}
}
