//go:build linux

package store_test

// The power-loss test of appends: several goroutines append stamped units
// to one file through store/crashfs, the power is cut at a random moment,
// and each crashed image is held to the append rules of docs/guarantees.md:
// an acknowledged synced append reads back whole, with no zeros below it.
// An append's units carry its id and their index in it (the offset is not
// known before the append returns), so that any unit can be traced to the
// append that wrote it.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store"
	"github.com/filewrite/filewrite/store/crashfs"
)

const plAppendPath = "logs/events"

// plAppend is one append of the history and what it returned.
type plAppend struct {
	id        uint64
	units     int64
	sync      store.SyncMode
	off       int64
	call, ret int64
	err       error
}

// appendData is the bytes of append id: units units, each stamped with the
// id and the unit's index in the append.
func appendData(id uint64, units int64) []byte {
	b := make([]byte, units*plUnit)
	for i := range units {
		fillUnit(b[i*plUnit:(i+1)*plUnit], plAppendPath, id, i*plUnit)
	}
	return b
}

// appendUnit says which append wrote u, and which of its units it is: id
// 0 for zeros; ok false for bytes no append wrote.
func appendUnit(u []byte) (id uint64, idx int64, ok bool) {
	if !bytes.ContainsFunc(u, func(r rune) bool { return r != 0 }) {
		return 0, 0, true
	}
	id, rel := binary.LittleEndian.Uint64(u), int64(binary.LittleEndian.Uint64(u[8:]))
	want := make([]byte, plUnit)
	fillUnit(want, plAppendPath, id, rel)
	return id, rel / plUnit, bytes.Equal(u, want)
}

// plAppendRun is one run of appends and its crash.
type plAppendRun struct {
	opts    store.Options
	seed    uint64
	workers int
	ops     int
	crashAt int64

	clock   atomic.Int64
	ids     atomic.Uint64
	started atomic.Int64

	mu      sync.Mutex
	history []*plAppend

	crashOnce  sync.Once
	crashClock int64
	crashed    atomic.Bool
	state      *crashfs.State
}

func (r *plAppendRun) do(ctx context.Context, s *store.Store, a *plAppend) {
	a.id = r.ids.Add(1)
	data := appendData(a.id, a.units)
	a.call = r.clock.Add(1)
	var res store.AppendResult
	res, a.err = s.Append(ctx, plAppendPath, data, a.sync, store.AppendOptions{})
	a.off = res.Offset
	a.ret = r.clock.Add(1)
	r.mu.Lock()
	r.history = append(r.history, a)
	r.mu.Unlock()
}

func (r *plAppendRun) crash(fsys *crashfs.FS) {
	r.crashOnce.Do(func() {
		r.mu.Lock()
		r.crashClock = r.clock.Add(1)
		r.mu.Unlock()
		r.state = fsys.Crash()
		r.crashed.Store(true)
	})
}

func (r *plAppendRun) durable(a *plAppend) bool {
	return a.err == nil && a.ret < r.crashClock && a.sync != store.SyncNone
}

// run drives random appends until the cut.
func (r *plAppendRun) run(t *testing.T, open func(*crashfs.FS) store.FS, script func(context.Context, *store.Store, *crashfs.FS)) {
	t.Helper()
	ctx := context.Background()
	base, err := store.OpenOSFS(testutil.Dir(t))
	if err != nil {
		t.Fatal(err)
	}
	fsys := crashfs.New(base)
	var fsOpen store.FS = fsys
	if open != nil {
		fsOpen = open(fsys)
	}
	s, err := store.Open(fsOpen, r.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close() // fails: the disk is gone
	if script != nil {
		script(ctx, s, fsys)
		r.crash(fsys)
		return
	}
	var wg sync.WaitGroup
	for w := range r.workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(r.seed, uint64(w)+1))
			for range r.ops {
				if r.crashed.Load() {
					return
				}
				a := &plAppend{units: 1 + rng.Int64N(8), sync: []store.SyncMode{store.SyncNone, store.SyncData, store.SyncFull}[rng.IntN(3)]}
				if r.started.Add(1) == r.crashAt {
					go r.crash(fsys)
				}
				r.do(ctx, s, a)
			}
		})
	}
	wg.Wait()
	r.crash(fsys)
}

// check holds a store reopened on a crashed image to the rules.
func (r *plAppendRun) check(ctx context.Context, s *store.Store) []string {
	byID := map[uint64]*plAppend{}
	durable := false
	for _, a := range r.history {
		byID[a.id] = a
		durable = durable || r.durable(a)
	}
	st, err := s.Stat(ctx, plAppendPath)
	if errors.Is(err, store.ErrNotFound) {
		if durable {
			return []string{"the file is missing, but a synced append returned OK before the cut"}
		}
		return nil
	}
	if err != nil {
		return []string{fmt.Sprintf("Stat: %v", err)}
	}
	data, err := s.Read(ctx, plAppendPath, 0, st.Size)
	if err != nil {
		return []string{fmt.Sprintf("Read: %v", err)}
	}
	if int64(len(data)) != st.Size || st.Size%plUnit != 0 {
		return []string{fmt.Sprintf("size %d, %d bytes read: no append leaves such a size", st.Size, len(data))}
	}
	var v []string
	zeros := int64(-1) // the first unit of zeros
	for off := int64(0); off < st.Size; off += plUnit {
		id, idx, ok := appendUnit(data[off : off+plUnit])
		a := byID[id]
		switch {
		case id == 0:
			if zeros < 0 {
				zeros = off
			}
		case !ok:
			v = append(v, fmt.Sprintf("bytes [%d,+%d) were written by no append", off, plUnit))
		case a != nil && a.err == nil && a.off+idx*plUnit != off:
			v = append(v, fmt.Sprintf("unit %d of append #%d at %d, but the append landed at %d", idx, id, off, a.off))
		}
	}
	for _, a := range r.history {
		if !r.durable(a) {
			continue
		}
		end := a.off + a.units*plUnit
		switch {
		case end > st.Size:
			v = append(v, fmt.Sprintf("append #%d [%d,+%d) was acknowledged durable, but the size is %d", a.id, a.off, a.units*plUnit, st.Size))
		case !bytes.Equal(data[a.off:end], appendData(a.id, a.units)):
			v = append(v, fmt.Sprintf("append #%d [%d,+%d) was acknowledged durable, but its bytes are not there", a.id, a.off, a.units*plUnit))
		case zeros >= 0 && zeros < a.off:
			v = append(v, fmt.Sprintf("append #%d at %d was acknowledged durable, but zeros lie below it at %d", a.id, a.off, zeros))
		}
	}
	return v
}

// appendPowerLoss runs r and checks its images, returning the violations.
func appendPowerLoss(t *testing.T, r *plAppendRun, onlyNone bool, open func(*crashfs.FS) store.FS, script func(context.Context, *store.Store, *crashfs.FS)) []string {
	t.Helper()
	r.run(t, open, script)
	images := plImages(r.state, rand.New(rand.NewPCG(r.seed, 0)))
	if onlyNone {
		images = images[:1]
	}
	var v []string
	for _, img := range images {
		dir := testutil.Dir(t)
		kept, err := r.state.Write(dir, img.keep)
		if err != nil {
			t.Fatal(err)
		}
		base, err := store.OpenOSFS(dir)
		if err != nil {
			t.Fatal(err)
		}
		s, err := store.Open(base, store.Options{Policy: r.opts.Policy})
		if err != nil {
			t.Fatal(err)
		}
		for _, msg := range r.check(context.Background(), s) {
			v = append(v, fmt.Sprintf("image %q (%d pieces kept, %d lost): %s", img.name, kept.Kept, kept.Lost, msg))
		}
		if err := s.Close(); err != nil {
			t.Error(err)
		}
		os.RemoveAll(dir)
	}
	return v
}

// TestPowerLossAppends cuts the power during concurrent appends, synced
// and not, under every policy, and checks five images of each cut.
func TestPowerLossAppends(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	for _, p := range store.Policies() {
		t.Run(p.String(), func(t *testing.T) {
			for i := range *powerLossRuns {
				r := &plAppendRun{opts: store.Options{Policy: p}, seed: seed + uint64(i), workers: 6, ops: 25}
				r.crashAt = 1 + int64(rand.New(rand.NewPCG(r.seed, 0)).IntN(r.workers*r.ops))
				if v := appendPowerLoss(t, r, false, nil, nil); len(v) > 0 {
					t.Errorf("seed %d, crash after %d appends: %d violations:\n%s", r.seed, r.crashAt, len(v), strings.Join(v[:min(len(v), 10)], "\n"))
				}
			}
		})
	}
}

// TestPowerLossCatchesUnorderedAppend stages the interleaving that
// the break AckAppendUnordered breaks: append A's write is held in the
// FS while append B, above it, asks for SyncData. With the break B syncs
// and returns while A's bytes are not written, and the power is cut then:
// the checker must find zeros below B. Without it B waits for A, both
// complete, and the image is clean.
func TestPowerLossCatchesUnorderedAppend(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			opts := store.Options{Policy: store.PolicyUnlockedBelowEOF}
			if broken {
				opts.Hooks = store.BrokenHooks(t, store.BreakAckAppendUnordered)
			}
			r := &plAppendRun{opts: opts}
			hold := &holdWriteFS{held: make(chan struct{}), release: make(chan struct{})}
			open := func(fsys *crashfs.FS) store.FS { hold.FS = fsys; return hold }
			script := func(ctx context.Context, s *store.Store, fsys *crashfs.FS) {
				// The file exists, empty, so that both appends reserve.
				if err := s.Truncate(ctx, plAppendPath, 0); err != nil {
					t.Fatal(err)
				}
				hold.armed.Store(true)
				var wg sync.WaitGroup
				wg.Go(func() { r.do(ctx, s, &plAppend{units: 2, sync: store.SyncNone}) })
				<-hold.held
				b := make(chan struct{})
				go func() {
					r.do(ctx, s, &plAppend{units: 1, sync: store.SyncData})
					close(b)
				}()
				if broken {
					<-b // acknowledged while A is held
					r.crash(fsys)
					close(hold.release)
					wg.Wait()
					return
				}
				testutil.WaitFor(t, "B to reserve", func() bool {
					for _, f := range s.Locks(10) {
						if f.Path == plAppendPath && f.Appending == 2 {
							return true
						}
					}
					return false
				})
				close(hold.release)
				wg.Wait()
				<-b
			}
			v := appendPowerLoss(t, r, true, open, script)
			caught := len(v) > 0 && strings.Contains(v[0], "zeros lie below it")
			switch {
			case !broken && len(v) > 0:
				t.Errorf("without the break: %s", strings.Join(v, "\n"))
			case broken && !caught:
				t.Errorf("with the break, the checker reported no zeros below the synced append: %q", v)
			case broken:
				t.Logf("caught: %s", v[0])
			}
		})
	}
}

// holdWriteFS passes every call to its FS, except that the first file
// WriteAt after armed is set signals held and waits for release before it
// goes on.
type holdWriteFS struct {
	store.FS
	armed   atomic.Bool
	held    chan struct{}
	release chan struct{}
}

func (h *holdWriteFS) OpenFile(name string, flag int, perm fs.FileMode) (store.File, error) {
	f, err := h.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return holdWriteFile{File: f, fs: h}, nil
}

type holdWriteFile struct {
	store.File
	fs *holdWriteFS
}

func (f holdWriteFile) WriteAt(p []byte, off int64) (int, error) {
	if f.fs.armed.CompareAndSwap(true, false) {
		f.fs.held <- struct{}{}
		<-f.fs.release
	}
	return f.File.WriteAt(p, off)
}
