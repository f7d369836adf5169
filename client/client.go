package client

import (
	"context"
	"crypto/tls"
	"errors"
	"math/bits"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/bufpool"
	"github.com/filewrite/filewrite/internal/shard"
)

// PathHeader is the metadata header that carries the file's path on every
// call and stream, for routing by path. Its value is the path's routing
// key: the path percent-encoded, every byte but A-Z a-z 0-9 - . _ ~ and /
// written %XX, so that any path fits in a header and every router hashes
// the same string. A daemon refuses (FAILED_PRECONDITION) a call whose
// header names another path than its request.
const PathHeader = "filewrite-path"

// Default option values.
const (
	// DefaultMaxMessageBytes is the default of WithMaxMessageBytes: well
	// below the daemon's default message limit (64 MiB plus 64 KiB) and
	// gRPC's default receive limit (4 MiB), and room for a 1 MiB piece.
	DefaultMaxMessageBytes = 2 << 20
)

// HTTP/2 flow-control windows of a Dial'ed connection: a stream's and the
// connection's. Fixed windows also turn off gRPC's window estimation.
const (
	streamWindow = 4 << 20
	connWindow   = 16 << 20
)

// Option configures a Client.
type Option func(*options)

type options struct {
	token           string
	tls             *tls.Config
	retries         int
	maxMessageBytes int
	piece           int      // the size writes and reads are split into
	targets         []string // WithTargets (targets.go)
	ringHash        bool     // WithRingHash
}

// WithToken sends tok as a bearer token ("authorization: Bearer tok") on
// every call and stream. Default: no token.
func WithToken(tok string) Option { return func(o *options) { o.token = tok } }

// WithTLS makes Dial use TLS with cfg. Default: plaintext, which suits
// loopback and unix sockets only. New ignores it: the connection it is
// given has its credentials already.
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

// WithRetry resends, up to attempts times, a write whose stream broke
// before its ack arrived, on a new stream. Writes are idempotent, so a
// resend that lands twice does no harm, but it may land after a later
// write of the same bytes' range by another caller: leave it off when
// writers overlap. Default: 0, no resend; such writes fail with the
// stream's error.
func WithRetry(attempts int) Option { return func(o *options) { o.retries = max(0, attempts) } }

// WithMaxMessageBytes bounds the data of one stream message. Writes and
// reads larger than the largest power of two that fits in it with room to
// spare (1 MiB by default) are split into pieces of that size, so that
// pieces of aligned writes stay aligned. It must stay below the daemon's
// --max-request-bytes and gRPC's receive limits. Default
// DefaultMaxMessageBytes (2 MiB).
func WithMaxMessageBytes(n int) Option {
	return func(o *options) {
		if n > 0 {
			o.maxMessageBytes = n
		}
	}
}

// Client talks to one filewrite daemon over one gRPC connection, or to
// several, each file's calls to the daemon that owns it (WithTargets). It
// is safe for concurrent use. Close it once every File is closed.
//
// Every call carries the file's path in PathHeader, and Files of one path
// share one stream, so a connection that routes by that header keeps each
// file on one daemon.
type Client struct {
	cc    grpc.ClientConnInterface
	owned *grpc.ClientConn // made by Dial, closed by Close; nil for New
	api   filewritev1.FileServiceClient
	opts  options
	// ctx bounds every stream; Close cancels it.
	ctx    context.Context
	cancel context.CancelFunc

	// mu guards streams and closed.
	mu sync.Mutex
	// streams holds the stream of each path with an open File.
	streams map[string]*fileStream
	closed  bool
}

// New makes a Client over cc, a connection the caller made (and closes
// after Client.Close).
func New(cc grpc.ClientConnInterface, opts ...Option) *Client {
	o := options{maxMessageBytes: DefaultMaxMessageBytes}
	for _, opt := range opts {
		opt(&o)
	}
	// The room left: a write's fields besides its data.
	o.piece = 1 << (bits.Len(uint(max(1, o.maxMessageBytes-writeOverhead))) - 1)
	ctx, cancel := context.WithCancel(context.Background())
	return &Client{
		cc:      cc,
		api:     filewritev1.NewFileServiceClient(cc),
		opts:    o,
		ctx:     ctx,
		cancel:  cancel,
		streams: make(map[string]*fileStream),
	}
}

// Dial connects to the daemon at target: "host:port", "unix:PATH", or any
// gRPC target. It does not wait for the connection: the first call does.
// Without WithTLS the connection is plaintext.
func Dial(target string, opts ...Option) (*Client, error) {
	o := options{}
	for _, opt := range opts {
		opt(&o)
	}
	target, routing, err := routedTarget(target, o)
	if err != nil {
		return nil, err
	}
	cc, err := grpc.NewClient(target, append(dialOptions(o), routing...)...)
	if err != nil {
		return nil, err
	}
	c := New(cc, opts...)
	c.owned = cc
	return c, nil
}

// dialOptions are the connection's options, in one place, but for the
// routing of WithTargets and WithRingHash (routedTarget, targets.go).
func dialOptions(o options) []grpc.DialOption {
	creds := insecure.NewCredentials()
	if o.tls != nil {
		creds = credentials.NewTLS(o.tls)
	}
	return []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		// gRPC's own pool zeroes every buffer it hands out; this one
		// does not (internal/bufpool says why that is safe).
		experimental.WithBufferPool(bufpool.Shared),
		// Windows that hold the pipeline (many writes in flight on one
		// stream) without waiting for window updates.
		grpc.WithInitialWindowSize(streamWindow),
		grpc.WithInitialConnWindowSize(connWindow),
		// Reads are split at the message bound; this leaves room for a
		// caller who raises it.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30 + 1<<20)),
	}
}

// Close ends the streams of Files left open (their waiting writes fail
// with CANCELED) and, for a Client made by Dial, closes the connection.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	if c.owned != nil {
		return c.owned.Close()
	}
	return nil
}

// errClientClosed is what calls on a closed Client fail with.
var errClientClosed = status.Error(codes.Canceled, "filewrite client: closed")

// outgoing adds the path's routing key and the token to ctx's metadata.
func (c *Client) outgoing(ctx context.Context, path string) context.Context {
	key := shard.RoutingKey(path)
	if c.opts.token != "" {
		return metadata.AppendToOutgoingContext(ctx, PathHeader, key, "authorization", "Bearer "+c.opts.token)
	}
	return metadata.AppendToOutgoingContext(ctx, PathHeader, key)
}

// Open opens path for the File's calls, creating it and its missing parent
// directories. It opens the file's stream first (unless another File of
// this Client has it open), so that an error opening the file (a bad path,
// too many open files, no token) is Open's. ctx bounds Open, and every
// call of the File made without a context of its own (WriteAt, ReadAt,
// Close).
func (c *Client) Open(ctx context.Context, path string, opts ...FileOption) (*File, error) {
	var fo fileOptions
	for _, opt := range opts {
		opt(&fo)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errClientClosed
	}
	s := c.streams[path]
	if s == nil {
		s = newFileStream(c, path)
		c.streams[path] = s
	}
	s.refs++
	c.mu.Unlock()
	if err := s.ensureOpen(ctx); err != nil {
		c.release(s)
		return nil, err
	}
	return &File{c: c, path: path, ctx: ctx, sync: fo.sync, s: s}, nil
}

// release drops a File's reference to s; the last one ends the stream.
func (c *Client) release(s *fileStream) error {
	c.mu.Lock()
	s.refs--
	last := s.refs == 0
	if last {
		delete(c.streams, s.path)
	}
	c.mu.Unlock()
	if !last {
		return nil
	}
	return s.close()
}

// FileOption configures a File.
type FileOption func(*fileOptions)

type fileOptions struct {
	sync SyncMode
}

// WithSync sets the SyncMode of every WriteAt of the File. Default
// SyncNone. Write takes its own.
func WithSync(mode SyncMode) FileOption { return func(o *fileOptions) { o.sync = mode } }

// isStatus reports whether err carries a gRPC status other than Unknown.
func isStatus(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() != codes.Unknown
}

// asStatus turns a context error into its status, and leaves other
// errors as they are.
func asStatus(err error) error {
	switch {
	case err == nil || isStatus(err):
		return err
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return err
}
