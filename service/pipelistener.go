package service

import (
	"context"
	"net"
	"sync"
)

// pipeListener is a listener inside the process: each dial hands one end of
// a net.Pipe to Accept. The gateway reaches its own gRPC server through it
// (see restDoor), so that connection is no socket: it holds no
// file descriptor, nothing outside the process can dial it, and it needs
// no TLS, since its bytes never leave the process.
type pipeListener struct {
	conns     chan net.Conn
	closed    chan struct{}
	closeOnce sync.Once
}

var _ net.Listener = (*pipeListener)(nil)

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
}

// pipeAddr is the address of both ends of a pipeListener's connections.
type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "gateway" }

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

// dial is the gRPC client's dialer (grpc.WithContextDialer): it waits for
// Accept to take the server's end.
func (l *pipeListener) dial(ctx context.Context, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.closed:
		client.Close()
		server.Close()
		return nil, net.ErrClosed
	case <-ctx.Done():
		client.Close()
		server.Close()
		return nil, ctx.Err()
	}
}
