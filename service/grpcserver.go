package service

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/store"
)

// messageOverhead is what a message carries besides its data: a path of up
// to store.MaxPathLen bytes, a few varints and the protobuf tags. Adding it
// to --max-request-bytes lets a Write of exactly that many bytes through the
// transport, so the store, not the transport, decides at the limit, with a
// message that names it.
const messageOverhead = 64 << 10

// maxMessageBytes is the gRPC message limit, both ways, for a data limit.
func maxMessageBytes(maxRequestBytes int64) int {
	return int(maxRequestBytes) + messageOverhead
}

// newGRPCServer builds the whole gRPC server: interceptors, the otel stats
// handler, message limits, the FileService, health and reflection (so that
// grpcurl and ghz need no .proto files). Its stats handler and metrics use
// tel's providers. extra adds options after these: TLS and the
// authentication interceptors, which chain after logUnary.
func newGRPCServer(st *store.Store, hs *health.Server, maxRequestBytes int64, log *slog.Logger, tel *telemetry, extra ...grpc.ServerOption) *grpc.Server {
	limit := maxMessageBytes(maxRequestBytes)
	opts := append([]grpc.ServerOption{
		grpc.StatsHandler(tel.serverHandler()),
		grpc.MaxRecvMsgSize(limit),
		grpc.MaxSendMsgSize(limit),
		grpc.ForceServerCodecV2(newRequestCodec()),
		grpc.ChainUnaryInterceptor(logUnary(log)),
	}, extra...)
	// Last, after any interceptor in extra: see codec.go.
	opts = append(opts,
		grpc.ChainUnaryInterceptor(rejectUndecodableUnary),
		grpc.ChainStreamInterceptor(rejectUndecodableStream))
	srv := grpc.NewServer(opts...)
	filewritev1.RegisterFileServiceServer(srv, &fileServer{store: st, extentsPerReply: extentsPerReply(limit)})
	healthpb.RegisterHealthServer(srv, hs)
	reflection.Register(srv)
	return srv
}

// logUnary logs every RPC at debug level, and at error level those whose
// code means the server or the disk failed, so that an operator sees I/O
// errors without turning on debug logs.
func logUnary(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		code := status.Code(err)
		level := slog.LevelDebug
		switch code {
		case codes.Internal, codes.DataLoss, codes.Unknown:
			level = slog.LevelError
		}
		if log.Enabled(ctx, level) {
			attrs := []slog.Attr{
				slog.String("method", info.FullMethod),
				slog.String("code", code.String()),
				slog.Duration("elapsed", time.Since(start)),
			}
			if err != nil {
				attrs = append(attrs, slog.String("error", status.Convert(err).Message()))
			}
			// The stats handler put the RPC's span in ctx: its id finds
			// the trace of a failed call.
			attrs = append(attrs, traceAttrs(ctx)...)
			log.LogAttrs(ctx, level, "rpc", attrs...)
		}
		return resp, err
	}
}
