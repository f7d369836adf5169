//go:build linux

package store_test

// The power-loss test: random operations from several goroutines through
// store/crashfs, a power cut at a random moment, a store reopened on each
// of several crashed images, and a checker that holds each image to the
// durability contract of docs/guarantees.md. The checker knows nothing of crashfs's
// model: it works from the history of calls and their acknowledgements,
// and from stamps that every written unit carries (the write's id and the
// unit's offset), so that any byte can be traced to the write that put it
// there, or to none.

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store"
	"github.com/filewrite/filewrite/store/crashfs"
)

var (
	powerLossRuns = flag.Int("powerloss.runs", 3, "power cuts per policy and I/O mode in TestPowerLoss")
	powerLossSeed = flag.Uint64("powerloss.seed", 0, "seed of TestPowerLoss's first run (0: random)")
)

const (
	plUnit  = 64   // the stamp unit: every offset and length is a multiple
	plBlock = 4096 // the block the operations are aligned to or not
	plSpan  = 16 * plBlock
)

type plKind int

const (
	plWrite plKind = iota + 1
	plFsync
	plTruncate
	plFallocate
)

// plOp is one call of the history and what it returned.
type plOp struct {
	id   uint64
	kind plKind
	path string
	off  int64          // write, fallocate; truncate: the size
	n    int64          // write, fallocate
	sync store.SyncMode // write, fsync
	mode store.FallocateMode
	// call and ret are logical times, taken just before the call and just
	// after it returned: an operation whose ret is below another's call
	// completed before that one began.
	call, ret int64
	err       error
}

func (op *plOp) String() string {
	switch op.kind {
	case plWrite:
		return fmt.Sprintf("write #%d [%d,+%d) sync=%v", op.id, op.off, op.n, op.sync)
	case plFsync:
		return fmt.Sprintf("fsync #%d %v", op.id, op.sync)
	case plTruncate:
		return fmt.Sprintf("truncate #%d to %d", op.id, op.off)
	}
	return fmt.Sprintf("fallocate #%d %v [%d,+%d)", op.id, op.mode, op.off, op.n)
}

// before reports whether op completed before other was called.
func (op *plOp) before(other *plOp) bool { return op.ret < other.call }

// end is where op leaves the size if it grows it: a write's or an
// allocating fallocate's end, a truncate's size; -1 for the rest.
func (op *plOp) end() int64 {
	switch {
	case op.kind == plWrite, op.kind == plFallocate && op.mode == store.FallocAllocate:
		return op.off + op.n
	case op.kind == plTruncate:
		return op.off
	}
	return -1
}

// zeroes reports whether op can make the unit at u read as zeros (or lie
// past the end): a truncate at or below it, a punch or zero-range over it.
func (op *plOp) zeroes(u int64) bool {
	switch {
	case op.kind == plTruncate:
		return op.off <= u
	case op.kind == plFallocate && (op.mode == store.FallocPunchHole || op.mode == store.FallocZeroRange):
		return op.off <= u && u < op.off+op.n
	}
	return false
}

// stamp fills p, to be written at off of path by write id, with units that
// name the write, the unit's offset and the file.
func stamp(p []byte, path string, id uint64, off int64) {
	for i := 0; i < len(p); i += plUnit {
		fillUnit(p[i:i+plUnit], path, id, off+int64(i))
	}
}

func fillUnit(u []byte, path string, id uint64, off int64) {
	binary.LittleEndian.PutUint64(u[0:], id)
	binary.LittleEndian.PutUint64(u[8:], uint64(off))
	binary.LittleEndian.PutUint64(u[16:], pathHash(path))
	x := id*0x9E3779B97F4A7C15 ^ uint64(off)
	for i := 24; i < plUnit; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(u[i:], x)
	}
}

func pathHash(path string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(path))
	return h.Sum64()
}

// readUnit says which write put the unit u (at off of path) there: 0 for
// zeros, else the write's id; ok is false for bytes no write of this test
// would write there.
func readUnit(u []byte, path string, off int64) (id uint64, ok bool) {
	if !slices.ContainsFunc(u, func(b byte) bool { return b != 0 }) {
		return 0, true
	}
	id = binary.LittleEndian.Uint64(u)
	want := make([]byte, plUnit)
	fillUnit(want, path, id, off)
	return id, id != 0 && string(u) == string(want)
}

// plMix weighs the operations a run draws.
type plMix struct {
	write, fsync, truncate, fallocate, newFile int
	// syncs are the sync modes a write draws from, equally.
	syncs []store.SyncMode
	// unaligned is the percentage of writes not aligned to blocks.
	unaligned int
	// files is how many files exist from the start.
	files int
}

var plDefaultMix = plMix{
	write: 55, fsync: 15, truncate: 8, fallocate: 12, newFile: 10,
	syncs:     []store.SyncMode{store.SyncNone, store.SyncNone, store.SyncData, store.SyncFull},
	unaligned: 50, files: 3,
}

// plRun is one run: its options, operations and the crash.
type plRun struct {
	opts    store.Options
	mix     plMix
	seed    uint64
	workers int
	ops     int // per worker at most
	crashAt int64
	// stage, if set, replaces the random workers with a scripted history:
	// given the crashfs, it returns the FS to open the store over (the
	// crashfs or a wrapper of it) and the script, which runs operations
	// with r.do and cuts the power with r.crash. It may set r.opts.Hooks.
	stage func(t *testing.T, r *plRun, fsys *crashfs.FS) (store.FS, func(ctx context.Context, s *store.Store))

	clock   atomic.Int64
	ids     atomic.Uint64
	started atomic.Int64
	newDirs atomic.Int64

	mu      sync.Mutex
	history []*plOp
	files   []string

	crashOnce  sync.Once
	crashed    atomic.Bool
	crashClock int64
	state      *crashfs.State

	// checked counts, over the images, the durable writes held to the
	// contract in a file that was there to hold them.
	checked int
	// durableWrites counts the synced writes made durable by themselves
	// (durable.go).
	durableWrites atomic.Int64
}

func (r *plRun) String() string {
	return fmt.Sprintf("seed %d, %v/%v, fsync=%v, synced-writes=%v", r.seed, r.opts.Policy, r.opts.IO, r.opts.Fsync, r.opts.SyncedWrites)
}

// run drives the store until the crash and returns the crashed state.
func (r *plRun) run(t *testing.T, dir string) {
	t.Helper()
	ctx := context.Background()
	base, err := store.OpenOSFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	fsys := crashfs.New(base)
	var open store.FS = fsys
	var script func(context.Context, *store.Store)
	if r.stage != nil {
		open, script = r.stage(t, r, fsys)
	}
	var hooks store.Hooks
	if r.opts.Hooks != nil {
		hooks = *r.opts.Hooks
	}
	hooks.DurableWrite = func(string) { r.durableWrites.Add(1) }
	opts := r.opts
	opts.Hooks = &hooks
	s, err := store.Open(open, opts)
	if err != nil {
		t.Fatal(err)
	}
	// The files that exist from the start, each with one synced block, so
	// that a run begins with durable names and data to lose.
	for i := range r.mix.files {
		path := []string{"a", "d1/b", "d1/d2/c", "d3/e"}[i%4]
		r.files = append(r.files, path)
		r.do(ctx, s, &plOp{kind: plWrite, path: path, off: 0, n: plBlock, sync: store.SyncFull})
	}
	if script != nil {
		script(ctx, s)
		r.crash(fsys)
		s.Close() // fails: the disk is gone
		return
	}
	var wg sync.WaitGroup
	for w := range r.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(r.seed, uint64(w)+1))
			for range r.ops {
				if r.crashed.Load() {
					return
				}
				op := r.draw(rng)
				if n := r.started.Add(1); n == r.crashAt {
					// The cut comes while the other workers run.
					go r.crash(fsys)
				}
				r.do(ctx, s, op)
			}
		}()
	}
	wg.Wait()
	r.crash(fsys)
	s.Close() // fails: the disk is gone
}

func (r *plRun) crash(fsys *crashfs.FS) {
	r.crashOnce.Do(func() {
		r.mu.Lock()
		r.crashClock = r.clock.Add(1)
		r.mu.Unlock()
		r.state = fsys.Crash()
		r.crashed.Store(true)
	})
}

// draw picks the next operation.
func (r *plRun) draw(rng *rand.Rand) *plOp {
	m := r.mix
	r.mu.Lock()
	path := r.files[rng.IntN(len(r.files))]
	r.mu.Unlock()
	units := func(max int64) int64 { return rng.Int64N(max/plUnit+1) * plUnit }
	x := rng.IntN(m.write + m.fsync + m.truncate + m.fallocate + m.newFile)
	switch {
	case x < m.write, x >= m.write+m.fsync+m.truncate+m.fallocate:
		op := &plOp{kind: plWrite, path: path, sync: m.syncs[rng.IntN(len(m.syncs))]}
		if rng.IntN(100) < m.unaligned {
			op.off, op.n = units(plSpan-plUnit), plUnit+units(3*plBlock-plUnit)
			if op.off%plBlock == 0 && op.n%plBlock == 0 {
				op.n += plUnit
			}
		} else {
			op.off, op.n = rng.Int64N(plSpan/plBlock)*plBlock, (1+rng.Int64N(3))*plBlock
		}
		if x >= m.write+m.fsync+m.truncate+m.fallocate {
			k := r.newDirs.Add(1)
			op.path = fmt.Sprintf("n%d/m%d/f", k, k)
		}
		return op
	case x < m.write+m.fsync:
		return &plOp{kind: plFsync, path: path, sync: []store.SyncMode{store.SyncData, store.SyncFull}[rng.IntN(2)]}
	case x < m.write+m.fsync+m.truncate:
		if rng.IntN(2) == 0 {
			return &plOp{kind: plTruncate, path: path, off: rng.Int64N(plSpan/plBlock+1) * plBlock}
		}
		return &plOp{kind: plTruncate, path: path, off: units(plSpan)}
	}
	modes := []store.FallocateMode{store.FallocAllocate, store.FallocKeepSize, store.FallocPunchHole, store.FallocZeroRange}
	return &plOp{kind: plFallocate, path: path, mode: modes[rng.IntN(len(modes))], off: units(plSpan - plUnit), n: plUnit + units(3*plBlock)}
}

// do runs op against the store and records it.
func (r *plRun) do(ctx context.Context, s *store.Store, op *plOp) {
	op.id = r.ids.Add(1)
	var data []byte
	if op.kind == plWrite {
		data = make([]byte, op.n)
		stamp(data, op.path, op.id, op.off)
	}
	op.call = r.clock.Add(1)
	switch op.kind {
	case plWrite:
		_, op.err = s.Write(ctx, op.path, op.off, data, op.sync)
	case plFsync:
		op.err = s.Fsync(ctx, op.path, op.sync)
	case plTruncate:
		op.err = s.Truncate(ctx, op.path, op.off)
	case plFallocate:
		_, op.err = s.Fallocate(ctx, op.path, op.mode, op.off, op.n)
	}
	op.ret = r.clock.Add(1)
	r.mu.Lock()
	r.history = append(r.history, op)
	if op.kind == plWrite && op.err == nil && !slices.Contains(r.files, op.path) {
		r.files = append(r.files, op.path)
	}
	r.mu.Unlock()
}

// acked reports whether op returned OK before the power cut.
func (r *plRun) acked(op *plOp) bool { return op.err == nil && op.ret < r.crashClock }

// durable reports whether the contract makes op durable: a synced write
// acknowledged, or any change covered by an acknowledged Fsync of its
// file called after op returned.
func (r *plRun) durable(op *plOp, ops []*plOp) bool {
	if !r.acked(op) {
		return false
	}
	if op.kind == plWrite && op.sync != store.SyncNone {
		return true
	}
	for _, f := range ops {
		if f.kind == plFsync && r.acked(f) && op.before(f) {
			return true
		}
	}
	return false
}

// check holds the store s, reopened on a crashed image in dir, to the
// contract, and returns the violations found.
func (r *plRun) check(ctx context.Context, s *store.Store, dir string) []string {
	byPath := make(map[string][]*plOp)
	for _, op := range r.history {
		byPath[op.path] = append(byPath[op.path], op)
	}
	var v []string
	for _, path := range slices.Sorted(mapsKeys(byPath)) {
		v = append(v, r.checkFile(ctx, s, path, byPath[path])...)
	}
	// Nothing appears that no operation created, but the store's own
	// state.
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if rel == store.StateDir {
			return filepath.SkipDir
		}
		if d.IsDir() {
			return nil
		}
		if byPath[filepath.ToSlash(rel)] == nil {
			v = append(v, fmt.Sprintf("%s: a file no operation created", rel))
		}
		return nil
	})
	if err != nil {
		v = append(v, fmt.Sprintf("walk the image: %v", err))
	}
	return v
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func (r *plRun) checkFile(ctx context.Context, s *store.Store, path string, ops []*plOp) []string {
	var v []string
	st, err := s.Stat(ctx, path)
	if errors.Is(err, store.ErrNotFound) {
		for _, op := range ops {
			if (op.kind == plFsync || op.kind == plWrite && op.sync != store.SyncNone) && r.acked(op) {
				return []string{fmt.Sprintf("%s: %v returned OK before the crash, so the name was durable, but the file is missing", path, op)}
			}
		}
		return nil
	}
	if err != nil {
		return []string{fmt.Sprintf("%s: Stat: %v", path, err)}
	}
	size := st.Size
	data, err := s.Read(ctx, path, 0, size)
	if err != nil {
		return []string{fmt.Sprintf("%s: Read: %v", path, err)}
	}
	if size%plUnit != 0 || int64(len(data)) != size {
		return []string{fmt.Sprintf("%s: size %d and %d bytes read: no operation leaves such a size", path, size, len(data))}
	}
	writes := make(map[uint64]*plOp)
	for _, op := range ops {
		if op.kind == plWrite {
			writes[op.id] = op
		}
	}
	// Every unit is zeros or a unit some write of this file put there.
	units := make([]uint64, size/plUnit)
	for i := range units {
		off := int64(i) * plUnit
		id, ok := readUnit(data[off:off+plUnit], path, off)
		if w := writes[id]; id != 0 && (!ok || w == nil || off < w.off || off >= w.off+w.n) {
			v = append(v, fmt.Sprintf("%s: bytes [%d,+%d) were written by no write of this file (%x...)", path, off, plUnit, data[off:off+16]))
			continue
		}
		units[i] = id
	}
	// Every durable write reads back, unless an operation not ordered
	// before it overwrote, cut or zeroed it.
	for _, w := range ops {
		if w.kind != plWrite || !r.durable(w, ops) {
			continue
		}
		r.checked++
		for off := w.off; off < w.off+w.n; off += plUnit {
			var got *plOp // the write whose bytes are there, if any
			if off < size && units[off/plUnit] != 0 {
				got = writes[units[off/plUnit]]
			}
			if got == w || got != nil && !got.before(w) {
				continue
			}
			if got == nil && slices.ContainsFunc(ops, func(z *plOp) bool { return z.zeroes(off) && !z.before(w) }) {
				continue
			}
			what := "zeros"
			switch {
			case off >= size:
				what = fmt.Sprintf("past the end (size %d)", size)
			case got != nil:
				what = fmt.Sprintf("the bytes of %v, which returned before it was called", got)
			}
			v = append(v, fmt.Sprintf("%s: %v was acknowledged durable (returned at t%d, crash at t%d) but [%d,+%d) reads %s", path, w, w.ret, r.crashClock, off, plUnit, what))
			break
		}
	}
	v = append(v, r.checkSize(path, size, ops)...)
	v = append(v, r.checkExtents(ctx, s, path, st.BlockSize, units)...)
	return v
}

// checkSize: the size is one some operation gave, no smaller than a
// durable operation left it (unless a truncate not ordered before it may
// have cut it), no larger than a durable truncate left it (unless an
// operation not ordered before it may have grown it).
func (r *plRun) checkSize(path string, size int64, ops []*plOp) []string {
	if size != 0 && !slices.ContainsFunc(ops, func(op *plOp) bool { return op.end() == size }) {
		return []string{fmt.Sprintf("%s: size %d is no size an operation gave the file", path, size)}
	}
	var v []string
	for _, d := range ops {
		e := d.end()
		if e < 0 || !r.durable(d, ops) {
			continue
		}
		later := func(pred func(*plOp) bool) bool {
			return slices.ContainsFunc(ops, func(x *plOp) bool { return x != d && !x.before(d) && pred(x) })
		}
		if size < e && !later(func(x *plOp) bool { return x.kind == plTruncate && x.off < e }) {
			v = append(v, fmt.Sprintf("%s: size %d, but %v was acknowledged durable and nothing after it shrinks the file", path, size, d))
		}
		if d.kind == plTruncate && size > e && !later(func(x *plOp) bool { return x.end() >= size }) {
			v = append(v, fmt.Sprintf("%s: size %d, but %v was acknowledged durable and nothing after it grows the file", path, size, d))
		}
	}
	return v
}

// checkExtents: the extent map the reopened store rebuilt (through
// File.Extents) calls every block that holds data written.
func (r *plRun) checkExtents(ctx context.Context, s *store.Store, path string, bs int32, units []uint64) []string {
	ext, err := s.Extents(ctx, path, 0, 0)
	if err != nil {
		return []string{fmt.Sprintf("%s: Extents: %v", path, err)}
	}
	for i, id := range units {
		if id == 0 {
			continue
		}
		off := int64(i) * plUnit
		for _, e := range ext {
			if off >= e.Offset && off < e.Offset+e.Length && e.State != store.ExtentWritten {
				return []string{fmt.Sprintf("%s: the extent map rebuilt after the crash calls [%d,+%d) %v, but byte %d holds data (blocks of %d)", path, e.Offset, e.Length, e.State, off, bs)}
			}
		}
	}
	return nil
}

// plImages are the crashed images each run is checked on.
func plImages(st *crashfs.State, rng *rand.Rand) []struct {
	name string
	keep crashfs.Keep
} {
	return []struct {
		name string
		keep crashfs.Keep
	}{
		{"none", crashfs.KeepNone},
		{"all", crashfs.KeepAll},
		{"prefix", crashfs.KeepBefore(rng.Uint64N(st.LastSeq() + 1))},
		{"half", crashfs.KeepRandom(rng, 0.5)},
		{"few", crashfs.KeepRandom(rng, 0.1)},
	}
}

// powerLoss runs one crash and checks its images, returning the
// violations by image.
func powerLoss(t *testing.T, r *plRun, images func(*crashfs.State, *rand.Rand) []struct {
	name string
	keep crashfs.Keep
}) []string {
	t.Helper()
	ctx := context.Background()
	r.run(t, testutil.Dir(t))
	rng := rand.New(rand.NewPCG(r.seed, 0))
	var v []string
	for _, img := range images(r.state, rng) {
		dir := testutil.Dir(t)
		kept, err := r.state.Write(dir, img.keep)
		if err != nil {
			t.Fatalf("%v: image %s: %v", r, img.name, err)
		}
		base, err := store.OpenOSFS(dir)
		if err != nil {
			t.Fatal(err)
		}
		s, err := store.Open(base, store.Options{Policy: r.opts.Policy, IO: r.opts.IO})
		if err != nil {
			t.Fatal(err)
		}
		for _, msg := range r.check(ctx, s, dir) {
			v = append(v, fmt.Sprintf("image %q (%d pieces kept, %d lost): %s", img.name, kept.Kept, kept.Lost, msg))
		}
		if err := s.Close(); err != nil {
			t.Errorf("%v: close the store on image %s: %v", r, img.name, err)
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
	}
	return v
}

// TestPowerLoss cuts the power at a random moment of a random concurrent
// history, under every policy and both I/O modes, and checks five crashed
// images of each cut against the durability contract. The runs take the
// fsync modes in turn, and synced writes made durable by themselves or by
// a sync of the file in turn (Options.SyncedWrites). Each subtest runs
// -powerloss.runs cuts (3 by default); -powerloss.seed replays the
// operation choices of a logged seed (the interleaving is the scheduler's).
func TestPowerLoss(t *testing.T) {
	seed := *powerLossSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (-powerloss.seed=%d replays the operation choices)", seed, seed)
	fsyncs := []store.FsyncMode{store.FsyncGroup, store.FsyncPerCall, store.FsyncTimer}
	synced := []store.SyncedWriteMode{store.SyncedWritesDirect, store.SyncedWritesFsync}
	var n, ops, acked, checked int
	var durable int64
	for _, io := range []store.IOMode{store.IOBuffered, store.IODirect} {
		for _, p := range store.Policies() {
			t.Run(io.String()+"/"+p.String(), func(t *testing.T) {
				if io == store.IODirect {
					skipWithoutODirect(t)
				}
				for i := range *powerLossRuns {
					n++
					r := &plRun{
						opts: store.Options{Policy: p, IO: io, Fsync: fsyncs[i%len(fsyncs)], SyncedWrites: synced[n%len(synced)], MaxOpenFiles: 3},
						mix:  plDefaultMix, seed: seed + uint64(n), workers: 4, ops: 40,
					}
					r.crashAt = 1 + int64(rand.New(rand.NewPCG(r.seed, 0)).IntN(r.workers*r.ops))
					if v := powerLoss(t, r, plImages); len(v) > 0 {
						t.Errorf("%v, crash after %d operations: %d violations:\n%s", r, r.crashAt, len(v), strings.Join(v[:min(len(v), 10)], "\n"))
					}
					ops += len(r.history)
					for _, op := range r.history {
						if r.acked(op) {
							acked++
						}
					}
					checked += r.checked
					durable += r.durableWrites.Load()
				}
			})
		}
	}
	t.Logf("%d power cuts, %d images: %d operations, %d acknowledged before the cut; %d durable writes checked over the images; %d synced writes made durable by themselves", n, 5*n, ops, acked, checked, durable)
}

// plDurableMix is mostly aligned writes that ask for SyncData, with a few
// unsynced ones, Fsyncs and truncates, so that files go from owing a sync
// to owing none and back, and many synced writes are made durable by
// themselves (durable.go).
var plDurableMix = plMix{
	write: 80, fsync: 12, truncate: 4, fallocate: 4,
	syncs:     []store.SyncMode{store.SyncData, store.SyncData, store.SyncData, store.SyncData, store.SyncNone, store.SyncFull},
	unaligned: 10, files: 2,
}

// TestPowerLossDurableWrites is TestPowerLoss with plDurableMix, synced
// writes made durable by themselves where they can, under the policies
// that allow it, both I/O modes: the checker holds those writes, and the
// syncs and unsynced writes around them, to the contract.
func TestPowerLossDurableWrites(t *testing.T) {
	seed := *powerLossSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (-powerloss.seed=%d replays the operation choices)", seed, seed)
	var n int
	var durable int64
	for _, io := range []store.IOMode{store.IOBuffered, store.IODirect} {
		for _, p := range []store.Policy{store.PolicyUnlockedBelowEOF, store.PolicySharedOverwrite} {
			t.Run(io.String()+"/"+p.String(), func(t *testing.T) {
				skipWithoutODirect(t)
				for range *powerLossRuns {
					n++
					r := &plRun{
						opts: store.Options{Policy: p, IO: io, SyncedWrites: store.SyncedWritesDirect, MaxOpenFiles: 3},
						mix:  plDurableMix, seed: seed + uint64(n), workers: 4, ops: 40,
					}
					r.crashAt = 1 + int64(rand.New(rand.NewPCG(r.seed, 0)).IntN(r.workers*r.ops))
					if v := powerLoss(t, r, plImages); len(v) > 0 {
						t.Errorf("%v, crash after %d operations: %d violations:\n%s", r, r.crashAt, len(v), strings.Join(v[:min(len(v), 10)], "\n"))
					}
					durable += r.durableWrites.Load()
				}
			})
		}
	}
	t.Logf("%d power cuts: %d synced writes made durable by themselves", n, durable)
	if durable == 0 {
		t.Error("no synced write was made durable by itself: the test did not reach the path it is for")
	}
}

// skipWithoutODirect skips where the test directory's filesystem refuses
// O_DIRECT.
func skipWithoutODirect(t *testing.T) {
	t.Helper()
	dir := testutil.Dir(t)
	f, err := os.OpenFile(filepath.Join(dir, "probe"), os.O_RDWR|os.O_CREATE|0x4000, 0o644) // O_DIRECT
	if err != nil {
		t.Skipf("O_DIRECT is not supported here: %v", err)
	}
	f.Close()
}

// TestPowerLossCatchesBrokenDurability turns on, one at a time, four
// deliberate breaks of the durability contract (store.BrokenHooks) and expects
// the power-loss checker to report each, on the image that keeps nothing
// unsynced. Each break's run uses the operations that give it a chance:
// new files for the directory sync, aligned synced writes for the writes
// made durable by themselves, unaligned synced writes in direct mode for
// the writeback, each caught within a few random cuts. The group
// commit's break needs an interleaving that random cuts under load did
// not always give, so its run is staged (ackFromRunningStage): the checker
// must report it with the break and never without.
func TestPowerLossCatchesBrokenDurability(t *testing.T) {
	onlyNone := func(*crashfs.State, *rand.Rand) []struct {
		name string
		keep crashfs.Keep
	} {
		return []struct {
			name string
			keep crashfs.Keep
		}{{"none", crashfs.KeepNone}}
	}
	tests := []struct {
		name  string
		hooks *store.Hooks
		opts  store.Options
		mix   plMix
		want  string // in the violation
		// stage, if set, replaces the random cuts with one staged run
		// (plRun.stage), made with and without the break.
		stage func(t *testing.T, r *plRun, fsys *crashfs.FS) (store.FS, func(ctx context.Context, s *store.Store))
	}{
		{
			name:  "group commit acknowledges a write that completed after its sync started",
			hooks: store.BrokenHooks(t, store.BreakAckFromRunningSync),
			opts:  store.Options{Policy: store.PolicyUnlockedBelowEOF, Fsync: store.FsyncGroup},
			mix:   plMix{write: 1, syncs: []store.SyncMode{store.SyncData}, files: 1},
			want:  "was acknowledged durable",
			stage: ackFromRunningStage,
		},
		{
			name:  "a new file's first sync skips its directories",
			hooks: store.BrokenHooks(t, store.BreakSkipNewFileDirSync),
			opts:  store.Options{Policy: store.PolicySharedOverwrite},
			mix:   plMix{write: 1, newFile: 1, syncs: []store.SyncMode{store.SyncData, store.SyncFull}, files: 1},
			want:  "so the name was durable, but the file is missing",
		},
		{
			name:  "a synced write made durable by itself is acknowledged without its flush",
			hooks: store.BrokenHooks(t, store.BreakDirectWriteWithoutDSync),
			opts:  store.Options{Policy: store.PolicyUnlockedBelowEOF, SyncedWrites: store.SyncedWritesDirect},
			mix:   plMix{write: 1, syncs: []store.SyncMode{store.SyncData}, files: 2},
			want:  "was acknowledged durable",
		},
		{
			name:  "an unaligned direct write is acknowledged after its writeback, unsynced",
			hooks: store.BrokenHooks(t, store.BreakAckUnalignedDirectWriteBack),
			opts:  store.Options{Policy: store.PolicySharedWritten, IO: store.IODirect},
			mix:   plMix{write: 1, syncs: []store.SyncMode{store.SyncData, store.SyncFull}, unaligned: 100, files: 2},
			want:  "was acknowledged durable",
		},
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.opts.IO == store.IODirect {
				skipWithoutODirect(t)
			}
			const cuts, controls = 10, 3
			for i := range controls {
				// Without the break, the same runs are clean.
				opts := tt.opts
				opts.MaxOpenFiles = 3
				r := &plRun{opts: opts, mix: tt.mix, seed: seed + uint64(i), workers: 4, ops: 20}
				r.crashAt = 1 + int64(rand.New(rand.NewPCG(r.seed, 0)).IntN(r.workers*r.ops))
				if v := powerLoss(t, r, onlyNone); len(v) > 0 {
					t.Fatalf("without the break (%v): %s", r, strings.Join(v, "\n"))
				}
			}
			if tt.stage != nil {
				for _, broken := range []bool{false, true} {
					opts := tt.opts
					if broken {
						opts.Hooks = tt.hooks
					}
					r := &plRun{opts: opts, mix: tt.mix, seed: seed, stage: tt.stage}
					v := powerLoss(t, r, onlyNone)
					for _, op := range r.history {
						if !r.acked(op) {
							t.Fatalf("broken=%v: %v did not return OK before the cut (%v): the stage did not run as planned", broken, op, op.err)
						}
					}
					caught := slices.ContainsFunc(v, func(msg string) bool { return strings.Contains(msg, tt.want) })
					switch {
					case !broken && len(v) > 0:
						t.Errorf("without the break: %s", strings.Join(v, "\n"))
					case broken && !caught:
						t.Errorf("with the break, the checker reported no violation containing %q: %q", tt.want, v)
					case broken:
						t.Logf("caught: %s", v[0])
					}
				}
				return
			}
			for i := range cuts {
				opts := tt.opts
				opts.Hooks = tt.hooks
				opts.MaxOpenFiles = 3
				r := &plRun{opts: opts, mix: tt.mix, seed: seed + uint64(i), workers: 4, ops: 20}
				r.crashAt = 1 + int64(rand.New(rand.NewPCG(r.seed, 0)).IntN(r.workers*r.ops))
				v := powerLoss(t, r, onlyNone)
				if i := slices.IndexFunc(v, func(msg string) bool { return strings.Contains(msg, tt.want) }); i >= 0 {
					t.Logf("caught on cut %d (%v): %s", i+1, r, v[i])
					return
				}
			}
			t.Errorf("the checker reported no violation containing %q in %d cuts", tt.want, cuts)
		})
	}
}

// ackFromRunningStage stages the interleaving that the break
// AckFromRunningSync needs: a synced write W of file a completes while a
// sync of a runs that started before it, and W's caller then waits in the
// group commit. The sync is held after its syscall (so what it covers is
// fixed) until W's caller waits; then every sync runs freely, and the
// power is cut once both writes returned. With the break, W's caller is
// released by the held sync, which did not cover W, and nothing syncs W
// before the cut; without it, W returns only after a sync that started
// after it asked.
func ackFromRunningStage(t *testing.T, r *plRun, fsys *crashfs.FS) (store.FS, func(ctx context.Context, s *store.Store)) {
	hold := &holdSyncFS{FS: fsys, held: make(chan struct{}), release: make(chan struct{})}
	waiting := make(chan struct{}, 1)
	var hooks store.Hooks
	if r.opts.Hooks != nil {
		hooks = *r.opts.Hooks
	}
	hooks.WaitingForSync = func(string) {
		select {
		case waiting <- struct{}{}:
		default:
		}
	}
	r.opts.Hooks = &hooks
	return hold, func(ctx context.Context, s *store.Store) {
		if len(r.files) != 1 {
			t.Fatalf("the stage wants one file, not %v", r.files)
		}
		path := r.files[0] // made with one synced block
		var wg sync.WaitGroup
		hold.armed.Store(true)
		wg.Go(func() {
			r.do(ctx, s, &plOp{kind: plWrite, path: path, off: 0, n: plBlock, sync: store.SyncData})
		})
		<-hold.held // its sync is done and covers no later write
		wg.Go(func() {
			r.do(ctx, s, &plOp{kind: plWrite, path: path, off: plBlock, n: plBlock, sync: store.SyncData})
		})
		<-waiting // W's caller waits in the group commit
		close(hold.release)
		wg.Wait()
	}
}

// holdSyncFS passes every call to its FS, except that the first file Sync
// after armed is set, once its syscall has returned, signals held and
// waits for release to be closed before it returns.
type holdSyncFS struct {
	store.FS
	armed   atomic.Bool
	held    chan struct{}
	release chan struct{}
}

var _ store.FS = (*holdSyncFS)(nil)

func (h *holdSyncFS) OpenFile(name string, flag int, perm fs.FileMode) (store.File, error) {
	f, err := h.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return holdSyncFile{File: f, fs: h}, nil
}

type holdSyncFile struct {
	store.File
	fs *holdSyncFS
}

func (f holdSyncFile) Sync(mode store.SyncMode) error {
	err := f.File.Sync(mode)
	if f.fs.armed.CompareAndSwap(true, false) {
		f.fs.held <- struct{}{}
		<-f.fs.release
	}
	return err
}
