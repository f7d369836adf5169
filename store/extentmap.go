//go:build linux

package store

import (
	"fmt"
	"math"
	"strings"
	"sync"

	"github.com/google/btree"

	"github.com/filewrite/filewrite/internal/invariants"
)

// extentRun is a maximal run of blocks [start, end) in one allocated state.
// Holes are never stored: they are the gaps between runs.
type extentRun struct {
	start, end int64
	state      ExtentState
}

func (r extentRun) String() string {
	return fmt.Sprintf("[%d,%d) %v", r.start, r.end, r.state)
}

func runLess(a, b extentRun) bool { return a.start < b.start }

// extentMapDegree is the B-tree degree. Runs are 24 bytes, so a node of up
// to 2*degree-1 items spans a few cache lines; 32 keeps the tree shallow
// (four levels for a million runs) without making inserts shift much.
const extentMapDegree = 32

// extentMap is the block-granular allocation map of one file: which blocks
// are holes, unwritten (preallocated) or written. It plays the part of the
// extent tree that ext4 guards with i_data_sem.
//
// An extentMap does no locking: the caller holds inode.extentMu around
// every call, reads included, because even a read walks the tree while a
// writer may be rebalancing it.
//
// Runs are kept in a B-tree ordered by start, never overlapping, with
// adjacent runs of equal state always coalesced, so that the representation
// of a given block layout is unique (equal compares it run by run) and a
// file cut into n pieces by random writes costs O(log n) per lookup and
// O(k log n) per update that touches k runs, never O(n).
type extentMap struct {
	blockSize int64
	tree      *btree.BTreeG[extentRun]
	// allocated is the total length of all runs, kept so that Stat does not
	// walk a map of 260k runs.
	allocated int64
	// oldRuns and newRuns are scratch space for rewrite, reused so that the
	// hot path (one block written) does not allocate.
	oldRuns, newRuns []extentRun
}

// newExtentMap returns an empty map (all holes) for blocks of blockSize
// bytes: a recycled one if there is one (recycle).
func newExtentMap(blockSize int64) *extentMap {
	if blockSize <= 0 {
		panic(fmt.Sprintf("extentMap: block size %d", blockSize))
	}
	if m, _ := recycledExtentMaps.Get().(*extentMap); m != nil {
		m.blockSize = blockSize
		return m
	}
	return &extentMap{
		blockSize: blockSize,
		tree:      btree.NewG(extentMapDegree, runLess),
	}
}

// recycledExtentMaps holds emptied maps of inodes closed for room, for the
// next inodes to open (newExtentMap): a store with more files than
// descriptors opens a file for most writes, and a map is a B-tree with a
// free list of its own, a node and two scratch slices, which a recycled
// map keeps. A sync.Pool, so that the collector bounds it.
var recycledExtentMaps sync.Pool

// recycleRuns bounds the maps recycled: emptying one returns its nodes to
// its free list one by one, and a fragmented file's map is better left to
// the collector than walked while the table is locked.
const recycleRuns = 4 * extentMapDegree

// recycle empties m for newExtentMap, unless it has more than recycleRuns
// runs; either way the caller drops m.
//
// Preconditions: nothing can reach m any more.
func (m *extentMap) recycle() {
	if m.tree.Len() > recycleRuns {
		return
	}
	m.tree.Clear(true)
	m.allocated = 0
	recycledExtentMaps.Put(m)
}

// extentMapOf builds the map of a file whose allocated extents are list
// (File.Extents), rounding each out to whole blocks of blockSize. Where
// rounding makes an unwritten and a written extent share a block, written
// wins, because the block holds data. Holes in list are skipped.
func extentMapOf(list []Extent, blockSize int64) (*extentMap, error) {
	if blockSize <= 0 {
		return nil, fmt.Errorf("extent map: block size %d", blockSize)
	}
	m := newExtentMap(blockSize)
	for _, e := range list {
		if e.Offset < 0 || e.Length < 0 || e.Offset > math.MaxInt64-e.Length {
			return nil, fmt.Errorf("extent [%d, +%d) out of range", e.Offset, e.Length)
		}
		end := e.Offset + e.Length
		switch e.State {
		case ExtentWritten:
			m.markWritten(e.Offset, end)
		case ExtentUnwritten:
			first, last := m.blocksTouched(e.Offset, end)
			m.fillHoles(first, last, ExtentUnwritten)
		}
	}
	return m, nil
}

// set makes blocks [start, end) st; ExtentHole deallocates them.
func (m *extentMap) set(start, end int64, st ExtentState) {
	m.rewrite(start, end, func(ExtentState) ExtentState { return st })
}

// fillHoles makes the hole blocks in [start, end) st and leaves allocated
// blocks alone, like fallocate(2) mode 0: written data stays written.
func (m *extentMap) fillHoles(start, end int64, st ExtentState) {
	if st == ExtentHole {
		return
	}
	m.rewrite(start, end, func(old ExtentState) ExtentState {
		if old == ExtentHole {
			return st
		}
		return old
	})
}

// rewrite gives every block of [start, end) the state next(old state). Only
// the runs overlapping or touching the range are read, so that the result
// can be coalesced with its neighbours, and only those that change are
// written back to the tree.
func (m *extentMap) rewrite(start, end int64, next func(ExtentState) ExtentState) {
	if start >= end {
		return
	}
	// Touching runs are needed too: a run ending at start may merge with
	// the new state.
	old := m.collect(m.oldRuns[:0], satSub(start, 1), satAdd(end, 1))
	nu := m.newRuns[:0]
	emit := func(s, e int64, st ExtentState) {
		if s >= e || st == ExtentHole {
			return
		}
		if n := len(nu); n > 0 && nu[n-1].end == s && nu[n-1].state == st {
			nu[n-1].end = e
			return
		}
		nu = append(nu, extentRun{s, e, st})
	}
	pos := start // first block of [start, end) not yet emitted
	for _, r := range old {
		if r.start < start {
			emit(r.start, min(r.end, start), r.state)
		}
		if gapEnd := min(r.start, end); pos < gapEnd {
			emit(pos, gapEnd, next(ExtentHole))
		}
		emit(max(r.start, start), min(r.end, end), next(r.state))
		if r.end > end {
			emit(max(r.start, end), r.end, r.state)
		}
		pos = max(pos, min(r.end, end))
	}
	emit(pos, end, next(ExtentHole))
	m.replace(old, nu)
	m.oldRuns, m.newRuns = old[:0], nu[:0]
	if invariants.Enabled {
		m.checkRuns(start, end)
	}
}

// checkRuns panics unless the runs around blocks [lo, hi) (those that
// overlap or touch it, and one more on each side) are what the map
// promises: not empty, not holes, sorted, apart, and coalesced. Only
// builds with the invariants tag call it, after each change: it costs a
// descent and the runs it reads.
func (m *extentMap) checkRuns(lo, hi int64) {
	from, skip := extentRun{start: math.MinInt64}, 2
	m.tree.DescendLessOrEqual(extentRun{start: satSub(lo, 1)}, func(r extentRun) bool {
		from = r
		skip--
		return skip > 0
	})
	var prev extentRun
	first, after := true, 0
	m.tree.AscendGreaterOrEqual(from, func(r extentRun) bool {
		switch {
		case r.start >= r.end || r.state == ExtentHole:
			panic(fmt.Sprintf("store: extent map holds the run %v", r))
		case !first && r.start < prev.end:
			panic(fmt.Sprintf("store: extent runs %v and %v overlap or are out of order", prev, r))
		case !first && r.start == prev.end && r.state == prev.state:
			panic(fmt.Sprintf("store: extent runs %v and %v are not coalesced", prev, r))
		}
		prev, first = r, false
		if r.start > hi {
			after++
		}
		return after < 2
	})
}

// replace swaps the sorted runs old, which are all in the tree, for the
// sorted runs nu covering the same span. A run in both is left in place; a
// new run with the start of an old one overwrites it in one tree operation.
func (m *extentMap) replace(old, nu []extentRun) {
	i, j := 0, 0
	for i < len(old) || j < len(nu) {
		switch {
		case j == len(nu) || (i < len(old) && old[i].start < nu[j].start):
			m.tree.Delete(old[i])
			m.allocated -= old[i].end - old[i].start
			i++
		case i == len(old) || nu[j].start < old[i].start:
			m.tree.ReplaceOrInsert(nu[j])
			m.allocated += nu[j].end - nu[j].start
			j++
		default: // same start
			if old[i] != nu[j] {
				m.tree.ReplaceOrInsert(nu[j])
				m.allocated += (nu[j].end - nu[j].start) - (old[i].end - old[i].start)
			}
			i++
			j++
		}
	}
}

// collect appends to buf the runs that overlap [lo, hi), in order.
func (m *extentMap) collect(buf []extentRun, lo, hi int64) []extentRun {
	m.ascend(lo, hi, func(r extentRun) bool {
		buf = append(buf, r)
		return true
	})
	return buf
}

// ascend calls fn, in order, for each run that overlaps [lo, hi) until fn
// returns false. It costs one descent plus the runs visited.
func (m *extentMap) ascend(lo, hi int64, fn func(extentRun) bool) {
	if lo >= hi {
		return
	}
	// Only the last run starting at or before lo can reach into the range
	// from the left: runs do not overlap.
	from := lo
	m.tree.DescendLessOrEqual(extentRun{start: lo}, func(r extentRun) bool {
		if r.end > lo {
			from = r.start
		}
		return false
	})
	m.tree.AscendRange(extentRun{start: from}, extentRun{start: hi}, fn)
}

// classify reports which states occur in blocks [start, end). It stops as
// soon as the answer cannot change.
func (m *extentMap) classify(start, end int64) (holes, unwritten, written bool) {
	if start >= end {
		return false, false, false
	}
	pos := start
	m.ascend(start, end, func(r extentRun) bool {
		if r.start > pos {
			holes = true
		}
		switch r.state {
		case ExtentUnwritten:
			unwritten = true
		case ExtentWritten:
			written = true
		}
		pos = r.end
		return !(holes && unwritten && written)
	})
	if pos < end {
		holes = true
	}
	return holes, unwritten, written
}

// truncateFrom deallocates every block at or after block, as ftruncate(2)
// does to whole blocks past the new size. It costs O(log n) per run removed,
// or O(1) when everything goes.
func (m *extentMap) truncateFrom(block int64) {
	if first, ok := m.tree.Min(); !ok || block <= first.start {
		m.tree.Clear(false)
		m.allocated = 0
		return
	}
	for {
		last, ok := m.tree.Max()
		if !ok || last.end <= block {
			return
		}
		if last.start < block {
			m.allocated -= last.end - block
			last.end = block
			m.tree.ReplaceOrInsert(last)
			return
		}
		m.tree.DeleteMax()
		m.allocated -= last.end - last.start
	}
}

// extents describes the bytes [off, off+length) as consecutive ranges, holes
// included, the first and last clipped to the query. Blocks past endBlock are
// holes. length must not be negative and off+length must not overflow.
func (m *extentMap) extents(off, length int64) []Extent {
	out, _ := m.extentsUpTo(off, length, math.MaxInt)
	return out
}

// extentsUpTo is extents, stopped after limit extents (limit > 0): more
// says whether the range holds more after the last one returned. It walks
// only the runs it returns, and one more.
func (m *extentMap) extentsUpTo(off, length int64, limit int) (out []Extent, more bool) {
	if length <= 0 || off < 0 {
		return nil, false
	}
	end := off + length
	bs := m.blockSize
	add := func(s, e int64, st ExtentState) {
		s, e = max(s, off), min(e, end)
		if s >= e || more {
			return
		}
		if n := len(out); n > 0 && out[n-1].State == st && out[n-1].Offset+out[n-1].Length == s {
			out[n-1].Length += e - s
			return
		}
		if len(out) == limit {
			// The last one is whole: this one differs from it.
			more = true
			return
		}
		out = append(out, Extent{Offset: s, Length: e - s, State: st})
	}
	pos := off // first byte not yet described
	first, last := m.blocksTouched(off, end)
	m.ascend(first, last, func(r extentRun) bool {
		s, e := byteOffset(r.start, bs), byteOffset(r.end, bs)
		add(pos, s, ExtentHole)
		add(s, e, r.state)
		pos = max(pos, e)
		return !more
	})
	add(pos, end, ExtentHole)
	return out, more
}

// allocatedBlocks is the number of unwritten and written blocks.
func (m *extentMap) allocatedBlocks() int64 { return m.allocated }

// runs is the number of runs: how fragmented the map is.
func (m *extentMap) runs() int { return m.tree.Len() }

// endBlock is one past the last allocated block, 0 when nothing is.
func (m *extentMap) endBlock() int64 {
	if last, ok := m.tree.Max(); ok {
		return last.end
	}
	return 0
}

// equal reports whether both maps give every block the same state. Runs are
// coalesced, so equal layouts have equal runs.
func (m *extentMap) equal(other *extentMap) bool {
	if m.tree.Len() != other.tree.Len() || m.allocated != other.allocated {
		return false
	}
	mine := make([]extentRun, 0, m.tree.Len())
	m.tree.Ascend(func(r extentRun) bool {
		mine = append(mine, r)
		return true
	})
	same, i := true, 0
	other.tree.Ascend(func(r extentRun) bool {
		same = r == mine[i]
		i++
		return same
	})
	return same
}

// String lists the runs, for test failures and debugging: "[0,4) unwritten
// [4,5) written".
func (m *extentMap) String() string {
	var b strings.Builder
	m.tree.Ascend(func(r extentRun) bool {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(r.String())
		return true
	})
	if b.Len() == 0 {
		return "(all holes)"
	}
	return b.String()
}

// byteOffset converts a block number to bytes, saturating rather than
// wrapping so that a map reaching towards MaxInt64 blocks still clips
// correctly against a byte range.
func byteOffset(block, blockSize int64) int64 {
	if block > math.MaxInt64/blockSize {
		return math.MaxInt64
	}
	return block * blockSize
}

// ceilBlock is n/bs rounded up: the first block boundary at or after byte
// n, as a block number. It is the store's one block-rounding helper: unlike
// (n+bs-1)/bs it cannot overflow, so a size or range end near MaxInt64
// (tmpfs allows such sizes) rounds up instead of wrapping negative.
//
// Preconditions: n >= 0 and bs > 0.
func ceilBlock(n, bs int64) int64 {
	q := n / bs
	if n%bs != 0 {
		q++
	}
	return q
}

// blocksTouched is the range of blocks [first, last) that the bytes
// [off, end) touch, partial blocks at the edges included.
func (m *extentMap) blocksTouched(off, end int64) (first, last int64) {
	return off / m.blockSize, ceilBlock(end, m.blockSize)
}

// blocksCovered is the range of blocks [first, last) that lie wholly inside
// the bytes [off, end); it is empty (first >= last) when none does.
func (m *extentMap) blocksCovered(off, end int64) (first, last int64) {
	return ceilBlock(off, m.blockSize), end / m.blockSize
}

// markWritten records that the bytes [off, end) hold data.
func (m *extentMap) markWritten(off, end int64) {
	first, last := m.blocksTouched(off, end)
	if m.within(first, last, ExtentWritten) {
		return // an overwrite of written blocks, most writes: one descent
	}
	m.set(first, last, ExtentWritten)
}

// within reports whether blocks [start, end) lie in one run of state st.
func (m *extentMap) within(start, end int64, st ExtentState) bool {
	in := false
	m.tree.DescendLessOrEqual(extentRun{start: start}, func(r extentRun) bool {
		in = r.end >= end && r.state == st
		return false
	})
	return in && start < end
}

// truncate drops the blocks wholly past a new file size, as ftruncate(2)
// frees them (the block that holds the new EOF stays).
func (m *extentMap) truncate(size int64) {
	m.truncateFrom(ceilBlock(size, m.blockSize))
}

// fallocate records what a successful fallocate(2) of the bytes [off, end)
// in mode did to the blocks, where that does not depend on the filesystem
// (Store.Fallocate reloads the map where it does).
func (m *extentMap) fallocate(mode FallocateMode, off, end int64) {
	switch mode {
	case FallocAllocate, FallocKeepSize:
		first, last := m.blocksTouched(off, end)
		m.fillHoles(first, last, ExtentUnwritten)
	case FallocPunchHole:
		// Only whole blocks are freed; partial ones are zeroed in place.
		first, last := m.blocksCovered(off, end)
		m.set(first, last, ExtentHole)
	case FallocZeroRange:
		// Like ext4: the rounded-out range is preallocated (holes at the
		// edges become unwritten), whole blocks become unwritten, and
		// partial blocks that held data are zeroed in place and stay
		// written.
		first, last := m.blocksTouched(off, end)
		m.fillHoles(first, last, ExtentUnwritten)
		first, last = m.blocksCovered(off, end)
		m.set(first, last, ExtentUnwritten)
	}
}

func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func satSub(a, b int64) int64 {
	if a < math.MinInt64+b {
		return math.MinInt64
	}
	return a - b
}

// appendRuns appends the runs, in order, to runs: what the extent cache
// keeps of a closed file, at 24 bytes a run rather than a B-tree's nodes.
// Where runs has no room for them it grows to exactly their number.
func (m *extentMap) appendRuns(runs []extentRun) []extentRun {
	if need := len(runs) + m.tree.Len(); need > cap(runs) {
		runs = append(make([]extentRun, 0, need), runs...)
	}
	m.tree.Ascend(func(r extentRun) bool {
		runs = append(runs, r)
		return true
	})
	return runs
}

// extentMapOfRuns rebuilds the map that appendRuns listed.
//
// Preconditions: runs came from appendRuns of a map of blockSize blocks.
func extentMapOfRuns(runs []extentRun, blockSize int64) *extentMap {
	m := newExtentMap(blockSize)
	for _, r := range runs {
		m.tree.ReplaceOrInsert(r)
		m.allocated += r.end - r.start
	}
	if invariants.Enabled {
		m.checkRuns(math.MinInt64, math.MaxInt64)
	}
	return m
}
