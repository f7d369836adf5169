//go:build linux

package store

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"golang.org/x/sys/unix"
)

// The linearizability test drives one small file with several concurrent
// clients and checks the history against a sequential model of the file.
//
// The model does not track every byte: the kernel makes neither a buffered
// pread atomic against a concurrent pwrite across bytes, nor does the store
// lock writes below EOF under every policy, so a read of many bytes may
// legitimately see a mix of two writes. Instead the file is four blocks with
// two one-byte probes each, at the block's start ("head") and middle
// ("mid"). Every read reads one probe; every write sets whole probes; bytes
// between probes are never looked at.
const (
	linBlock  = 4096
	linBlocks = 4
	linProbes = 2 * linBlocks
)

// probeOffset is the file offset of probe p: heads at even p, mids at odd.
func probeOffset(p int) int64 {
	return int64(p/2)*linBlock + int64(p%2)*linBlock/2
}

// linState is the model: the size and the probes. A probe at or past the
// size is always zero, so that a file that grows again reads zeros there.
// It is a comparable value, as porcupine's default equality wants.
type linState struct {
	size   int64
	probes [linProbes]byte
}

// clip zeroes the probes at or past the size.
func (s linState) clip() linState {
	for p := range s.probes {
		if probeOffset(p) >= s.size {
			s.probes[p] = 0
		}
	}
	return s
}

func (s linState) String() string {
	return fmt.Sprintf("size=%d probes=%v", s.size, s.probes)
}

type linKind int

const (
	linWriteHead  linKind = iota // 1 byte at block i's head: unaligned
	linWriteBlock                // block i whole: aligned (O_DIRECT in direct mode)
	linWriteSpan                 // from block i's mid to block i+1's head inclusive: unaligned, two blocks
	linRead                      // 2 bytes at a probe: the probe's byte and, by the count, the size
	linTruncate
	linStat
	linFallocate // one whole block
	// linClose closes the file as the table does to make room, if it is
	// idle, once its last change is old enough for the close to keep its
	// extent map: the next operation reopens it, from the extent cache.
	linClose
	// linOutside closes the file likewise (if idle; else it does nothing)
	// and, with the table locked so that no operation can reopen it
	// meanwhile, changes it from outside the store: a byte at block i's
	// head (outHead), block i punched (outPunch) or blocks preallocated
	// past the end (outKeepSize, which no read can see).
	linOutside
	// linFinal runs alone after all clients finished: it compares the
	// store's size with the file's real size and reads every probe from
	// the file itself, so that a write that landed past a truncate (which
	// the store's own Read would hide behind its size) is seen.
	linFinal
)

// outsideChange is what linOutside does to the file.
type outsideChange int

const (
	outHead outsideChange = iota
	outPunch
	outKeepSize
)

type linInput struct {
	kind  linKind
	block int           // writes, fallocate
	probe int           // read
	val   byte          // writes
	size  int64         // truncate
	mode  FallocateMode // fallocate
	out   outsideChange // outside
}

type linOutput struct {
	err  error
	n    int   // read: bytes returned
	b    byte  // read: the probe's byte, if n > 0
	size int64 // write (the size it returned), stat, final
	// applied says whether linOutside found the file idle and changed it.
	applied bool
	// final only: the size and probes of the file as the kernel has it.
	diskSize   int64
	diskProbes [linProbes]byte
}

// writeRange is the byte range a write input covers.
func (in linInput) writeRange() (int64, int64) {
	base := int64(in.block) * linBlock
	switch in.kind {
	case linWriteHead:
		return base, base + 1
	case linWriteBlock:
		return base, base + linBlock
	}
	return base + linBlock/2, base + linBlock + 1
}

// step is the sequential specification of one operation. Writes are checked
// through later reads, and through the size they return: at least the size
// the write leaves, never exactly. The store reads that size after the
// data landed but while the write still holds its lock mode or is counted
// in flight, where no truncate can finish but an extending write (which
// does not wait for writes in flight) can; so it may include an extension
// that the reads order after this write, and only "at least" holds in
// every order. A size below the write's own end is illegal in any order.
func (s linState) step(in linInput, out linOutput) (bool, linState) {
	if out.err != nil {
		return false, s
	}
	switch in.kind {
	case linWriteHead, linWriteBlock, linWriteSpan:
		off, end := in.writeRange()
		for p := range s.probes {
			if o := probeOffset(p); o >= off && o < end {
				s.probes[p] = in.val
			}
		}
		s.size = max(s.size, end)
		return out.size >= s.size, s
	case linRead:
		off := probeOffset(in.probe)
		want := int(min(2, max(0, s.size-off)))
		if out.n != want {
			return false, s
		}
		return want == 0 || out.b == s.probes[in.probe], s
	case linTruncate:
		s.size = in.size
		return true, s.clip()
	case linStat:
		return out.size == s.size, s
	case linFinal:
		return out.size == s.size && out.diskSize == s.size && out.diskProbes == s.probes, s
	case linClose:
		return true, s
	case linOutside:
		if !out.applied {
			return true, s
		}
		switch in.out {
		case outHead:
			off := int64(in.block) * linBlock
			s.probes[2*in.block] = in.val
			s.size = max(s.size, off+1)
		case outPunch:
			s.probes[2*in.block], s.probes[2*in.block+1] = 0, 0
		}
		return true, s
	case linFallocate:
		base := int64(in.block) * linBlock
		switch in.mode {
		case FallocAllocate:
			s.size = max(s.size, base+linBlock)
		case FallocPunchHole, FallocZeroRange:
			s.probes[2*in.block], s.probes[2*in.block+1] = 0, 0
		}
		return true, s
	}
	return false, s
}

func (in linInput) String() string {
	switch in.kind {
	case linWriteHead:
		return fmt.Sprintf("write head %d = %d", in.block, in.val)
	case linWriteBlock:
		return fmt.Sprintf("write block %d = %d", in.block, in.val)
	case linWriteSpan:
		return fmt.Sprintf("write mid %d..head %d = %d", in.block, in.block+1, in.val)
	case linRead:
		return fmt.Sprintf("read probe %d @%d", in.probe, probeOffset(in.probe))
	case linTruncate:
		return fmt.Sprintf("truncate %d", in.size)
	case linStat:
		return "stat"
	case linFallocate:
		return fmt.Sprintf("fallocate %v block %d", in.mode, in.block)
	case linClose:
		return "close"
	case linOutside:
		switch in.out {
		case outHead:
			return fmt.Sprintf("outside: write head %d = %d", in.block, in.val)
		case outPunch:
			return fmt.Sprintf("outside: punch block %d", in.block)
		}
		return "outside: preallocate past the end"
	case linFinal:
		return "final check"
	}
	return fmt.Sprintf("linKind(%d)", int(in.kind))
}

var linModel = porcupine.Model{
	Init: func() any { return linState{} },
	Step: func(state, input, output any) (bool, any) {
		return state.(linState).step(input.(linInput), output.(linOutput))
	},
	Hash: func(state any) uint64 {
		s := state.(linState)
		h := uint64(s.size)
		for _, b := range s.probes {
			h = h*31 + uint64(b)
		}
		return h
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(linInput), output.(linOutput)
		switch {
		case out.err != nil:
			return fmt.Sprintf("%v -> error %v", in, out.err)
		case in.kind == linRead && out.n > 0:
			return fmt.Sprintf("%v -> %d bytes, probe %d", in, out.n, out.b)
		case in.kind == linRead:
			return fmt.Sprintf("%v -> empty", in)
		case in.kind == linStat, in.kind == linWriteHead, in.kind == linWriteBlock, in.kind == linWriteSpan:
			return fmt.Sprintf("%v -> size %d", in, out.size)
		case in.kind == linFinal:
			return fmt.Sprintf("%v -> size %d, file size %d, file probes %v", in, out.size, out.diskSize, out.diskProbes)
		case in.kind == linOutside && !out.applied:
			return fmt.Sprintf("%v -> not done: the file was busy", in)
		}
		return in.String()
	},
	DescribeState: func(state any) string { return state.(linState).String() },
}

// randomLinInput draws one operation. Truncate sizes are block boundaries
// and the ends of heads and mids, so that truncates cut between probes as
// well as at them.
func randomLinInput(rng *rand.Rand, val byte) linInput {
	switch r := rng.IntN(100); {
	case r < 15:
		return linInput{kind: linWriteHead, block: rng.IntN(linBlocks), val: val}
	case r < 30:
		return linInput{kind: linWriteBlock, block: rng.IntN(linBlocks), val: val}
	case r < 40:
		return linInput{kind: linWriteSpan, block: rng.IntN(linBlocks - 1), val: val}
	case r < 70:
		return linInput{kind: linRead, probe: rng.IntN(linProbes)}
	case r < 78:
		var size int64
		switch rng.IntN(3) {
		case 0:
			size = int64(rng.IntN(linBlocks+1)) * linBlock
		default:
			size = probeOffset(rng.IntN(linProbes)) + 1
		}
		return linInput{kind: linTruncate, size: size}
	case r < 86:
		return linInput{kind: linStat}
	case r < 90:
		return linInput{kind: linClose}
	case r < 94:
		return linInput{kind: linOutside, out: outsideChange(rng.IntN(3)), block: rng.IntN(linBlocks), val: val}
	}
	modes := []FallocateMode{FallocAllocate, FallocKeepSize, FallocPunchHole, FallocZeroRange}
	return linInput{kind: linFallocate, block: rng.IntN(linBlocks), mode: modes[rng.IntN(len(modes))]}
}

// apply runs in against the store.
func (in linInput) apply(ctx context.Context, s *Store, dir, name string) linOutput {
	switch in.kind {
	case linWriteHead, linWriteBlock, linWriteSpan:
		off, end := in.writeRange()
		data := make([]byte, end-off)
		for i := range data {
			data[i] = in.val
		}
		res, err := s.Write(ctx, name, off, data, SyncNone)
		if err == nil && res.BytesWritten != len(data) {
			err = fmt.Errorf("wrote %d bytes of %d", res.BytesWritten, len(data))
		}
		return linOutput{err: err, size: res.Size}
	case linRead:
		b, err := s.Read(ctx, name, probeOffset(in.probe), 2)
		out := linOutput{err: err, n: len(b)}
		if len(b) > 0 {
			out.b = b[0]
		}
		return out
	case linTruncate:
		return linOutput{err: s.Truncate(ctx, name, in.size)}
	case linStat:
		st, err := s.Stat(ctx, name)
		return linOutput{err: err, size: st.Size}
	case linFallocate:
		_, err := s.Fallocate(ctx, name, in.mode, int64(in.block)*linBlock, linBlock)
		return linOutput{err: err}
	case linClose:
		// Wait, a few ticks at most, for the last change to settle, so
		// that the close keeps the map; others may change the file
		// meanwhile, and then it closes without.
		p := filepath.Join(dir, name)
		for range 20 {
			var st unix.Stat_t
			if err := unix.Stat(p, &st); err != nil {
				return linOutput{err: err}
			}
			if s.table.closedExtents.settled(st.Ctim.Nano(), coarseNow()) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		closeIfIdle(s, name)
		return linOutput{}
	case linOutside:
		applied, err := changeOutside(s, dir, name, in)
		return linOutput{err: err, applied: applied}
	case linFinal:
		st, err := s.Stat(ctx, name)
		if err != nil {
			return linOutput{err: err}
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		out := linOutput{err: err, size: st.Size, diskSize: int64(len(b))}
		for p := range out.diskProbes {
			if o := probeOffset(p); o < int64(len(b)) {
				out.diskProbes[p] = b[o]
			}
		}
		return out
	}
	return linOutput{err: fmt.Errorf("unknown operation %v", in)}
}

// changeOutside makes in's change to the file from outside the store,
// with the table locked and the file closed, so that no operation of the
// store can run on it meanwhile; it does nothing if the file is busy.
func changeOutside(s *Store, dir, name string, in linInput) (bool, error) {
	t := s.table
	t.mu.Lock()
	defer t.mu.Unlock()
	if ino := t.byPath[name]; ino != nil {
		if ino.refs > 0 || ino.openErr != nil || !t.closeIdleLocked(ino) {
			return false, nil
		}
		ino.closeFiles()
	}
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR, 0)
	if err != nil {
		return false, err
	}
	defer f.Close()
	base := int64(in.block) * linBlock
	switch in.out {
	case outHead:
		_, err = f.WriteAt([]byte{in.val}, base)
	case outPunch:
		err = unix.Fallocate(int(f.Fd()), punchHole, base, linBlock)
	case outKeepSize:
		err = unix.Fallocate(int(f.Fd()), keepSize, linBlocks*linBlock, 2*linBlock)
	}
	if err != nil {
		return false, err
	}
	return true, reopenMatchesFile(t, name)
}

// reopenMatchesFile opens name as the table would (its extent map from the
// extent cache if the file is unchanged since its close), compares the map
// with FIEMAP's, and closes it again as if for room.
//
// Preconditions: t.mu is held and name is closed.
func reopenMatchesFile(t *inodeTable, name string) error {
	ino := &inode{ready: make(chan struct{})}
	ino.name.Store(&name)
	if err := t.openInode(ino, false); err != nil {
		return err
	}
	defer ino.closeFiles()
	fromFile, err := loadExtentMap(ino.file, ino.blockSize)
	if err != nil {
		return err
	}
	if !ino.extents.equal(fromFile) {
		return fmt.Errorf("reopened after a change from outside, the extent map is %v, FIEMAP says %v", ino.extents, fromFile)
	}
	t.keepExtentsLocked(ino)
	return nil
}

// runLinHistory runs clients goroutines, each doing ops random operations
// on a fresh file, and returns the history. Call and return times come from
// one logical clock taken just before each call and just after it returns,
// so an operation that returned before another was called is ordered
// before it.
func runLinHistory(t *testing.T, s *Store, dir, name string, seed uint64, clients, ops int) []porcupine.Operation {
	t.Helper()
	ctx := context.Background()
	if err := s.Truncate(ctx, name, 0); err != nil { // the model starts empty
		t.Fatal(err)
	}
	var clock atomic.Int64
	var vals atomic.Uint32
	history := make([][]porcupine.Operation, clients)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(c)))
			<-start
			for range ops {
				// Distinct values (1..255, never the zero of a hole) make
				// a lost or misplaced write visible in the probes.
				in := randomLinInput(rng, byte(vals.Add(1)%255+1))
				call := clock.Add(1)
				out := in.apply(ctx, s, dir, name)
				ret := clock.Add(1)
				if out.err != nil {
					t.Errorf("client %d: %v: %v", c, in, out.err)
				}
				history[c] = append(history[c], porcupine.Operation{
					ClientId: c, Input: in, Output: out, Call: call, Return: ret,
				})
			}
		}()
	}
	close(start)
	wg.Wait()
	var all []porcupine.Operation
	for _, h := range history {
		all = append(all, h...)
	}
	final := linInput{kind: linFinal}
	call := clock.Add(1)
	out := final.apply(ctx, s, dir, name)
	if out.err != nil {
		t.Errorf("%v: %v", final, out.err)
	}
	return append(all, porcupine.Operation{
		ClientId: 0, Input: final, Output: out, Call: call, Return: clock.Add(1),
	})
}

// TestLinearizability checks concurrent histories of Write (and the size it
// returns), Read, Truncate, Stat and Fallocate against the sequential file
// model, under every policy in buffered mode and in direct mode. The file
// is closed as if for room now and then, and changed from outside the
// store while closed, so that it is reopened with its extent map from the
// extent cache or, where it changed, from FIEMAP. The seed is logged; set
// FILEWRITE_LIN_SEED to replay one.
func TestLinearizability(t *testing.T) {
	const histories, clients, opsPerClient = 8, 5, 40
	seed := rand.Uint64()
	if s := os.Getenv("FILEWRITE_LIN_SEED"); s != "" {
		if _, err := fmt.Sscan(s, &seed); err != nil {
			t.Fatalf("FILEWRITE_LIN_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (FILEWRITE_LIN_SEED=%d replays the operation choices; the interleaving is the scheduler's)", seed, seed)
	for _, io := range []IOMode{IOBuffered, IODirect} {
		for _, p := range Policies() {
			t.Run(io.String()+"/"+p.String(), func(t *testing.T) {
				s, dir := newJitterStore(t, Options{Policy: p, IO: io})
				if err := s.Truncate(context.Background(), "o-direct-probe", 0); io == IODirect && errors.Is(err, ErrUnsupported) {
					t.Skipf("O_DIRECT is not supported here: %v", err)
				}
				for h := range histories {
					name := fmt.Sprintf("h%d", h)
					ops := runLinHistory(t, s, dir, name, seed+uint64(h), clients, opsPerClient)
					if t.Failed() {
						return
					}
					res, info := porcupine.CheckOperationsVerbose(linModel, ops, time.Minute)
					switch res {
					case porcupine.Ok:
						if !extentsMatchFile(t, s, name) {
							t.Errorf("history %d: visualization: %s", h, writeVisualization(t, info, name))
						}
					case porcupine.Illegal:
						t.Errorf("history %d (%d operations) is not linearizable; visualization: %s", h, len(ops), writeVisualization(t, info, name))
					default:
						t.Errorf("history %d: the checker gave up (%v)", h, res)
					}
				}
			})
		}
	}
}

// extentsMatchFile compares, once no operation runs, the store's extent
// map of name with the one FIEMAP gives for the file. The model cannot see
// the map (a punch and a write that overlap may land in either order), but
// a punch or zero-range that did not wait for a write in flight can leave
// the map saying "written" over a block the kernel punched afterwards.
func extentsMatchFile(t *testing.T, s *Store, name string) bool {
	t.Helper()
	ino, err := s.table.get(context.Background(), name, false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.table.put(ino)
	fromFile, err := loadExtentMap(ino.file, ino.blockSize)
	if err != nil {
		t.Fatal(err)
	}
	ino.extentMu.Lock()
	defer ino.extentMu.Unlock()
	if !ino.extents.equal(fromFile) {
		t.Errorf("%s: extent map after the history = %v, FIEMAP of the file = %v", name, ino.extents, fromFile)
		return false
	}
	return true
}

// jitterFS pauses now and then around the store's reads and writes, to
// widen the windows a missing lock or wait would open: between a write's
// decision and its data landing (where a truncate that did not wait would
// be overtaken), between the data landing and the write updating the
// extent map (where a punch that did not wait would be undone in the map),
// and between a read loading the size and reading the bytes (where a read
// without the lock would meet a truncate). Unpaused, each window is a few
// instructions wide and the scheduler rarely lands in it.
type jitterFS struct{ FS }

func (f jitterFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return jitterFile{file}, nil
}

type jitterFile struct{ File }

func (f jitterFile) WriteAt(p []byte, off int64) (int, error) {
	jitter()
	n, err := f.File.WriteAt(p, off)
	jitter()
	return n, err
}

func (f jitterFile) ReadAt(p []byte, off int64) (int, error) {
	jitter()
	return f.File.ReadAt(p, off)
}

// jitter sleeps up to 200µs a quarter of the time and yields another
// quarter: enough to land in the windows above now and then, and cheap
// enough that the test stays a few seconds long.
func jitter() {
	switch rand.IntN(4) {
	case 0:
		time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
	case 1:
		runtime.Gosched()
	}
}

// newJitterStore is newTestStore over a jitterFS.
func newJitterStore(t *testing.T, opts Options) (*Store, string) {
	t.Helper()
	dir := testDir(t)
	fsys, err := OpenOSFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(jitterFS{fsys}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s, dir
}

// writeVisualization writes porcupine's HTML view of a failed history and
// returns its path. With go test -artifacts it goes to the test's artifact
// directory; otherwise to a directory next to the package that is kept
// (testDir's would be removed with the test), named like testDir's so that
// git ignores it.
func writeVisualization(t *testing.T, info porcupine.LinearizationInfo, name string) string {
	t.Helper()
	var dir string
	if f := flag.Lookup("test.artifacts"); f != nil && f.Value.String() == "true" {
		dir = t.ArtifactDir()
	} else {
		base, err := filepath.Abs(".")
		if err == nil {
			dir, err = os.MkdirTemp(base, "testdata-tmp-porcupine-")
		}
		if err != nil {
			return fmt.Sprintf("(not written: %v)", err)
		}
	}
	path := filepath.Join(dir, name+".html")
	if err := porcupine.VisualizePath(linModel, info, path); err != nil {
		return fmt.Sprintf("(not written: %v)", err)
	}
	return path
}
