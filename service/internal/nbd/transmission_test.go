//go:build linux

package nbd

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store"
)

// hookedBackend calls before, if set, ahead of each ReadAt and WriteAt of
// its exports: tests hold requests there. Its exports are not
// TryWriters, so every write reaches WriteAt.
type hookedBackend struct {
	Backend
	before func(ctx context.Context, cmd Command, off int64) error
}

func (b *hookedBackend) Open(ctx context.Context, p *Peer, name string) (Export, error) {
	e, err := b.Backend.Open(ctx, p, name)
	if err != nil {
		return nil, err
	}
	return &hookedExport{Export: e, b: b}, nil
}

type hookedExport struct {
	Export
	b *hookedBackend
}

func (e *hookedExport) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if err := e.b.before(ctx, CmdRead, off); err != nil {
		return 0, err
	}
	return e.Export.ReadAt(ctx, p, off)
}

func (e *hookedExport) WriteAt(ctx context.Context, p []byte, off int64, fua bool) error {
	if err := e.b.before(ctx, CmdWrite, off); err != nil {
		return err
	}
	return e.Export.WriteAt(ctx, p, off, fua)
}

// heldAt returns a hook that holds requests at offset off until the gate
// opens or their context ends, and a channel that says when one is held.
func heldAt(t *testing.T, off int64) (gate *testutil.Gate, held chan struct{}, hook func(*Config, *StoreBackend)) {
	gate, held = testutil.NewGate(t), make(chan struct{}, 10)
	return gate, held, func(c *Config, b *StoreBackend) {
		c.Backend = &hookedBackend{Backend: b, before: func(ctx context.Context, _ Command, at int64) error {
			if at != off {
				return nil
			}
			held <- struct{}{}
			select {
			case <-gate.Opened():
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}}
	}
}

// heldRead starts a server whose export holds requests at offset 0, and a
// client in transmission on it whose READ of 4 KiB there (cookie 1) is
// held: the gate lets it go.
func heldRead(t *testing.T, structured bool) (*testServer, *rawClient, *testutil.Gate) {
	t.Helper()
	gate, held, hook := heldAt(t, 0)
	ts := startServer(t, hook)
	ts.file(t, "a.img", make([]byte, 64<<10))
	rc := dialFixed(t, ts.sock)
	rc.goExport("a.img", structured)
	rc.sendReq(0, cmdRead, 1, 0, 4096, nil)
	<-held
	return ts, rc, gate
}

// TestRequestErrors: a request the server refuses gets the error value
// the protocol names, with simple and with structured replies, changes
// nothing, and the connection goes on: a READ after it succeeds.
func TestRequestErrors(t *testing.T) {
	const size = 64 << 10
	ts := startServer(t, func(c *Config, _ *StoreBackend) { c.MaxPayload = 8192 })
	content := randomBytes(4, size)
	file := ts.file(t, "a.img", content)
	for _, structured := range []bool{false, true} {
		for _, tt := range []struct {
			name    string
			flags   uint16
			typ     uint16
			off     uint64
			length  uint32
			payload bool
			want    uint32
			wantSR  uint32 // with structured replies, if other than want
		}{
			{"READ past the end", 0, cmdRead, size - 10, 20, false, errnoINVAL, 0},
			{"READ at an offset past 2^63", 0, cmdRead, 1 << 63, 1, false, errnoINVAL, 0},
			{"READ whose end overflows", 0, cmdRead, ^uint64(0), 2, false, errnoINVAL, 0},
			{"READ longer than the maximum payload", 0, cmdRead, 0, 16384, false, errnoINVAL, errnoOVERFLOW},
			{"READ with NBD_CMD_FLAG_NO_HOLE", cmdFlagNoHole, cmdRead, 0, 1, false, errnoINVAL, 0},
			{"READ with an unknown flag", 1 << 9, cmdRead, 0, 1, false, errnoINVAL, 0},
			{"WRITE past the end", 0, cmdWrite, size - 10, 20, true, errnoNOSPC, 0},
			{"WRITE longer than the maximum payload", 0, cmdWrite, 0, 16384, true, errnoINVAL, 0},
			{"WRITE with NBD_CMD_FLAG_REQ_ONE", cmdFlagReqOne, cmdWrite, 0, 4, true, errnoINVAL, 0},
			{"WRITE_ZEROES past the end", 0, cmdWriteZeroes, size - 10, 20, false, errnoNOSPC, 0},
			{"TRIM past the end", 0, cmdTrim, size, 1, false, errnoINVAL, 0},
			{"CACHE past the end", 0, cmdCache, size, 1, false, errnoINVAL, 0},
			{"FLUSH with an offset", 0, cmdFlush, 1, 0, false, errnoINVAL, 0},
			{"FLUSH with a length", 0, cmdFlush, 0, 1, false, errnoINVAL, 0},
			{"BLOCK_STATUS of length 0", 0, cmdBlockStatus, 0, 0, false, errnoINVAL, 0},
			{"BLOCK_STATUS past the end", 0, cmdBlockStatus, size, 1, false, errnoINVAL, 0},
			{"unknown command", 0, 42, 0, 0, false, errnoINVAL, 0},
			{"NBD_CMD_RESIZE (an extension)", 0, 8, 0, 0, false, errnoINVAL, 0},
		} {
			t.Run(fmt.Sprintf("%s structured %v", tt.name, structured), func(t *testing.T) {
				rc := dialFixed(t, ts.sock)
				rc.goExport("a.img", structured)
				var payload []byte
				if tt.payload {
					payload = bytes.Repeat([]byte{0xee}, int(tt.length))
				}
				rc.sendReq(tt.flags, tt.typ, 1, tt.off, tt.length, payload)
				want := tt.want
				if structured && tt.wantSR != 0 {
					want = tt.wantSR
				}
				if got := errnoOfReply(rc.readAll(1, 0)); got != want {
					t.Errorf("error %d, want %d", got, want)
				}
				rc.sendReq(0, cmdRead, 2, 0, 4096, nil)
				cs := rc.readAll(2, 4096)
				if errnoOfReply(cs) != 0 {
					t.Fatalf("READ after it: error %d", errnoOfReply(cs))
				}
			})
		}
	}
	t.Run("BLOCK_STATUS without a metadata context", func(t *testing.T) {
		rc := dialFixed(t, ts.sock)
		rc.option(optStructuredReply, nil)
		rc.goExport("a.img", false) // structured, but no context selected
		rc.sendReq(0, cmdBlockStatus, 1, 0, 4096, nil)
		if got := errnoOfReply(rc.readAll(1, 0)); got != errnoINVAL {
			t.Errorf("error %d, want EINVAL", got)
		}
	})
	t.Run("BLOCK_STATUS with a context selected for another export", func(t *testing.T) {
		ts.file(t, "b.img", make([]byte, 4096))
		rc := dialFixed(t, ts.sock)
		rc.option(optStructuredReply, nil)
		rc.option(optSetMetaContext, metaData("b.img", metaBaseAllocation))
		rc.goExport("a.img", false)
		rc.sendReq(0, cmdBlockStatus, 1, 0, 4096, nil)
		if got := errnoOfReply(rc.readAll(1, 0)); got != errnoINVAL {
			t.Errorf("error %d, want EINVAL", got)
		}
	})
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	testutil.SameBytes(t, "the file after refused requests", got, content)
}

// TestRequestDisconnects: a request the server cannot answer ends the
// connection: a bad magic (nothing after it can be found), and a refused
// WRITE whose payload is past what the protocol has a server read.
func TestRequestDisconnects(t *testing.T) {
	ts := startServer(t)
	ts.file(t, "a.img", make([]byte, 4096))
	for _, tt := range []struct {
		name string
		send func(rc *rawClient)
	}{
		{"bad magic", func(rc *rawClient) { rc.write(make([]byte, requestHeaderLen)) }},
		{"the old request magic", func(rc *rawClient) {
			rc.write(binary.BigEndian.AppendUint32(nil, 0x12560953))
			rc.write(make([]byte, requestHeaderLen-4))
		}},
		{"WRITE of more than 32 MiB", func(rc *rawClient) { rc.sendReq(0, cmdWrite, 1, 0, MaxPayload+1, nil) }},
		{"DISC", func(rc *rawClient) { rc.sendReq(0, cmdDisc, 1, 0, 0, nil) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rc := dialFixed(t, ts.sock)
			rc.goExport("a.img", true)
			tt.send(rc)
			rc.expectClosed()
		})
	}
}

// sparseFile makes name under ts's root: size bytes, data at the
// offsets of data and holes elsewhere.
func sparseFile(t *testing.T, ts *testServer, name string, size int64, data map[int64][]byte) {
	t.Helper()
	f, err := os.Create(filepath.Join(ts.root, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for off, b := range data {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
}

// chunkSummary describes a reply's chunks: DATA(off,len) HOLE(off,len)
// NONE ERROR(errno) STATUS(len:flags ...).
func chunkSummary(cs []chunk) string {
	var s []string
	for _, c := range cs {
		switch c.typ {
		case replyTypeOffsetData:
			s = append(s, fmt.Sprintf("DATA(%d,%d)", binary.BigEndian.Uint64(c.payload), len(c.payload)-8))
		case replyTypeOffsetHole:
			s = append(s, fmt.Sprintf("HOLE(%d,%d)", binary.BigEndian.Uint64(c.payload), binary.BigEndian.Uint32(c.payload[8:])))
		case replyTypeNone:
			s = append(s, "NONE")
		case replyTypeBlockStatus:
			d := fmt.Sprintf("STATUS(%d:", binary.BigEndian.Uint32(c.payload))
			for p := c.payload[4:]; len(p) >= 8; p = p[8:] {
				d += fmt.Sprintf(" %d/%d", binary.BigEndian.Uint32(p), binary.BigEndian.Uint32(p[4:]))
			}
			s = append(s, d+")")
		default:
			s = append(s, fmt.Sprintf("TYPE%d(errno %d)", c.typ, c.errno))
		}
	}
	return fmt.Sprint(s)
}

// TestStructuredRead: with structured replies a READ sends the ranges
// that read as zeros as holes and the rest as data, one chunk of either
// with NBD_CMD_FLAG_DF, and the data read back is the file's.
func TestStructuredRead(t *testing.T) {
	ts := startServer(t)
	a, b := randomBytes(5, 4096), randomBytes(6, 8192)
	sparseFile(t, ts, "s.img", 2<<20, map[int64][]byte{0: a, 1 << 20: b})
	rc := dialFixed(t, ts.sock)
	rc.goExport("s.img", true)
	want := make([]byte, 2<<20)
	copy(want, a)
	copy(want[1<<20:], b)
	checkReplies(t, rc, cmdRead, []replyCase{
		{"data, hole, data", 0, 0, 1<<20 + 4096, "[DATA(0,4096) HOLE(4096,1044480) DATA(1048576,4096)]"},
		{"a hole", 0, 8192, 4096, "[HOLE(8192,4096)]"},
		{"from the middle of the data", 0, 100, 8000, "[DATA(100,3996) HOLE(4096,4004)]"},
		{"to the end", 0, 1<<20 + 8192, 1<<20 - 8192, "[HOLE(1056768,1040384)]"},
		{"don't fragment", cmdFlagDF, 0, 1<<20 + 4096, "[DATA(0,1052672)]"},
		{"don't fragment, a hole", cmdFlagDF, 8192, 4096, "[HOLE(8192,4096)]"},
		{"length 0", 0, 0, 0, "[NONE]"},
	}, func(tt replyCase, cs []chunk) {
		// Reassembled, the reply is the file's bytes.
		got := make([]byte, tt.length)
		for _, c := range cs {
			if c.typ == replyTypeOffsetData {
				copy(got[binary.BigEndian.Uint64(c.payload)-tt.off:], c.payload[8:])
			}
		}
		testutil.SameBytes(t, tt.name, got, want[tt.off:tt.off+uint64(tt.length)])
	})
}

// replyCase is a request and the summary of its reply's chunks.
type replyCase struct {
	name   string
	flags  uint16
	off    uint64
	length uint32
	want   string
}

// checkReplies sends each case's request of type typ on rc and checks
// the summary of its reply, then hands the reply to more, if not nil.
func checkReplies(t *testing.T, rc *rawClient, typ uint16, cases []replyCase, more func(replyCase, []chunk)) {
	t.Helper()
	for i, tt := range cases {
		cookie := uint64(i + 1)
		rc.sendReq(tt.flags, typ, cookie, tt.off, tt.length, nil)
		cs := rc.readAll(cookie, 0)
		if got := chunkSummary(cs); got != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
		if more != nil {
			more(tt, cs)
		}
	}
}

// TestBlockStatus: base:allocation's descriptors follow the file's
// extents: data is 0, a hole 3 (NBD_STATE_HOLE|NBD_STATE_ZERO),
// preallocated blocks 2 (NBD_STATE_ZERO); one descriptor, no longer than
// asked, with NBD_CMD_FLAG_REQ_ONE.
func TestBlockStatus(t *testing.T) {
	ts := startServer(t)
	sparseFile(t, ts, "s.img", 1<<20, map[int64][]byte{0: make([]byte, 8192), 512 << 10: make([]byte, 4096)})
	if _, err := ts.st.Fallocate(context.Background(), "s.img", store.FallocKeepSize, 768<<10, 64<<10); err != nil {
		t.Fatal(err)
	}
	rc := dialFixed(t, ts.sock)
	rc.goExport("s.img", true)
	checkReplies(t, rc, cmdBlockStatus, []replyCase{
		{"the whole file", 0, 0, 1 << 20, "[STATUS(1: 8192/0 516096/3 4096/0 258048/3 65536/2 196608/3)]"},
		{"unaligned", 0, 100, 8192, "[STATUS(1: 8092/0 100/3)]"},
		{"one", cmdFlagReqOne, 0, 1 << 20, "[STATUS(1: 8192/0)]"},
		{"one, shorter than the extent", cmdFlagReqOne, 4096, 10, "[STATUS(1: 10/0)]"},
	}, nil)
}

// TestShrunkFile: the export keeps the size it was opened with when
// another door shrinks the file: a read past the file's end reads zeros
// and block status calls it a hole, a write within the export's size is
// made where the client asked (the file grows back), and a request past
// the export's size is refused.
func TestShrunkFile(t *testing.T) {
	ts := startServer(t)
	ts.file(t, "a.img", randomBytes(7, 64<<10))
	for _, structured := range []bool{false, true} {
		t.Run(fmt.Sprintf("structured %v", structured), func(t *testing.T) {
			ctx := context.Background()
			if err := ts.st.Truncate(ctx, "a.img", 64<<10); err != nil {
				t.Fatal(err)
			}
			rc := dialFixed(t, ts.sock)
			if s := rc.goExport("a.img", structured); s.size != 64<<10 {
				t.Fatalf("size %d", s.size)
			}
			if err := ts.st.Truncate(ctx, "a.img", 4096); err != nil {
				t.Fatal(err)
			}
			rc.sendReq(0, cmdRead, 1, 0, 16384, nil)
			cs := rc.readAll(1, 16384)
			got := make([]byte, 16384)
			for _, c := range cs {
				switch {
				case c.simple:
					copy(got, c.payload)
				case c.typ == replyTypeOffsetData:
					copy(got[binary.BigEndian.Uint64(c.payload):], c.payload[8:])
				}
			}
			if !bytes.Equal(got[4096:], make([]byte, 12288)) || errnoOfReply(cs) != 0 {
				t.Errorf("read past the file's end: %s", chunkSummary(cs))
			}
			if structured {
				rc.sendReq(0, cmdBlockStatus, 2, 8192, 8192, nil)
				if got := chunkSummary(rc.readAll(2, 0)); got != "[STATUS(1: 8192/3)]" {
					t.Errorf("block status past the file's end: %s", got)
				}
			}
			rc.sendReq(0, cmdWrite, 3, 32768, 4, []byte("abcd"))
			if e := errnoOfReply(rc.readAll(3, 0)); e != 0 {
				t.Errorf("write within the export past the file's end: error %d", e)
			}
			st, err := ts.st.Stat(ctx, "a.img")
			if err != nil || st.Size != 32772 {
				t.Errorf("the file's size %d (%v), want 32772", st.Size, err)
			}
			rc.sendReq(0, cmdWrite, 4, 64<<10, 4, []byte("abcd"))
			if e := errnoOfReply(rc.readAll(4, 0)); e != errnoNOSPC {
				t.Errorf("write past the export: error %d, want ENOSPC", e)
			}
		})
	}
}

// TestTrimAndZeroes: TRIM punches a hole, WRITE_ZEROES zeroes a range
// leaving holes (or, with NBD_CMD_FLAG_NO_HOLE, allocated blocks), and
// both read back as zeros; FUA and FAST_ZERO are taken.
func TestTrimAndZeroes(t *testing.T) {
	ts := startServer(t)
	content := randomBytes(8, 1<<20)
	file := ts.file(t, "a.img", content)
	rc := dialFixed(t, ts.sock)
	rc.goExport("a.img", true)
	for i, r := range []struct {
		flags       uint16
		typ         uint16
		off, length uint64
	}{
		{0, cmdTrim, 0, 64 << 10},
		{cmdFlagFUA, cmdWriteZeroes, 128 << 10, 64 << 10},
		{cmdFlagNoHole, cmdWriteZeroes, 256 << 10, 64 << 10},
		{cmdFlagFastZero | cmdFlagNoHole, cmdWriteZeroes, 384 << 10, 100},
		{cmdFlagFUA, cmdTrim, 512 << 10, 0},
	} {
		rc.sendReq(r.flags, r.typ, uint64(i), r.off, uint32(r.length), nil)
		if e := errnoOfReply(rc.readAll(uint64(i), 0)); e != 0 {
			t.Fatalf("request %d: error %d", i, e)
		}
		clear(content[r.off : r.off+r.length])
	}
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	testutil.SameBytes(t, "the file", got, content)
	rc.sendReq(0, cmdBlockStatus, 9, 0, 320<<10, nil)
	if got, want := chunkSummary(rc.readAll(9, 0)), "[STATUS(1: 65536/3 65536/0 65536/3 65536/0 65536/2)]"; got != want {
		t.Errorf("block status: %s, want %s", got, want)
	}
}

// TestOutOfOrder: the requests of one connection run concurrently and
// are answered as they finish: a READ held in the export does not hold
// up a WRITE sent after it, nor the READ that reads that write.
func TestOutOfOrder(t *testing.T) {
	_, rc, gate := heldRead(t, false)
	rc.sendReq(0, cmdWrite, 2, 8192, 4, []byte("abcd"))
	if c := rc.readReply(0); c.cookie != 2 || c.errno != 0 {
		t.Fatalf("first reply: cookie %d error %d, want the WRITE's (2)", c.cookie, c.errno)
	}
	rc.sendReq(0, cmdRead, 3, 8192, 4, nil)
	if c := rc.readReply(4); c.cookie != 3 || string(c.payload) != "abcd" {
		t.Fatalf("second reply: cookie %d %q, want the READ's (3) of abcd", c.cookie, c.payload)
	}
	gate.Open()
	if c := rc.readReply(4096); c.cookie != 1 || c.errno != 0 {
		t.Fatalf("last reply: cookie %d error %d, want the held READ's (1)", c.cookie, c.errno)
	}
}

// TestDiscFinishesRequests: after NBD_CMD_DISC the server finishes the
// requests in flight ("MUST handle all outstanding requests") before it
// closes the connection.
func TestDiscFinishesRequests(t *testing.T) {
	gate, held, hook := heldAt(t, 4096)
	ts := startServer(t, hook)
	file := ts.file(t, "a.img", make([]byte, 64<<10))
	rc := dialFixed(t, ts.sock)
	rc.goExport("a.img", false)
	rc.sendReq(0, cmdWrite, 1, 4096, 4, []byte("abcd"))
	<-held
	rc.sendReq(0, cmdDisc, 2, 0, 0, nil)
	testutil.WaitFor(t, "the DISC to be read", func() bool { return ts.srv.Conns()[0].Requests == 2 })
	if got := ts.srv.Conns()[0].InFlight; got != 1 {
		t.Errorf("%d requests in flight after DISC, want 1", got)
	}
	gate.Open()
	if c := rc.readReply(0); c.cookie != 1 || c.errno != 0 {
		t.Errorf("reply: cookie %d error %d, want the WRITE's", c.cookie, c.errno)
	}
	rc.expectClosed()
	got, err := os.ReadFile(file)
	if err != nil || string(got[4096:4100]) != "abcd" {
		t.Errorf("the file holds %q (%v), want abcd", got[4096:4100], err)
	}
}

// TestShutdown: Shutdown closes the listener and connections in the
// handshake, answers requests that arrive meanwhile with NBD_ESHUTDOWN,
// lets the requests in flight finish, then closes the connection.
func TestShutdown(t *testing.T) {
	ts, rc, gate := heldRead(t, true)
	handshaking := dialFixed(t, ts.sock)
	done := make(chan error, 1)
	go func() { done <- ts.srv.Shutdown(context.Background()) }()
	handshaking.expectClosed()
	if c, err := net.Dial("unix", ts.sock); err == nil {
		c.Close()
		t.Errorf("the listener still accepts")
	}
	rc.sendReq(0, cmdFlush, 2, 0, 0, nil)
	if e := errnoOfReply(rc.readAll(2, 0)); e != errnoSHUTDOWN {
		t.Errorf("a request during shutdown: error %d, want ESHUTDOWN", e)
	}
	gate.Open()
	if cs := rc.readAll(1, 0); errnoOfReply(cs) != 0 {
		t.Errorf("the request in flight: %s", chunkSummary(cs))
	}
	rc.expectClosed()
	if err := <-done; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// TestShutdownDeadline: when Shutdown's context ends first, the requests
// still running are cancelled and the connections closed.
func TestShutdownDeadline(t *testing.T) {
	ts, rc, _ := heldRead(t, false)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ts.srv.Shutdown(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Shutdown: %v, want context.Canceled", err)
	}
	rc.expectClosed()
}

// countingBudget is a Budget that counts what it holds (a request larger
// than the whole budget holding all of it), over a localBudget.
type countingBudget struct {
	*localBudget
	held, peak atomic.Int64
	mu         sync.Mutex
}

func (b *countingBudget) Acquire(ctx context.Context, n int64) error {
	if err := b.localBudget.Acquire(ctx, n); err != nil {
		return err
	}
	h := b.held.Add(min(n, b.capacity))
	b.mu.Lock()
	b.peak.Store(max(b.peak.Load(), h))
	b.mu.Unlock()
	return nil
}

func (b *countingBudget) Release(n int64) {
	b.held.Add(-min(n, b.capacity))
	b.localBudget.Release(n)
}

// TestBudget: every request's bytes come back to the budget, a budget
// smaller than one request still serves it, and what requests hold never
// passes the budget.
func TestBudget(t *testing.T) {
	const capacity = 64 << 10
	budget := &countingBudget{localBudget: newLocalBudget(capacity)}
	ts := startServer(t, func(c *Config, _ *StoreBackend) { c.Budget = budget })
	ts.file(t, "a.img", make([]byte, 4<<20))
	var wg sync.WaitGroup
	for conn := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rc := dialFixed(t, ts.sock)
			rc.goExport("a.img", conn%2 == 0)
			const n = 32
			// Replies are read as they come, as a client does: one that
			// stops reading holds the budget until Config.ReplyTimeout.
			replies := make(chan struct{})
			go func() {
				defer close(replies)
				for range n {
					c := rc.readReply(0)
					switch {
					case !c.simple:
						for c.flags&replyFlagDone == 0 {
							c = rc.readReply(0)
						}
					case c.errno == 0 && c.cookie%4 == 1:
						rc.read(make([]byte, 1<<20))
					case c.errno == 0 && c.cookie%4 == 3:
						rc.read(make([]byte, 4096))
					}
				}
			}()
			for i := range n {
				off := uint64(conn<<20 + i*32<<10)
				switch i % 4 {
				case 0:
					rc.sendReq(0, cmdWrite, uint64(i), off, 32<<10, make([]byte, 32<<10))
				case 1:
					rc.sendReq(0, cmdRead, uint64(i), off, 1<<20, nil) // past the budget
				case 2:
					rc.sendReq(0, cmdWrite, uint64(i), 4<<20, 100, make([]byte, 100)) // refused
				case 3:
					rc.sendReq(0, cmdRead, uint64(i), off, 4096, nil)
				}
			}
			<-replies
			rc.sendReq(0, cmdDisc, 0, 0, 0, nil)
			rc.expectClosed()
		}()
	}
	wg.Wait()
	testutil.WaitFor(t, "the connections to end", func() bool { return len(ts.srv.Conns()) == 0 })
	if h := budget.held.Load(); h != 0 {
		t.Errorf("the budget holds %d bytes after every connection ended", h)
	}
	if p := budget.peak.Load(); p > capacity {
		t.Errorf("the budget held %d bytes at its peak, its capacity is %d", p, capacity)
	}
}

// TestConns: the open connections are listed with their export, and
// leave the list when they end.
func TestConns(t *testing.T) {
	ts := startServer(t)
	ts.file(t, "a.img", make([]byte, 4096))
	rc := dialFixed(t, ts.sock)
	rc.goExport("a.img", true)
	handshaking := dialFixed(t, ts.sock)
	testutil.WaitFor(t, "two connections, one in transmission", func() bool {
		cs := ts.srv.Conns()
		return len(cs) == 2 && cs[0].Export != ""
	})
	cs := ts.srv.Conns()
	if cs[0].Export != "a.img" || !cs[0].Structured || cs[1].Export != "" {
		t.Errorf("Conns: %+v", cs)
	}
	handshaking.nc.Close()
	rc.sendReq(0, cmdDisc, 0, 0, 0, nil)
	testutil.WaitFor(t, "no connections", func() bool { return len(ts.srv.Conns()) == 0 })
}

// TestRecheck: after a Recheck that narrows what the client may do, the
// connection refuses what it no longer may with EPERM, and a later
// Recheck gives it back, up to what the export was opened with.
func TestRecheck(t *testing.T) {
	ts := startServer(t)
	ts.file(t, "a.img", make([]byte, 64<<10))
	rc := dialFixed(t, ts.sock)
	rc.goExport("a.img", false)
	cookie := uint64(0)
	try := func(typ uint16, payload []byte) uint32 {
		cookie++
		rc.sendReq(0, typ, cookie, 0, 4, payload)
		readLen := 0
		if typ == cmdRead {
			readLen = 4
		}
		return errnoOfReply(rc.readAll(cookie, readLen))
	}
	refusing := errors.New("out of scope")
	for _, tt := range []struct {
		name                string
		readOnly            bool
		err                 error
		wantRead, wantWrite uint32
	}{
		{"read-only", true, nil, 0, errnoPERM},
		{"nothing", false, refusing, errnoPERM, errnoPERM},
		{"read and write again", false, nil, 0, 0},
	} {
		var asked string
		ts.srv.Recheck(func(_ *Peer, name string) (bool, error) {
			asked = name
			return tt.readOnly, tt.err
		})
		if asked != "a.img" {
			t.Errorf("%s: Recheck asked about %q, want a.img", tt.name, asked)
		}
		if got := try(cmdRead, nil); got != tt.wantRead {
			t.Errorf("%s: READ error %d, want %d", tt.name, got, tt.wantRead)
		}
		if got := try(cmdWrite, []byte("abcd")); got != tt.wantWrite {
			t.Errorf("%s: WRITE error %d, want %d", tt.name, got, tt.wantWrite)
		}
	}
}

// TestErrnoName: metrics name each error value as the client was told it.
func TestErrnoName(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want string
	}{
		{nil, "OK"},
		{refusal{errnoOVERFLOW, "x"}, "EOVERFLOW"},
		{fmt.Errorf("wrapped: %w", refusal{errnoNOSPC, "x"}), "ENOSPC"},
		{fmt.Errorf("%w: x", ErrPermission), "EPERM"},
		{fmt.Errorf("%w: x", ErrNotSupported), "ENOTSUP"},
		{context.Canceled, "ESHUTDOWN"},
		{errors.New("anything else"), "EIO"},
	} {
		if got := ErrnoName(tt.err); got != tt.want {
			t.Errorf("ErrnoName(%v) = %s, want %s", tt.err, got, tt.want)
		}
	}
}
