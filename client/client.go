package client

import (
	"context"
	"crypto/tls"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/metadata"

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
const PathHeader = shard.Header

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

// readBufferBytes is the size of the buffer a connection reads the
// socket into (grpc-go's default is 32 KiB). It is taken from the pool
// when data is ready and given back once its frames are copied out, so
// an idle connection holds none.
const readBufferBytes = 256 << 10

// Option configures a Client.
type Option func(*options)

type options struct {
	token           string
	tls             *tls.Config
	retries         int
	maxMessageBytes int
	piece           int               // the size writes and reads are split into
	targets         []string          // WithTargets (targets.go)
	ringHash        bool              // WithRingHash
	dialOpts        []grpc.DialOption // WithDialOptions
	filesPerStream  int               // WithSharedStreams; 0: a stream per path
}

// DefaultFilesPerStream is WithSharedStreams' default: the daemon's
// default --max-files-per-stream.
const DefaultFilesPerStream = 4096

// WithSharedStreams sets how many paths' Files share one WriteStream:
// each path is a file declared on a shared stream (docs/streaming.md), so
// that many open files cost a few streams, not one each. It must not
// exceed the daemon's --max-files-per-stream. With WithTargets a stream
// carries only files of one daemon (their owner on the ring). Not with
// WithRingHash, whose members only the resolver knows: there each path
// keeps a stream of its own. Each file still holds a file open on its
// daemon (--max-open-files). A daemon that predates declared files
// refuses a shared stream (INVALID_ARGUMENT), and Open fails: 0 gives
// each path a stream of its own, as before. Default:
// DefaultFilesPerStream.
func WithSharedStreams(filesPerStream int) Option {
	return func(o *options) { o.filesPerStream = max(0, filesPerStream) }
}

// WithToken sends tok as a bearer token ("authorization: Bearer tok") on
// every call and stream. Default: no token.
func WithToken(tok string) Option { return func(o *options) { o.token = tok } }

// WithTLS makes Dial use TLS with cfg. Default: plaintext, which suits
// loopback and unix sockets only. New ignores it: the connection it is
// given has its credentials already.
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

// WithRetry makes the Client ride out a daemon that restarts or a
// connection that breaks. Default: 0, off; every call fails at once with
// the error that stopped it.
//
// With it, a write whose stream broke before its ack arrived is resent on
// a new stream, up to attempts times, after a wait that doubles from
// 50ms up to 2s, with jitter; each new stream waits for the connection to
// be ready (gRPC's WaitForReady). All of it happens within the write's own
// context (WithTimeout for WriteAt): when that ends, the write fails with
// the context's error. A write whose ack arrived is never sent again, and
// only a stream that broke (UNAVAILABLE) leads to a resend: any other
// error is the daemon's answer and is returned.
//
// A resend writes the same bytes at the same offset, so it is harmless
// alone; but if another writer wrote an overlapping range between the
// first attempt and the resend, the resend lands last and its bytes win
// there, although the other write was acknowledged after the first
// attempt was sent. Leave retries off, or keep writers to ranges of their
// own, when that order matters.
//
// On a Client made by Dial, Read, Stat, Extents and List are retried too,
// by gRPC's own retry policy (a service config: up to attempts+1 tries,
// at most 5, on UNAVAILABLE, after waiting for the connection). Truncate
// and the Allocate family are idempotent, but a retry could land after a
// later call of the caller's, so they are left to the caller; Delete and
// Rename are never retried (see their docs). File.Append is resent with
// its append ID (see its doc). An exclusive Open is never
// sent twice: its second attempt would find the file the first created.
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

// WithDialOptions adds opts to the options Dial gives grpc.NewClient,
// after its own (flow-control windows sized for pipelined writes, a
// buffer pool, the receive limit, credentials, routing), so that an
// option of the same kind given here wins. The usual one is OpenTelemetry
// tracing, so that a client's spans and the daemon's join in one trace:
//
//	client.WithDialOptions(grpc.WithStatsHandler(otelgrpc.NewClientHandler()))
//
// Default: none. New ignores it: the connection it is given is made.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOpts = append(o.dialOpts, opts...) }
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
	// appendIDs names appends under WithRetry (File.Append).
	appendIDs *appendIDs
	// owners is the ring of WithTargets' daemons, built once for ownerOf;
	// nil with fewer than two. Immutable.
	owners *shard.Owners
	// ctx bounds every stream; Close cancels it.
	ctx    context.Context
	cancel context.CancelFunc

	// mu guards the fields below (paths: see its own note), and
	// muxStream.users.
	mu sync.Mutex
	// streams holds the stream of each path with an open File.
	streams map[string]*fileStream
	// muxes holds the shared streams by owner (WithSharedStreams);
	// muxOpening, the owners a new one is being opened for, closed once
	// it is in muxes or failed.
	muxes      map[string][]*muxStream
	muxOpening map[string]chan struct{}
	// paths is len(streams): written under mu, read without it by
	// idleSenderLocked, which holds a fileStream.mu (below Client.mu in
	// the lock order).
	paths  atomic.Int64
	closed bool
}

// New makes a Client over cc, a connection the caller made (and closes
// after Client.Close).
func New(cc grpc.ClientConnInterface, opts ...Option) *Client {
	o := options{maxMessageBytes: DefaultMaxMessageBytes, filesPerStream: DefaultFilesPerStream}
	for _, opt := range opts {
		opt(&o)
	}
	// The room left: a write's fields besides its data.
	o.piece = 1 << (bits.Len(uint(max(1, o.maxMessageBytes-writeOverhead))) - 1)
	ctx, cancel := context.WithCancel(context.Background())
	return &Client{
		cc:         cc,
		api:        filewritev1.NewFileServiceClient(cc),
		opts:       o,
		ctx:        ctx,
		cancel:     cancel,
		streams:    make(map[string]*fileStream),
		muxes:      make(map[string][]*muxStream),
		muxOpening: make(map[string]chan struct{}),
		appendIDs:  newAppendIDs(),
		owners:     ownersOf(o.targets),
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
	target, routing, config, err := routedTarget(target, o)
	if err != nil {
		return nil, err
	}
	dopts := append(dialOptions(o), routing...)
	if config, err = withRetryPolicy(config, o.retries); err != nil {
		return nil, err
	}
	if config != "" {
		dopts = append(dopts, grpc.WithDefaultServiceConfig(config))
	}
	cc, err := grpc.NewClient(target, append(dopts, o.dialOpts...)...)
	if err != nil {
		return nil, err
	}
	c := New(cc, opts...)
	c.owned = cc
	return c, nil
}

// dialOptions are the connection's options, in one place, but for the
// routing of WithTargets and WithRingHash (routedTarget, targets.go), the
// service config and WithDialOptions.
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
		// A Read's megabyte arrives in 16 KiB frames; grpc-go reads the
		// socket into a buffer of this size and copies the frames out,
		// so a larger one takes fewer system calls (docs/design.md,
		// bulk bytes).
		grpc.WithReadBufferSize(readBufferBytes),
		// Reads are split at the message bound; this leaves room for a
		// caller who raises it.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30 + 1<<20)),
	}
}

// Close ends the streams of Files left open (their waiting writes fail
// with an error wrapping fs.ErrClosed and context.Canceled) and, for a
// Client made by Dial, closes the connection. Calls made after it fail
// the same way.
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

// outgoing adds the path's routing key and the token to ctx's metadata.
func (c *Client) outgoing(ctx context.Context, path string) context.Context {
	key := shard.RoutingKey(path)
	if c.opts.token != "" {
		return metadata.AppendToOutgoingContext(ctx, PathHeader, key, "authorization", "Bearer "+c.opts.token)
	}
	return metadata.AppendToOutgoingContext(ctx, PathHeader, key)
}

// Open opens path for the File's calls, as WithOpenMode says: by default
// creating it and its missing parent directories. It opens the file's
// stream first (unless another File of this Client has it open on the
// same file), so that an error opening the file (a bad path, a missing
// file with OpenMustExist, an existing one with OpenExclusive, too many
// open files, no token) is Open's.
//
// ctx bounds Open only. The File lives until Close, whatever becomes of
// ctx; each later call takes a context of its own, or, for WriteAt,
// ReadAt and Close, is bounded by WithTimeout.
func (c *Client) Open(ctx context.Context, path string, opts ...FileOption) (*File, error) {
	var fo fileOptions
	for _, opt := range opts {
		opt(&fo)
	}
	if err := fo.open.check(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errClientClosed
	}
	s := c.streams[path]
	// Share the stream only while it serves the file that path names: not
	// once the file it held was deleted (a new Open then opens the new
	// file), nor while it is broken (see shareable), and never for an
	// exclusive create or a condition on the generation, which the daemon
	// must see to refuse or grant.
	if s == nil || !s.shareable() || fo.open == OpenExclusive || fo.ifGeneration != nil {
		s = newFileStream(c, path, fo.open.proto(), fo.ifGeneration)
	}
	s.refs++
	c.mu.Unlock()
	if err := s.ensureOpen(ctx); err != nil {
		c.release(s)
		return nil, err
	}
	c.mu.Lock()
	// The stream opened last serves the file path names now: later Opens
	// share it.
	c.streams[path] = s
	c.paths.Store(int64(len(c.streams)))
	c.mu.Unlock()
	return &File{c: c, path: path, sync: fo.sync, timeout: fo.timeout, s: s}, nil
}

// release drops a File's reference to s; the last one ends the stream.
func (c *Client) release(s *fileStream) error {
	c.mu.Lock()
	s.refs--
	last := s.refs == 0
	if last && c.streams[s.path] == s {
		delete(c.streams, s.path)
		c.paths.Store(int64(len(c.streams)))
	}
	c.mu.Unlock()
	if !last {
		return nil
	}
	return s.close()
}

// Stat describes the file at path, as File.Stat does, without opening it.
// A missing file is NOT_FOUND, wrapping fs.ErrNotExist.
func (c *Client) Stat(ctx context.Context, path string) (FileInfo, error) {
	if err := c.checkOpen(); err != nil {
		return FileInfo{}, err
	}
	resp, err := c.api.Stat(c.outgoing(ctx, path), &filewritev1.StatRequest{Path: path})
	if err != nil {
		return FileInfo{}, wrapErr(err)
	}
	return FileInfo{Path: path, Size: resp.GetSize(), AllocatedBytes: resp.GetAllocatedBytes(), BlockSize: resp.GetBlockSize(),
		Generation: resp.GetGeneration(), ETag: resp.GetEtag()}, nil
}

// checkOpen returns errClientClosed once Close was called.
func (c *Client) checkOpen() error {
	if c.ctx.Err() != nil {
		return errClientClosed
	}
	return nil
}

// FileOption configures a File.
type FileOption func(*fileOptions)

type fileOptions struct {
	sync         SyncMode
	timeout      time.Duration
	open         OpenMode
	ifGeneration *int64
}

// WithSync sets the SyncMode of every WriteAt of the File, and of its
// Writer. Default SyncNone. Write takes its own.
func WithSync(mode SyncMode) FileOption { return func(o *fileOptions) { o.sync = mode } }

// WithTimeout bounds each call of the File that takes no context: WriteAt,
// ReadAt, Close, and each wait of its Writer and Reader. A call that runs
// out of it fails with DEADLINE_EXCEEDED, wrapping
// context.DeadlineExceeded. Default: 0, no bound (the call waits as long
// as the daemon takes, or, with WithRetry, for the daemon to come back).
func WithTimeout(d time.Duration) FileOption { return func(o *fileOptions) { o.timeout = d } }

// WithOpenMode says whether Open may create the file (OpenCreate, the
// default), must find it (OpenMustExist) or must create it
// (OpenExclusive), as os.OpenFile's O_CREATE and O_EXCL do. The daemon
// decides it in one step with the open, so of two Clients racing to
// create one path exclusively, exactly one succeeds.
func WithOpenMode(m OpenMode) FileOption { return func(o *fileOptions) { o.open = m } }

// WithIfGeneration makes Open open the file only if its generation
// (FileInfo.Generation, File.Generation) is gen; 0 means only if no file
// exists, which Open then creates (OpenMustExist cannot meet it). The
// daemon checks it as it opens the file, with the file's lock held after
// the writes in flight; a condition that does not hold opens and creates
// nothing, and Open fails with FAILED_PRECONDITION (reason ETAG_MISMATCH,
// or PRECONDITION_FAILED for 0), the file's generation in its ErrorInfo's
// metadata "generation". The File's writes are not conditional: it is a
// read-modify-write's "nobody wrote since I read" for the start of a
// File's life. An Open under it is never retried (WithRetry) and never
// shares another File's stream.
func WithIfGeneration(gen int64) FileOption {
	return func(o *fileOptions) { o.ifGeneration = &gen }
}
