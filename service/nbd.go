package service

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/semconv/v1.43.0/rpcconv"
	"go.opentelemetry.io/otel/trace"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/filewrite/filewrite/service/internal/auth"
	"github.com/filewrite/filewrite/service/internal/nbd"
)

// The NBD door (docs/nbd.md): service/internal/nbd speaks the protocol,
// and calls the store through nbd.StoreBackend with the daemon's
// authorization, in-flight budget, limits and telemetry applied as
// functions (docs/design.md, "Many front doors, one engine").

// nbdSocketMode is the mode of --nbd-addr's unix socket: its owner and
// group may connect, as the directory's permissions allow.
const nbdSocketMode = 0o660

// startNBD listens on Config.NBDAddr and makes the NBD server, its door
// (nbdDoor); Start serves it once everything else is up.
func (s *Server) startNBD() error {
	lis, err := listenGRPC(s.cfg.NBDAddr)
	if err != nil {
		return fmt.Errorf("NBD listener: %w", err)
	}
	if path, ok := strings.CutPrefix(s.cfg.NBDAddr, "unix:"); ok {
		if err := os.Chmod(path, nbdSocketMode); err != nil {
			lis.Close()
			return fmt.Errorf("NBD listener: %w", err)
		}
	}
	var conf *tls.Config
	if s.tlsConf != nil {
		conf = s.tlsConf.Clone()
		if s.auth != nil {
			// NBD carries no token: the certificate is the credential.
			conf.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	obs, err := newNBDObserver(s.tel)
	if err != nil {
		lis.Close()
		return err
	}
	srv, err := nbd.NewServer(nbd.Config{
		Backend:          &nbd.StoreBackend{Store: s.store, Authorize: s.nbdAuthorize, Lists: s.nbdLists},
		Budget:           s.budget,
		Observer:         obs,
		TLS:              conf,
		RequireTLS:       s.auth != nil,
		MaxPayload:       int(min(nbd.MaxPayload, s.cfg.Store.MaxRequestBytes)),
		HandshakeTimeout: s.cfg.ConnAuthTimeout,
		PayloadTimeout:   s.cfg.BodyTimeout,
		Logger:           s.log,
	})
	if err != nil {
		lis.Close()
		return err
	}
	s.nbdSrv, s.nbdLis = srv, lis
	d := &nbdDoor{srv: srv, lis: lis, log: s.log, stop: make(chan struct{})}
	if s.auth != nil {
		d.afterReload = s.auth.AfterReload
		d.recheck = func() {
			srv.Recheck(func(p *nbd.Peer, name string) (bool, error) {
				return s.nbdAuthorize(context.Background(), p, name)
			})
		}
	}
	s.doors = append(s.doors, d)
	return nil
}

// nbdDoor is the NBD server on --nbd-addr. While it serves, each reload
// of the token file narrows the exports in use before the reload returns
// (recheck), until the door is drained or closed.
type nbdDoor struct {
	srv *nbd.Server
	lis net.Listener
	log *slog.Logger
	// afterReload is the credentials' AfterReload, recheck what each
	// reload calls for; both nil without --auth-token-file.
	afterReload func(func())
	recheck     func()
	// stop, closed once (stopOnce), ends the rechecks.
	stop     chan struct{}
	stopOnce sync.Once
}

func (d *nbdDoor) serve(errc chan<- error) {
	go func() {
		if err := d.srv.Serve(d.lis); !errors.Is(err, nbd.ErrServerClosed) {
			errc <- fmt.Errorf("NBD server: %w", err)
		}
	}()
	if d.afterReload == nil {
		return
	}
	d.afterReload(func() {
		select {
		case <-d.stop:
		default:
			d.recheck()
		}
	})
}

// drain is NBD's own: requests in flight finish, new ones answer
// NBD_ESHUTDOWN; past ctx, the rest is cancelled.
func (d *nbdDoor) drain(ctx context.Context) {
	d.stopOnce.Do(func() { close(d.stop) })
	if err := d.srv.Shutdown(ctx); err != nil {
		d.log.Warn("NBD drain cut short: cancelling requests in flight", "error", context.Cause(ctx))
	}
}

func (d *nbdDoor) close() {
	d.stopOnce.Do(func() { close(d.stop) })
	d.srv.Close()
	d.lis.Close()
}

// nbdAuthorize is what the client p may do with the file name: its
// verified client certificate, mapped by its cert= line, must let it read
// the file, and the export is read-only unless it may write it too.
// Without --auth-token-file everything is allowed.
func (s *Server) nbdAuthorize(ctx context.Context, p *nbd.Peer, name string) (readOnly bool, err error) {
	if s.auth == nil {
		return false, nil
	}
	ctx, err = s.auth.WithClientCert(ctx, p.TLS)
	if err != nil {
		return false, fmt.Errorf("%w: %v", nbd.ErrPermission, err)
	}
	if err := s.auth.Authorize(ctx, auth.AccessRead, name); err != nil {
		return false, fmt.Errorf("%w: %s", nbd.ErrPermission, grpcstatus.Convert(err).Message())
	}
	return !s.auth.Allows(ctx, auth.AccessWrite, name), nil
}

// nbdLists is whether NBD_OPT_LIST names the file name to p: whether it
// may read it.
func (s *Server) nbdLists(ctx context.Context, p *nbd.Peer, name string) bool {
	if s.auth == nil {
		return true
	}
	ctx, err := s.auth.WithClientCert(ctx, p.TLS)
	return err == nil && s.auth.Allows(ctx, auth.AccessRead, name)
}

// nbdObserver puts NBD's requests into the daemon's telemetry as its
// gRPC calls are: a server span per request, under which the store
// records its lock waits, and the rpc.server.call.duration histogram
// otelgrpc fills, with rpc.system.name "nbd", the command as rpc.method
// ("nbd/NBD_CMD_WRITE") and the error value the client was told as
// rpc.response.status_code ("OK", "EPERM", ...).
type nbdObserver struct {
	tracer   trace.Tracer
	duration rpcconv.ServerCallDuration
	// methods are the rpc.method attributes, by command.
	methods map[nbd.Command]attribute.KeyValue
}

var _ nbd.Observer = (*nbdObserver)(nil)

func newNBDObserver(t *telemetry) (*nbdObserver, error) {
	// otelgrpc's buckets, so that NBD's series sit beside gRPC's.
	duration, err := rpcconv.NewServerCallDuration(t.meterProvider.Meter(serviceScope),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10))
	if err != nil {
		return nil, fmt.Errorf("NBD metrics: %w", err)
	}
	o := &nbdObserver{tracer: t.tracerProvider.Tracer(serviceScope), duration: duration, methods: map[nbd.Command]attribute.KeyValue{}}
	for _, c := range []nbd.Command{nbd.CmdRead, nbd.CmdWrite, nbd.CmdFlush, nbd.CmdTrim, nbd.CmdCache, nbd.CmdWriteZeroes, nbd.CmdBlockStatus} {
		o.methods[c] = duration.AttrMethod("nbd/" + c.String())
	}
	return o, nil
}

// nbdSystem is NBD's rpc.system.name.
const nbdSystem rpcconv.SystemNameAttr = "nbd"

func (o *nbdObserver) Begin(ctx context.Context, cmd nbd.Command, offset int64, length uint32) (context.Context, func(error)) {
	method, ok := o.methods[cmd]
	if !ok {
		method = o.duration.AttrMethod("nbd/" + cmd.String())
	}
	start := time.Now()
	ctx, span := o.tracer.Start(ctx, method.Value.AsString(), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("rpc.system.name", string(nbdSystem)), method,
			attribute.Int64("nbd.offset", offset), attribute.Int64("nbd.length", int64(length))))
	return ctx, func(err error) {
		code := nbd.ErrnoName(err)
		o.duration.Record(ctx, time.Since(start).Seconds(), nbdSystem, method, o.duration.AttrResponseStatusCode(code))
		if err != nil {
			span.SetStatus(codes.Error, code+": "+err.Error())
		}
		span.End()
	}
}

// NBDAddr is the address the NBD server listens on, nil when disabled.
func (s *Server) NBDAddr() net.Addr {
	if s.nbdLis == nil {
		return nil
	}
	return s.nbdLis.Addr()
}
