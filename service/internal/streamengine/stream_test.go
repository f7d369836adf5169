package streamengine

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store"
	"github.com/filewrite/filewrite/store/faultfs"
)

// The engine driven without a server: the test is the framing. Its
// reader queues writes as decoded messages would carry them, its handler
// delivers (run), and its Sender records what each response carried.

// message is a decoded message as the engine sees it: it counts the
// writes that gave its bytes back.
type message struct{ applied atomic.Int32 }

func (m *message) Applied() { m.applied.Add(1) }

// sentAck is what an ack carried, copied before the engine reuses it.
type sentAck struct {
	id      uint64
	written int
	size    int64
	landed  int64
	path    string
	err     error
}

type harness struct {
	t      *testing.T
	root   string
	faults *faultfs.FS // under st: passes every call until a test injects a rule
	st     *store.Store
	s      *Stream

	mu        sync.Mutex
	responses int            // guarded by mu
	acks      []sentAck      // every ack, in the order sent; guarded by mu
	files     []FileStatus   // every file report, in the order sent; guarded by mu
	firstAck  map[uint32]int // per file index, the response of its first ack; guarded by mu
	reported  map[uint32]int // per file index, the response of its report; guarded by mu
	sendErr   error          // if set, every send fails with it; guarded by mu
}

func newHarness(t *testing.T, idle time.Duration) *harness {
	t.Helper()
	h := &harness{t: t, root: testutil.Dir(t), firstAck: map[uint32]int{}, reported: map[uint32]int{}}
	osfs, err := store.OpenOSFS(h.root)
	if err != nil {
		t.Fatal(err)
	}
	h.faults = faultfs.New(osfs)
	if h.st, err = store.Open(h.faults, store.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.st.Close() })
	h.s = New(testutil.Context(t), idle, h.send)
	return h
}

func (h *harness) send(acks []*Write, files []FileStatus) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sendErr != nil {
		return h.sendErr
	}
	h.responses++
	for _, f := range files {
		h.files = append(h.files, f)
		h.reported[f.Index] = h.responses
	}
	for _, w := range acks {
		h.acks = append(h.acks, sentAck{id: w.ID, written: w.Res.BytesWritten, size: w.Res.Size, landed: w.Landed, path: w.Path(), err: w.Err})
		if _, ok := h.firstAck[w.FileIndex]; !ok {
			h.firstAck[w.FileIndex] = h.responses
		}
	}
	return nil
}

// run is the handler: it delivers whenever the engine wakes it, until the
// stream is over, and then reports the stream's end.
func (h *harness) run() <-chan error {
	end := make(chan error, 1)
	go func() {
		for range h.s.Wake() {
			if done, err := h.s.Deliver(); done {
				h.s.CloseSends()
				end <- err
				return
			}
		}
	}()
	return end
}

// open opens path for the stream, creating it.
func (h *harness) open(path string) *store.Handle {
	h.t.Helper()
	hd, err := h.st.OpenHandle(h.t.Context(), path, store.OpenCreate)
	if err != nil {
		h.t.Fatal(err)
	}
	return hd
}

// finish ends the stream as a half-close does, once end is the stream's
// outcome, and gives its files back; it returns the outcome.
func (h *harness) finish(end <-chan error, stop bool) error {
	h.t.Helper()
	if stop {
		h.s.Stop(nil)
	}
	h.s.ReaderDone()
	err := <-end
	h.s.Close()
	return err
}

func (h *harness) sent() []sentAck {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]sentAck(nil), h.acks...)
}

// TestStreamAppliesInArrivalOrder: writes that overlap land as if applied
// one by one in the order they were queued, those that owe a sync are
// acked once synced, every write is acked once with what it wrote, and
// every write gives its message's bytes back once.
func TestStreamAppliesInArrivalOrder(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		h := newHarness(t, 0)
		end := h.run()
		h.s.StartIdleTimer()
		h.s.SetMain("f", h.open("f"))
		h.s.MarkOpened()
		var want []byte
		var msgs []*message
		wantCount := map[*message]int32{}
		wantLen := map[uint64]int{}
		wantOff := map[uint64]int64{}
		id := uint64(0)
		for range 10 {
			m := &message{}
			msgs = append(msgs, m)
			var writes []*Write
			for range 1 + rng.IntN(20) {
				off := int64(rng.IntN(64))
				data := bytes.Repeat([]byte{byte(1 + rng.IntN(255))}, rng.IntN(17))
				w := &Write{ID: id, Off: off, Data: data, Msg: m}
				if rng.IntN(4) == 0 {
					w.Sync = store.SyncData
				}
				wantLen[id], wantOff[id] = len(data), off
				id++
				writes = append(writes, w)
				if len(data) > 0 {
					if last := int(off) + len(data); last > len(want) {
						want = append(want, make([]byte, last-len(want))...)
					}
					copy(want[off:], data)
				}
			}
			wantCount[m] = int32(len(writes))
			h.s.Receiving()
			if queued, err := h.s.Queue(writes, nil); !queued || err != nil {
				t.Fatalf("seed %d: Queue = %v, %v; want queued", seed, queued, err)
			}
			h.s.Handled()
		}
		if err := h.finish(end, true); err != nil {
			t.Fatalf("seed %d: the stream ended with %v, want nil", seed, err)
		}
		acks := h.sent()
		seen := map[uint64]bool{}
		for _, a := range acks {
			if seen[a.id] {
				t.Errorf("seed %d: write %d acked twice", seed, a.id)
			}
			seen[a.id] = true
			if a.err != nil || a.path != "f" || a.written != wantLen[a.id] || a.landed != wantOff[a.id] {
				t.Errorf("seed %d: write %d acked with %+v, want %d bytes written at %d on f", seed, a.id, a, wantLen[a.id], wantOff[a.id])
			}
		}
		if got := len(seen); got != int(id) {
			t.Errorf("seed %d: %d writes acked, want %d", seed, got, id)
		}
		for _, m := range msgs {
			if got, want := m.applied.Load(), wantCount[m]; got != want {
				t.Errorf("seed %d: a message was told Applied %d times, want %d (one per write)", seed, got, want)
			}
		}
		got, err := os.ReadFile(filepath.Join(h.root, "f"))
		if err != nil {
			t.Fatal(err)
		}
		testutil.SameBytes(t, "the file after the stream", got, want)
	}
}

// TestStreamRefusals: a write the framing refused is acked with its error
// and writes nothing; a message that reuses an id not yet acked, or names
// a file not on the stream, is not handed out at all and ends the stream
// with the engine's error; a message after the stop is dropped.
func TestStreamRefusals(t *testing.T) {
	refused := errors.New("refused by the framing")
	tests := []struct {
		name        string
		writes      []*Write
		wantQueued  bool
		wantErr     any // nil, or a pointer to the error type Queue returns
		wantAcked   int
		wantApplied int32
	}{
		{"refused write", []*Write{{ID: 1, Data: []byte("x"), Err: refused}}, true, nil, 1, 1},
		{"id reused in the message", []*Write{{ID: 1, Data: []byte("x")}, {ID: 1, Off: 4, Data: []byte("y")}}, false, new(*IDInUseError), 0, 0},
		{"unknown file", []*Write{{ID: 1, Data: []byte("x")}, {ID: 2, FileIndex: 3, Data: []byte("y")}}, false, new(*UnknownFileError), 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 0)
			end := h.run()
			h.s.SetMain("f", h.open("f"))
			h.s.MarkOpened()
			m := &message{}
			for _, w := range tt.writes {
				w.Msg = m
			}
			queued, err := h.s.Queue(tt.writes, nil)
			if queued != tt.wantQueued {
				t.Errorf("Queue queued = %v, want %v", queued, tt.wantQueued)
			}
			switch target := tt.wantErr.(type) {
			case nil:
				if err != nil {
					t.Errorf("Queue = %v, want no error", err)
				}
			default:
				if !errors.As(err, target) {
					t.Errorf("Queue = %v, want a %T", err, target)
				}
				h.s.Stop(err)
			}
			// A message after the stop is dropped, not handed out.
			h.s.Stop(nil)
			if queued, err := h.s.Queue([]*Write{{ID: 99, Data: []byte("late"), Msg: m}}, nil); queued || err != nil {
				t.Errorf("Queue after the stop = %v, %v; want dropped", queued, err)
			}
			gotEnd := h.finish(end, false)
			if tt.wantErr != nil && !errors.As(gotEnd, tt.wantErr) {
				t.Errorf("the stream ended with %v, want the Queue error", gotEnd)
			}
			acks := h.sent()
			if len(acks) != tt.wantAcked {
				t.Fatalf("%d acks, want %d", len(acks), tt.wantAcked)
			}
			for _, a := range acks {
				if !errors.Is(a.err, refused) || a.written != 0 {
					t.Errorf("ack %+v, want the framing's refusal and nothing written", a)
				}
			}
			if got := m.applied.Load(); got != tt.wantApplied {
				t.Errorf("the message was told Applied %d times, want %d", got, tt.wantApplied)
			}
			if fi, err := os.Stat(filepath.Join(h.root, "f")); err != nil || fi.Size() != 0 {
				t.Errorf("f after refused writes: %v, %v; want empty", fi, err)
			}
		})
	}
}

// TestStreamRefusedAckSizeInStreamOrder: the ack of a write refused
// before anything was written (a CRC-32C mismatch, say) reports the
// file's size after the writes read before it on its file, and none read
// after it, as if the stream's writes were applied one by one: even when
// the write before it is held back in the store, and one after it could
// run at once.
func TestStreamRefusedAckSizeInStreamOrder(t *testing.T) {
	h := newHarness(t, 0)
	end := h.run()
	h.s.SetMain("f", h.open("f"))
	h.s.MarkOpened()
	gate := testutil.NewGate(t)
	held := h.faults.Inject(faultfs.Rule{Op: faultfs.OpWrite, Path: "f", Off: 0, Len: 9, Hold: gate.Opened(), Times: 1})
	refused := errors.New("refused by the framing")
	m := &message{}
	writes := []*Write{
		{ID: 0, Data: []byte("refused"), Err: refused, Msg: m}, // before any write: size 0
		{ID: 1, Data: []byte("nine byte"), Msg: m},             // held in the store
		{ID: 2, Off: 9, Data: []byte("bad"), Err: refused, Msg: m},
		{ID: 3, Off: 100, Data: []byte("later"), Msg: m}, // overlaps neither
	}
	if queued, err := h.s.Queue(writes, nil); !queued || err != nil {
		t.Fatalf("Queue = %v, %v; want queued", queued, err)
	}
	testutil.WaitFor(t, "write 1 to be held", func() bool { return held.Hits() == 1 })
	gate.Open()
	if err := h.finish(end, true); err != nil {
		t.Fatalf("the stream ended with %v, want nil", err)
	}
	want := map[uint64]struct {
		size    int64
		refused bool
	}{0: {0, true}, 1: {9, false}, 2: {9, true}, 3: {105, false}}
	acks := h.sent()
	if len(acks) != len(want) {
		t.Fatalf("%d acks %+v, want %d", len(acks), acks, len(want))
	}
	for _, a := range acks {
		w := want[a.id]
		if a.size != w.size || errors.Is(a.err, refused) != w.refused {
			t.Errorf("write %d acked with size %d, error %v; want size %d, refused %v", a.id, a.size, a.err, w.size, w.refused)
		}
	}
}

// TestStreamDeclaredFiles: a declared file's report goes out no later than
// the first ack of its writes; the writes of a file that could not be
// opened are acked with its error; a closed index takes no more writes.
func TestStreamDeclaredFiles(t *testing.T) {
	h := newHarness(t, 0)
	end := h.run()
	notOpened := errors.New("could not be opened")
	if got := h.s.Closing([]uint32{1, 1, 2}); got != 0 {
		t.Errorf("Closing before any declaration = %d, want 0", got)
	}
	h.s.Declare(1, "a", h.open("a"), nil)
	h.s.Declare(2, "b", nil, notOpened)
	if inUse, held := h.s.Slot(1, h.s.Closing([]uint32{1, 1})); !inUse || held != 1 {
		t.Errorf("Slot(1) with 1 closing = %v, %d; want in use, 1 held", inUse, held)
	}
	h.s.MarkOpened()
	m := &message{}
	writes := []*Write{
		{ID: 1, FileIndex: 1, Data: []byte("to a"), Msg: m},
		{ID: 2, FileIndex: 2, Data: []byte("to b"), Msg: m},
		{ID: 3, FileIndex: 1, Off: 4, Data: []byte("!"), Sync: store.SyncData, Msg: m},
	}
	if queued, err := h.s.Queue(writes, []uint32{1}); !queued || err != nil {
		t.Fatalf("Queue = %v, %v; want queued", queued, err)
	}
	// Index 1 was closed with the message: a write to it now names no file.
	var unknown *UnknownFileError
	if _, err := h.s.Queue([]*Write{{ID: 4, FileIndex: 1, Data: []byte("late"), Msg: m}}, nil); !errors.As(err, &unknown) || unknown.Index != 1 {
		t.Errorf("Queue to a closed index = %v, want an UnknownFileError for 1", err)
	}
	if err := h.finish(end, true); err != nil {
		t.Fatalf("the stream ended with %v, want nil", err)
	}
	h.mu.Lock()
	files, reported, firstAck := h.files, h.reported, h.firstAck
	h.mu.Unlock()
	if len(files) != 2 || files[0].Index != 1 || files[0].Err != nil || files[1].Index != 2 || !errors.Is(files[1].Err, notOpened) {
		t.Errorf("file reports %+v, want 1 open and 2 not opened", files)
	}
	for _, i := range []uint32{1, 2} {
		if reported[i] == 0 || reported[i] > firstAck[i] {
			t.Errorf("file %d reported in response %d, its first ack in %d: want the report first", i, reported[i], firstAck[i])
		}
	}
	byID := map[uint64]sentAck{}
	for _, a := range h.sent() {
		byID[a.id] = a
	}
	for id, want := range map[uint64]struct {
		path string
		err  error
	}{1: {"a", nil}, 2: {"b", notOpened}, 3: {"a", nil}} {
		a, ok := byID[id]
		if !ok || a.path != want.path || !errors.Is(a.err, want.err) {
			t.Errorf("write %d acked %+v (acked: %v), want on %s with %v", id, a, ok, want.path, want.err)
		}
	}
	got, err := os.ReadFile(filepath.Join(h.root, "a"))
	if err != nil {
		t.Fatal(err)
	}
	testutil.SameBytes(t, "a", got, []byte("to a!"))
}

// TestStreamEndsWhenItsFileIsDeleted: deleting the file of the stream's
// path ends the stream with a FileDeletedError naming it, after the acks
// of the writes read before.
func TestStreamEndsWhenItsFileIsDeleted(t *testing.T) {
	h := newHarness(t, 0)
	end := h.run()
	h.s.SetMain("f", h.open("f"))
	h.s.MarkOpened()
	m := &message{}
	if queued, err := h.s.Queue([]*Write{{ID: 1, Data: []byte("before"), Msg: m}}, nil); !queued || err != nil {
		t.Fatalf("Queue = %v, %v", queued, err)
	}
	testutil.WaitFor(t, "the write's ack", func() bool { return len(h.sent()) == 1 })
	if err := h.st.Delete(t.Context(), "f", false); err != nil {
		t.Fatal(err)
	}
	<-h.s.Stopped().Done()
	var deleted *FileDeletedError
	if err := h.finish(end, false); !errors.As(err, &deleted) || deleted.Path != "f" {
		t.Errorf("the stream ended with %v, want a FileDeletedError for f", err)
	}
	if acks := h.sent(); len(acks) != 1 || acks[0].err != nil {
		t.Errorf("acks %+v, want the write read before acked with success", acks)
	}
}

// TestStreamEndsWhenIdle: a stream with nothing to read, apply or ack for
// its idle timeout ends with an IdleError that names the timeout.
func TestStreamEndsWhenIdle(t *testing.T) {
	const idle = 10 * time.Millisecond
	h := newHarness(t, idle)
	end := h.run()
	h.s.StartIdleTimer()
	h.s.SetMain("f", h.open("f"))
	h.s.MarkOpened()
	<-h.s.Stopped().Done()
	var idleErr *IdleError
	if err := h.finish(end, false); !errors.As(err, &idleErr) || idleErr.Timeout != idle {
		t.Errorf("the stream ended with %v, want an IdleError of %v", err, idle)
	}
}

// TestStreamSendFailureEndsIt: a response that cannot be sent ends the
// stream with the send's error, and the reader reads nothing more.
func TestStreamSendFailureEndsIt(t *testing.T) {
	h := newHarness(t, 0)
	broken := errors.New("the client went away")
	h.sendErr = broken
	end := h.run()
	h.s.SetMain("f", h.open("f"))
	h.s.MarkOpened() // its answer is the first response
	<-h.s.Stopped().Done()
	if queued, err := h.s.Queue([]*Write{{ID: 1, Data: []byte("x"), Msg: &message{}}}, nil); queued || err != nil {
		t.Errorf("Queue after the failed send = %v, %v; want dropped", queued, err)
	}
	if err := h.finish(end, false); !errors.Is(err, broken) {
		t.Errorf("the stream ended with %v, want %v", err, broken)
	}
}
