//go:build linux

package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/filewrite/filewrite/internal/testutil"
)

// gate holds writers inside the store (InsideWrite) until released, and
// reports each arrival.
type gate struct {
	arrived chan string
	release chan struct{}
	once    sync.Once
}

// newGate makes a gate for n writers. It opens by itself when the test
// ends, so that a failing test does not leave writers (and Close) hanging.
func newGate(t *testing.T, n int) *gate {
	g := &gate{arrived: make(chan string, n), release: make(chan struct{})}
	t.Cleanup(g.open)
	return g
}

func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

func (g *gate) hooks() *Hooks {
	return &Hooks{InsideWrite: func(ctx context.Context, path, mode, reason string) {
		g.arrived <- mode
		<-g.release
	}}
}

// holdWriters starts n writers of file "f" of s, the i-th writing what
// write(i) says (data at off, without sync), each held inside its write
// by the gate it returns: g.arrived takes each one's lock mode as it gets
// inside, and g.open lets them all go on. A write that fails fails t.
func holdWriters(t *testing.T, s *Store, n int, write func(i int) (off int64, data []byte)) (*gate, *sync.WaitGroup) {
	g := newGate(t, n)
	s.opts.Hooks = g.hooks()
	var wg sync.WaitGroup
	for i := range n {
		off, data := write(i)
		wg.Go(func() {
			if _, err := s.Write(context.Background(), "f", off, data, SyncNone); err != nil {
				t.Error(err)
			}
		})
	}
	return g, &wg
}

func fileLocks(s *Store, path string) FileLocks {
	for _, fl := range s.Locks(100) {
		if fl.Path == path {
			return fl
		}
	}
	return FileLocks{}
}

// TestParallelWritersBelowEOF shows parallelism without timing: writers are
// held inside the write; under a policy whose table says "-" or S all of
// them get inside at once, under exclusive exactly one does while the rest
// queue on the lock.
func TestParallelWritersBelowEOF(t *testing.T) {
	const n, bs = 8, 4096
	for _, tc := range []struct {
		policy   Policy
		parallel bool
	}{
		{PolicyExclusive, false},
		{PolicyUnlockedBelowEOF, true},
		{PolicySharedWritten, true},
		{PolicySharedOverwrite, true},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			ctx := context.Background()
			s, _ := newTestStore(t, Options{Policy: tc.policy})
			if _, err := s.Write(ctx, "f", 0, make([]byte, n*bs), SyncNone); err != nil {
				t.Fatal(err)
			}
			g, wg := holdWriters(t, s, n, func(i int) (int64, []byte) {
				return int64(i) * bs, bytes.Repeat([]byte{byte(i + 1)}, bs)
			})
			if tc.parallel {
				for range n {
					<-g.arrived // all n are inside at the same time
				}
			} else {
				<-g.arrived
				testutil.WaitFor(t, "the other writers to queue", func() bool { return fileLocks(s, "f").Waiting == n-1 })
				if got := len(g.arrived); got != 0 {
					t.Fatalf("%d more writers got inside while one held the lock, want 0", got)
				}
			}
			g.open()
			wg.Wait()
			s.opts.Hooks = nil
			got, err := s.Read(ctx, "f", 0, n*bs)
			if err != nil {
				t.Fatal(err)
			}
			for i := range n {
				if b := got[i*bs]; b != byte(i+1) {
					t.Errorf("block %d = %d, want %d", i, b, i+1)
				}
			}
		})
	}
}

// TestTruncateWaitsForInflight: writers below EOF held inside the write
// (counted in flight) keep a truncate from finishing; once they finish the
// truncate cuts the file, and none of them can make it larger again.
func TestTruncateWaitsForInflight(t *testing.T) {
	const n, bs = 4, 4096
	ctx := context.Background()
	s, dir := newTestStore(t, Options{Policy: PolicyUnlockedBelowEOF})
	if _, err := s.Write(ctx, "f", 0, make([]byte, 8*bs), SyncNone); err != nil {
		t.Fatal(err)
	}
	// Past the truncate point: landing after it would regrow the file.
	g, wg := holdWriters(t, s, n, func(i int) (int64, []byte) { return int64(4+i) * bs, make([]byte, bs) })
	for range n {
		<-g.arrived
	}
	truncated := make(chan error)
	go func() { truncated <- s.Truncate(ctx, "f", bs) }()
	testutil.WaitFor(t, "truncate to hold the lock", func() bool {
		select {
		case err := <-truncated:
			t.Fatalf("truncate returned (%v) while %d writes were in flight", err, n)
		default:
		}
		fl := fileLocks(s, "f")
		return len(fl.Holders) == 1 && fl.Holders[0].Op == "truncate" && fl.Inflight == n
	})
	g.open()
	if err := <-truncated; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if got := len(readFile(t, dir, "f")); got != bs {
		t.Errorf("file size after truncate = %d, want %d", got, bs)
	}
	if st, _ := s.Stat(ctx, "f"); st.Size != bs {
		t.Errorf("Stat size = %d, want %d", st.Size, bs)
	}
}

// TestExtendingWaitsForInflight lines up the race of an extending write with
// an overlapping write below EOF in flight: the extending write lands its
// bytes, the unlocked write lands its own over them and reads the size, and
// only then does the extending write store its new size. The unlocked write
// then returns the old size (it came first) while its bytes win (it came
// last), which no serial order gives. An extending write that waits for
// writes in flight, as truncate does, orders them all before itself.
func TestExtendingWaitsForInflight(t *testing.T) {
	const bs = 4096
	for _, io := range []IOMode{IOBuffered, IODirect} {
		t.Run(io.String(), func(t *testing.T) {
			ctx := context.Background()
			extData := make(chan struct{}) // the extending write's bytes landed
			unlockedDone := make(chan struct{})
			wrap := func(fsys FS) FS {
				after := func(p []byte, off int64) {
					if off == bs && len(p) == 2*bs { // the extending write
						close(extData)
						<-unlockedDone
					}
				}
				return fileWrapFS{fsys, func(f File) File { return afterWriteFile{f, after} }}
			}
			s, _ := newWrappedStore(t, wrap, Options{Policy: PolicyUnlockedBelowEOF, IO: io})
			if _, err := s.Write(ctx, "f", 0, bytes.Repeat([]byte{1}, 2*bs), SyncNone); err != nil {
				if errors.Is(err, ErrUnsupported) {
					t.Skipf("O_DIRECT is not supported here: %v", err)
				}
				t.Fatal(err)
			}
			ino, err := s.table.get(ctx, "f", false)
			if err != nil {
				t.Fatal(err)
			}
			defer s.table.put(ino)

			// U: block 1, below EOF, held in flight before its bytes.
			g := newGate(t, 2)
			s.opts.Hooks = &Hooks{InsideWrite: func(ctx context.Context, path, mode, reason string) {
				if mode == lockNone.String() {
					g.arrived <- mode
					<-g.release
				}
			}}
			var uSize int64
			go func() {
				defer close(unlockedDone)
				res, err := s.Write(ctx, "f", bs, bytes.Repeat([]byte{28}, bs), SyncNone)
				if err != nil {
					t.Error(err)
				}
				uSize = res.Size
			}()
			<-g.arrived

			// E: blocks 1 and 2, extending, started while U is in flight.
			extended := inBackground(func() (int64, error) {
				res, err := s.Write(ctx, "f", bs, bytes.Repeat([]byte{23}, 2*bs), SyncNone)
				return res.Size, err
			})
			// Either E waits for U (the fix), or its bytes landed and it
			// is held before it stores the size (the race).
			testutil.WaitFor(t, "the extending write to wait for the write in flight or to land its bytes", func() bool {
				select {
				case <-extData:
					return true
				default:
					return ino.inflight.waiting.Load()
				}
			})
			g.open()
			e := <-extended
			if e.err != nil {
				t.Fatal(e.err)
			}
			<-unlockedDone
			s.opts.Hooks = nil

			got, err := s.Read(ctx, "f", bs, 1)
			if err != nil {
				t.Fatal(err)
			}
			// U then E: E's bytes, U saw a size of at least 2 blocks.
			// E then U: U's bytes, U saw E's size.
			uFirst := got[0] == 23 && uSize >= 2*bs && e.size == 3*bs
			eFirst := got[0] == 28 && uSize == 3*bs && e.size == 3*bs
			if !uFirst && !eFirst {
				t.Errorf("block 1 = %d, the write below EOF returned size %d, the extending write %d: no serial order gives that (U;E: 23, >=%d, %d; E;U: 28, %d, %d)",
					got[0], uSize, e.size, 2*bs, 3*bs, 3*bs, 3*bs)
			}
		})
	}
}

// afterWriteFile calls after once each WriteAt returned, with the write's
// bytes and offset: before the store sees the result.
type afterWriteFile struct {
	File
	after func(p []byte, off int64)
}

func (f afterWriteFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := f.File.WriteAt(p, off)
	f.after(p, off)
	return n, err
}

// TestTruncateStress races writers below EOF with truncates under every
// policy. Every write is gated to start before its round's truncate; after
// the truncate returns, the file must be exactly the truncated size.
func TestTruncateStress(t *testing.T) {
	const writers, rounds, bs = 6, 40, 4096
	for _, p := range Policies() {
		t.Run(p.String(), func(t *testing.T) {
			ctx := context.Background()
			s, dir := newTestStore(t, Options{Policy: p})
			for r := range rounds {
				if _, err := s.Write(ctx, "f", 0, make([]byte, 16*bs), SyncNone); err != nil {
					t.Fatal(err)
				}
				// Writers report once they are inside; the truncate is
				// issued only when all of them are, so every write
				// started before it.
				var inside sync.WaitGroup
				inside.Add(writers)
				var once [writers]sync.Once
				s.opts.Hooks = &Hooks{InsideWrite: func(ctx context.Context, path, mode, reason string) {
					i := ctx.Value(writerKey{}).(int)
					once[i].Do(inside.Done)
					// Widen the window in which a write that started
					// before the truncate could land after it.
					time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
				}}
				var wg sync.WaitGroup
				for i := range writers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						wctx := context.WithValue(ctx, writerKey{}, i)
						off := int64((i*7+r)%15+1) * bs
						if _, err := s.Write(wctx, "f", off, bytes.Repeat([]byte{1}, bs), SyncNone); err != nil {
							t.Error(err)
						}
					}()
				}
				// Under exclusive policies only one writer is inside at a
				// time, so wait for each to have entered, not to be inside
				// together.
				inside.Wait()
				size := int64(r%4) * bs
				if err := s.Truncate(ctx, "f", size); err != nil {
					t.Fatal(err)
				}
				wg.Wait()
				if got := int64(len(readFile(t, dir, "f"))); got != size {
					t.Fatalf("round %d: size after truncate(%d) = %d", r, size, got)
				}
				s.opts.Hooks = nil
			}
		})
	}
}

type writerKey struct{}

// TestWriteSizeCoversItsEnd races writers below EOF with truncates that
// shrink the file to nothing and grow it back, under every policy: the size
// a successful Write returns is the size at some moment after its data
// landed, so it is never less than the write's end. A size read after the
// write left its lock mode or the in-flight count could be. The race is
// narrow: the race detector's slower scheduling hits it about once in a
// thousand writes before the fix, hence this many.
func TestWriteSizeCoversItsEnd(t *testing.T) {
	const writers, writesEach, bs = 4, 2500, 4096
	ctx := context.Background()
	for _, p := range Policies() {
		t.Run(p.String(), func(t *testing.T) {
			s, _ := newTestStore(t, Options{Policy: p})
			if err := s.Truncate(ctx, "f", 2*bs); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			truncated := make(chan error, 1)
			go func() {
				for i := 0; ; i++ {
					select {
					case <-done:
						truncated <- nil
						return
					default:
					}
					if err := s.Truncate(ctx, "f", int64(i%2)*2*bs); err != nil {
						truncated <- err
						return
					}
				}
			}()
			var wg sync.WaitGroup
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					data := make([]byte, bs)
					for i := range writesEach {
						off := int64((w+i)%2) * bs
						res, err := s.Write(ctx, "f", off, data, SyncNone)
						if err != nil {
							t.Error(err)
							return
						}
						if end := off + bs; res.Size < end {
							t.Errorf("Write [%d, %d) returned size %d, below its own end", off, end, res.Size)
							return
						}
					}
				}()
			}
			wg.Wait()
			close(done)
			if err := <-truncated; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestCancelWhileQueued: a writer whose context ends while it queues for the
// lock returns promptly with the context's error, and its data never
// appears, not even after the holder releases.
func TestCancelWhileQueued(t *testing.T) {
	for _, cause := range []string{"cancel", "deadline"} {
		t.Run(cause, func(t *testing.T) {
			ctx := context.Background()
			s, dir := newTestStore(t, Options{Policy: PolicyExclusive})
			if _, err := s.Write(ctx, "f", 0, make([]byte, 8192), SyncNone); err != nil {
				t.Fatal(err)
			}
			g := newGate(t, 1)
			s.opts.Hooks = g.hooks()
			holderDone := make(chan error)
			go func() {
				_, err := s.Write(ctx, "f", 0, []byte("holder"), SyncNone)
				holderDone <- err
			}()
			<-g.arrived
			var wctx context.Context
			var cancel context.CancelFunc
			if cause == "cancel" {
				wctx, cancel = context.WithCancel(ctx)
			} else {
				wctx, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
			}
			defer cancel()
			waiterDone := make(chan error)
			go func() {
				_, err := s.Write(wctx, "f", 4096, []byte("waiter"), SyncNone)
				waiterDone <- err
			}()
			testutil.WaitFor(t, "the waiter to queue", func() bool { return fileLocks(s, "f").Waiting == 1 })
			if cause == "cancel" {
				cancel()
			}
			err := <-waiterDone // returns while the holder still holds the lock
			want := context.Canceled
			if cause == "deadline" {
				want = context.DeadlineExceeded
			}
			if !errors.Is(err, want) {
				t.Fatalf("waiter error = %v, want %v", err, want)
			}
			if w := fileLocks(s, "f").Waiting; w != 0 {
				t.Errorf("waiters after cancel = %d, want 0", w)
			}
			g.open()
			if err := <-holderDone; err != nil {
				t.Fatal(err)
			}
			got := readFile(t, dir, "f")
			if bytes.Contains(got, []byte("waiter")) {
				t.Error("the cancelled write reached the file")
			}
			if !bytes.HasPrefix(got, []byte("holder")) {
				t.Errorf("holder's write missing: %q", got[:8])
			}
		})
	}
}

// TestWaiterLimit: beyond MaxWaitersPerFile a caller is refused at once
// with ErrTooManyWaiters naming the limit, and writes nothing.
func TestWaiterLimit(t *testing.T) {
	ctx := context.Background()
	s, dir := newTestStore(t, Options{Policy: PolicyExclusive, MaxWaitersPerFile: 2})
	if _, err := s.Write(ctx, "f", 0, make([]byte, 4096), SyncNone); err != nil {
		t.Fatal(err)
	}
	g := newGate(t, 4)
	s.opts.Hooks = g.hooks()
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Write(ctx, "f", int64(i), []byte{'a'}, SyncNone); err != nil {
				t.Error(err)
			}
		}()
		if i == 0 {
			<-g.arrived
		}
	}
	testutil.WaitFor(t, "two waiters", func() bool { return fileLocks(s, "f").Waiting == 2 })
	_, err := s.Write(ctx, "f", 100, []byte("refused"), SyncNone)
	if !errors.Is(err, ErrTooManyWaiters) {
		t.Fatalf("error = %v, want ErrTooManyWaiters", err)
	}
	if want := "the limit is 2"; !bytes.Contains([]byte(err.Error()), []byte(want)) {
		t.Errorf("error %q does not name the limit %q", err, want)
	}
	g.open()
	wg.Wait()
	if bytes.Contains(readFile(t, dir, "f"), []byte("refused")) {
		t.Error("refused write reached the file")
	}
}

// TestGroupCommit: 32 concurrent Fsyncs share syncs, and each caller was
// released by a sync that started after it asked, so the write it made
// just before is covered. The first caller's sync is held until the 31
// others have queued behind it, so that the count does not depend on how
// the goroutines are scheduled: they must all be covered by one more
// sync, 2 in all. Without a group commit there would be 32; with one that
// joined a running sync, a caller would be covered by none.
func TestGroupCommit(t *testing.T) {
	const callers = 32
	ctx := context.Background()
	rec := &syncRecorder{}
	s, _ := newRecordedStore(t, rec, Options{})
	if _, err := s.Write(ctx, "f", 0, make([]byte, callers*4096), SyncData); err != nil {
		t.Fatal(err)
	}
	type call struct{ asked, returned int64 }
	calls := make([]call, callers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if _, err := s.Write(ctx, "f", int64(i)*4096, []byte(fmt.Sprint(i)), SyncNone); err != nil {
				t.Error(err)
			}
			calls[i].asked = rec.now()
			if err := s.Fsync(ctx, "f", SyncData); err != nil {
				t.Error(err)
			}
			calls[i].returned = rec.now()
		}()
	}
	first := rec.count()
	// If the test fails early, the gate opens and then the callers end,
	// before the store's Close, which would wait for them.
	t.Cleanup(wg.Wait)
	release := testutil.NewGate(t)
	held := rec.holdNext(release.Opened())
	close(start)
	<-held
	testutil.WaitFor(t, "every other caller to queue behind the held sync", func() bool {
		n, err := PendingSyncCallers(s, "f")
		if err != nil {
			t.Fatal(err)
		}
		return n == callers-1
	})
	release.Open()
	wg.Wait()
	syncs := rec.since(first)
	if len(syncs) != 2 {
		t.Errorf("%d syncs for %d callers, the first held until the others queued: want 2", len(syncs), callers)
	}
	for i, c := range calls {
		covered := false
		for _, sy := range syncs {
			if sy.start > c.asked && sy.end < c.returned {
				covered = true
			}
		}
		if !covered {
			t.Errorf("caller %d (asked at %d, returned at %d) was covered by no sync that started after it asked: %v", i, c.asked, c.returned, syncs)
		}
	}
	t.Logf("%d callers, %d syncs", callers, len(syncs))
}

// TestLocksListsWaiters: Locks describes each caller queued for a file's
// lock in queue order, with what it wants, why, and since when it waits.
func TestLocksListsWaiters(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t, Options{Policy: PolicyExclusive})
	if _, err := s.Write(ctx, "f", 0, make([]byte, 4096), SyncNone); err != nil {
		t.Fatal(err)
	}
	g := newGate(t, 4)
	s.opts.Hooks = g.hooks()
	errs := make(chan error, 3)
	go func() { _, err := s.Write(ctx, "f", 0, []byte("held"), SyncNone); errs <- err }()
	<-g.arrived
	start := time.Now()
	go func() { _, err := s.Write(ctx, "f", 4096, []byte("extends"), SyncNone); errs <- err }()
	testutil.WaitFor(t, "the extending write to queue", func() bool { return fileLocks(s, "f").Waiting == 1 })
	go func() { errs <- s.Truncate(ctx, "f", 100) }()
	testutil.WaitFor(t, "the truncate to queue", func() bool { return fileLocks(s, "f").Waiting == 2 })

	fl := fileLocks(s, "f")
	type waiter struct{ mode, op, reason string }
	var got []waiter
	for _, w := range fl.Waiters {
		got = append(got, waiter{w.Mode, w.Op, w.Reason})
	}
	want := []waiter{{"exclusive", "write", ReasonExtending}, {"exclusive", "truncate", ReasonTruncate}}
	if !slices.Equal(got, want) {
		t.Fatalf("waiters %+v, want %+v", got, want)
	}
	if w := fl.Waiters; w[0].Since.Before(start) || w[1].Since.Before(w[0].Since) {
		t.Errorf("waiters since %v and %v, want from %v on, in queue order", w[0].Since, w[1].Since, start)
	}
	if len(fl.Holders) != 1 || !fl.Holders[0].Since.Before(start) {
		t.Errorf("holders %+v, want the held write, since before the waiters came", fl.Holders)
	}
	g.open()
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if fl := fileLocks(s, "f"); len(fl.Waiters) != 0 || fl.Waiting != 0 || len(fl.Holders) != 0 {
		t.Errorf("after all three: %+v, want no holder or waiter", fl)
	}
}
