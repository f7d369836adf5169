//go:build linux

package nbd

// Fuzz targets for what a client controls: a whole session's bytes
// (FuzzSession: the handshake, then the requests), and request headers
// against every state a handshake can settle (FuzzRequest). Seeds are in
// testdata/fuzz and added below; .ci/run fuzzes each briefly:
//
//	go test ./service/internal/nbd -run '^$' -fuzz '^FuzzSession$' -fuzztime 1m
//	go test ./service/internal/nbd -run '^$' -fuzz '^FuzzRequest$' -fuzztime 1m

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// memBackend serves two exports from memory: "a" and the read-only "ro",
// whose even 4 KiB blocks are data and odd ones holes.
type memBackend struct{}

func (memBackend) Open(_ context.Context, _ *Peer, name string) (Export, error) {
	switch name {
	case "a", "ro":
		return &memExport{data: make([]byte, 64<<10), readOnly: name == "ro"}, nil
	}
	return nil, ErrNotFound
}

func (memBackend) List(context.Context, *Peer, int) ([]string, error) {
	return []string{"a", "ro"}, nil
}

type memExport struct {
	readOnly bool
	mu       sync.Mutex // guards data
	data     []byte
}

func (e *memExport) Size() int64    { return int64(len(e.data)) }
func (e *memExport) ReadOnly() bool { return e.readOnly }

func (e *memExport) ReadAt(_ context.Context, p []byte, off int64) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return copy(p, e.data[off:]), nil
}

func (e *memExport) WriteAt(_ context.Context, p []byte, off int64, _ bool) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	copy(e.data[off:], p)
	return nil
}

func (e *memExport) Flush(context.Context) error { return nil }

func (e *memExport) Trim(ctx context.Context, off, length int64, _ bool) error {
	return e.Zero(ctx, off, length, ZeroFlags{})
}

func (e *memExport) Zero(_ context.Context, off, length int64, f ZeroFlags) error {
	if f.Fast && f.NoHole {
		return ErrNotSupported
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	clear(e.data[off : off+length])
	return nil
}

func (e *memExport) Extents(_ context.Context, off, length int64, limit int) ([]Extent, error) {
	var out []Extent
	for pos, end := off, off+length; pos < end && len(out) < limit; {
		next := min((pos/4096+1)*4096, end)
		hole := pos/4096%2 == 1
		out = append(out, Extent{Offset: pos, Length: next - pos, Hole: hole, Zero: hole})
		pos = next
	}
	return out, nil
}

func (e *memExport) Close() error { return nil }

// fuzzConn is a net.Conn whose reads are the fuzz input and whose writes
// are dropped.
type fuzzConn struct {
	r      *bytes.Reader // read by the serve goroutine only
	closed atomic.Bool
}

func (c *fuzzConn) Read(p []byte) (int, error) {
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	return c.r.Read(p)
}

func (c *fuzzConn) Write(p []byte) (int, error) {
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	return len(p), nil
}

func (c *fuzzConn) Close() error                     { c.closed.Store(true); return nil }
func (c *fuzzConn) LocalAddr() net.Addr              { return &net.UnixAddr{Name: "fuzz", Net: "unix"} }
func (c *fuzzConn) RemoteAddr() net.Addr             { return &net.UnixAddr{Name: "@", Net: "unix"} }
func (c *fuzzConn) SetDeadline(time.Time) error      { return nil }
func (c *fuzzConn) SetReadDeadline(time.Time) error  { return nil }
func (c *fuzzConn) SetWriteDeadline(time.Time) error { return nil }

// clientSession builds the bytes of a client's session: the client flags,
// options, then requests.
type clientSession struct{ b []byte }

func newClientSession() *clientSession {
	return &clientSession{b: binary.BigEndian.AppendUint32(nil, clientFixedNewstyle|clientNoZeroes)}
}

func (s *clientSession) opt(opt uint32, data []byte) *clientSession {
	s.b = binary.BigEndian.AppendUint64(s.b, magicIHaveOpt)
	s.b = binary.BigEndian.AppendUint32(s.b, opt)
	s.b = binary.BigEndian.AppendUint32(s.b, uint32(len(data)))
	s.b = append(s.b, data...)
	return s
}

func (s *clientSession) req(flags, typ uint16, off uint64, length uint32, payload []byte) *clientSession {
	s.b = binary.BigEndian.AppendUint32(s.b, magicRequest)
	s.b = binary.BigEndian.AppendUint16(s.b, flags)
	s.b = binary.BigEndian.AppendUint16(s.b, typ)
	s.b = binary.BigEndian.AppendUint64(s.b, 7)
	s.b = binary.BigEndian.AppendUint64(s.b, off)
	s.b = binary.BigEndian.AppendUint32(s.b, length)
	s.b = append(s.b, payload...)
	return s
}

// fuzzAllocBytes bounds what a session may allocate: the connection's
// buffers and a fixed part, and then per byte of input a bounded amount
// (a 28-byte READ takes a buffer of at most the 4 KiB maximum payload
// set below; an option at most its data). Never anything sized by a
// length the client claims beyond that.
func fuzzAllocBytes(input int) uint64 {
	return 1<<20 + 256*uint64(input)
}

// FuzzSession: whatever bytes a client sends, the server never panics,
// allocates no more than fuzzAllocBytes, gives back every byte of its
// budget, and ends every goroutine it started once the bytes run out.
func FuzzSession(f *testing.F) {
	structured := newClientSession().opt(optStructuredReply, nil).opt(optSetMetaContext, metaData("a", metaBaseAllocation))
	for _, s := range []*clientSession{
		newClientSession().opt(optList, nil).opt(optInfo, infoData("a", infoName, infoBlockSize)).opt(optAbort, nil),
		newClientSession().opt(optExportName, []byte("a")).req(0, cmdWrite, 0, 4, []byte("abcd")).req(0, cmdRead, 0, 4, nil),
		newClientSession().opt(optGo, infoData("ro")).req(0, cmdWrite, 0, 4, []byte("abcd")).req(0, cmdTrim, 0, 1, nil),
		structured.opt(optListMetaContext, metaData("a", "base:")).opt(optGo, infoData("a")).
			req(cmdFlagDF, cmdRead, 0, 4096*3, nil).req(cmdFlagReqOne, cmdBlockStatus, 100, 9000, nil).
			req(cmdFlagNoHole|cmdFlagFastZero, cmdWriteZeroes, 0, 8192, nil).req(cmdFlagFUA, cmdFlush, 0, 0, nil).
			req(0, cmdCache, 0, 4096, nil).req(0, cmdDisc, 0, 0, nil),
		newClientSession().opt(optStartTLS, nil).opt(99, []byte("x")),
	} {
		f.Add(s.b)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		budget := &countingBudget{localBudget: newLocalBudget(1 << 20)}
		srv, err := NewServer(Config{Backend: memBackend{}, Budget: budget, MaxPayload: MinPayload,
			TLS: &tls.Config{}, MaxRequestsPerConn: 8})
		if err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		c := newConn(srv, &fuzzConn{r: bytes.NewReader(in)})
		c.serve()
		runtime.ReadMemStats(&after)
		if got, limit := after.TotalAlloc-before.TotalAlloc, fuzzAllocBytes(len(in)); got > limit {
			t.Errorf("a session of %d bytes allocated %d bytes, the bound is %d", len(in), got, limit)
		}
		if h := budget.held.Load(); h != 0 {
			t.Errorf("the budget holds %d bytes after the session", h)
		}
		if n := c.running.Load(); n != 0 {
			t.Errorf("%d requests still running after the session", n)
		}
	})
}

// FuzzRequest: decoding and checking a request header allocates nothing
// and lets through only what the export can take: a known command with
// flags it takes, within the export, within the maximum payload, no
// write to a read-only export; a refusal carries an error value of
// "Error values" and a message.
func FuzzRequest(f *testing.F) {
	add := func(state byte, size uint64, r request) {
		var b [1 + 8 + requestHeaderLen]byte
		b[0] = state
		binary.BigEndian.PutUint64(b[1:], size)
		binary.BigEndian.PutUint32(b[9:], magicRequest)
		binary.BigEndian.PutUint16(b[13:], r.flags)
		binary.BigEndian.PutUint16(b[15:], r.typ)
		binary.BigEndian.PutUint64(b[25:], r.offset)
		binary.BigEndian.PutUint32(b[33:], r.length)
		f.Add(b[:])
	}
	add(0, 1<<20, request{typ: cmdRead, length: 4096})
	add(7, 1<<20, request{typ: cmdWrite, offset: 1<<20 - 1, length: 2})
	add(2, 1<<20, request{typ: cmdBlockStatus, flags: cmdFlagReqOne, length: 1})
	add(1, 0, request{typ: cmdWriteZeroes, flags: cmdFlagFastZero | cmdFlagNoHole | cmdFlagFUA, length: 0})
	add(6, ^uint64(0), request{typ: cmdRead, flags: cmdFlagDF, offset: ^uint64(0), length: 1})
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < 9 {
			return
		}
		lim := limits{readOnly: in[0]&1 != 0, structured: in[0]&2 != 0, meta: in[0]&4 != 0,
			size: binary.BigEndian.Uint64(in[1:]) >> (in[0] >> 3), maxPayload: 8192}
		headers := in[9:]
		allocs := testing.AllocsPerRun(1, func() {
			for h := headers; len(h) >= requestHeaderLen; h = h[requestHeaderLen:] {
				if r, err := decodeRequest((*[requestHeaderLen]byte)(h)); err == nil {
					sinkRefusal = lim.check(r)
				}
			}
		})
		if allocs != 0 {
			t.Fatalf("decoding and checking %d headers allocated %v times", len(headers)/requestHeaderLen, allocs)
		}
		for h := headers; len(h) >= requestHeaderLen; h = h[requestHeaderLen:] {
			r, err := decodeRequest((*[requestHeaderLen]byte)(h))
			if err != nil {
				if binary.BigEndian.Uint32(h) == magicRequest {
					t.Fatalf("request %x refused for its magic", h[:requestHeaderLen])
				}
				continue
			}
			checkRefusal(t, lim, r, lim.check(r))
		}
	})
}

// sinkRefusal keeps the compiler from dropping the checks that
// FuzzRequest counts the allocations of.
var sinkRefusal refusal

// checkRefusal holds check's decision on r to what the protocol allows.
func checkRefusal(t *testing.T, lim limits, r request, ref refusal) {
	t.Helper()
	if ref.errno != 0 {
		switch ref.errno {
		case errnoPERM, errnoINVAL, errnoNOSPC, errnoOVERFLOW:
		default:
			t.Fatalf("%+v refused with error %d", r, ref.errno)
		}
		if ref.msg == "" {
			t.Fatalf("%+v refused without a message", r)
		}
		return
	}
	if int(r.typ) >= len(allowedFlags) {
		t.Fatalf("%+v: unknown command let through", r)
	}
	allowed := allowedFlags[r.typ]
	if !lim.structured {
		allowed &^= cmdFlagDF
	}
	if r.flags&^allowed != 0 {
		t.Fatalf("%+v: flags %#x let through for a command that takes %#x", r, r.flags, allowed)
	}
	switch r.typ {
	case cmdDisc:
		return
	case cmdFlush:
		if r.offset != 0 || r.length != 0 {
			t.Fatalf("%+v: FLUSH with an offset or length let through", r)
		}
		return
	case cmdWrite, cmdTrim, cmdWriteZeroes:
		if lim.readOnly {
			t.Fatalf("%+v: a write to a read-only export let through", r)
		}
	case cmdBlockStatus:
		if !lim.meta || r.length == 0 {
			t.Fatalf("%+v: BLOCK_STATUS let through without a context or of length 0", r)
		}
	}
	if (r.typ == cmdRead || r.typ == cmdWrite) && r.length > lim.maxPayload {
		t.Fatalf("%+v: a payload past the maximum let through", r)
	}
	if end := r.offset + uint64(r.length); end < r.offset || end > lim.size {
		t.Fatalf("%+v: a range past the export's %d bytes let through", r, lim.size)
	}
}
