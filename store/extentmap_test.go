//go:build linux

package store

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// Shorthands for tables.
const (
	hole = ExtentHole
	unw  = ExtentUnwritten
	wr   = ExtentWritten
)

// blockModel is the obviously correct extent map: one state per block,
// ExtentHole past the end of the slice.
type blockModel []ExtentState

func (b blockModel) at(i int64) ExtentState {
	if i < int64(len(b)) {
		return b[i]
	}
	return ExtentHole
}

func (b *blockModel) grow(end int64) {
	for int64(len(*b)) < end {
		*b = append(*b, ExtentHole)
	}
}

func (b *blockModel) set(start, end int64, st ExtentState) {
	b.grow(end)
	for i := start; i < end; i++ {
		(*b)[i] = st
	}
}

func (b *blockModel) fillHoles(start, end int64, st ExtentState) {
	b.grow(end)
	for i := start; i < end; i++ {
		if (*b)[i] == ExtentHole {
			(*b)[i] = st
		}
	}
}

func (b *blockModel) truncateFrom(block int64) {
	if block < int64(len(*b)) {
		*b = (*b)[:max(block, 0)]
	}
}

// runs is the coalesced run list the model implies.
func (b blockModel) runs() []extentRun {
	var out []extentRun
	for i, st := range b {
		if st == ExtentHole {
			continue
		}
		if n := len(out); n > 0 && out[n-1].end == int64(i) && out[n-1].state == st {
			out[n-1].end++
			continue
		}
		out = append(out, extentRun{int64(i), int64(i) + 1, st})
	}
	return out
}

func (b blockModel) classify(start, end int64) (holes, unwritten, written bool) {
	for i := start; i < end; i++ {
		switch b.at(i) {
		case ExtentHole:
			holes = true
		case ExtentUnwritten:
			unwritten = true
		case ExtentWritten:
			written = true
		}
	}
	return
}

// extents walks the byte range one block at a time.
func (b blockModel) extents(bs, off, length int64) []Extent {
	var out []Extent
	for pos := off; pos < off+length; {
		blk := pos / bs
		e := min((blk+1)*bs, off+length)
		st := b.at(blk)
		if n := len(out); n > 0 && out[n-1].State == st {
			out[n-1].Length += e - pos
		} else {
			out = append(out, Extent{Offset: pos, Length: e - pos, State: st})
		}
		pos = e
	}
	return out
}

func dumpRuns(m *extentMap) []extentRun {
	var out []extentRun
	m.tree.Ascend(func(r extentRun) bool {
		out = append(out, r)
		return true
	})
	return out
}

// checkInvariants verifies what every operation must preserve: runs sorted,
// non-empty, non-overlapping, allocated, coalesced, and the cached counters.
func checkInvariants(m *extentMap) error {
	var prev *extentRun
	var total int64
	for _, r := range dumpRuns(m) {
		if r.start >= r.end {
			return fmt.Errorf("empty run %v", r)
		}
		if r.state != ExtentUnwritten && r.state != ExtentWritten {
			return fmt.Errorf("run %v stores state %v", r, r.state)
		}
		if prev != nil {
			if r.start < prev.end {
				return fmt.Errorf("run %v overlaps %v", r, *prev)
			}
			if r.start == prev.end && r.state == prev.state {
				return fmt.Errorf("runs %v and %v not coalesced", *prev, r)
			}
		}
		total += r.end - r.start
		prev = &r
	}
	if got := m.allocatedBlocks(); got != total {
		return fmt.Errorf("allocatedBlocks() = %d, runs sum to %d", got, total)
	}
	return nil
}

// checkModel compares every observable of m with the model, including
// classify and extents over some query ranges.
func checkModel(m *extentMap, model blockModel, queries [][2]int64) error {
	if err := checkInvariants(m); err != nil {
		return err
	}
	wantRuns := model.runs()
	if got := dumpRuns(m); !slices.Equal(got, wantRuns) {
		return fmt.Errorf("runs: got %v, want %v", got, wantRuns)
	}
	if got, want := m.runs(), len(wantRuns); got != want {
		return fmt.Errorf("runs() = %d, want %d", got, want)
	}
	var wantEnd int64
	if n := len(wantRuns); n > 0 {
		wantEnd = wantRuns[n-1].end
	}
	if got := m.endBlock(); got != wantEnd {
		return fmt.Errorf("endBlock() = %d, want %d", got, wantEnd)
	}
	bs := m.blockSize
	for _, q := range queries {
		sb, eb := q[0]/bs, q[0]/bs+q[1]/bs
		gh, gu, gw := m.classify(sb, eb)
		wh, wu, ww := model.classify(sb, eb)
		if gh != wh || gu != wu || gw != ww {
			return fmt.Errorf("classify(%d, %d) = %v %v %v, want %v %v %v", sb, eb, gh, gu, gw, wh, wu, ww)
		}
		got, want := m.extents(q[0], q[1]), model.extents(bs, q[0], q[1])
		if !reflect.DeepEqual(got, want) {
			return fmt.Errorf("extents(%d, %d):\n got %v\nwant %v", q[0], q[1], got, want)
		}
	}
	return nil
}

type mapOp struct {
	kind       byte // 's' set, 'f' fillHoles, 't' truncateFrom
	start, end int64
	state      ExtentState
}

func (o mapOp) String() string {
	switch o.kind {
	case 's':
		return fmt.Sprintf("set(%d, %d, %v)", o.start, o.end, o.state)
	case 'f':
		return fmt.Sprintf("fillHoles(%d, %d, %v)", o.start, o.end, o.state)
	}
	return fmt.Sprintf("truncateFrom(%d)", o.start)
}

func (o mapOp) apply(m *extentMap, model *blockModel) {
	switch o.kind {
	case 's':
		m.set(o.start, o.end, o.state)
		model.set(o.start, o.end, o.state)
	case 'f':
		m.fillHoles(o.start, o.end, o.state)
		model.fillHoles(o.start, o.end, o.state)
	case 't':
		m.truncateFrom(o.start)
		model.truncateFrom(o.start)
	}
}

func TestExtentMapOps(t *testing.T) {
	type run = extentRun
	tests := []struct {
		name string
		ops  []mapOp
		want []run
	}{
		{"empty range is a no-op", []mapOp{{'s', 5, 5, wr}, {'s', 7, 3, unw}}, nil},
		{"one run", []mapOp{{'s', 2, 6, unw}}, []run{{2, 6, unw}}},
		{"write inside preallocation splits it",
			[]mapOp{{'s', 0, 10, unw}, {'s', 4, 5, wr}},
			[]run{{0, 4, unw}, {4, 5, wr}, {5, 10, unw}}},
		{"adjacent writes coalesce",
			[]mapOp{{'s', 0, 10, unw}, {'s', 4, 5, wr}, {'s', 6, 7, wr}, {'s', 5, 6, wr}},
			[]run{{0, 4, unw}, {4, 7, wr}, {7, 10, unw}}},
		{"rewriting the same state changes nothing",
			[]mapOp{{'s', 0, 10, wr}, {'s', 3, 4, wr}},
			[]run{{0, 10, wr}}},
		{"writes touching on both sides merge into one run",
			[]mapOp{{'s', 0, 2, wr}, {'s', 4, 6, wr}, {'s', 2, 4, wr}},
			[]run{{0, 6, wr}}},
		{"punch splits and does not merge neighbours",
			[]mapOp{{'s', 0, 10, wr}, {'s', 3, 5, hole}},
			[]run{{0, 3, wr}, {5, 10, wr}}},
		{"set spans several runs and holes",
			[]mapOp{{'s', 0, 2, wr}, {'s', 3, 4, unw}, {'s', 6, 8, wr}, {'s', 1, 7, unw}},
			[]run{{0, 1, wr}, {1, 7, unw}, {7, 8, wr}}},
		{"fillHoles keeps written and unwritten blocks",
			[]mapOp{{'s', 2, 4, wr}, {'s', 6, 7, unw}, {'f', 0, 10, unw}},
			[]run{{0, 2, unw}, {2, 4, wr}, {4, 10, unw}}},
		{"fillHoles with hole is a no-op",
			[]mapOp{{'s', 2, 4, wr}, {'f', 0, 10, hole}},
			[]run{{2, 4, wr}}},
		{"fillHoles over allocated blocks only",
			[]mapOp{{'s', 0, 10, wr}, {'f', 2, 5, unw}},
			[]run{{0, 10, wr}}},
		{"truncate inside a run clips it",
			[]mapOp{{'s', 0, 4, unw}, {'s', 4, 8, wr}, {'s', 9, 12, unw}, {'t', 6, 0, 0}},
			[]run{{0, 4, unw}, {4, 6, wr}}},
		{"truncate at a run boundary",
			[]mapOp{{'s', 0, 4, unw}, {'s', 4, 8, wr}, {'t', 4, 0, 0}},
			[]run{{0, 4, unw}}},
		{"truncate to zero", []mapOp{{'s', 3, 4, unw}, {'s', 9, 12, wr}, {'t', 0, 0, 0}}, nil},
		{"truncate past the end", []mapOp{{'s', 3, 4, unw}, {'t', 100, 0, 0}}, []run{{3, 4, unw}}},
		{"truncate in a hole before the first run", []mapOp{{'s', 3, 4, unw}, {'t', 1, 0, 0}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newExtentMap(4096)
			var model blockModel
			for _, op := range tt.ops {
				op.apply(m, &model)
			}
			if got := dumpRuns(m); !slices.Equal(got, tt.want) {
				t.Errorf("runs: got %v, want %v", got, tt.want)
			}
			if err := checkModel(m, model, [][2]int64{{0, 20 * 4096}, {4097, 3 * 4096}}); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestExtentMapClassify(t *testing.T) {
	m := newExtentMap(4096)
	m.set(2, 4, unw)
	m.set(4, 6, wr)
	m.set(8, 9, unw)
	tests := []struct {
		start, end                int64
		holes, unwritten, written bool
	}{
		{0, 2, true, false, false},
		{2, 4, false, true, false},
		{3, 5, false, true, true},
		{4, 6, false, false, true},
		{5, 7, true, false, true},
		{0, 10, true, true, true},
		{8, 9, false, true, false},
		{9, 1 << 40, true, false, false},
		{5, 5, false, false, false},
	}
	for _, tt := range tests {
		h, u, w := m.classify(tt.start, tt.end)
		if h != tt.holes || u != tt.unwritten || w != tt.written {
			t.Errorf("classify(%d, %d): got holes=%v unwritten=%v written=%v, want %v %v %v",
				tt.start, tt.end, h, u, w, tt.holes, tt.unwritten, tt.written)
		}
	}
}

func TestExtentMapExtents(t *testing.T) {
	const bs = 4096
	m := newExtentMap(bs)
	m.set(1, 3, unw)
	m.set(3, 4, wr)
	tests := []struct {
		name        string
		off, length int64
		want        []Extent
	}{
		{"whole", 0, 5 * bs, []Extent{{0, bs, hole}, {bs, 2 * bs, unw}, {3 * bs, bs, wr}, {4 * bs, bs, hole}}},
		{"clipped both ends", bs + 100, 2*bs + 10, []Extent{{bs + 100, 2*bs - 100, unw}, {3 * bs, 110, wr}}},
		{"inside one block", 3*bs + 5, 10, []Extent{{3*bs + 5, 10, wr}}},
		{"past the end", 10 * bs, 7, []Extent{{10 * bs, 7, hole}}},
		{"empty", 0, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := m.extents(tt.off, tt.length); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestExtentMapEqual(t *testing.T) {
	a, b := newExtentMap(4096), newExtentMap(4096)
	// Same layout reached in different orders must compare equal: that is
	// what lets a test compare the store's map with FIEMAP's.
	a.set(0, 10, unw)
	a.set(3, 5, wr)
	b.set(3, 4, wr)
	b.set(4, 5, wr)
	b.fillHoles(0, 10, unw)
	if !a.equal(b) {
		t.Errorf("equal: got false for %v and %v, want true", a, b)
	}
	b.set(9, 10, wr)
	if a.equal(b) {
		t.Errorf("equal: got true for %v and %v, want false", a, b)
	}
	if got, want := newExtentMap(512).String(), "(all holes)"; got != want {
		t.Errorf("String() of an empty map: got %q, want %q", got, want)
	}
}

// TestExtentMapRandom runs random operation sequences against the model.
// Small block numbers and a tiny block size make runs touch, merge and split
// often, and unaligned byte queries exercise the clipping in extents.
func TestExtentMapRandom(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			const bs, span = 8, 96
			m := newExtentMap(bs)
			var model blockModel
			var history []mapOp
			for range 300 {
				op := randomOp(rng, span)
				history = append(history, op)
				op.apply(m, &model)
				var queries [][2]int64
				for range 4 {
					off := rng.Int64N((span + 8) * bs)
					queries = append(queries, [2]int64{off, rng.Int64N(40*bs) + 1})
				}
				if err := checkModel(m, model, queries); err != nil {
					t.Fatalf("after %v: %v", history, err)
				}
			}
		})
	}
}

func randomOp(rng *rand.Rand, span int64) mapOp {
	start := rng.Int64N(span)
	end := start + rng.Int64N(12)
	if rng.IntN(8) == 0 {
		end = start + rng.Int64N(span)
	}
	states := []ExtentState{hole, unw, wr}
	switch n := rng.IntN(10); {
	case n < 6:
		return mapOp{'s', start, end, states[rng.IntN(3)]}
	case n < 9:
		return mapOp{'f', start, end, states[1+rng.IntN(2)]}
	default:
		return mapOp{kind: 't', start: start}
	}
}

// decodeOps turns fuzz bytes into operations, 4 bytes each: kind, start,
// length, state. Block numbers stay small so that operations overlap.
func decodeOps(data []byte) []mapOp {
	var ops []mapOp
	for ; len(data) >= 4; data = data[4:] {
		start := int64(data[1] % 64)
		end := start + int64(data[2]%48)
		st := ExtentState(data[3]%3 + 1)
		switch data[0] % 3 {
		case 0:
			ops = append(ops, mapOp{'s', start, end, st})
		case 1:
			ops = append(ops, mapOp{'f', start, end, st})
		default:
			ops = append(ops, mapOp{kind: 't', start: start})
		}
	}
	return ops
}

func FuzzExtentMap(f *testing.F) {
	// Seeds: a preallocation cut by writes, a punch through a write, a
	// truncate inside a run followed by fillHoles across the cut.
	f.Add([]byte{0, 0, 40, 1, 0, 5, 1, 2, 0, 7, 1, 2, 0, 6, 1, 2})
	f.Add([]byte{0, 10, 20, 2, 0, 12, 3, 0, 1, 0, 47, 1})
	f.Add([]byte{0, 0, 30, 1, 2, 17, 0, 0, 1, 10, 20, 2, 0, 30, 5, 1})
	f.Add(binary.LittleEndian.AppendUint64(nil, 0x0102030405060708))
	f.Fuzz(func(t *testing.T, data []byte) {
		const bs = 16
		m := newExtentMap(bs)
		var model blockModel
		ops := decodeOps(data)
		// Queries come from the same bytes so that the fuzzer steers them.
		var queries [][2]int64
		for i := 0; i+3 < len(data); i += 4 {
			off := int64(binary.LittleEndian.Uint16(data[i:])) % (128 * bs)
			queries = append(queries, [2]int64{off, int64(binary.LittleEndian.Uint16(data[i+2:]))%(64*bs) + 1})
		}
		for i, op := range ops {
			op.apply(m, &model)
			if err := checkModel(m, model, queries); err != nil {
				t.Fatalf("after %v: %v", ops[:i+1], err)
			}
		}
	})
}

// TestExtentMapSetDoesNotAllocate guards the hot path: one block written
// into a fragmented preallocation must reuse the scratch slices.
func TestExtentMapSetDoesNotAllocate(t *testing.T) {
	m := newExtentMap(4096)
	m.set(0, 1<<18, unw)
	for b := int64(0); b < 1<<18; b += 4 {
		m.set(b, b+1, wr)
	}
	b := int64(2)
	got := testing.AllocsPerRun(100, func() {
		m.set(b, b+1, wr)
		b += 4
	})
	// The B-tree may allocate a node when one splits; that is amortized
	// over many inserts, so the average stays far below one.
	if got >= 1 {
		t.Errorf("allocations per set: got %v, want < 1", got)
	}
}

// BenchmarkExtentMapRandomWrites measures one 4 KiB write recorded in the map
// of a 1 GiB preallocated file (262144 blocks), the hot path of the
// shared-overwrite policy.
//
// "fresh" starts from the single unwritten run and writes random blocks, as
// a checkpoint writer would; its runs metric is the fragmentation reached.
// The runs=N cases hold the fragmentation fixed: written blocks every
// 262144/(N/2) blocks, then each op writes a random unwritten block and
// restores it, so ns/op (two set calls) can be compared across N: a B-tree
// grows with log N, a sorted slice would grow with N.
func BenchmarkExtentMapRandomWrites(b *testing.B) {
	const blocks = (1 << 30) / 4096
	b.Run("overwrite", func(b *testing.B) {
		// Writes to written blocks, as most writes of a prepared file are.
		m := newExtentMap(4096)
		m.set(0, blocks, wr)
		rng := rand.New(rand.NewPCG(1, 2))
		for b.Loop() {
			off := rng.Int64N(blocks) * 4096
			m.markWritten(off, off+4096)
		}
	})
	b.Run("fresh", func(b *testing.B) {
		m := newExtentMap(4096)
		m.set(0, blocks, unw)
		rng := rand.New(rand.NewPCG(1, 2))
		for b.Loop() {
			blk := rng.Int64N(blocks)
			m.set(blk, blk+1, wr)
		}
		b.ReportMetric(float64(m.runs()), "runs")
	})
	for _, stride := range []int64{512, 32, 2} { // ~1k, ~16k, ~262k runs
		m := newExtentMap(4096)
		m.set(0, blocks, unw)
		for blk := int64(0); blk < blocks; blk += stride {
			m.set(blk, blk+1, wr)
		}
		b.Run(fmt.Sprintf("runs=%d", m.runs()), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(3, 4))
			for b.Loop() {
				// A block strictly inside a gap between written blocks.
				blk := rng.Int64N(blocks/stride)*stride + 1 + rng.Int64N(stride-1)
				m.set(blk, blk+1, wr)
				m.set(blk, blk+1, unw)
			}
			b.ReportMetric(float64(m.runs()), "runs")
		})
	}
}

// TestCeilBlock: the one block-rounding helper rounds up without wrapping,
// up to MaxInt64.
func TestCeilBlock(t *testing.T) {
	const bs = 4096
	tests := []struct{ n, want int64 }{
		{0, 0},
		{1, 1},
		{bs, 1},
		{bs + 1, 2},
		{math.MaxInt64 - bs, math.MaxInt64 / bs},
		{math.MaxInt64 / bs * bs, math.MaxInt64 / bs},
		{math.MaxInt64, math.MaxInt64/bs + 1},
	}
	for _, tt := range tests {
		if got := ceilBlock(tt.n, bs); got != tt.want {
			t.Errorf("ceilBlock(%d, %d) = %d, want %d", tt.n, bs, got, tt.want)
		}
	}
}

// TestExtentMapBytesNearMaxInt64: the byte-range operations of the map
// (truncate, fallocate, markWritten) round ranges ending near MaxInt64 up,
// not negative: the first two blocks, written, stay written, and the blocks
// at the end get the state the operation gives them.
func TestExtentMapBytesNearMaxInt64(t *testing.T) {
	const bs, top = 4096, math.MaxInt64
	lastBlock := int64(top / bs) // the block that holds byte MaxInt64-1
	tests := []struct {
		name string
		op   func(m *extentMap)
		want []extentRun
	}{
		{"truncate to MaxInt64 twice", func(m *extentMap) { m.truncate(top); m.truncate(top) },
			[]extentRun{{0, 2, wr}}},
		{"truncate to MaxInt64-1", func(m *extentMap) { m.truncate(top - 1) },
			[]extentRun{{0, 2, wr}}},
		{"punch the last 100 bytes", func(m *extentMap) { m.fallocate(FallocPunchHole, top-100, top) },
			[]extentRun{{0, 2, wr}}},
		{"zero the last 100 bytes", func(m *extentMap) { m.fallocate(FallocZeroRange, top-100, top) },
			[]extentRun{{0, 2, wr}, {lastBlock, lastBlock + 1, unw}}},
		{"allocate the last 100 bytes", func(m *extentMap) { m.fallocate(FallocKeepSize, top-100, top) },
			[]extentRun{{0, 2, wr}, {lastBlock, lastBlock + 1, unw}}},
		{"write the last byte", func(m *extentMap) { m.markWritten(top-1, top) },
			[]extentRun{{0, 2, wr}, {lastBlock, lastBlock + 1, wr}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newExtentMap(bs)
			m.markWritten(0, 2*bs)
			tt.op(m)
			if got := dumpRuns(m); !slices.Equal(got, tt.want) {
				t.Errorf("runs: got %v, want %v", got, tt.want)
			}
		})
	}
}
