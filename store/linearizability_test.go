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
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"golang.org/x/sys/unix"
)

// The linearizability test drives a few small files with several
// concurrent clients and checks the history against a sequential model: a
// map from names to file contents, so that Delete and Rename, which move
// contents between names, are checked along with the operations on data.
//
// The model does not track every byte: the kernel makes neither a buffered
// pread atomic against a concurrent pwrite across bytes, nor does the store
// lock writes below EOF under every policy, so a read of many bytes may
// legitimately see a mix of two writes. Instead each file is four blocks
// with two one-byte probes each, at the block's start ("head") and middle
// ("mid"). Every read reads one probe; every write sets whole probes; bytes
// between probes are never looked at.
const (
	linBlock  = 4096
	linBlocks = 4
	linProbes = 2 * linBlocks
)

// linNames are the names of a history's files, below its own directory:
// two side by side and one in a subdirectory, so that a Rename moves a file
// between directories and may have to create one.
var linNames = [...]string{"a", "b", "d/c"}

const linFiles = len(linNames)

// probeOffset is the file offset of probe p: heads at even p, mids at odd.
func probeOffset(p int) int64 {
	return int64(p/2)*linBlock + int64(p%2)*linBlock/2
}

// linFile is the model of one name: whether it names a file, and that
// file's size and probes. A probe at or past the size is always zero, so
// that a file that grows again reads zeros there.
type linFile struct {
	exists bool
	size   int64
	probes [linProbes]byte
}

// linState is the model: every name's file. It is a comparable value, as
// porcupine's default equality wants.
type linState struct {
	files [linFiles]linFile
}

// clip zeroes the probes at or past the size.
func (f linFile) clip() linFile {
	for p := range f.probes {
		if probeOffset(p) >= f.size {
			f.probes[p] = 0
		}
	}
	return f
}

func (s linState) String() string {
	var b strings.Builder
	for i, f := range s.files {
		if f.exists {
			fmt.Fprintf(&b, "%s: size=%d probes=%v; ", linNames[i], f.size, f.probes)
		} else {
			fmt.Fprintf(&b, "%s: none; ", linNames[i])
		}
	}
	return b.String()
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
	linDelete
	linRename // file to to, replacing it unless noReplace
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
	// linFinal runs alone after all clients finished: for every name it
	// compares the store's size with the file's real size and reads every
	// probe from the file itself, so that a write that landed past a
	// truncate (which the store's own Read would hide behind its size), or
	// in a file the name no longer names, is seen.
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
	kind      linKind
	file      int           // the name operated on (an index of linNames)
	block     int           // writes, fallocate
	probe     int           // read
	val       byte          // writes
	size      int64         // truncate
	mode      FallocateMode // fallocate
	to        int           // rename
	noReplace bool          // rename
	out       outsideChange // outside
}

type linOutput struct {
	err  error
	n    int   // read: bytes returned
	b    byte  // read: the probe's byte, if n > 0
	size int64 // write (the size it returned), stat
	// applied says whether linOutside found the file idle and changed it.
	applied bool
	// final only: every name as the store and the kernel have it.
	final [linFiles]linOnDisk
}

// linOnDisk is one name at the end: the store's Stat and the file's bytes.
type linOnDisk struct {
	exists     bool // the store has it (Stat succeeded)
	size       int64
	diskExists bool // the kernel has it
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
// in flight, where no truncate or extending write can finish (they wait for
// writes in flight) but a Fallocate that grows the file can (it changes no
// data and does not wait); so it may include a growth that the reads order
// after this write (another unlocked write landed over it before the
// growth), and only "at least" holds in every order. A size below the
// write's own end is illegal in any order.
// An operation on a name that names no file fails with ErrNotFound unless
// it creates one (Write, Truncate, Fallocate); a Rename with noReplace onto
// a name that names a file fails with ErrExists. Any other error is wrong.
func (s linState) step(in linInput, out linOutput) (bool, linState) {
	missing := errors.Is(out.err, ErrNotFound)
	exists := errors.Is(out.err, ErrExists)
	if out.err != nil && !missing && !exists {
		return false, s
	}
	f := s.files[in.file]
	switch in.kind {
	case linWriteHead, linWriteBlock, linWriteSpan, linTruncate, linFallocate:
		if out.err != nil {
			return false, s
		}
		if !f.exists {
			f = linFile{exists: true}
		}
		f = f.apply(in)
		s.files[in.file] = f
		switch in.kind {
		case linWriteHead, linWriteBlock, linWriteSpan:
			return out.size >= f.size, s
		}
		return true, s
	case linClose:
		return out.err == nil, s
	case linOutside:
		if out.err != nil || !out.applied {
			return out.err == nil, s
		}
		if !f.exists {
			return false, s // the file is on disk: the model must have it
		}
		switch in.out {
		case outHead:
			off := int64(in.block) * linBlock
			f.probes[2*in.block] = in.val
			f.size = max(f.size, off+1)
		case outPunch:
			f.probes[2*in.block], f.probes[2*in.block+1] = 0, 0
		}
		s.files[in.file] = f
		return true, s
	case linFinal:
		for i, f := range s.files {
			d := out.final[i]
			if d.exists != f.exists || d.diskExists != f.exists {
				return false, s
			}
			if f.exists && (d.size != f.size || d.diskSize != f.size || d.diskProbes != f.probes) {
				return false, s
			}
		}
		return out.err == nil, s
	}
	// The rest need the file.
	if !f.exists || missing {
		return !f.exists && missing, s
	}
	switch in.kind {
	case linRead:
		off := probeOffset(in.probe)
		want := int(min(2, max(0, f.size-off)))
		if exists || out.n != want {
			return false, s
		}
		return want == 0 || out.b == f.probes[in.probe], s
	case linStat:
		return !exists && out.size == f.size, s
	case linDelete:
		s.files[in.file] = linFile{}
		return !exists, s
	case linRename:
		taken := in.to != in.file && s.files[in.to].exists
		if in.noReplace && taken {
			return exists, s
		}
		if exists {
			return false, s
		}
		if in.to != in.file {
			s.files[in.to] = f
			s.files[in.file] = linFile{}
		}
		return true, s
	}
	return false, s
}

// apply is the effect of a write, truncate or fallocate on an existing
// file.
func (f linFile) apply(in linInput) linFile {
	switch in.kind {
	case linWriteHead, linWriteBlock, linWriteSpan:
		off, end := in.writeRange()
		for p := range f.probes {
			if o := probeOffset(p); o >= off && o < end {
				f.probes[p] = in.val
			}
		}
		f.size = max(f.size, end)
	case linTruncate:
		f.size = in.size
		f = f.clip()
	case linFallocate:
		base := int64(in.block) * linBlock
		switch in.mode {
		case FallocAllocate:
			f.size = max(f.size, base+linBlock)
		case FallocPunchHole, FallocZeroRange:
			f.probes[2*in.block], f.probes[2*in.block+1] = 0, 0
		}
	}
	return f
}

func (in linInput) String() string {
	name := linNames[in.file]
	switch in.kind {
	case linWriteHead:
		return fmt.Sprintf("%s: write head %d = %d", name, in.block, in.val)
	case linWriteBlock:
		return fmt.Sprintf("%s: write block %d = %d", name, in.block, in.val)
	case linWriteSpan:
		return fmt.Sprintf("%s: write mid %d..head %d = %d", name, in.block, in.block+1, in.val)
	case linRead:
		return fmt.Sprintf("%s: read probe %d @%d", name, in.probe, probeOffset(in.probe))
	case linTruncate:
		return fmt.Sprintf("%s: truncate %d", name, in.size)
	case linStat:
		return fmt.Sprintf("%s: stat", name)
	case linFallocate:
		return fmt.Sprintf("%s: fallocate %v block %d", name, in.mode, in.block)
	case linDelete:
		return fmt.Sprintf("%s: delete", name)
	case linClose:
		return fmt.Sprintf("%s: close", name)
	case linOutside:
		switch in.out {
		case outHead:
			return fmt.Sprintf("%s: outside: write head %d = %d", name, in.block, in.val)
		case outPunch:
			return fmt.Sprintf("%s: outside: punch block %d", name, in.block)
		}
		return fmt.Sprintf("%s: outside: preallocate past the end", name)
	case linRename:
		if in.noReplace {
			return fmt.Sprintf("%s: rename to %s, no replace", name, linNames[in.to])
		}
		return fmt.Sprintf("%s: rename to %s", name, linNames[in.to])
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
		var h uint64
		for _, f := range state.(linState).files {
			h = h*31 + uint64(f.size)
			if f.exists {
				h++
			}
			for _, b := range f.probes {
				h = h*31 + uint64(b)
			}
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
			return fmt.Sprintf("%v -> %+v", in, out.final)
		case in.kind == linOutside && !out.applied:
			return fmt.Sprintf("%v -> not done: the file was busy or missing", in)
		}
		return in.String()
	},
	DescribeState: func(state any) string { return state.(linState).String() },
}

// randomLinInput draws one operation. Most go to the first name, so that
// its file sees long runs of writes, truncates and reads between the
// deletes and renames that move contents between names. Truncate sizes are
// block boundaries and the ends of heads and mids, so that truncates cut
// between probes as well as at them.
func randomLinInput(rng *rand.Rand, val byte) linInput {
	var file int
	switch r := rng.IntN(100); {
	case r < 60:
		file = 0
	case r < 85:
		file = 1
	default:
		file = 2
	}
	switch r := rng.IntN(100); {
	case r < 13:
		return linInput{kind: linWriteHead, file: file, block: rng.IntN(linBlocks), val: val}
	case r < 26:
		return linInput{kind: linWriteBlock, file: file, block: rng.IntN(linBlocks), val: val}
	case r < 36:
		return linInput{kind: linWriteSpan, file: file, block: rng.IntN(linBlocks - 1), val: val}
	case r < 62:
		return linInput{kind: linRead, file: file, probe: rng.IntN(linProbes)}
	case r < 70:
		var size int64
		switch rng.IntN(3) {
		case 0:
			size = int64(rng.IntN(linBlocks+1)) * linBlock
		default:
			size = probeOffset(rng.IntN(linProbes)) + 1
		}
		return linInput{kind: linTruncate, file: file, size: size}
	case r < 76:
		return linInput{kind: linStat, file: file}
	case r < 79:
		return linInput{kind: linClose, file: file}
	case r < 82:
		return linInput{kind: linOutside, file: file, out: outsideChange(rng.IntN(3)), block: rng.IntN(linBlocks), val: val}
	case r < 91:
		modes := []FallocateMode{FallocAllocate, FallocKeepSize, FallocPunchHole, FallocZeroRange}
		return linInput{kind: linFallocate, file: file, block: rng.IntN(linBlocks), mode: modes[rng.IntN(len(modes))]}
	case r < 95:
		return linInput{kind: linDelete, file: file}
	}
	return linInput{kind: linRename, file: file, to: rng.IntN(linFiles), noReplace: rng.IntN(3) == 0}
}

// apply runs in against the store, on the files below prefix.
func (in linInput) apply(ctx context.Context, s *Store, dir, prefix string) linOutput {
	name := prefix + "/" + linNames[in.file]
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
	case linDelete:
		return linOutput{err: s.Delete(ctx, name, false)}
	case linClose:
		// Wait, a few ticks at most, for the last change to settle, so
		// that the close keeps the map; others may change the file
		// meanwhile, and then it closes without.
		p := filepath.Join(dir, name)
		for range 20 {
			var st unix.Stat_t
			if err := unix.Stat(p, &st); errors.Is(err, fs.ErrNotExist) {
				return linOutput{} // nothing to close
			} else if err != nil {
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
	case linRename:
		return linOutput{err: s.Rename(ctx, name, prefix+"/"+linNames[in.to], in.noReplace, false)}
	case linFinal:
		var out linOutput
		for i, n := range linNames {
			d := &out.final[i]
			st, err := s.Stat(ctx, prefix+"/"+n)
			switch {
			case err == nil:
				d.exists, d.size = true, st.Size
			case !errors.Is(err, ErrNotFound):
				return linOutput{err: err}
			}
			b, err := os.ReadFile(filepath.Join(dir, prefix, n))
			switch {
			case err == nil:
				d.diskExists, d.diskSize = true, int64(len(b))
			case !errors.Is(err, fs.ErrNotExist):
				return linOutput{err: err}
			}
			for p := range d.diskProbes {
				if o := probeOffset(p); o < int64(len(b)) {
					d.diskProbes[p] = b[o]
				}
			}
		}
		return out
	}
	return linOutput{err: fmt.Errorf("unknown operation %v", in)}
}

// changeOutside makes in's change to the file from outside the store,
// with the table locked and the file closed, so that no operation of the
// store can run on it meanwhile; it does nothing if the file is busy or
// missing. (Every operation on a name, Delete and Rename included, holds a
// reference to an inode known by it, or reserves it, while it runs.)
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
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
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
	source := extentsSource(t, name)
	ino := &inode{ready: make(chan struct{})}
	ino.name.Store(&name)
	if err := ino.open(t, false); err != nil {
		return err
	}
	defer ino.closeFiles()
	fromFile, err := loadExtentMap(ino.file, ino.blockSize)
	if err != nil {
		return err
	}
	if !ino.extents.equal(fromFile) {
		return fmt.Errorf("reopened after a change from outside, the extent map (%s) is %v, FIEMAP says %v; %s",
			source, ino.extents, fromFile, mapMismatch(ino.extents, fromFile, ino.file, ino.size.Load()))
	}
	if fi, err := ino.file.Stat(); err == nil {
		t.keepExtentsLocked(ino, fi)
	}
	return nil
}

// expectedLinErr says whether err is one that the model allows (the
// client does not report it).
func expectedLinErr(err error) bool {
	return err == nil || errors.Is(err, ErrNotFound) || errors.Is(err, ErrExists)
}

// runLinHistory runs clients goroutines, each doing ops random operations
// on the files below prefix, which name none at first, and returns the
// history. Call and return times come from one logical clock taken just
// before each call and just after it returns, so an operation that
// returned before another was called is ordered before it.
func runLinHistory(t *testing.T, s *Store, dir, prefix string, seed uint64, clients, ops int) []porcupine.Operation {
	t.Helper()
	ctx := context.Background()
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
				out := in.apply(ctx, s, dir, prefix)
				ret := clock.Add(1)
				if !expectedLinErr(out.err) {
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
	out := final.apply(ctx, s, dir, prefix)
	if out.err != nil {
		t.Errorf("%v: %v", final, out.err)
	}
	return append(all, porcupine.Operation{
		ClientId: 0, Input: final, Output: out, Call: call, Return: clock.Add(1),
	})
}

// TestLinearizability checks concurrent histories of Write (and the size it
// returns), Read, Truncate, Stat, Fallocate, Delete and Rename against the
// sequential model, under every policy in buffered mode and in direct mode.
// Files are closed as if for room now and then, and changed from outside
// the store while closed, so that they are reopened with their extent map
// from the extent cache or, where they changed, from FIEMAP. The seed is logged; set
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
	// "mapped" is buffered with files mapped at their first overwrite
	// (mapped.go), so that writes go through the mapping where their
	// blocks are written and their pages resident, and through pwrite
	// elsewhere.
	for _, mode := range []string{"buffered", "direct", "mapped"} {
		io, mapped := IOBuffered, mode == "mapped"
		if mode == "direct" {
			io = IODirect
		}
		for _, p := range Policies() {
			t.Run(mode+"/"+p.String(), func(t *testing.T) {
				opts := Options{Policy: p, IO: io}
				var viaMapping atomic.Int64
				if mapped {
					opts.Hooks = &Hooks{mapEagerly: true, MappedWrite: func(string) { viaMapping.Add(1) }}
					defer func() {
						if viaMapping.Load() == 0 {
							t.Error("no write went through a mapping")
						}
					}()
				}
				s, dir := newJitterStore(t, opts)
				if err := s.Truncate(context.Background(), "o-direct-probe", 0); io == IODirect && errors.Is(err, ErrUnsupported) {
					t.Skipf("O_DIRECT is not supported here: %v", err)
				}
				for h := range histories {
					prefix := fmt.Sprintf("h%d", h)
					ops := runLinHistory(t, s, dir, prefix, seed+uint64(h), clients, opsPerClient)
					if t.Failed() {
						return
					}
					res, info := porcupine.CheckOperationsVerbose(linModel, ops, time.Minute)
					switch res {
					case porcupine.Ok:
						for _, n := range linNames {
							if !extentsMatchFile(t, s, prefix+"/"+n) {
								t.Errorf("history %d: visualization: %s", h, writeVisualization(t, info, prefix))
							}
						}
					case porcupine.Illegal:
						t.Errorf("history %d (%d operations) is not linearizable; visualization: %s", h, len(ops), writeVisualization(t, info, prefix))
					default:
						t.Errorf("history %d: the checker gave up (%v)", h, res)
					}
				}
			})
		}
	}
}

// extentsMatchFile compares, once no operation runs, the store's extent
// map of name, if name names a file, with the one FIEMAP gives for the
// file. The model cannot see the map (a punch and a write that overlap may
// land in either order), but a punch or zero-range that did not wait for a
// write in flight can leave the map saying "written" over a block the
// kernel punched afterwards. A file the store has closed is reopened here,
// not before, so that a failure says where its map came from.
func extentsMatchFile(t *testing.T, s *Store, name string) bool {
	t.Helper()
	s.table.mu.Lock()
	source := "the map of the open file"
	if s.table.byPath[name] == nil {
		source = extentsSource(s.table, name)
	}
	s.table.mu.Unlock()
	ino, err := s.table.get(context.Background(), name, false)
	if errors.Is(err, ErrNotFound) {
		return true
	}
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
		t.Errorf("%s: extent map after the history (%s) = %v, FIEMAP of the file = %v; %s",
			name, source, ino.extents, fromFile, mapMismatch(ino.extents, fromFile, ino.file, ino.size.Load()))
		return false
	}
	return true
}

// extentsSource says where the next open of name will take its extent map
// from: the extent cache, if it holds an entry that fits the file as it is
// now, or FIEMAP. A map that is wrong only when it came from the cache
// points at the cache's rule (an entry used for a file that changed);
// one that is wrong when just read from FIEMAP points at the kernel.
//
// Preconditions: t.mu is held, so that no open takes the entry meanwhile.
func extentsSource(t *inodeTable, name string) string {
	fi, err := t.fsys.Lstat(name)
	if err != nil {
		return fmt.Sprintf("to be read from FIEMAP (lstat: %v)", err)
	}
	c := t.closedExtents
	c.mu.Lock()
	defer c.mu.Unlock()
	if i, ok := c.byID[fileID{fi.Dev, fi.Ino}]; ok && c.entries[i].size == fi.Size && c.entries[i].ctime == fi.Ctime {
		e := c.entries[i]
		return fmt.Sprintf("reopened from the extent cache, entry of size %d and ctime %d", e.size, e.ctime)
	}
	return "reopened from FIEMAP"
}

// mapMismatch describes, for a failure message, how the store's map m
// differs from fromFile, FIEMAP's map of the file f of size bytes: the
// blocks where they disagree, where EOF falls (a difference past it is
// preallocation, which no read can see), and what FIEMAP says when asked
// once more, since if that differs from fromFile as well, the kernel's
// answer moved while nothing of the store ran.
func mapMismatch(m, fromFile *extentMap, f File, size int64) string {
	var bounds []int64
	for _, r := range fromFile.appendRuns(m.appendRuns(nil)) {
		bounds = append(bounds, r.start, r.end)
	}
	slices.Sort(bounds)
	bounds = slices.Compact(bounds)
	state := func(m *extentMap, start, end int64) ExtentState {
		switch _, unwritten, written := m.classify(start, end); {
		case written:
			return ExtentWritten
		case unwritten:
			return ExtentUnwritten
		}
		return ExtentHole
	}
	var b strings.Builder
	for i := 0; i+1 < len(bounds); i++ {
		// No run of either map starts or ends inside [start, end): one
		// state each.
		start, end := bounds[i], bounds[i+1]
		if mine, theirs := state(m, start, end), state(fromFile, start, end); mine != theirs {
			fmt.Fprintf(&b, "blocks [%d,%d) are %v in the store's map, %v in FIEMAP's; ", start, end, mine, theirs)
		}
	}
	fmt.Fprintf(&b, "the size is %d bytes (blocks from %d on are past EOF)", size, ceilBlock(size, m.blockSize))
	if again, err := loadExtentMap(f, m.blockSize); err != nil {
		fmt.Fprintf(&b, "; FIEMAP again: %v", err)
	} else if again.equal(fromFile) {
		b.WriteString("; FIEMAP again says the same")
	} else {
		fmt.Fprintf(&b, "; FIEMAP again says %v, not what it said just before", again)
	}
	return b.String()
}

// jitterFile pauses now and then around the store's reads and writes, to
// widen the windows a missing lock or wait would open: between a write's
// decision and its data landing (where a truncate that did not wait would
// be overtaken), between the data landing and the write updating the
// extent map (where a punch that did not wait would be undone in the map),
// and between a read loading the size and reading the bytes (where a read
// without the lock would meet a truncate). Unpaused, each window is a few
// instructions wide and the scheduler rarely lands in it.
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

// The mapping of the file below, where it has one (a store into it is not
// jittered: it is a copy, with no call to pause around).
func (f jitterFile) Map(length int64) ([]byte, error) { return f.File.(mappable).Map(length) }
func (f jitterFile) Unmap(b []byte) error             { return f.File.(mappable).Unmap(b) }
func (f jitterFile) Resident(b, vec []byte) error     { return f.File.(mappable).Resident(b, vec) }
func (f jitterFile) TouchModified() error             { jitter(); return f.File.(mappable).TouchModified() }

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

// newJitterStore is newTestStore with every file a jitterFile.
func newJitterStore(t *testing.T, opts Options) (*Store, string) {
	t.Helper()
	return newWrappedStore(t, func(fsys FS) FS { return fileWrapFS{fsys, func(f File) File { return jitterFile{f} }} }, opts)
}

// writeVisualization writes porcupine's HTML view of a failed history and
// returns its path. With go test -artifacts it goes to the test's artifact
// directory; otherwise to a directory next to the package that is kept
// (testutil.Dir's would be removed with the test), named like
// testutil.Dir's so that git ignores it.
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
