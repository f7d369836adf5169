package service

import (
	"context"
	"log/slog"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"
	grpcstatus "google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/bufpool"
	"github.com/filewrite/filewrite/service/internal/rpc"
	"github.com/filewrite/filewrite/service/internal/status"
)

// transportRecvBytes is the limit gRPC itself enforces on a message it
// receives: twice the data limit, above status.MaxMessageBytes. gRPC refuses a
// message over its limit by ending the RPC at once, which would lose the
// acks a WriteStream still owes for the writes it read before; between
// the two limits the stream's handler refuses the message itself, after
// those acks (service/internal/rpc). Unary calls up to this size reach their
// handler, and the store refuses the data past --max-request-bytes with a
// message that names it.
func transportRecvBytes(maxRequestBytes int64) int {
	return status.MaxMessageBytes(maxRequestBytes) + int(maxRequestBytes)
}

// HTTP/2 flow-control windows the daemon grants: per stream, at least a
// WriteStream's pipeline (the client package's 32 callers of 4 KiB hold
// 136 KiB in flight, --max-stream-bytes defaults to 4 MiB), and per
// connection. They bound what a connection's transport holds unread.
const (
	streamWindow = 4 << 20
	connWindow   = 16 << 20
)

// newGRPCServer builds the whole gRPC server: interceptors, the otel stats
// handler, message limits, the FileService, health and reflection (so that
// grpcurl and ghz need no .proto files). Its stats handler and metrics use
// tel's providers. extra adds options after these: TLS and the
// authentication interceptors, which chain after logUnary.
func newGRPCServer(files *rpc.FileServer, hs *health.Server, maxRequestBytes int64, log *slog.Logger, tel *telemetry, extra ...grpc.ServerOption) *grpc.Server {
	limit := status.MaxMessageBytes(maxRequestBytes)
	opts := append([]grpc.ServerOption{
		grpc.StatsHandler(tel.serverHandler()),
		// Performance (docs/benchmarks.md, the stream path): a pool of goroutines per
		// CPU serves new RPCs instead of a goroutine each; gRPC's buffers
		// come from a pool that does not zero them (internal/bufpool);
		// fixed windows hold a stream's pipeline of writes without
		// waiting for window updates (and turn off gRPC's estimation).
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		experimental.BufferPool(bufpool.Shared),
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		grpc.MaxRecvMsgSize(transportRecvBytes(maxRequestBytes)),
		grpc.MaxSendMsgSize(limit),
		grpc.ForceServerCodecV2(rpc.NewRequestCodec()),
		grpc.ChainUnaryInterceptor(logUnary(log)),
		grpc.ChainStreamInterceptor(logStream(log)),
	}, extra...)
	// Last, after any interceptor in extra: see codec.go.
	opts = append(opts,
		grpc.ChainUnaryInterceptor(rpc.RejectUndecodableUnary),
		grpc.ChainStreamInterceptor(rpc.RejectUndecodableStream))
	srv := grpc.NewServer(opts...)
	filewritev1.RegisterFileServiceServer(srv, files)
	healthpb.RegisterHealthServer(srv, hs)
	reflection.Register(srv)
	return srv
}

// ensureReason gives a status that leaves the daemon without an ErrorInfo
// the reason its code implies (withReason): the last chance, outermost in
// the interceptor chain, for one that came from gRPC itself, such as a
// deadline that passed in the transport.
func ensureReason(err error) error {
	if err == nil {
		return nil
	}
	return status.Of(err)
}

// logStream logs every stream when it ends, as logUnary logs a call.
func logStream(log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		ps := &pathStream{ServerStream: ss}
		err := ensureReason(handler(srv, ps))
		var path string
		if p := ps.path.Load(); p != nil {
			path = *p
		}
		logRPC(ss.Context(), log, info.FullMethod, path, start, err)
		return err
	}
}

// pathStream notes the first file path a stream's messages name (a
// WriteStream names its file in its first message), for the stream's log
// line. Once it has one, a message costs it an atomic load.
type pathStream struct {
	grpc.ServerStream
	// path is set once; atomic because a handler's receiving goroutine
	// may outlive the handler's return by a RecvMsg.
	path atomic.Pointer[string]
}

func (s *pathStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil && s.path.Load() == nil {
		if r, ok := m.(interface{ GetPath() string }); ok && r.GetPath() != "" {
			p := r.GetPath()
			s.path.Store(&p)
		}
	}
	return err
}

// logUnary logs every RPC at debug level, and at error level those whose
// code means the server or the disk failed, so that an operator sees I/O
// errors without turning on debug logs.
func logUnary(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		err = ensureReason(err)
		var path string
		if r, ok := req.(interface{ GetPath() string }); ok {
			path = r.GetPath()
		}
		logRPC(ctx, log, info.FullMethod, path, start, err)
		return resp, err
	}
}

// logRPC logs the end of an RPC: at error level when its code says the
// server or the disk failed (status.FailureLevel), else at debug level. It names
// the caller (peerAddr) and the file (path: a unary call's, or the first
// that a stream's messages name).
// The elapsed time is a Go duration string in either log format: slog's
// JSON handler would write a duration as integer nanoseconds.
func logRPC(ctx context.Context, log *slog.Logger, method, path string, start time.Time, err error) {
	code := grpcstatus.Code(err)
	level := status.FailureLevel(code)
	if !log.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{
		slog.String("method", method),
		slog.String("code", code.String()),
		slog.String("elapsed", time.Since(start).String()),
		slog.String("peer", peerAddr(ctx)),
	}
	if path != "" {
		attrs = append(attrs, slog.String("path", path))
	}
	if err != nil {
		attrs = append(attrs, slog.String("error", grpcstatus.Convert(err).Message()))
	}
	// The stats handler put the RPC's span in ctx: its id finds the trace
	// of a failed call.
	attrs = append(attrs, traceAttrs(ctx)...)
	log.LogAttrs(ctx, level, "rpc", attrs...)
}

// peerAddr is the address of whoever made the call in ctx: the gRPC peer,
// or for a REST call, which reaches the gateway's gRPC server over an
// in-process pipe, the HTTP client that grpc-gateway appended to
// X-Forwarded-For (the last entry: earlier ones are whatever the client
// sent).
func peerAddr(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	if p.Addr.Network() != (pipeAddr{}).Network() {
		return p.Addr.String()
	}
	fwd := metadata.ValueFromIncomingContext(ctx, "x-forwarded-for")
	if len(fwd) == 0 {
		return p.Addr.String()
	}
	last := fwd[len(fwd)-1]
	if i := strings.LastIndexByte(last, ','); i >= 0 {
		last = last[i+1:]
	}
	return strings.TrimSpace(last)
}
