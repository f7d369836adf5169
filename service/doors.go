package service

import (
	"context"
	"net"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/filewrite/filewrite/service/internal/status"
	"github.com/filewrite/filewrite/service/internal/uploads"
)

// The doors beside the gateway on the HTTP listener (docs/design.md,
// "Many front doors, one engine"): tus under /v1/uploads/ (uploads.go's
// package). Each translates its protocol into the store's calls, run
// under the FileService's checks (doorCalls).

// doorCalls runs a door's operations as the gateway's gRPC server runs a
// call: under a server span named for the method, through its log line
// and its scope check, with the identity the HTTP middleware found in the
// request's context (it checked the token already).
type doorCalls struct {
	s      *Server
	tracer trace.Tracer
	chain  []grpc.UnaryServerInterceptor
}

var _ uploads.Calls = (*doorCalls)(nil)

func (s *Server) newDoorCalls() *doorCalls {
	return &doorCalls{
		s:      s,
		tracer: s.tel.tracerProvider.Tracer(serviceScope),
		chain:  []grpc.UnaryServerInterceptor{logUnary(s.log), s.auth.UnaryAuthorize},
	}
}

func (c *doorCalls) Run(ctx context.Context, method string, req any, do func(ctx context.Context) error) error {
	ctx, span := c.tracer.Start(ctx, method[1:], trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("rpc.system", "filewrite-door"), attribute.String("rpc.method", method)))
	defer span.End()
	info := &grpc.UnaryServerInfo{FullMethod: method}
	next := func(ctx context.Context, _ any) (any, error) { return nil, do(ctx) }
	for i := len(c.chain) - 1; i >= 0; i-- {
		ic, inner := c.chain[i], next
		next = func(ctx context.Context, req any) (any, error) { return ic(ctx, req, info, inner) }
	}
	_, err := next(ctx, req)
	if err != nil {
		err = status.Of(err)
		st := grpcstatus.Convert(err)
		span.SetStatus(codes.Error, st.Message())
		span.SetAttributes(attribute.String("rpc.grpc.status_code", st.Code().String()))
	}
	return err
}

// doorContext is the context a door's calls run in for r: the host r
// came from as the call's peer, as the gateway's gRPC server sees a REST
// caller.
func doorContext(r *http.Request) context.Context {
	ctx := r.Context()
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		ctx = peer.NewContext(ctx, &peer.Peer{Addr: hostAddr(host)})
	}
	return ctx
}

// hostAddr is an HTTP client's address as the log names it: its host.
type hostAddr string

func (h hostAddr) Network() string { return "tcp" }
func (h hostAddr) String() string  { return string(h) }

// startDoors makes the doors of the HTTP listener.
func (s *Server) startDoors() error {
	var err error
	s.uploads, err = uploads.New(uploads.Config{
		Store:           s.store,
		Calls:           s.newDoorCalls(),
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
	ctx, cancel := context.WithCancel(context.Background())
	s.stopDoors = cancel
	go s.uploads.Run(ctx)
	return nil
}

// door is the door that serves path, nil for the gateway's.
func (s *Server) door(path string) http.Handler {
	switch {
	case s.uploads != nil && (path == "/v1/uploads" || len(path) >= len(uploads.Prefix) && path[:len(uploads.Prefix)] == uploads.Prefix):
		return s.uploads
	}
	return nil
}
