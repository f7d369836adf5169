package gateway

import (
	"context"
	"net/http"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/metadata"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/service/internal/local"
)

// Files is what the routes that move bytes call (the raw PUT, the raw
// append, :read and downloads): the FileService in the process, through
// the direct road (local.Files, the daemon's), or, for a gateway without
// one (Config.Local nil, as the tests' gateway over a fake server), its
// gRPC client.
type Files interface {
	Write(ctx context.Context, req *filewritev1.WriteRequest) (*filewritev1.WriteResponse, error)
	Append(ctx context.Context, req *filewritev1.AppendRequest) (*filewritev1.AppendResponse, error)
	Stat(ctx context.Context, req *filewritev1.StatRequest) (*filewritev1.StatResponse, error)
	Read(ctx context.Context, req *filewritev1.ReadRequest) (*filewritev1.ReadResponse, error)
}

var _ Files = (*local.Files)(nil)

// clientFiles is Files over the gateway's gRPC client.
type clientFiles struct{ c filewritev1.FileServiceClient }

func (f clientFiles) Write(ctx context.Context, req *filewritev1.WriteRequest) (*filewritev1.WriteResponse, error) {
	return f.c.Write(ctx, req)
}

func (f clientFiles) Append(ctx context.Context, req *filewritev1.AppendRequest) (*filewritev1.AppendResponse, error) {
	return f.c.Append(ctx, req)
}

func (f clientFiles) Stat(ctx context.Context, req *filewritev1.StatRequest) (*filewritev1.StatResponse, error) {
	return f.c.Stat(ctx, req)
}

func (f clientFiles) Read(ctx context.Context, req *filewritev1.ReadRequest) (*filewritev1.ReadResponse, error) {
	return f.c.Read(ctx, req)
}

// callContext is the context of the calls a byte route makes for r as
// method: the gRPC client's, with the metadata grpc-gateway forwards (the
// Authorization header, the routing header) and pattern as its route; or,
// on the direct road, the same (with the deadline of a Grpc-Timeout
// header), with that metadata as it would arrive (local.Incoming), so that
// the checks on it are the same.
func (g *gateway) callContext(r *http.Request, method, pattern string) (context.Context, error) {
	ctx, err := runtime.AnnotateContext(r.Context(), g.mux, r, method, runtime.WithHTTPPathPattern(pattern))
	if err != nil || g.Local == nil {
		return ctx, err
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	return local.Incoming(ctx, r, md), nil
}
