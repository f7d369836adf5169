package rpc

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/shard"
	"github.com/filewrite/filewrite/service/internal/status"
)

// The routing header. A router (HAProxy, the client's ring hash) sends a
// call on a file to the daemon that owns the file's path, by the path it
// reads from shard.Header. If the daemon served a call whose header names
// another file, two routers that read a path differently (an encoded ':'
// taken for a verb, a raw PUT of "q:write") would put one file on two
// daemons without a sign. So a call whose header is present must name the
// request's own path (shard.CheckHeader), or it is FAILED_PRECONDITION;
// with --require-path-header, a call on a file without the header is
// refused too, since nothing routed it. List and health name no file and
// are never checked; a Rename is routed, and checked, by its old path.

const fileServicePrefix = "/filewrite.v1.FileService/"

// errNoPathHeader is returned, with --require-path-header, for a call on
// a file that carries no shard.Header.
var errNoPathHeader = errors.New("this daemon is one of a cluster (--require-path-header) and the call carries no " + shard.Header + " header: send it through the cluster's router, or set the header to the path's routing key")

// routedByPath says whether fullMethod is a call on one file, which
// routers place by its path.
func routedByPath(fullMethod string) bool {
	name, ok := strings.CutPrefix(fullMethod, fileServicePrefix)
	return ok && name != "List"
}

// checkPathHeader checks ctx's routing header against path.
func checkPathHeader(ctx context.Context, path string, require bool) error {
	values := metadata.ValueFromIncomingContext(ctx, shard.Header)
	if len(values) == 0 && require {
		return noPathHeader()
	}
	if err := shard.CheckHeader(values, path); err != nil {
		return status.Refusal(filewritev1.ErrorReason_PATH_HEADER_MISMATCH, nil, "%v: a router placed this call by another file than the one it names", err)
	}
	return nil
}

// noPathHeader is the refusal of a call without the header, under
// --require-path-header.
func noPathHeader() error {
	return status.Build(filewritev1.ErrorReason_PATH_HEADER_MISMATCH, nil, errNoPathHeader.Error(), "--require-path-header").Err()
}

// PathHeaderUnary is the unary interceptor of PathHeaderOptions, which the
// direct road (service/internal/local) runs as the gRPC server does.
func PathHeaderUnary(require bool) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if p, ok := req.(interface{ GetPath() string }); ok && routedByPath(info.FullMethod) {
			if err := checkPathHeader(ctx, p.GetPath(), require); err != nil {
				return nil, err
			}
		}
		return handler(ctx, req)
	}
}

// PathHeaderOptions are the interceptors that check the routing header of
// every call on a file (see above). WriteStream's header is checked by the
// stream itself (writeStream.check) against its first file: its first
// message's path, or else the first file that message declares. The files
// declared later are not held to it: a router places a stream once, so a
// client (the Go client groups them by owner) puts on one stream only
// files that the daemon the header routes to owns.
func PathHeaderOptions(require bool) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(PathHeaderUnary(require)),
		grpc.ChainStreamInterceptor(PathHeaderStream(require)),
	}
}

// PathHeaderStream is the stream interceptor of PathHeaderOptions.
func PathHeaderStream(require bool) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if require && routedByPath(info.FullMethod) && len(metadata.ValueFromIncomingContext(ss.Context(), shard.Header)) == 0 {
			return noPathHeader()
		}
		return handler(srv, ss)
	}
}
