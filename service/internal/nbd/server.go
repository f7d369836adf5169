package nbd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"
)

// Limits and defaults.
const (
	// MaxPayload is the largest READ or WRITE served: the 32 MiB that the
	// protocol says no client should see as an attack ("Size
	// constraints"). Config.MaxPayload may lower it, never raise it.
	MaxPayload = 32 << 20
	// MinPayload is the smallest maximum payload a server accepts: the
	// preferred block size it advertises, which the protocol requires the
	// maximum payload to reach.
	MinPayload = preferredBlock
	// preferredBlock is the preferred block size advertised: the page
	// and the file system's block.
	preferredBlock = 4096
	// MaxListNames is how many names NBD_OPT_LIST returns at most; the
	// rest are left out (the client is not told: the protocol has no way).
	MaxListNames = 1000
	// maxOptionData bounds the data of one option. Every option a client
	// has reason to send fits: a name is at most 4096 bytes. Larger
	// option data is read past and refused with NBD_REP_ERR_TOO_BIG.
	maxOptionData = 16 << 10
	// maxStatusExtents bounds the descriptors of one BLOCK_STATUS reply
	// (the protocol asks for at most 2^20): 128 KiB of reply.
	maxStatusExtents = 16 << 10
	// maxReadChunks bounds the content chunks of one structured READ
	// reply; past it the rest of the range is sent as data.
	maxReadChunks = 32

	// DefaultHandshakeTimeout is how long a connection may take from
	// accept to the transmission phase.
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultPayloadTimeout is how long a WRITE's payload may take to
	// deliver each 64 KiB once its header has arrived.
	DefaultPayloadTimeout = 30 * time.Second
	// DefaultReplyTimeout is how long a reply may wait for the client to
	// take it before the connection is dropped.
	DefaultReplyTimeout = time.Minute
	// DefaultMaxRequestsPerConn bounds the requests of one connection in
	// flight at once; the connection is not read further until one ends.
	DefaultMaxRequestsPerConn = 128
	// DefaultMaxInflightBytes is the budget of a server given none.
	DefaultMaxInflightBytes = 256 << 20
)

// ErrServerClosed is returned by Serve once Shutdown or Close was called.
var ErrServerClosed = errors.New("nbd: server closed")

// Config configures a Server.
type Config struct {
	// Backend serves the exports. Required.
	Backend Backend
	// Budget bounds the bytes requests hold, shared with the daemon's
	// other doors; nil: a budget of DefaultMaxInflightBytes for this
	// server alone.
	Budget Budget
	// Observer sees every request; nil: none.
	Observer Observer
	// TLS, when set, lets clients upgrade with NBD_OPT_STARTTLS; nil
	// answers it with NBD_REP_ERR_POLICY.
	TLS *tls.Config
	// RequireTLS refuses every option but NBD_OPT_STARTTLS and
	// NBD_OPT_ABORT before TLS ("FORCEDTLS mode"). It needs TLS.
	RequireTLS bool
	// MaxPayload is the largest READ or WRITE (NBD_INFO_BLOCK_SIZE's
	// maximum payload); 0 or more than MaxPayload mean MaxPayload.
	MaxPayload int
	// HandshakeTimeout, PayloadTimeout, ReplyTimeout: 0 means the
	// Default of each.
	HandshakeTimeout, PayloadTimeout, ReplyTimeout time.Duration
	// MaxRequestsPerConn: 0 means DefaultMaxRequestsPerConn.
	MaxRequestsPerConn int
	// Logger receives connection errors at debug level; nil:
	// slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() (Config, error) {
	if c.Backend == nil {
		return c, errors.New("nbd: no backend")
	}
	if c.RequireTLS && c.TLS == nil {
		return c, errors.New("nbd: TLS required but no certificate configured")
	}
	if c.MaxPayload <= 0 || c.MaxPayload > MaxPayload {
		c.MaxPayload = MaxPayload
	}
	if c.MaxPayload < MinPayload {
		return c, fmt.Errorf("nbd: maximum payload %d bytes is below the %d bytes of the preferred block size", c.MaxPayload, MinPayload)
	}
	if c.Budget == nil {
		c.Budget = newLocalBudget(DefaultMaxInflightBytes)
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if c.PayloadTimeout <= 0 {
		c.PayloadTimeout = DefaultPayloadTimeout
	}
	if c.ReplyTimeout <= 0 {
		c.ReplyTimeout = DefaultReplyTimeout
	}
	if c.MaxRequestsPerConn <= 0 {
		c.MaxRequestsPerConn = DefaultMaxRequestsPerConn
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// Server serves NBD on the listeners given to Serve.
//
// Lock order:
//
//	Server.mu
//	  conn.mu
type Server struct {
	cfg Config

	// mu guards listeners, conns and closed.
	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	closed    bool
	// shutdown is closed by Shutdown and Close: handshakes refuse
	// further options, transmissions refuse further requests.
	shutdown chan struct{}
	// stop cancels every connection's requests (Close, or Shutdown's
	// deadline).
	stop    context.Context
	stopAll context.CancelFunc
	wg      sync.WaitGroup // the connections' goroutines
}

// NewServer returns a server as cfg says.
func NewServer(cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, listeners: map[net.Listener]struct{}{}, conns: map[*conn]struct{}{}, shutdown: make(chan struct{})}
	s.stop, s.stopAll = context.WithCancel(context.Background())
	return s, nil
}

// Serve accepts connections on l until Shutdown or Close, and returns
// ErrServerClosed then; it closes l.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		l.Close()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
		l.Close()
	}()
	var delay time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			if s.isClosed() {
				return ErrServerClosed
			}
			if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ECONNABORTED) {
				// Out of descriptors, or a peer gone before accept: wait,
				// as net/http does, rather than spin or stop serving.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		c := newConn(s, nc)
		if !s.track(c) {
			nc.Close()
			return ErrServerClosed
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.untrack(c)
			c.serve()
		}()
	}
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *Server) track(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) untrack(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
}

// Shutdown stops the server gracefully: it closes the listeners and the
// connections still in the handshake, answers requests that arrive from
// now on with NBD_ESHUTDOWN ("Terminating the transmission phase"), lets
// the requests in flight finish, and closes each connection once it has
// none. When ctx ends first, it cancels the requests still running and
// closes every connection; it returns once every connection's goroutines
// have ended, with ctx's error if it had to cut them short.
func (s *Server) Shutdown(ctx context.Context) error {
	conns := s.beginClose()
	for _, c := range conns {
		c.drain()
	}
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.stopAll()
		for _, c := range conns {
			c.closeConn()
		}
		<-done
		return ctx.Err()
	}
}

// Close closes the listeners and every connection at once, cancelling the
// requests in flight, and waits for the connections' goroutines.
func (s *Server) Close() error {
	conns := s.beginClose()
	s.stopAll()
	for _, c := range conns {
		c.closeConn()
	}
	s.wg.Wait()
	return nil
}

// beginClose marks the server closed, closes its listeners and returns
// its connections.
func (s *Server) beginClose() []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.shutdown)
	}
	for l := range s.listeners {
		l.Close()
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	return conns
}

// shuttingDown reports whether Shutdown or Close was called.
func (s *Server) shuttingDown() bool {
	select {
	case <-s.shutdown:
		return true
	default:
		return false
	}
}

// Recheck asks check again, for each connection in the transmission
// phase, what its client may do with its export, after the daemon's
// credentials changed (a reload of the token file): a connection whose
// client check now refuses answers every request from then on with
// NBD_EPERM, one that check now gives read-only access answers writes,
// trims and zeroes with NBD_EPERM. The requests in flight finish. A later
// Recheck may give back what an earlier one took, up to what the export
// was opened with (its transmission flags cannot change).
func (s *Server) Recheck(check func(p *Peer, name string) (readOnly bool, err error)) {
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.recheck(check)
	}
}

// ConnInfo describes one open connection, for a debug page.
type ConnInfo struct {
	Remote string    `json:"remote"`
	Opened time.Time `json:"opened"`
	// Export is the export's name once the handshake chose one; "" while
	// the handshake runs.
	Export   string `json:"export,omitempty"`
	ReadOnly bool   `json:"read_only,omitempty"`
	TLS      bool   `json:"tls,omitempty"`
	// Structured: structured replies were negotiated.
	Structured bool `json:"structured_replies,omitempty"`
	// Requests counts the requests received; InFlight those not yet
	// answered.
	Requests int64 `json:"requests"`
	InFlight int64 `json:"in_flight"`
}

// Conns describes the open connections, oldest first.
func (s *Server) Conns() []ConnInfo {
	s.mu.Lock()
	out := make([]ConnInfo, 0, len(s.conns))
	for c := range s.conns {
		out = append(out, c.info())
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b ConnInfo) int { return a.Opened.Compare(b.Opened) })
	return out
}
