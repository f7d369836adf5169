package nbd

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// conn is one client connection: its handshake, then its transmission
// phase.
//
// The goroutine that runs serve owns the handshake's state (neg, optBuf,
// br) and reads the transmission's requests; each request the export
// must work on runs on a goroutine of its own, and all of them send their
// replies through out.
type conn struct {
	srv    *Server
	opened time.Time

	// mu guards nc, peer.TLS, name, exp's presence and the flags info
	// reports, which the serve goroutine writes (on STARTTLS, on entering
	// transmission) and info reads from another.
	mu sync.Mutex
	// nc is the connection: the socket, or the TLS session over it
	// after NBD_OPT_STARTTLS.
	nc   net.Conn
	peer Peer
	name string

	br     *bufio.Reader
	bw     *bufio.Writer // the handshake's; out's in transmission
	neg    negotiation
	optBuf []byte

	// Set on entering the transmission phase (enter), then read only.
	exp        Export
	tw         TryWriter // exp, if it is one
	size       uint64
	readOnly   bool
	structured bool
	// meta is base:allocation selected for this export (BLOCK_STATUS
	// allowed).
	meta bool
	// ctx is the requests' context: cancelled by the server's stop, and
	// when the connection ends.
	ctx    context.Context
	cancel context.CancelFunc
	out    replyWriter
	// slots bounds the requests in flight (Config.MaxRequestsPerConn).
	slots chan struct{}
	// running counts the requests handed to goroutines that have not
	// ended; handlers waits for them.
	running  atomic.Int64
	handlers sync.WaitGroup
	// requests counts the requests received, for info.
	requests atomic.Int64
	// held: the serve goroutine held back replies it made (replyMade);
	// owned by it.
	held bool
	// narrowed is what Recheck took away from the client since the export
	// opened: narrowedNone, narrowedToRead, narrowedAll.
	narrowed atomic.Int32
	// draining is set by Shutdown: requests that arrive are refused with
	// NBD_ESHUTDOWN, and the connection is closed once none runs.
	draining atomic.Bool
}

func newConn(s *Server, nc net.Conn) *conn {
	return &conn{srv: s, opened: time.Now(), nc: nc, peer: Peer{Addr: nc.RemoteAddr(), Local: nc.LocalAddr()},
		br: bufio.NewReaderSize(nc, 64<<10), bw: bufio.NewWriterSize(nc, 64<<10)}
}

// serve runs the connection to its end and closes it.
func (c *conn) serve() {
	defer c.closeConn()
	log := c.srv.cfg.Logger
	c.nc.SetDeadline(time.Now().Add(c.srv.cfg.HandshakeTimeout))
	ctx, cancel := context.WithDeadline(c.srv.stop, time.Now().Add(c.srv.cfg.HandshakeTimeout))
	err := c.handshake(ctx)
	cancel()
	if err != nil && c.exp != nil {
		// Entered, but the client was not told.
		c.cancel()
		c.exp.Close()
	}
	if err != nil {
		if !errors.Is(err, errAborted) && !errors.Is(err, io.EOF) && !c.srv.shuttingDown() {
			log.Debug("nbd handshake ended", "remote", c.peer.Addr, "err", err)
		}
		return
	}
	c.nc.SetDeadline(time.Time{})
	err = c.transmit()
	if err != nil && !errors.Is(err, io.EOF) && !c.srv.shuttingDown() {
		log.Debug("nbd connection ended", "remote", c.peer.Addr, "export", c.name, "err", err)
	}
}

// enter switches c to the transmission phase on exp, opened as name.
func (c *conn) enter(exp Export, name string) {
	c.exp = exp
	c.tw, _ = exp.(TryWriter)
	c.size = uint64(exp.Size())
	c.readOnly = exp.ReadOnly()
	c.structured = c.neg.structured
	c.meta = c.neg.structured && c.neg.metaAllocation && c.neg.metaExport == name
	c.ctx, c.cancel = context.WithCancel(c.srv.stop)
	c.slots = make(chan struct{}, c.srv.cfg.MaxRequestsPerConn)
	c.mu.Lock()
	c.name = name
	c.out = replyWriter{nc: c.nc, bw: c.bw, timeout: c.srv.cfg.ReplyTimeout}
	c.mu.Unlock()
}

// What Recheck took from a connection.
const (
	narrowedNone   = iota
	narrowedToRead // writes, trims and zeroes refused
	narrowedAll    // every request refused
)

// recheck is Server.Recheck for c.
func (c *conn) recheck(check func(p *Peer, name string) (readOnly bool, err error)) {
	c.mu.Lock()
	name, peer := c.name, c.peer
	c.mu.Unlock()
	if name == "" {
		return // the handshake asks the backend itself
	}
	readOnly, err := check(&peer, name)
	switch {
	case err != nil:
		c.narrowed.Store(narrowedAll)
	case readOnly && !c.readOnly:
		c.narrowed.Store(narrowedToRead)
	default:
		c.narrowed.Store(narrowedNone)
	}
}

// drain is Shutdown's: a connection in the handshake is closed; one in
// transmission refuses further requests and is closed once none runs.
func (c *conn) drain() {
	c.mu.Lock()
	inTransmission := c.name != ""
	c.mu.Unlock()
	if !inTransmission {
		c.closeConn()
		return
	}
	c.draining.Store(true)
	if c.running.Load() == 0 {
		c.closeConn()
	}
}

// closeConn closes the connection, which ends whatever reads or writes
// it: serve's, when it returns, and the server's to cut it short. The
// serve goroutine then cleans up; the export is closed by transmit, once
// its requests have ended.
func (c *conn) closeConn() {
	c.mu.Lock()
	nc := c.nc
	c.mu.Unlock()
	nc.Close()
}

// info describes the connection for Server.Conns.
func (c *conn) info() ConnInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	ci := ConnInfo{Remote: addrString(c.peer.Addr), Opened: c.opened, Export: c.name, TLS: c.peer.TLS != nil}
	if c.name != "" {
		ci.ReadOnly, ci.Structured = c.readOnly, c.structured
		ci.Requests, ci.InFlight = c.requests.Load(), c.running.Load()
	}
	return ci
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	if s := a.String(); s != "" {
		return s
	}
	return a.Network()
}

// replyWriter serializes the replies of a connection's requests onto its
// socket. A reply is written whole under mu; the buffer is flushed by
// the last of the replies that were waiting for mu at once, so that
// replies sent together leave in one write. The serve goroutine holds
// back the replies it makes itself while the next request is already
// read (unlockHeld), and flushes them before it waits for the client.
type replyWriter struct {
	nc      net.Conn
	timeout time.Duration
	// waiting counts the senders between asking for mu and taking it.
	waiting atomic.Int32
	// mu guards bw, err and closed.
	mu sync.Mutex
	bw *bufio.Writer
	// err is the first write error; every later reply fails with it, and
	// the connection is closed (closed).
	err    error
	closed bool
}

// lock takes the writer for one reply.
func (w *replyWriter) lock() error {
	w.waiting.Add(1)
	w.mu.Lock()
	w.waiting.Add(-1)
	if w.err != nil {
		w.mu.Unlock()
		return w.err
	}
	// A client that stops reading replies would otherwise hold the
	// request's budget for ever.
	w.nc.SetWriteDeadline(time.Now().Add(w.timeout))
	return nil
}

// unlock ends a reply, flushing unless another is waiting to follow it.
// A reply that could not be written closes the connection: the client
// cannot tell which of its requests were answered.
func (w *replyWriter) unlock() error {
	return w.unlockFlush(w.waiting.Load() == 0)
}

// unlockHeld ends a reply without flushing it: the caller flushes
// (flush) before it could wait for the client.
func (w *replyWriter) unlockHeld() error {
	return w.unlockFlush(false)
}

func (w *replyWriter) unlockFlush(flush bool) error {
	if w.err == nil && flush {
		w.err = w.bw.Flush()
	}
	err := w.err
	if err != nil && !w.closed {
		w.closed = true
		w.nc.Close()
	}
	w.mu.Unlock()
	return err
}

// flush sends what replies left in the buffer.
func (w *replyWriter) flush() error {
	if err := w.lock(); err != nil {
		return err
	}
	return w.unlockFlush(w.bw.Buffered() > 0)
}

// write writes parts of a reply; errors show in unlock.
//
// Preconditions: w is locked.
func (w *replyWriter) write(parts ...[]byte) {
	for _, p := range parts {
		if _, err := w.bw.Write(p); err != nil && w.err == nil {
			w.err = err
		}
	}
}
