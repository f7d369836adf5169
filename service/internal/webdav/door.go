// Package webdav is the WebDAV door: the files under /dav/ for the
// clients that mount or sync a tree (rclone, davfs2, cadaver, Finder,
// Windows Explorer; RFC 4918, docs/webdav.md). golang.org/x/net/webdav
// speaks the protocol; this package is its FileSystem over the store,
// every operation run on the direct road (service/internal/local) as the
// FileService call it stands for, and a layer around its handler for what
// the daemon decides itself:
//
//   - GET and HEAD are served as the REST download route serves them
//     (the file's own descriptor, its media type shown in place only if
//     it runs nothing, ranges and validators by net/http);
//   - PROPFIND with Depth: infinity (or none, which means infinity) is
//     refused as RFC 4918, section 9.1 allows (403 with
//     DAV:propfind-finite-depth), and a collection of more than
//     Config.MaxListing entries is not listed (507);
//   - an error the store or the checks gave (a scope, a bad name, a full
//     disk) is answered with its own status and the JSON error body of
//     every other route, where x/net/webdav would say 404 or 500.
//
// A PUT is written to a staged file (store.OpenStaged) and published onto
// its path when it ends (store.Publish: fsync, rename, both directories
// synced): a reader never sees half a file, and the PUT is durable when
// it is answered. COPY copies a file inside the kernel (copy_file_range,
// a reflink where the filesystem has them) into a staged file published
// the same way; MOVE is Rename. A collection's MOVE moves its files one by
// one (the store renames files, not directories: its table knows open
// files by path), so it is not atomic. Dead properties (PROPPATCH) are
// kept with each file or collection in an extended attribute. Locks are
// x/net/webdav's, in memory: they hold WebDAV clients back from each
// other, and nothing else (a REST, gRPC, tus or NBD client does not see
// them).
package webdav

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	xwebdav "golang.org/x/net/webdav"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/service/internal/admit"
	"github.com/filewrite/filewrite/service/internal/local"
	"github.com/filewrite/filewrite/service/internal/media"
	"github.com/filewrite/filewrite/service/internal/status"
	"github.com/filewrite/filewrite/store"
)

// Prefix is the path the door serves: Prefix+p is the file or collection
// p below the root.
const Prefix = "/dav/"

// DefaultMaxListing is the most entries a collection may have for a
// PROPFIND of Depth 1 to list it.
const DefaultMaxListing = 10000

// Files is what the door calls: the FileService on the direct road
// (local.Files in the daemon).
type Files interface {
	Stat(ctx context.Context, req *filewritev1.StatRequest) (*filewritev1.StatResponse, error)
	Read(ctx context.Context, req *filewritev1.ReadRequest) (*filewritev1.ReadResponse, error)
	List(ctx context.Context, req *filewritev1.ListRequest) (*filewritev1.ListResponse, error)
	Delete(ctx context.Context, req *filewritev1.DeleteRequest) (*filewritev1.DeleteResponse, error)
	Rename(ctx context.Context, req *filewritev1.RenameRequest) (*filewritev1.RenameResponse, error)
	OpenReader(ctx context.Context, path string) (*local.Reader, error)
	Run(ctx context.Context, method string, req any, do func(ctx context.Context) error) error
}

var _ Files = (*local.Files)(nil)

// Config is what the door needs of the daemon.
type Config struct {
	Store  *store.Store
	Files  Files
	Budget *admit.Budget // --max-inflight-bytes; nil: unbounded
	// MaxRequestBytes is --max-request-bytes: the most one write of a
	// PUT's body moves.
	MaxRequestBytes int64
	// MaxListing bounds a Depth 1 PROPFIND's collection
	// (DefaultMaxListing if 0).
	MaxListing int
	// Context is the context a request's calls run in (its token as
	// metadata, its host as the peer); nil: the request's own.
	Context func(r *http.Request) context.Context
	Logger  *slog.Logger
}

// Door serves WebDAV under Prefix. It is safe for concurrent use.
type Door struct {
	cfg        Config
	log        *slog.Logger
	h          *xwebdav.Handler
	pieceBytes int64
	// pieces recycles the buffers of pieceBytes a PUT reads its body
	// into: a fresh one per PUT, zeroed by the runtime, was a third of
	// the daemon's CPU in an rclone copy of small files.
	pieces sync.Pool
}

// maxPieceBytes is the most of a PUT's body the door holds at once.
const maxPieceBytes = 8 << 20

// New makes the door.
func New(cfg Config) *Door {
	if cfg.MaxListing <= 0 {
		cfg.MaxListing = DefaultMaxListing
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	d := &Door{cfg: cfg, log: cfg.Logger, pieceBytes: maxPieceBytes}
	if cfg.MaxRequestBytes > 0 {
		d.pieceBytes = min(d.pieceBytes, cfg.MaxRequestBytes)
	}
	d.pieces.New = func() any { b := make([]byte, d.pieceBytes); return &b }
	d.h = &xwebdav.Handler{
		Prefix:     strings.TrimSuffix(Prefix, "/"),
		FileSystem: &davFS{d: d},
		LockSystem: xwebdav.NewMemLS(),
	}
	return d
}

// reqState is what the door learns of one request as it goes: the PUT's
// media type, the refusal to answer with, the stats and listings made.
// It is used by the request's goroutine only.
type reqState struct {
	contentType string
	// ifGeneration, when set, is the generation of the file a PUT
	// replaces or a DELETE removes that the request's If-Match and
	// If-None-Match held for (0: no file), which the publish or the
	// delete is made conditional on (preconditions).
	ifGeneration *int64
	// failure is the last error of the store or the checks worth its own
	// status (failure); 0 when none.
	failCode int
	failure  error
	stats    map[string]*fileInfo
	listings map[string][]*fileInfo
}

type stateKey struct{}

func stateOf(ctx context.Context) *reqState {
	if st, ok := ctx.Value(stateKey{}).(*reqState); ok {
		return st
	}
	return &reqState{} // a call outside a request: nothing to keep
}

// ServeHTTP serves WebDAV.
func (d *Door) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if d.cfg.Context != nil {
		ctx = d.cfg.Context(r)
	}
	st := &reqState{stats: map[string]*fileInfo{}, listings: map[string][]*fileInfo{}}
	r = r.WithContext(context.WithValue(ctx, stateKey{}, st))
	p := clean(strings.TrimPrefix(r.URL.Path, d.h.Prefix))
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		d.serveGet(w, r, p)
		return
	case http.MethodPost:
		w.Header().Set("Allow", "OPTIONS, GET, HEAD, PUT, DELETE, MKCOL, COPY, MOVE, PROPFIND, PROPPATCH, LOCK, UNLOCK")
		writeStatus(w, r, http.StatusMethodNotAllowed, status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, nil, "POST is no WebDAV method: PUT writes a file"))
		return
	case "PROPFIND":
		if depth := r.Header.Get("Depth"); depth != "0" && depth != "1" {
			// RFC 4918, section 9.1: a server may refuse an infinite
			// PROPFIND, which would walk the whole tree; no Depth means
			// infinity.
			w.Header().Set("Content-Type", "application/xml; charset=utf-8")
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, `<?xml version="1.0" encoding="utf-8"?>`+"\n"+`<D:error xmlns:D="DAV:"><D:propfind-finite-depth/></D:error>`+"\n")
			return
		} else if depth == "1" {
			// List first, so that a collection too large to list is
			// refused before the multistatus begins.
			if fi, err := d.stat(r.Context(), p); err == nil && fi.IsDir() {
				if _, err := d.list(r.Context(), p); err != nil {
					answerError(w, r, err)
					return
				}
			}
		}
	case http.MethodPut, http.MethodDelete:
		if ct := r.Header.Get("Content-Type"); ct != "" && r.Method == http.MethodPut {
			norm, err := store.CheckContentType(ct)
			if err != nil {
				writeStatus(w, r, http.StatusBadRequest, status.Of(err))
				return
			}
			st.contentType = norm
		}
		if code, err := d.preconditions(r, p, st); err != nil {
			writeStatus(w, r, code, err)
			return
		}
	}
	d.h.ServeHTTP(&failWriter{ResponseWriter: w, r: r, st: st}, r)
}

// preconditions evaluates a PUT's or a DELETE's If-Match and
// If-None-Match (RFC 9110, section 13.2.2; davfs2 sends If-Match with the
// ETag it last saw) on a Stat of p, as the REST routes do, and keeps the
// generation they held for in st: the publish or the delete is then
// conditional on it (store.PublishIf, DeleteRequest's
// if_generation_match), so that nothing lands between the decision and
// the change, and a file changed since is 412 too. A collection has no
// generation: conditions on one are decided once. WebDAV's own If header
// (RFC 4918, section 10.4) is x/net/webdav's.
func (d *Door) preconditions(r *http.Request, p string, st *reqState) (int, error) {
	ifMatch, ifNoneMatch := r.Header.Values("If-Match"), r.Header.Values("If-None-Match")
	if len(ifMatch) == 0 && len(ifNoneMatch) == 0 {
		return 0, nil
	}
	var (
		etag   string
		gen    int64
		exists bool
		dir    bool
	)
	fi, err := d.stat(r.Context(), p)
	switch {
	case err == nil:
		exists, dir, etag = true, fi.dir, fi.etag
		gen, _ = status.ParseETag(etag)
	case !os.IsNotExist(err):
		return failure(err)
	}
	for _, c := range []struct {
		header string
		values []string
	}{{"If-Match", ifMatch}, {"If-None-Match", ifNoneMatch}} {
		if len(c.values) == 0 {
			continue
		}
		l, err := status.ParseETagList(c.values)
		if err != nil {
			return http.StatusBadRequest, status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: c.header}, "%s: %v", c.header, err)
		}
		held := l.MatchesStrong(etag, exists)
		if c.header == "If-None-Match" {
			held = !l.MatchesWeak(etag, exists)
		}
		if !held {
			return http.StatusPreconditionFailed, status.PreconditionFailed(c.header, !l.Any, gen, etag, "")
		}
	}
	if !dir {
		st.ifGeneration = &gen
	}
	return 0, nil
}

// clean is the store's path of a WebDAV name ("/a/b/" is "a/b"; "/" is
// "", the root).
func clean(name string) string {
	return strings.TrimPrefix(path.Clean("/"+name), "/")
}

// serveGet serves a file's bytes, as the REST download route does.
func (d *Door) serveGet(w http.ResponseWriter, r *http.Request, p string) {
	ctx := r.Context()
	fi, err := d.stat(ctx, p)
	if err != nil {
		answerError(w, r, err)
		return
	}
	if fi.IsDir() {
		w.Header().Set("Allow", "OPTIONS, PROPFIND, PROPPATCH, MKCOL, DELETE, COPY, MOVE, LOCK, UNLOCK")
		writeStatus(w, r, http.StatusMethodNotAllowed, status.Refusal(filewritev1.ErrorReason_IS_A_DIRECTORY, nil, "%s is a collection: PROPFIND lists it", r.URL.Path))
		return
	}
	h := w.Header()
	media.SetHeaders(h, p, fi.contentType, false)
	h.Set("Cache-Control", "no-cache")
	if fi.etag != "" {
		h.Set("ETag", fi.etag)
	}
	if r.Method == http.MethodHead || fi.size == 0 {
		http.ServeContent(w, r, "", fi.modTime, emptySeeker{size: fi.size})
		return
	}
	rd, err := d.cfg.Files.OpenReader(ctx, p)
	if err != nil {
		code, err := failure(err)
		writeStatus(w, r, code, err)
		return
	}
	defer rd.Close()
	var content io.ReadSeeker = rd.File
	if rd.File == nil {
		content = &rpcReader{ctx: ctx, d: d, p: p, size: fi.size}
	}
	http.ServeContent(w, r, "", fi.modTime, content)
}

// emptySeeker is a body of size bytes that HEAD never reads: ServeContent
// learns the size from it.
type emptySeeker struct{ size int64 }

func (e emptySeeker) Read([]byte) (int, error) { return 0, io.EOF }
func (e emptySeeker) Seek(off int64, whence int) (int64, error) {
	if whence == io.SeekEnd {
		return e.size + off, nil
	}
	return off, nil
}

// failWriter answers an error x/net/webdav writes (a 4xx or 5xx with its
// status text) with the status and body of the refusal behind it, when
// the store or the checks gave one (reqState.failure): 403 for a scope,
// 400 for a bad name, 507 for a full disk, where x/net/webdav would say
// 404 or 500.
type failWriter struct {
	http.ResponseWriter
	r       *http.Request
	st      *reqState
	swallow bool
}

func (w *failWriter) WriteHeader(code int) {
	if code >= 400 && w.st.failure != nil && w.st.failCode != 0 && code != w.st.failCode {
		writeStatus(w.ResponseWriter, w.r, w.st.failCode, w.st.failure)
		w.swallow = true
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *failWriter) Write(b []byte) (int, error) {
	if w.swallow {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

func (w *failWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// writeStatus answers err with code and the gateway's JSON error body.
func writeStatus(w http.ResponseWriter, r *http.Request, code int, err error) {
	st := grpcstatus.Convert(status.Of(err))
	if d, ok := status.RetryDelay(st.Err()); ok {
		w.Header().Set("Retry-After", fmt.Sprint(int(d.Seconds()+0.999)))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	if r.Method != http.MethodHead {
		w.Write(status.JSON(st))
	}
}

// answerError answers err, which an operation of davFS returned (through
// fsError), with the refusal behind it.
func answerError(w http.ResponseWriter, r *http.Request, err error) {
	st := stateOf(r.Context())
	switch {
	case st.failure != nil:
		writeStatus(w, r, st.failCode, st.failure)
	case os.IsNotExist(err):
		writeStatus(w, r, http.StatusNotFound, status.Refusal(filewritev1.ErrorReason_FILE_NOT_FOUND, nil, "%s: no such file or collection", r.URL.Path))
	default:
		code, err := failure(err)
		writeStatus(w, r, code, err)
	}
}

// failure is the HTTP status of err, a status error of the store or the
// checks, as the other routes answer it; Insufficient Storage for a full
// disk or a collection too large to list, as WebDAV has it.
func failure(err error) (int, error) {
	if errors.Is(err, errTooMany) {
		return http.StatusInsufficientStorage, status.Refusal(filewritev1.ErrorReason_REQUEST_TOO_LARGE, nil, "%v", err)
	}
	err = status.Of(err)
	if code, ok := status.HTTPStatus(err); ok {
		return code, err // 412 for a generation's refusal, as on REST
	}
	switch errorinfo.Reason(err) {
	case filewritev1.ErrorReason_NO_SPACE.String():
		return http.StatusInsufficientStorage, err
	case filewritev1.ErrorReason_FILE_NOT_FOUND.String(), filewritev1.ErrorReason_FILE_DELETED.String():
		return http.StatusNotFound, err
	}
	return runtime.HTTPStatusFromCode(grpcstatus.Code(err)), err
}

// fsError is err, of the store or the checks, as x/net/webdav tells
// errors apart (os.IsNotExist, os.IsExist, os.IsPermission): it notes the
// refusals that deserve a status of their own in the request's state
// (failWriter answers them).
func fsError(ctx context.Context, op, name string, err error) error {
	if err == nil {
		return nil
	}
	code, serr := failure(err)
	switch code {
	case http.StatusNotFound:
		return &os.PathError{Op: op, Path: name, Err: os.ErrNotExist}
	case http.StatusConflict:
		return &os.PathError{Op: op, Path: name, Err: os.ErrExist}
	}
	st := stateOf(ctx)
	st.failCode, st.failure = code, serr
	if code == http.StatusForbidden || code == http.StatusUnauthorized {
		return &os.PathError{Op: op, Path: name, Err: os.ErrPermission}
	}
	return serr
}

// errTooMany: a collection has more entries than Config.MaxListing.
var errTooMany = errors.New("too many entries")

// timeOf is a timestamp of the store as a time.
func timeOf(ns int64) time.Time { return time.Unix(0, ns).UTC() }
