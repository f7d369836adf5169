package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"google.golang.org/grpc"

	"github.com/filewrite/filewrite/service/internal/auth"
)

// A door is one way into the daemon: a listener and what serves it. Start
// adds each door to Server.doors as it opens it; Shutdown drains them all
// at once, after the shutdown delay, and closeAll closes them. The NBD
// door is one (nbd.go); one added later (uploads, WebDAV) is one more of
// these: it is drained and closed with the rest, and nothing in Shutdown
// names it.
type door interface {
	// serve serves in the background until the door is drained or
	// closed; a failure while serving goes to errc.
	serve(errc chan<- error)
	// drain stops taking new work (new connections, new calls, new
	// requests) and returns once the work in flight is done; once ctx
	// ends it cancels what still runs, and returns when that has ended.
	drain(ctx context.Context)
	// close stops the door at once, whether it was drained, served or
	// only partly built (a Start that failed). A second call does
	// nothing.
	close()
}

// grpcDoor is the public gRPC server on --grpc-addr.
type grpcDoor struct {
	srv *grpc.Server
	lis *auth.GuardedListener
	log *slog.Logger
}

func (d *grpcDoor) serve(errc chan<- error) {
	go func() {
		if err := d.srv.Serve(d.lis); err != nil {
			errc <- fmt.Errorf("gRPC server: %w", err)
		}
	}()
}

func (d *grpcDoor) drain(ctx context.Context) {
	drainGRPC(ctx, d.srv, "gRPC", d.log, func() {
		// GracefulStop sends its GOAWAYs once no connection is in its
		// handshake: a stranger's would hold it up.
		d.lis.CloseUntrusted()
	})
}

func (d *grpcDoor) close() {
	d.srv.Stop()
	d.lis.Close() // Serve closes it too, if it ran
}

// restDoor is the REST gateway: its HTTP server on --http-addr, and the
// gRPC server of its own (grpcSrv) that it reaches through grpcConn over
// grpcLis, a pipe inside the process: the same FileService with the same
// token check and telemetry, but not the public listener's per-connection
// limits, which would make one connection's bound every REST caller's,
// and drained apart from it, after the REST requests it serves.
// startGateway fills it piece by piece; close closes the pieces made.
type restDoor struct {
	httpSrv   *http.Server
	httpLis   net.Listener
	httpGuard *auth.GuardedListener // under httpLis
	grpcSrv   *grpc.Server
	grpcLis   *pipeListener
	grpcConn  *grpc.ClientConn
	log       *slog.Logger
}

func (d *restDoor) serve(errc chan<- error) {
	go func() {
		if err := d.grpcSrv.Serve(d.grpcLis); err != nil {
			errc <- fmt.Errorf("gateway's gRPC server: %w", err)
		}
	}()
	go func() {
		if err := d.httpSrv.Serve(d.httpLis); !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("HTTP gateway: %w", err)
		}
	}()
}

// drain stops the HTTP server, and then the gateway's gRPC server, which
// REST requests in flight reach until they are done.
func (d *restDoor) drain(ctx context.Context) {
	go d.httpGuard.CloseUntrusted()
	if err := d.httpSrv.Shutdown(ctx); err != nil {
		d.log.Warn("HTTP drain cut short", "error", err)
		d.httpSrv.Close()
	}
	drainGRPC(ctx, d.grpcSrv, "gateway's gRPC", d.log, nil)
}

func (d *restDoor) close() {
	if d.httpSrv != nil {
		d.httpSrv.Close()
	}
	if d.httpLis != nil {
		d.httpLis.Close()
	}
	if d.grpcConn != nil {
		d.grpcConn.Close()
	}
	if d.grpcSrv != nil {
		d.grpcSrv.Stop()
	}
	if d.grpcLis != nil {
		d.grpcLis.Close()
	}
}

// pprofDoor is net/http/pprof on --pprof-addr (pprof.go). Its drain does
// nothing: profiles stay available while the other doors drain, since a
// drain that hangs is what one would want to profile; closeAll closes it.
type pprofDoor struct {
	srv *http.Server
	lis net.Listener
}

func (d *pprofDoor) serve(errc chan<- error) {
	go func() {
		if err := d.srv.Serve(d.lis); !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("pprof server: %w", err)
		}
	}()
}

func (d *pprofDoor) drain(context.Context) {}

func (d *pprofDoor) close() {
	d.srv.Close()
	d.lis.Close()
}

// drainGRPC stops srv gracefully, or, once ctx ends, cancels the RPCs it
// still runs. begun, if not nil, runs once the graceful stop has begun.
func drainGRPC(ctx context.Context, srv *grpc.Server, name string, log *slog.Logger, begun func()) {
	stopped := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(stopped)
	}()
	if begun != nil {
		begun()
	}
	select {
	case <-stopped:
	case <-ctx.Done():
		log.Warn(name+" drain cut short: cancelling RPCs in flight", "error", context.Cause(ctx))
		srv.Stop()
		<-stopped
	}
}
