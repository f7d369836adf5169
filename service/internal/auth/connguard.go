package auth

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// GuardedListener closes every connection that has not carried an
// authenticated request within a timeout of being accepted: a connection
// that only did its handshake (the HTTP/2 preface and nothing since), that
// stalls in its first request, or whose requests are all refused, holds a
// file descriptor, and enough of them would leave none for the accept of a
// legitimate client. An authenticated request stops the clock for good:
// from then on the connection is its client's, bounded by the usual idle
// and keepalive timeouts.
//
// Without --auth-token-file every request counts as authenticated; a
// connection is then closed only if it carried no request at all. gRPC
// health calls do not count unless they carry a valid token: they need
// none, so they cannot vouch for the connection.
type GuardedListener struct {
	net.Listener
	timeout time.Duration

	// byRemote maps each open connection's remote address to it: gRPC
	// tells its stats handler a new connection's addresses, not the
	// connection (see connByAddr).
	byRemote sync.Map // string → *guardedConn
	// seq numbers connections whose remote addresses are not unique
	// (unix sockets: all empty), to make them so.
	seq atomic.Uint64
}

// NewGuardedListener guards l: a connection that has not authenticated
// within timeout is closed.
func NewGuardedListener(l net.Listener, timeout time.Duration) *GuardedListener {
	return &GuardedListener{Listener: l, timeout: timeout}
}

func (l *GuardedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	g := &guardedConn{Conn: c, lis: l}
	if _, tcp := c.RemoteAddr().(*net.TCPAddr); tcp {
		g.remote = c.RemoteAddr().String()
	} else {
		g.remote = fmt.Sprintf("%s#%d", c.RemoteAddr(), l.seq.Add(1))
		g.addr = connAddr{network: c.RemoteAddr().Network(), name: g.remote}
	}
	// The timer is made before g is published (closeUntrusted may close
	// it at once) and armed after, so that expire never sees it unset.
	g.timer = time.AfterFunc(math.MaxInt64, g.expire)
	l.byRemote.Store(g.remote, g)
	g.timer.Reset(l.timeout)
	return g, nil
}

// CloseUntrusted closes every open connection that has not carried an
// authenticated request: Shutdown's, so that no handshake holds the drain
// up. Such a connection has no call in flight, by definition.
func (l *GuardedListener) CloseUntrusted() {
	l.byRemote.Range(func(_, v any) bool {
		if g := v.(*guardedConn); !g.trusted.Load() {
			g.Close()
		}
		return true
	})
}

// connByAddr is the open connection from remote, nil if there is none.
func (l *GuardedListener) connByAddr(remote net.Addr) *guardedConn {
	if remote == nil {
		return nil
	}
	g, _ := l.byRemote.Load(remote.String())
	c, _ := g.(*guardedConn)
	return c
}

// guardedConn is a connection accepted by a GuardedListener.
type guardedConn struct {
	net.Conn
	lis     *GuardedListener
	remote  string   // the key in lis.byRemote
	addr    net.Addr // RemoteAddr, when the connection's own is not unique
	trusted atomic.Bool
	timer   *time.Timer // closes the connection unless trusted first
	closed  sync.Once
}

// ReadFrom hands what is written from r to the connection's own ReadFrom,
// which net/http takes for a response's body: a *net.TCPConn sends an
// *os.File with sendfile(2), so that a download is not copied through the
// daemon's memory on its way past the guard.
func (g *guardedConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := g.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(g.Conn, r)
}

func (g *guardedConn) RemoteAddr() net.Addr {
	if g.addr != nil {
		return g.addr
	}
	return g.Conn.RemoteAddr()
}

// connAddr is a connection's remote address made unique.
type connAddr struct{ network, name string }

func (a connAddr) Network() string { return a.network }
func (a connAddr) String() string  { return a.name }

func (g *guardedConn) expire() {
	if !g.trusted.Load() {
		g.Close()
	}
}

// trust stops the clock: the connection carried an authenticated request.
func (g *guardedConn) trust() {
	if !g.trusted.Load() {
		g.trusted.Store(true)
		g.timer.Stop()
	}
}

func (g *guardedConn) Close() error {
	g.closed.Do(func() {
		g.timer.Stop()
		g.lis.byRemote.CompareAndDelete(g.remote, g)
	})
	return g.Conn.Close()
}

// guardedConnKey is the context key of a request's *guardedConn.
type guardedConnKey struct{}

// WithGuardedConn puts the guardedConn under c, if any, into ctx, so that a
// request can vouch for its connection (TrustConn). It serves as
// http.Server.ConnContext; gRPC's TagConn uses connByAddr.
func WithGuardedConn(ctx context.Context, c net.Conn) context.Context {
	if t, ok := c.(*tls.Conn); ok {
		c = t.NetConn()
	}
	if g, ok := c.(*guardedConn); ok {
		return context.WithValue(ctx, guardedConnKey{}, g)
	}
	return ctx
}

// TrustConn marks the connection that ctx's request arrived on as
// authenticated; a no-op for connections that are not guarded.
func TrustConn(ctx context.Context) {
	if g, ok := ctx.Value(guardedConnKey{}).(*guardedConn); ok {
		g.trust()
	}
}

// TagConn puts the guardedConn of the connection from remote, if it is
// one of l's, in ctx, for the public gRPC server's tap (AdmitCall).
func (l *GuardedListener) TagConn(ctx context.Context, remote net.Addr) context.Context {
	if g := l.connByAddr(remote); g != nil {
		return context.WithValue(ctx, guardedConnKey{}, g)
	}
	return ctx
}
