package rpc

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/service/internal/admit"
	"github.com/filewrite/filewrite/service/internal/auth"
	"github.com/filewrite/filewrite/service/internal/status"
	"github.com/filewrite/filewrite/store"
)

// FileServer is the FileService: each handler translates the request's
// enums, calls the store, and maps its error with status.Of. Paths, offsets
// and lengths are checked by the store, once, for every caller.
//
// It embeds UnsafeFileServiceServer, not UnimplementedFileServiceServer, so
// that an RPC added to the proto without a handler here fails the build
// rather than answering UNIMPLEMENTED in production.
type FileServer struct {
	filewritev1.UnsafeFileServiceServer
	store *store.Store
	log   *slog.Logger
	// extentsPerReply bounds an Extents page so that it fits in a reply
	// (extentsPerReply); 0 means no bound beyond MaxExtentsPageSize.
	extentsPerReply int
	// entriesPerReply bounds a List page likewise (EntriesPerReply).
	entriesPerReply int

	// The WriteStream side (writestream.go).

	// maxStreamBytes bounds the unacknowledged writes of one stream;
	// maxMessageBytes one message (maxMessageBytes()).
	maxStreamBytes, maxMessageBytes int64
	// maxFilesPerStream bounds the files declared on one stream and not
	// yet closed (--max-files-per-stream).
	maxFilesPerStream int
	// streamHeld is what all streams hold (admit.StreamBudget).
	streamHeld atomic.Int64
	// budget is --max-inflight-bytes (nil: unbounded): what streams hold
	// counts against it with every other request. Both gRPC servers share
	// this FileServer, but only the public one carries streams: the
	// gateway has no stream route.
	budget        *admit.Budget
	streamMetrics *streamMetrics
	// draining is closed when the daemon begins to shut down: streams
	// stop reading, ack what they read, and end with UNAVAILABLE.
	draining  chan struct{}
	drainOnce sync.Once
	// auth checks a stream's file against its credential's scope (nil:
	// no --auth-token-file).
	auth *auth.Tokens
	// streamIdleTimeout is --stream-idle-timeout (0: streams are never
	// closed for idleness).
	streamIdleTimeout time.Duration
	// typesDropped logs, once, that the filesystem keeps no media types.
	typesDropped sync.Once
}

// Config is what the FileService needs of the daemon's
// configuration.
type Config struct {
	Store *store.Store
	Log   *slog.Logger
	// MaxRequestBytes is --max-request-bytes, which sets the message limit
	// (status.MaxMessageBytes).
	MaxRequestBytes int64
	// MaxStreamBytes is --max-stream-bytes, maxFilesPerStream
	// --max-files-per-stream, streamIdleTimeout --stream-idle-timeout (0:
	// streams are never closed for idleness).
	MaxStreamBytes    int64
	MaxFilesPerStream int
	StreamIdleTimeout time.Duration
	// Budget is --max-inflight-bytes (nil: unbounded), which streams take.
	Budget *admit.Budget
	// Auth checks a stream's files against its credential's scope (nil:
	// no --auth-token-file).
	Auth *auth.Tokens
	// Meter takes the streams' metrics (nil: none).
	Meter metric.Meter
}

// NewFileServer is the FileService of cfg.
func NewFileServer(cfg Config) (*FileServer, error) {
	s := &FileServer{
		store:             cfg.Store,
		log:               cfg.Log,
		maxStreamBytes:    cfg.MaxStreamBytes,
		maxFilesPerStream: cfg.MaxFilesPerStream,
		budget:            cfg.Budget,
		maxMessageBytes:   int64(status.MaxMessageBytes(cfg.MaxRequestBytes)),
		extentsPerReply:   extentsPerReply(status.MaxMessageBytes(cfg.MaxRequestBytes)),
		entriesPerReply:   EntriesPerReply(status.MaxMessageBytes(cfg.MaxRequestBytes)),
		draining:          make(chan struct{}),
		auth:              cfg.Auth,
		streamIdleTimeout: cfg.StreamIdleTimeout,
	}
	var err error
	if s.streamMetrics, err = newStreamMetrics(cfg.Meter, &s.streamHeld); err != nil {
		return nil, fmt.Errorf("stream metrics: %w", err)
	}
	return s, nil
}

// streamHeldBytes is what all streams hold now.
func (s *FileServer) StreamHeld() int64 { return s.streamHeld.Load() }

// drained is closed once the daemon begins to shut down (drain).
func (s *FileServer) Draining() <-chan struct{} { return s.draining }

// Drain tells every stream, open or to come, that the daemon is shutting
// down.
func (s *FileServer) Drain() {
	s.drainOnce.Do(func() { close(s.draining) })
}

var _ filewritev1.FileServiceServer = (*FileServer)(nil)

func (s *FileServer) Write(ctx context.Context, req *filewritev1.WriteRequest) (*filewritev1.WriteResponse, error) {
	sync, err := status.SyncModeFromProto(req.GetSync())
	if err != nil {
		return nil, status.Of(err)
	}
	open, err := status.OpenModeFromProto(req.GetOpenMode())
	if err != nil {
		return nil, status.Of(err)
	}
	ct := req.GetContentType()
	if ct != "" {
		// Refused before anything is written.
		if ct, err = store.CheckContentType(ct); err != nil {
			return nil, status.Of(err)
		}
	}
	res, err := s.store.WriteIf(ctx, req.GetPath(), open, req.GetOffset(), req.GetData(), sync,
		status.Precondition(req.IfGenerationMatch, req.IfGenerationNotMatch))
	if err != nil {
		return nil, status.Of(err)
	}
	if ct != "" {
		if err := s.setContentType(ctx, req.GetPath(), ct); err != nil {
			return nil, status.Of(err)
		}
	}
	return &filewritev1.WriteResponse{BytesWritten: int64(res.BytesWritten), Size: res.Size, Created: res.Created, Generation: res.Generation}, nil
}

// setContentType keeps a Write's media type with its file. A filesystem
// that keeps no extended attributes keeps none: the Write stands, its
// type is dropped, and the first such drop is logged.
func (s *FileServer) setContentType(ctx context.Context, path, ct string) error {
	err := s.store.SetContentType(ctx, path, ct)
	if errors.Is(err, store.ErrUnsupported) {
		s.typesDropped.Do(func() {
			s.log.Warn("the filesystem under --root keeps no extended attributes: media types given to files are not kept, and their downloads are served as application/octet-stream", "path", path, "error", err)
		})
		return nil
	}
	return err
}

// Append checks the request's CRC-32C, if any, before the store sees it:
// a refused append writes nothing.
func (s *FileServer) Append(ctx context.Context, req *filewritev1.AppendRequest) (*filewritev1.AppendResponse, error) {
	sync, err := status.SyncModeFromProto(req.GetSync())
	if err != nil {
		return nil, status.Of(err)
	}
	if req.Crc32C != nil {
		if err := status.CheckCRC32C(req.GetData(), req.GetCrc32C(), "crc32c"); err != nil {
			return nil, err
		}
	}
	res, err := s.store.Append(ctx, req.GetPath(), req.GetData(), sync, store.AppendOptions{
		ExpectedOffset: req.ExpectedOffset,
		If:             status.Precondition(req.IfGenerationMatch, req.IfGenerationNotMatch),
		ID:             req.GetAppendId(),
	})
	if err != nil {
		return nil, status.Of(err)
	}
	return &filewritev1.AppendResponse{Offset: res.Offset, Size: res.Size, Generation: res.Generation}, nil
}

func (s *FileServer) Fsync(ctx context.Context, req *filewritev1.FsyncRequest) (*filewritev1.FsyncResponse, error) {
	mode := store.SyncFull
	if req.GetDataOnly() {
		mode = store.SyncData
	}
	if err := s.store.Fsync(ctx, req.GetPath(), mode); err != nil {
		return nil, status.Of(err)
	}
	return &filewritev1.FsyncResponse{}, nil
}

func (s *FileServer) Truncate(ctx context.Context, req *filewritev1.TruncateRequest) (*filewritev1.TruncateResponse, error) {
	res, err := s.store.TruncateIf(ctx, req.GetPath(), req.GetSize(), status.Precondition(req.IfGenerationMatch, req.IfGenerationNotMatch))
	if err != nil {
		return nil, status.Of(err)
	}
	return &filewritev1.TruncateResponse{Generation: res.Generation}, nil
}

func (s *FileServer) Fallocate(ctx context.Context, req *filewritev1.FallocateRequest) (*filewritev1.FallocateResponse, error) {
	mode, err := status.FallocateModeFromProto(req.GetMode())
	if err != nil {
		return nil, status.Of(err)
	}
	res, err := s.store.FallocateIf(ctx, req.GetPath(), mode, req.GetOffset(), req.GetLength(), status.Precondition(req.IfGenerationMatch, req.IfGenerationNotMatch))
	if err != nil {
		return nil, status.Of(err)
	}
	return &filewritev1.FallocateResponse{Size: res.Size, Generation: res.Generation}, nil
}

func (s *FileServer) Stat(ctx context.Context, req *filewritev1.StatRequest) (*filewritev1.StatResponse, error) {
	st, err := s.store.Stat(ctx, req.GetPath())
	if err != nil {
		return nil, status.Of(err)
	}
	return statResponse(st), nil
}

func (s *FileServer) Read(ctx context.Context, req *filewritev1.ReadRequest) (*filewritev1.ReadResponse, error) {
	data, err := s.store.ReadInto(ctx, req.GetPath(), req.GetOffset(), req.GetLength(), func(n int) []byte { return admit.ReplyBuffer(ctx, n) })
	if err != nil {
		return nil, status.Of(err)
	}
	sum := crc32.Checksum(data, status.Castagnoli)
	return &filewritev1.ReadResponse{Data: data, Crc32C: &sum}, nil
}

func (s *FileServer) Extents(ctx context.Context, req *filewritev1.ExtentsRequest) (*filewritev1.ExtentsResponse, error) {
	limit, err := extentsPageSize(req, s.extentsPerReply)
	if err != nil {
		return nil, err
	}
	start, err := extentsPageStart(req)
	if err != nil {
		return nil, err
	}
	length := req.GetLength()
	if length > 0 && start > req.GetOffset() {
		// What is left of the range; 0 would mean "to the end of the file".
		if length -= start - req.GetOffset(); length == 0 {
			return &filewritev1.ExtentsResponse{Extents: []*filewritev1.Extent{}}, nil
		}
	}
	exts, more, err := s.store.ExtentsPage(ctx, req.GetPath(), start, length, limit)
	if err != nil {
		return nil, status.Of(err)
	}
	out := make([]*filewritev1.Extent, len(exts))
	for i, e := range exts {
		out[i] = &filewritev1.Extent{Offset: e.Offset, Length: e.Length, State: status.ExtentStateToProto(e.State)}
	}
	resp := &filewritev1.ExtentsResponse{Extents: out}
	if more {
		last := exts[len(exts)-1]
		resp.NextPageToken = nextExtentsToken(req, last.Offset+last.Length)
	}
	return resp, nil
}

func (s *FileServer) Delete(ctx context.Context, req *filewritev1.DeleteRequest) (*filewritev1.DeleteResponse, error) {
	if err := s.store.DeleteIf(ctx, req.GetPath(), req.GetSync(), status.Precondition(req.IfGenerationMatch, req.IfGenerationNotMatch)); err != nil {
		return nil, status.Of(err)
	}
	return &filewritev1.DeleteResponse{}, nil
}

func (s *FileServer) Rename(ctx context.Context, req *filewritev1.RenameRequest) (*filewritev1.RenameResponse, error) {
	res, err := s.store.RenameIf(ctx, req.GetPath(), req.GetNewPath(), req.GetNoReplace(), req.GetSync(),
		status.Precondition(req.IfGenerationMatch, req.IfGenerationNotMatch),
		status.Precondition(req.IfDestinationGenerationMatch, req.IfDestinationGenerationNotMatch))
	if err != nil {
		return nil, status.Of(err)
	}
	return &filewritev1.RenameResponse{Generation: res.Generation}, nil
}

// Digest answers the checksum of a range of a file at one generation
// (store.Store.Digest).
func (s *FileServer) Digest(ctx context.Context, req *filewritev1.DigestRequest) (*filewritev1.DigestResponse, error) {
	alg, err := status.DigestAlgorithm(req.GetAlgorithm())
	if err != nil {
		return nil, status.Of(err)
	}
	res, err := s.store.Digest(ctx, req.GetPath(), req.GetOffset(), req.GetLength(), alg)
	if err != nil {
		return nil, status.Of(err)
	}
	return &filewritev1.DigestResponse{Algorithm: alg.String(), Offset: res.Offset, Length: res.Length, Digest: res.Sum, Generation: res.Generation}, nil
}

func (s *FileServer) List(ctx context.Context, req *filewritev1.ListRequest) (*filewritev1.ListResponse, error) {
	entries, next, err := s.store.List(ctx, req.GetPath(), ListPageSize(req, s.entriesPerReply), req.GetPageToken())
	if err != nil {
		return nil, status.Of(err)
	}
	out := make([]*filewritev1.DirEntry, len(entries))
	for i, e := range entries {
		out[i] = &filewritev1.DirEntry{Name: e.Name, IsDir: e.IsDir, Size: e.Size}
	}
	return &filewritev1.ListResponse{Entries: out, NextPageToken: next}, nil
}
