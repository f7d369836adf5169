// Package local is the direct road from a door that moves bytes to the
// FileService: the REST gateway's raw PUT, raw append and downloads now,
// tus and WebDAV later (docs/design.md, "Many front doors, one engine";
// the NBD server, built beside it, takes its checks as functions the
// service hands it). A gRPC call of the gateway's own server goes through an
// HTTP/2 pipe, protobuf encoding and the server's interceptors before the
// handler runs; here the door calls the same interceptors, as functions, in
// the order the gRPC server chains them (the token check of its tap, then
// the log line, the scope check and the routing header's check:
// Config.Tap and Config.Interceptors), under a span named for the
// method, and then the same handler (rpc.FileServer's method), so that a
// byte that comes in by a door is checked, limited, logged, traced and
// made durable as one that comes by gRPC, without being copied into a
// message and out again. What a request holds of the in-flight budget is
// its door's to take: the door knows what it holds (a piece of a body).
//
// It holds no lock of its own.
package local

import (
	"context"
	"net"
	"net/http"
	"os"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/service/internal/rpc"
	"github.com/filewrite/filewrite/service/internal/status"
	"github.com/filewrite/filewrite/store"
)

// Files calls the FileService in the process. It is safe for concurrent
// use.
type Files struct {
	files  *rpc.FileServer
	store  *store.Store
	tap    tap.ServerInHandle
	chain  grpc.UnaryServerInterceptor
	tracer trace.Tracer
}

// Config is what Files calls.
type Config struct {
	// Files is the FileService whose handlers run.
	Files *rpc.FileServer
	// Store is the store under it, for what no RPC has (a file to send
	// from its own descriptor: OpenReader).
	Store *store.Store
	// Tap is the gRPC server's InTapHandle (the token check), run first
	// on the call's incoming metadata; nil: none.
	Tap tap.ServerInHandle
	// Interceptors are the unary interceptors of the gRPC server the door
	// stands in for, in its chain's order: the same functions.
	Interceptors []grpc.UnaryServerInterceptor
	// Tracer starts each call's span; nil: none.
	Tracer trace.Tracer
}

// New returns the Files of cfg.
func New(cfg Config) *Files {
	tr := cfg.Tracer
	if tr == nil {
		tr = noop.NewTracerProvider().Tracer("")
	}
	return &Files{files: cfg.Files, store: cfg.Store, tap: cfg.Tap, chain: chain(cfg.Interceptors), tracer: tr}
}

// chain runs interceptors as grpc.ChainUnaryInterceptor does: the first
// outermost.
func chain(interceptors []grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		next := handler
		for i := len(interceptors) - 1; i >= 0; i-- {
			ic, inner := interceptors[i], next
			next = func(ctx context.Context, req any) (any, error) { return ic(ctx, req, info, inner) }
		}
		return next(ctx, req)
	}
}

// Incoming is the context a door's call runs in for the HTTP request r:
// ctx (r's context, with the deadline a Grpc-Timeout header asked for),
// with the host r's connection came from as the call's peer (the log
// names it, as it names a REST caller that reached the gateway's gRPC
// server: the host grpc-gateway forwards, without a port) and md, the
// metadata the door would send a gRPC server (the token, the routing
// header a proxy set), as the incoming metadata that the tap and the
// interceptors read.
func Incoming(ctx context.Context, r *http.Request, md metadata.MD) context.Context {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		ctx = peer.NewContext(ctx, &peer.Peer{Addr: clientHost(host)})
	}
	return metadata.NewIncomingContext(ctx, md)
}

// clientHost is the address of an HTTP client as the log names it: its
// host.
type clientHost string

func (h clientHost) Network() string { return "tcp" }
func (h clientHost) String() string  { return string(h) }

// call runs handler for req as the gRPC server runs method: under a span,
// through the interceptors. Its error is a status with a reason.
func (f *Files) call(ctx context.Context, method string, req any, handler grpc.UnaryHandler) (any, error) {
	ctx, span := f.tracer.Start(ctx, method[1:], trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("rpc.system", "filewrite-local"), attribute.String("rpc.method", method)))
	defer span.End()
	var resp any
	var err error
	if f.tap != nil {
		md, _ := metadata.FromIncomingContext(ctx)
		ctx, err = f.tap(ctx, &tap.Info{FullMethodName: method, Header: md})
	}
	if err == nil {
		resp, err = f.chain(ctx, req, &grpc.UnaryServerInfo{Server: f.files, FullMethod: method}, handler)
	}
	if err != nil {
		err = status.Of(err)
		st := grpcstatus.Convert(err)
		span.SetStatus(codes.Error, st.Message())
		span.SetAttributes(attribute.String("rpc.grpc.status_code", st.Code().String()))
	}
	return resp, err
}

// unary is call for a handler of the FileService: the request and reply
// keep their types.
func unary[Req, Resp any](f *Files, ctx context.Context, method string, req Req, handler func(context.Context, Req) (Resp, error)) (Resp, error) {
	resp, err := f.call(ctx, method, req, func(ctx context.Context, req any) (any, error) {
		return handler(ctx, req.(Req))
	})
	if err != nil {
		var none Resp
		return none, err
	}
	return resp.(Resp), nil
}

// Write is FileService.Write.
func (f *Files) Write(ctx context.Context, req *filewritev1.WriteRequest) (*filewritev1.WriteResponse, error) {
	return unary(f, ctx, filewritev1.FileService_Write_FullMethodName, req, f.files.Write)
}

// Append is FileService.Append.
func (f *Files) Append(ctx context.Context, req *filewritev1.AppendRequest) (*filewritev1.AppendResponse, error) {
	return unary(f, ctx, filewritev1.FileService_Append_FullMethodName, req, f.files.Append)
}

// Stat is FileService.Stat.
func (f *Files) Stat(ctx context.Context, req *filewritev1.StatRequest) (*filewritev1.StatResponse, error) {
	return unary(f, ctx, filewritev1.FileService_Stat_FullMethodName, req, f.files.Stat)
}

// Read is FileService.Read.
func (f *Files) Read(ctx context.Context, req *filewritev1.ReadRequest) (*filewritev1.ReadResponse, error) {
	return unary(f, ctx, filewritev1.FileService_Read_FullMethodName, req, f.files.Read)
}

// Delete is FileService.Delete.
func (f *Files) Delete(ctx context.Context, req *filewritev1.DeleteRequest) (*filewritev1.DeleteResponse, error) {
	return unary(f, ctx, filewritev1.FileService_Delete_FullMethodName, req, f.files.Delete)
}

// Rename is FileService.Rename.
func (f *Files) Rename(ctx context.Context, req *filewritev1.RenameRequest) (*filewritev1.RenameResponse, error) {
	return unary(f, ctx, filewritev1.FileService_Rename_FullMethodName, req, f.files.Rename)
}

// List is FileService.List.
func (f *Files) List(ctx context.Context, req *filewritev1.ListRequest) (*filewritev1.ListResponse, error) {
	return unary(f, ctx, filewritev1.FileService_List_FullMethodName, req, f.files.List)
}

// Run runs do, a door's operation that no RPC makes (a tus PATCH into its
// staged file, a WebDAV MKCOL), as the FileService runs a call of method
// with req: the token, the scope of req's paths, the log line, the span;
// do's error is the call's. req is the request of the RPC the operation
// stands for (a PATCH is a Write of its upload's target), so that it is
// checked for what it does.
func (f *Files) Run(ctx context.Context, method string, req any, do func(ctx context.Context) error) error {
	_, err := f.call(ctx, method, req, func(ctx context.Context, _ any) (any, error) { return nil, do(ctx) })
	return err
}

// StartWriteBack starts writing a range of path that a door wrote to the
// disk, without waiting (store.Store.StartWriteBack): a large PUT that
// syncs at its end calls it for each piece. It is no RPC: it changes and
// makes durable nothing, so it has no check of its own; the Write that
// wrote the range had them.
func (f *Files) StartWriteBack(ctx context.Context, path string, off, n int64) error {
	return f.store.StartWriteBack(ctx, path, off, n)
}

// CachedDigest is the checksum of [off, off+length) of the file at
// generation gen, if a Digest computed it and the store keeps it
// (store.Store.CachedDigest): a download announces it. It reads nothing
// and is no RPC.
func (f *Files) CachedDigest(gen, off, length int64, alg store.DigestAlgorithm) ([]byte, bool) {
	return f.store.CachedDigest(gen, off, length, alg)
}

// Reader is a file held open for reading from a descriptor of its own
// (store.Handle.OpenReader), for a download to send with sendfile(2).
// Close it when done.
type Reader struct {
	// File reads the file (nil where the store gives no descriptor:
	// read with Files.Read then).
	File   *os.File
	handle *store.Handle
}

// Gone is closed once the file is deleted, or replaced by a Rename.
func (r *Reader) Gone() <-chan struct{} { return r.handle.Gone() }

// Close closes the descriptor and gives the file back to the store.
func (r *Reader) Close() error {
	var err error
	if r.File != nil {
		err = r.File.Close()
	}
	r.handle.Close()
	return err
}

// OpenReader opens path for a download, checked, logged and traced as a
// Read of it (what it is, in pieces the kernel copies).
func (f *Files) OpenReader(ctx context.Context, path string) (*Reader, error) {
	return unary(f, ctx, filewritev1.FileService_Read_FullMethodName, &filewritev1.ReadRequest{Path: path}, func(ctx context.Context, _ *filewritev1.ReadRequest) (*Reader, error) {
		h, err := f.store.OpenHandle(ctx, path, store.OpenMustExist)
		if err != nil {
			return nil, status.Of(err)
		}
		r := &Reader{handle: h}
		if r.File, err = h.OpenReader(); err != nil {
			r.File = nil // read through Read
		}
		return r, nil
	})
}
