package service

import (
	"context"
	"crypto/tls"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/tap"

	"github.com/filewrite/filewrite/service/internal/admit"
	"github.com/filewrite/filewrite/service/internal/auth"
	"github.com/filewrite/filewrite/service/internal/rpc"
)

// What a caller must get past before the daemon spends anything on it.
//
// grpc-go reads and decompresses a request's whole message before any
// interceptor runs, so a check in an interceptor comes after the cost. The
// tap (grpc.InTapHandle) runs when a call's headers arrive, on the
// connection's reader goroutine: it must be quick and must not block, and
// what it refuses is answered at once and never read further.

// Limits of the public gRPC listener, per connection (docs/guarantees.md,
// "Connections").
const (
	// maxConcurrentStreams bounds the calls one connection may have open
	// at once; a client that opens more has them refused (REFUSED_STREAM,
	// which grpc-go clients queue and retry). The load scenarios run at
	// most 64 clients and give each its own connection. The gateway does
	// not share this bound: it reaches its own gRPC server (restDoor.grpcSrv).
	maxConcurrentStreams = 128

	// keepaliveMinTime is the shortest interval between a client's
	// keepalive pings, with or without calls open; pinging more often gets
	// the connection closed (GOAWAY "too_many_pings"). grpc-go clients
	// cannot ask for less than 10 s.
	keepaliveMinTime = 10 * time.Second
	// keepaliveTime is how long a connection may stay silent before the
	// server pings it, and keepaliveTimeout how long the answer may take:
	// a client that vanished stops holding its calls (and their memory)
	// after about the sum.
	keepaliveTime    = time.Minute
	keepaliveTimeout = 20 * time.Second
)

// publicServerOptions are those of the gRPC server on cfg.GRPCAddr, whose
// listener is lis: TLS (with tlsConf, if not nil), the tap that admits
// calls (tokens, nil without AuthTokenFile), their share of budget, and
// the per-connection limits.
func publicServerOptions(cfg Config, lis *auth.GuardedListener, tokens *auth.Tokens, tlsConf *tls.Config, budget *admit.Budget) []grpc.ServerOption {
	calls := admit.NewGRPCBudget(budget, cfg.Store.MaxRequestBytes)
	opts := []grpc.ServerOption{
		grpc.InTapHandle(tokens.AdmitCall),
		grpc.StatsHandler(publicStats{guard: lis, calls: calls}),
		// Replaces newGRPCServer's requestCodec with one that extends it.
		grpc.ForceServerCodecV2(admit.NewReplyCodec(rpc.NewRequestCodec(), calls)),
		grpc.ChainUnaryInterceptor(calls.Unary, tokens.UnaryAuthorize),
		grpc.ChainStreamInterceptor(admit.BudgetStream(budget)),
		// The handshake (TLS, HTTP/2 preface and settings) too must end
		// within the time a connection has to authenticate.
		grpc.ConnectionTimeout(cfg.ConnAuthTimeout),
		grpc.MaxConcurrentStreams(maxConcurrentStreams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: keepaliveTime, Timeout: keepaliveTimeout}),
	}
	if tlsConf != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsConf)))
	}
	return opts
}

// gatewayServerOptions are those of the gateway's own gRPC server, which
// only the gateway reaches, over a pipe: no TLS (the bytes stay in the
// process) and no per-connection limits (one connection carries every REST
// request), but the same token check, on the Authorization header the
// gateway forwards (tokens, nil without AuthTokenFile), and the checks of
// gatewayChecks.
func gatewayServerOptions(tokens *auth.Tokens, requirePathHeader bool) []grpc.ServerOption {
	tap, checks := gatewayChecks(tokens, requirePathHeader)
	return []grpc.ServerOption{grpc.InTapHandle(tap), grpc.ChainUnaryInterceptor(checks...),
		grpc.ChainStreamInterceptor(rpc.PathHeaderStream(requirePathHeader))}
}

// gatewayChecks are what a REST call meets on its way to a handler besides
// the log line (newGRPCServer's logUnary): the tap's token check and the
// unary interceptors, in order. The gateway's gRPC server runs them for
// the JSON routes, and the direct road (service/internal/local) for the
// routes that move bytes: one list, so that the two do not diverge.
func gatewayChecks(tokens *auth.Tokens, requirePathHeader bool) (tap.ServerInHandle, []grpc.UnaryServerInterceptor) {
	return tokens.Tap, []grpc.UnaryServerInterceptor{tokens.UnaryAuthorize, rpc.PathHeaderUnary(requirePathHeader)}
}

// publicStats is the public gRPC server's own stats handler. gRPC tells a
// stats handler of each new connection before any call on it, with a
// context that the connection's calls inherit, down to the tap: it puts
// the connection's guardedConn there for auth.AdmitCall. It also takes each
// unary call's share of the budget (budget.go).
type publicStats struct {
	guard *auth.GuardedListener
	calls *admit.GRPCBudget
}

var _ stats.Handler = publicStats{}

func (h publicStats) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	return h.guard.TagConn(ctx, info.RemoteAddr)
}

func (publicStats) HandleConn(context.Context, stats.ConnStats) {}

func (h publicStats) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	return h.calls.TagCall(ctx, info.FullMethodName)
}

func (h publicStats) HandleRPC(ctx context.Context, s stats.RPCStats) {
	h.calls.Event(ctx, s)
}
