package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/filewrite/filewrite/internal/shard"
	"github.com/filewrite/filewrite/service/internal/auth"
	"github.com/filewrite/filewrite/service/internal/local"
	"github.com/filewrite/filewrite/service/internal/uploads"
	"github.com/filewrite/filewrite/service/internal/webdav"
)

// A door is one way into the daemon: a listener and what serves it. Start
// adds each door to Server.doors as it opens it; Shutdown drains them all
// at once, after the shutdown delay, and closeAll closes them. The NBD
// door is one (nbd.go); a door with a listener of its own added later is
// one more of these: it is drained and closed with the rest, and nothing
// in Shutdown names it. The tus and WebDAV doors share the REST door's
// HTTP listener (httpDoor, below): its drain waits for their requests
// too.
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

// The doors beside the gateway on the HTTP listener (docs/design.md,
// "Many front doors, one engine"): tus under /v1/uploads/, WebDAV under
// /dav/. Each translates
// its protocol into the store's calls, run on the direct road
// (service/internal/local) as the FileService calls they stand for.

var (
	_ uploads.Calls = (*local.Files)(nil)
	_ webdav.Files  = (*local.Files)(nil)
)

// doorContext is the context a door's calls run in for r: its metadata is
// what the gateway would send its gRPC server (the Authorization header,
// a verified client certificate's identity, the routing header a proxy
// set), for the token check and the scope, and its peer the host r came
// from.
func doorContext(r *http.Request) context.Context {
	md := auth.GatewayMetadata(r.Context(), r)
	if md == nil {
		md = metadata.MD{}
	}
	for _, v := range r.Header.Values("Authorization") {
		md.Append("authorization", v)
	}
	if v := r.Header.Get(shard.Header); v != "" {
		md.Set(shard.Header, v)
	}
	return local.Incoming(r.Context(), r, md)
}

// startDoors makes the doors of the HTTP listener.
func (s *Server) startDoors() error {
	var err error
	s.uploads, err = uploads.New(uploads.Config{
		Store:           s.store,
		Calls:           s.directRoad(),
		Budget:          s.budget,
		MaxFileSize:     s.cfg.Store.MaxFileSize,
		MaxRequestBytes: s.cfg.Store.MaxRequestBytes,
		BodyTimeout:     s.cfg.BodyTimeout,
		Expiry:          s.cfg.UploadExpiry,
		Owner:           s.auth.Owner,
		Home:            s.auth.Home,
		Context:         doorContext,
		Logger:          s.log,
	})
	if err != nil {
		return err
	}
	s.dav = webdav.New(webdav.Config{
		Store:           s.store,
		Files:           s.directRoad(),
		Budget:          s.budget,
		MaxRequestBytes: s.cfg.Store.MaxRequestBytes,
		Context:         doorContext,
		Logger:          s.log,
	})
	ctx, cancel := context.WithCancel(context.Background())
	swept := make(chan struct{})
	go func() {
		defer close(swept)
		s.uploads.Run(ctx)
	}()
	// The store closes after this: a sweep must not run on past it.
	s.stopDoors = func() {
		cancel()
		<-swept
	}
	return nil
}

// httpDoor is the door on the HTTP listener that serves path, nil for the
// gateway's routes.
func (s *Server) httpDoor(path string) http.Handler {
	switch {
	case s.uploads != nil && under(path, uploads.Prefix):
		return s.uploads
	case s.dav != nil && under(path, webdav.Prefix):
		return s.dav
	}
	return nil
}

// under reports whether path is prefix (which ends in a slash), or below.
func under(path, prefix string) bool {
	return path == strings.TrimSuffix(prefix, "/") || strings.HasPrefix(path, prefix)
}

// davCredentials lets WebDAV clients authenticate as they can: a mounted
// share asks for a user name and a password, and sends them as Basic
// credentials. Under /dav/ the password is taken as the bearer token (the
// user name is not looked at), and a 401 asks for Basic credentials
// besides a bearer token, so that a client prompts for them. It runs
// before the token check (auth.Tokens.HTTPMiddleware).
func davCredentials(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !under(r.URL.Path, webdav.Prefix) {
			next.ServeHTTP(w, r)
			return
		}
		if _, pass, ok := r.BasicAuth(); ok {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+pass)
		}
		next.ServeHTTP(&basicChallenge{ResponseWriter: w}, r)
	})
}

// basicChallenge adds a Basic challenge to a 401.
type basicChallenge struct{ http.ResponseWriter }

func (w *basicChallenge) WriteHeader(code int) {
	if code == http.StatusUnauthorized {
		w.Header().Add("WWW-Authenticate", `Basic realm="filewrite", charset="UTF-8"`)
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *basicChallenge) Unwrap() http.ResponseWriter { return w.ResponseWriter }
