//go:build linux

package nbd

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// rawClient speaks the protocol byte by byte, for the tests of what real
// clients never send. Every read it makes is bounded by a deadline, so a
// server that fails to answer fails the test rather than hanging it.
type rawClient struct {
	t  *testing.T
	nc net.Conn
	br *bufio.Reader
}

// dialRaw connects and reads the greeting; it sends the client's flags
// unless flags is nil.
func dialRaw(t *testing.T, sock string, flags *uint32) *rawClient {
	t.Helper()
	nc, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	rc := &rawClient{t: t, nc: nc, br: bufio.NewReader(nc)}
	var g [18]byte
	rc.read(g[:])
	if binary.BigEndian.Uint64(g[0:]) != magicInitPasswd || binary.BigEndian.Uint64(g[8:]) != magicIHaveOpt {
		t.Fatalf("greeting %x", g)
	}
	if got := binary.BigEndian.Uint16(g[16:]); got != flagFixedNewstyle|flagNoZeroes {
		t.Fatalf("handshake flags %#x, want FIXED_NEWSTYLE|NO_ZEROES", got)
	}
	if flags != nil {
		rc.write(binary.BigEndian.AppendUint32(nil, *flags))
	}
	return rc
}

// dialFixed connects as a fixed newstyle client that asked for no zeroes.
func dialFixed(t *testing.T, sock string) *rawClient {
	f := uint32(clientFixedNewstyle | clientNoZeroes)
	return dialRaw(t, sock, &f)
}

func (rc *rawClient) read(b []byte) {
	rc.t.Helper()
	rc.nc.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := io.ReadFull(rc.br, b); err != nil {
		rc.t.Fatalf("read %d bytes: %v", len(b), err)
	}
}

func (rc *rawClient) write(b []byte) {
	rc.t.Helper()
	if _, err := rc.nc.Write(b); err != nil {
		rc.t.Fatalf("write: %v", err)
	}
}

// expectClosed fails t unless the server closes the connection (after
// any bytes it sends first, which are skipped).
func (rc *rawClient) expectClosed() {
	rc.t.Helper()
	rc.nc.SetReadDeadline(time.Now().Add(time.Minute))
	_, err := io.Copy(io.Discard, rc.br)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		rc.t.Fatalf("the server did not close the connection")
	}
}

// sendOpt sends an option with its data.
func (rc *rawClient) sendOpt(opt uint32, data []byte) {
	rc.t.Helper()
	b := binary.BigEndian.AppendUint64(nil, magicIHaveOpt)
	b = binary.BigEndian.AppendUint32(b, opt)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	rc.write(append(b, data...))
}

// optReply is one reply to an option.
type optReply struct {
	typ  uint32
	data []byte
}

// readOptReply reads a reply to opt.
func (rc *rawClient) readOptReply(opt uint32) optReply {
	rc.t.Helper()
	var h [20]byte
	rc.read(h[:])
	if m := binary.BigEndian.Uint64(h[0:]); m != magicOptionReply {
		rc.t.Fatalf("option reply magic %#x", m)
	}
	if got := binary.BigEndian.Uint32(h[8:]); got != opt {
		rc.t.Fatalf("reply to option %d, want %d", got, opt)
	}
	r := optReply{typ: binary.BigEndian.Uint32(h[12:]), data: make([]byte, binary.BigEndian.Uint32(h[16:]))}
	rc.read(r.data)
	return r
}

// option sends an option and reads its replies up to the final one
// (NBD_REP_ACK or an error).
func (rc *rawClient) option(opt uint32, data []byte) []optReply {
	rc.t.Helper()
	rc.sendOpt(opt, data)
	var rs []optReply
	for {
		r := rc.readOptReply(opt)
		rs = append(rs, r)
		if r.typ == repAck || r.typ&(1<<31) != 0 {
			return rs
		}
	}
}

// infoData is the data of NBD_OPT_INFO and NBD_OPT_GO for name with the
// information requests infos.
func infoData(name string, infos ...uint16) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(infos)))
	for _, i := range infos {
		b = binary.BigEndian.AppendUint16(b, i)
	}
	return b
}

// metaData is the data of the metadata context options.
func metaData(name string, queries ...string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(queries)))
	for _, q := range queries {
		b = binary.BigEndian.AppendUint32(b, uint32(len(q)))
		b = append(b, q...)
	}
	return b
}

// session is what a transmission phase was entered with.
type session struct {
	structured bool
	size       uint64
	flags      uint16
}

// goExport enters the transmission phase on name with NBD_OPT_GO, after
// negotiating structured replies and base:allocation if structured.
func (rc *rawClient) goExport(name string, structured bool) session {
	rc.t.Helper()
	s := session{structured: structured}
	if structured {
		if r := rc.option(optStructuredReply, nil); r[0].typ != repAck {
			rc.t.Fatalf("NBD_OPT_STRUCTURED_REPLY: %v", r)
		}
		if r := rc.option(optSetMetaContext, metaData(name, metaBaseAllocation)); r[len(r)-1].typ != repAck {
			rc.t.Fatalf("NBD_OPT_SET_META_CONTEXT: %v", r)
		}
	}
	rs := rc.option(optGo, infoData(name, infoBlockSize))
	if last := rs[len(rs)-1]; last.typ != repAck {
		rc.t.Fatalf("NBD_OPT_GO %q: reply %#x %q", name, last.typ, last.data)
	}
	for _, r := range rs {
		if r.typ == repInfo && binary.BigEndian.Uint16(r.data) == infoExport {
			s.size, s.flags = binary.BigEndian.Uint64(r.data[2:]), binary.BigEndian.Uint16(r.data[10:])
		}
	}
	return s
}

// startTLS sends NBD_OPT_STARTTLS and runs the TLS handshake with conf.
func (rc *rawClient) startTLS(conf *tls.Config) {
	rc.t.Helper()
	if r := rc.option(optStartTLS, nil); r[0].typ != repAck {
		rc.t.Fatalf("NBD_OPT_STARTTLS: %#x %q", r[0].typ, r[0].data)
	}
	tc := tls.Client(rc.nc, conf)
	if err := tc.Handshake(); err != nil {
		rc.t.Fatalf("TLS handshake: %v", err)
	}
	rc.nc, rc.br = tc, bufio.NewReader(tc)
}

// sendReq sends a request.
func (rc *rawClient) sendReq(flags, typ uint16, cookie, off uint64, length uint32, payload []byte) {
	rc.t.Helper()
	b := binary.BigEndian.AppendUint32(nil, magicRequest)
	b = binary.BigEndian.AppendUint16(b, flags)
	b = binary.BigEndian.AppendUint16(b, typ)
	b = binary.BigEndian.AppendUint64(b, cookie)
	b = binary.BigEndian.AppendUint64(b, off)
	b = binary.BigEndian.AppendUint32(b, length)
	rc.write(append(b, payload...))
}

// chunk is a reply message: a simple reply (typ replyTypeNone and done,
// with errno), or a structured reply chunk.
type chunk struct {
	simple  bool
	flags   uint16
	typ     uint16
	cookie  uint64
	errno   uint32
	payload []byte
}

// readReply reads one reply message; a simple reply to a READ of
// readLen bytes carries them when it succeeds.
func (rc *rawClient) readReply(readLen int) chunk {
	rc.t.Helper()
	var m [4]byte
	rc.read(m[:])
	switch binary.BigEndian.Uint32(m[:]) {
	case magicSimpleReply:
		var h [12]byte
		rc.read(h[:])
		c := chunk{simple: true, flags: replyFlagDone, errno: binary.BigEndian.Uint32(h[0:]), cookie: binary.BigEndian.Uint64(h[4:])}
		if c.errno == 0 && readLen > 0 {
			c.payload = make([]byte, readLen)
			rc.read(c.payload)
		}
		return c
	case magicStructuredRply:
		var h [16]byte
		rc.read(h[:])
		c := chunk{flags: binary.BigEndian.Uint16(h[0:]), typ: binary.BigEndian.Uint16(h[2:]), cookie: binary.BigEndian.Uint64(h[4:])}
		c.payload = make([]byte, binary.BigEndian.Uint32(h[12:]))
		rc.read(c.payload)
		if c.typ&(1<<15) != 0 {
			c.errno = binary.BigEndian.Uint32(c.payload)
		}
		return c
	}
	rc.t.Fatalf("reply magic %x", m)
	return chunk{}
}

// readAll reads the reply to the request cookie, to its last chunk.
func (rc *rawClient) readAll(cookie uint64, readLen int) []chunk {
	rc.t.Helper()
	var cs []chunk
	for {
		c := rc.readReply(readLen)
		if c.cookie != cookie {
			rc.t.Fatalf("reply to cookie %d, want %d", c.cookie, cookie)
		}
		cs = append(cs, c)
		if c.flags&replyFlagDone != 0 {
			return cs
		}
	}
}

// errnoOfReply is the error a reply's chunks carry, 0 for none.
func errnoOfReply(cs []chunk) uint32 {
	for _, c := range cs {
		if c.errno != 0 {
			return c.errno
		}
	}
	return 0
}
