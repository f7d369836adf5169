// Package service is the filewrite daemon's public face and its assembly,
// as etcd's server/embed is: Config and its defaults, Start and Run, and the
// Server with its listeners (gRPC, the REST gateway's HTTP, pprof), its
// telemetry, its probes and its drain. Each job it assembles lives in a
// package of its own under service/internal, and imports run one way,
// from here down (docs/design.md, "Layers"): rpc (the FileService) and
// gateway (REST) over auth and admit (who may call, and what a request may
// hold), all over status (the statuses every face shares).
//
// The Server takes no lock of its own: what it builds is set once in Start,
// before anything serves, and Shutdown runs once (shutdownOnce).
package service

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/service/internal/admit"
	"github.com/filewrite/filewrite/service/internal/auth"
	"github.com/filewrite/filewrite/service/internal/gateway"
	"github.com/filewrite/filewrite/service/internal/local"
	"github.com/filewrite/filewrite/service/internal/nbd"
	"github.com/filewrite/filewrite/service/internal/origin"
	"github.com/filewrite/filewrite/service/internal/rpc"
	"github.com/filewrite/filewrite/service/internal/status"
	"github.com/filewrite/filewrite/service/internal/uploads"
	"github.com/filewrite/filewrite/service/internal/webdav"
	"github.com/filewrite/filewrite/store"
)

// Server is a running daemon: the store, the gRPC server and, unless
// disabled, the REST gateway.
type Server struct {
	cfg    Config
	log    *slog.Logger
	store  *store.Store
	health *health.Server
	tel    *telemetry

	// The public gRPC server, on Config.GRPCAddr.
	grpcSrv *grpc.Server
	grpcLis *auth.GuardedListener
	// files is the FileService of both gRPC servers.
	files *rpc.FileServer

	// budget is --max-inflight-bytes, taken by the public gRPC server, its
	// WriteStreams (through files) and the gateway (the gateway's own gRPC
	// server takes none: the gateway took it for the whole request).
	budget *admit.Budget

	// httpLis is the REST gateway's listener (restDoor), nil when
	// Config.HTTPAddr is empty.
	httpLis net.Listener

	// pprofLis is where Config.PprofAddr is served (pprofDoor), nil when
	// it is empty.
	pprofLis net.Listener

	// nbdSrv serves Config.NBDAddr on nbdLis (nbd.go, nbdDoor); nil when
	// it is empty.
	nbdSrv *nbd.Server
	nbdLis net.Listener

	// The doors on the HTTP listener beside the gateway (doors.go), nil
	// when it is off; stopDoors ends their background work (the uploads'
	// sweeper).
	uploads   *uploads.Door
	dav       *webdav.Door
	stopDoors context.CancelFunc

	// doors are the ways in, each listener with what serves it, in the
	// order Start opened them: Shutdown drains them and closeAll closes
	// them (doors.go).
	doors []door
	// serveErr receives an error when a door fails while serving; it
	// holds one per door's server.
	serveErr chan error
	// endDelay, closed, ends Config.ShutdownDelay early: tests close it
	// once they have seen what happens during the delay.
	endDelay chan struct{}

	shutdownOnce sync.Once
	shutdownErr  error // Shutdown's result, for every call

	// Security, set up by setupSecurity: nil when off.
	auth    *auth.Tokens
	tlsConf *tls.Config
}

// Run starts the daemon and serves until ctx ends or SIGINT or SIGTERM
// arrives, then shuts it down (see Server.Shutdown) and returns nil if
// everything in flight finished and every file was synced. A second SIGINT
// or SIGTERM during the shutdown delay or the drain kills the process the
// default way.
//
// Run is meant to be the rest of the process's life: from its first line
// on, SIGHUP rereads --auth-token-file, or without one is logged and
// ignored, and it stays caught after Run returns. SIGHUP's default action
// is to exit at once, with no drain and no final sync, and a handler
// removed before the process exits would leave a window for exactly that.
func Run(ctx context.Context, cfg Config) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP) // never stopped: see above
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	procs, from := applyProcs(cfg.Procs)
	s, err := Start(cfg)
	if err != nil {
		return err
	}
	s.log.Info("threads for Go code", "procs", procs, "from", from)
	s.limitMemory()
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case <-hup:
				s.reloadOnSIGHUP()
			case <-done:
				// Later SIGHUPs fill hup's buffer and are dropped.
				return
			}
		}
	}()
	var serveErr error
	select {
	case <-ctx.Done():
		s.log.Info("shutting down", "cause", context.Cause(ctx))
	case serveErr = <-s.serveErr:
		s.log.Error("serving failed, shutting down", "error", serveErr)
	}
	stop()
	return errors.Join(serveErr, s.Shutdown())
}

// Start opens the store and the listeners and serves in the background.
// It logs the addresses it bound, which matter with port 0.
func Start(cfg Config) (_ *Server, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// What the store would fill in at Open, filled in now: the listeners
	// bound their messages by Store.MaxRequestBytes too.
	cfg.Store = cfg.Store.WithDefaults()
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Server{cfg: cfg, log: log, health: health.NewServer(), serveErr: make(chan error, 8), endDelay: make(chan struct{})}
	defer func() {
		if err != nil {
			s.closeAll()
		}
	}()

	if err := s.setupSecurity(); err != nil {
		return nil, err
	}

	if s.tel, err = newTelemetry(context.Background(), cfg.TracerProvider); err != nil {
		return nil, err
	}
	osfs, err := store.OpenOSFS(cfg.Root)
	if err != nil {
		return nil, err
	}
	var fsys store.FS = osfs
	if cfg.WrapFS != nil {
		fsys = cfg.WrapFS(osfs)
	}
	opts := cfg.Store
	if opts.Telemetry == nil {
		opts.Telemetry = s.tel.store
	}
	if opts.Logger == nil {
		opts.Logger = log
	}
	if s.store, err = store.Open(fsys, opts); err != nil {
		fsys.Close()
		return nil, fmt.Errorf("open store at %s: %w", cfg.Root, err)
	}
	if s.auth != nil {
		// Resolved once, now that the store has created and opened it:
		// the store keeps that directory whatever its path later leads
		// to, and authorize need not resolve it again on every call.
		if root, err := filepath.EvalSymlinks(cfg.Root); err == nil {
			s.auth.Root = root
		}
	}

	lis, err := listenGRPC(cfg.GRPCAddr)
	if err != nil {
		return nil, fmt.Errorf("gRPC listener: %w", err)
	}
	s.budget = admit.NewBudget(cfg.MaxInflightBytes)
	if err := registerBudgetGauges(s.tel.meterProvider.Meter(serviceScope), s.budget); err != nil {
		return nil, fmt.Errorf("budget metrics: %w", err)
	}
	s.files, err = rpc.NewFileServer(rpc.Config{
		Store:             s.store,
		Log:               log,
		MaxRequestBytes:   cfg.Store.MaxRequestBytes,
		MaxStreamBytes:    cfg.MaxStreamBytes,
		MaxFilesPerStream: cfg.MaxFilesPerStream,
		StreamIdleTimeout: cfg.StreamIdleTimeout,
		Budget:            s.budget,
		Auth:              s.auth,
		Meter:             s.tel.meterProvider.Meter(serviceScope),
	})
	if err != nil {
		lis.Close()
		return nil, err
	}
	s.grpcLis = auth.NewGuardedListener(lis, cfg.ConnAuthTimeout)
	s.grpcSrv = newGRPCServer(s.files, s.health, cfg.Store.MaxRequestBytes, log, s.tel, append(publicServerOptions(cfg, s.grpcLis, s.auth, s.tlsConf, s.budget), rpc.PathHeaderOptions(cfg.RequirePathHeader)...)...)
	s.doors = append(s.doors, &grpcDoor{srv: s.grpcSrv, lis: s.grpcLis, log: log})
	if cfg.HTTPAddr != "" {
		if err := s.startGateway(); err != nil {
			return nil, err
		}
	}
	if cfg.PprofAddr != "" {
		if err := s.startPprof(); err != nil {
			return nil, err
		}
	}
	if cfg.NBDAddr != "" {
		if err := s.startNBD(); err != nil {
			return nil, err
		}
	}

	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(filewritev1.FileService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	for _, d := range s.doors {
		d.serve(s.serveErr)
	}
	st := s.store.Options()
	build := ReadBuildInfo()
	log.Info("filewrite started", "version", build.Version, "commit", build.Commit, "traces", s.tel.tracesTo,
		"root", cfg.Root, "policy", st.Policy.String(), "io", st.IO.String(), "fsync", st.Fsync.String(), "max_file_size", st.MaxFileSize, "max_request_bytes", st.MaxRequestBytes,
		"max_open_files", st.MaxOpenFiles, "rlimit_nofile", store.NoFileLimit(), "extent_cache_bytes", max(st.ExtentCacheBytes, 0),
		"max_inflight_bytes", cfg.MaxInflightBytes, "procs", runtime.GOMAXPROCS(0))
	// The listening records are a contract (docs/operations.md, "The
	// listening records"): whoever starts the daemon on port 0 learns its addresses
	// from them, with internal/daemonproc.ParseListening. Keep the message,
	// the attributes' names and values, and their order.
	log.Info("listening", "protocol", "grpc", "addr", s.grpcLis.Addr().String())
	if s.httpLis != nil {
		log.Info("listening", "protocol", "http", "addr", s.httpLis.Addr().String())
	}
	if s.pprofLis != nil {
		log.Info("listening", "protocol", "pprof", "addr", s.pprofLis.Addr().String())
	}
	if s.nbdLis != nil {
		log.Info("listening", "protocol", "nbd", "addr", s.nbdLis.Addr().String())
	}
	return s, nil
}

// directRoad is the gateway's direct road to the FileService.
func (s *Server) directRoad() *local.Files {
	tap, checks := gatewayChecks(s.auth, s.cfg.RequirePathHeader)
	return local.New(local.Config{
		Files:        s.files,
		Store:        s.store,
		Tap:          tap,
		Interceptors: append([]grpc.UnaryServerInterceptor{logUnary(s.log)}, checks...),
		Tracer:       s.tel.tracerProvider.Tracer(serviceScope),
	})
}

// startGateway opens the REST door: its HTTP listener, and the gRPC
// server of its own that the gateway reaches over a pipe.
func (s *Server) startGateway() (err error) {
	limit := status.MaxMessageBytes(s.cfg.Store.MaxRequestBytes)
	// The door is filled as its pieces are made, so that a failure
	// half-way closes those made (closeAll).
	rest := &restDoor{log: s.log}
	s.doors = append(s.doors, rest)
	rest.grpcLis = newPipeListener()
	rest.grpcSrv = newGRPCServer(s.files, s.health, s.cfg.Store.MaxRequestBytes, s.log, s.tel, gatewayServerOptions(s.auth, s.cfg.RequirePathHeader)...)
	rest.grpcConn, err = grpc.NewClient("passthrough:///gateway",
		grpc.WithContextDialer(rest.grpcLis.dial),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(s.tel.clientHandler()),
		grpc.WithChainUnaryInterceptor(gateway.HoldBody, gateway.Preconditions),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(limit), grpc.MaxCallSendMsgSize(limit)),
	)
	if err != nil {
		return fmt.Errorf("gateway client: %w", err)
	}
	if err := s.startDoors(); err != nil {
		return err
	}
	handler, err := gateway.New(context.Background(), rest.grpcConn, gateway.Config{
		MaxRequestBytes: s.cfg.Store.MaxRequestBytes,
		MaxFileSize:     s.cfg.Store.MaxFileSize,
		BodyTimeout:     s.cfg.BodyTimeout,
		Budget:          s.budget,
		// Last-Modified only once a date cannot repeat (see
		// gateway.DefaultLastModifiedDelay).
		LastModifiedDelay: lastModifiedDelay(s.cfg),
		// The routes that move bytes take the direct road, through what
		// the gateway's gRPC server runs, in its order: the log line
		// (newGRPCServer) and gatewayChecks.
		Local: s.directRoad(),
	})
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", s.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("HTTP listener: %w", err)
	}
	browser, err := browserGuardFor(s.cfg, s.auth != nil)
	if err != nil {
		lis.Close()
		return err
	}
	rest.httpGuard = auth.NewGuardedListener(lis, s.cfg.ConnAuthTimeout)
	rest.httpLis = rest.httpGuard
	if s.tlsConf != nil {
		rest.httpLis = auth.HTTPTLSListener(rest.httpLis, s.tlsConf)
	}
	s.httpLis = rest.httpLis
	// Security wraps whatever the listener serves, gateway and all.
	cors, err := origin.NewCORS(s.cfg.HTTPAllowedOrigins)
	if err != nil {
		return err
	}
	rest.httpSrv = &http.Server{
		// CORS answers a preflight before the token check: a browser
		// sends none with it.
		Handler: probeRoutes(cors.Wrap(davCredentials(s.auth.HTTPMiddleware(
			httpHandler(handler, browser, s.tel, s.store, s.cfg.TraceURLTemplate, func() *nbd.Server { return s.nbdSrv }, s.httpDoor)))),
			s.health, s.auth != nil),
		ConnContext:       auth.WithGuardedConn,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	return nil
}

// GRPCAddr is the address the gRPC server listens on.
func (s *Server) GRPCAddr() net.Addr { return s.grpcLis.Addr() }

// listenGRPC listens on addr: host:port, or unix:PATH for a unix socket.
// A socket file left by a daemon that died is replaced; one that a live
// daemon answers on is not.
func listenGRPC(addr string) (net.Listener, error) {
	path, ok := strings.CutPrefix(addr, "unix:")
	if !ok {
		return net.Listen("tcp", addr)
	}
	lis, err := net.Listen("unix", path)
	if err == nil || !errors.Is(err, syscall.EADDRINUSE) {
		return lis, err
	}
	if fi, serr := os.Lstat(path); serr != nil || fi.Mode().Type() != os.ModeSocket {
		return nil, err
	}
	if c, derr := net.Dial("unix", path); derr == nil {
		c.Close()
		return nil, err // someone answers there
	}
	if rerr := os.Remove(path); rerr != nil {
		return nil, err
	}
	return net.Listen("unix", path)
}

// HTTPAddr is the address the REST gateway listens on, nil when disabled.
func (s *Server) HTTPAddr() net.Addr {
	if s.httpLis == nil {
		return nil
	}
	return s.httpLis.Addr()
}

// Shutdown drains the daemon and closes the store. In order:
//
//  1. health turns NOT_SERVING: health Watch streams are told, and
//     /readyz answers 503;
//  2. for Config.ShutdownDelay, nothing else changes: every door takes
//     new connections and new calls, and WriteStreams read on, so that a
//     load balancer that probes has the time to see the daemon leave
//     before it refuses anything;
//  3. WriteStreams stop reading, and every door (Server.doors) stops
//     taking new work at once: the public gRPC server stops accepting
//     connections and tells every connection to start no new call
//     (GOAWAY; calls already on their way are still served, as HTTP/2's
//     graceful shutdown has it), the gateway stops accepting requests,
//     connections that never authenticated are closed, and the NBD
//     listener closes, with the NBD connections still in their
//     handshake, answering requests that arrive from then on with
//     NBD_ESHUTDOWN;
//  4. requests in flight finish: REST ones still reach the gateway's own
//     gRPC server, which stops once they are done; each NBD connection
//     closes once it has none;
//  5. the store syncs and closes every open file.
//
// Step 4 is bounded by Config.DrainTimeout; past it, what still runs is
// cancelled, and the store still waits for the operations it has begun
// before its final sync. Shutdown returns that sync's error, if any; a
// second call waits for the first and returns the same.
func (s *Server) Shutdown() error {
	s.shutdownOnce.Do(func() { s.shutdownErr = s.shutdown() })
	return s.shutdownErr
}

func (s *Server) shutdown() error {
	s.health.Shutdown()
	s.waitShutdownDelay()
	s.files.Drain()
	s.log.Info("draining", "timeout", s.cfg.DrainTimeout)
	ctx, cancel := context.WithTimeoutCause(context.Background(), s.cfg.DrainTimeout,
		fmt.Errorf("--drain-timeout %v passed", s.cfg.DrainTimeout))
	defer cancel()
	var drains sync.WaitGroup
	for _, d := range s.doors {
		drains.Go(func() { d.drain(ctx) })
	}
	drains.Wait()
	err := s.closeAll()
	if err != nil {
		s.log.Error("stopped with errors", "error", err)
		return err
	}
	s.log.Info("stopped: all files synced")
	return nil
}

// waitShutdownDelay waits for Config.ShutdownDelay, unless endDelay
// closes first.
func (s *Server) waitShutdownDelay() {
	if s.cfg.ShutdownDelay <= 0 {
		return
	}
	s.log.Info("not ready: serving on until the shutdown delay has passed", "delay", s.cfg.ShutdownDelay)
	t := time.NewTimer(s.cfg.ShutdownDelay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.endDelay:
	}
}

// closeAll releases whatever Start opened; Shutdown calls it after the
// drain. Closing the store syncs every open file.
func (s *Server) closeAll() error {
	var errs []error
	// Doors close only the listeners they were serving; Start can fail
	// before that, so each closes its own too (twice is harmless).
	for _, d := range slices.Backward(s.doors) {
		d.close()
	}
	if s.stopDoors != nil {
		s.stopDoors()
	}
	if s.store != nil {
		if err := s.store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close store: %w", err))
		}
	}
	if s.tel != nil {
		// Last, so that the final RPCs' spans are flushed. A collector
		// that cannot be reached costs at most the timeout, and is no
		// reason to report the shutdown as failed: the files are synced.
		ctx, cancel := context.WithTimeout(context.Background(), telemetryFlushTimeout)
		if err := s.tel.shutdown(ctx); err != nil {
			s.log.Warn("flushing telemetry", "error", err)
		}
		cancel()
	}
	return errors.Join(errs...)
}
