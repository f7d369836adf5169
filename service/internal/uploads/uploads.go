package uploads

import (
	"context"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	tusd "github.com/tus/tusd/v2/pkg/handler"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/filewrite/filewrite/service/internal/admit"
	"github.com/filewrite/filewrite/service/internal/status"
	"github.com/filewrite/filewrite/store"
)

// Prefix is the path the door serves: POST to it creates an upload,
// Prefix+ID is the upload.
const Prefix = "/v1/uploads/"

// DefaultExpiry is how long an upload may go without a PATCH before it is
// removed, and how long a complete one is remembered (a HEAD of it tells
// its client it is done).
const DefaultExpiry = 24 * time.Hour

// MaxPieceBytes is the most of a PATCH's body the door holds at once: it
// reads the body into a buffer of this size (or --max-request-bytes, if
// less), writes it, and reads the next.
const MaxPieceBytes = 8 << 20

// Calls runs the door's operations under the FileService's checks: in
// the daemon, the direct road (service/internal/local).
type Calls interface {
	// Run runs do as the FileService runs a call of method with req: the
	// caller's token, the scope of req's paths, the call's log line and
	// span, and then do, whose error is the call's.
	Run(ctx context.Context, method string, req any, do func(ctx context.Context) error) error
}

// Config is what the door needs of the daemon.
type Config struct {
	Store  *store.Store
	Calls  Calls
	Budget *admit.Budget // --max-inflight-bytes; nil: unbounded
	// MaxFileSize is --max-file-size: the longest upload.
	MaxFileSize int64
	// MaxRequestBytes is --max-request-bytes: the most one write moves.
	MaxRequestBytes int64
	// BodyTimeout is --body-timeout: how long each read of a PATCH's body
	// may wait. 0: tusd's default (a minute).
	BodyTimeout time.Duration
	// Expiry is --upload-expiry (DefaultExpiry if 0).
	Expiry time.Duration
	// Owner is a key for the credential of the call in ctx ("" without
	// tokens): an upload answers only to the one that created it.
	Owner func(ctx context.Context) string
	// Home is the directory a filename without a path goes to, for the
	// credential in ctx; an error if it may write nowhere.
	Home func(ctx context.Context) (string, error)
	// Context is the context a request's calls run in (the caller's host
	// as its peer, its token as metadata); nil: the request's own.
	Context func(r *http.Request) context.Context
	Logger  *slog.Logger
}

// Door serves tus under Prefix. It is safe for concurrent use.
type Door struct {
	cfg        Config
	log        *slog.Logger
	tus        http.Handler
	locks      *locker
	pieceBytes int64
	// pieces are buffers of pieceBytes, reused from one PATCH to the next.
	pieces sync.Pool
}

// New makes the door.
func New(cfg Config) (*Door, error) {
	if cfg.Expiry <= 0 {
		cfg.Expiry = DefaultExpiry
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Owner == nil {
		cfg.Owner = func(context.Context) string { return "" }
	}
	if cfg.Home == nil {
		cfg.Home = func(context.Context) (string, error) { return "", nil }
	}
	d := &Door{cfg: cfg, log: cfg.Logger, locks: newLocker(), pieceBytes: MaxPieceBytes}
	if cfg.MaxRequestBytes > 0 {
		d.pieceBytes = min(d.pieceBytes, cfg.MaxRequestBytes)
	}
	d.pieces.New = func() any { return make([]byte, d.pieceBytes) }
	composer := tusd.NewStoreComposer()
	ds := dataStore{d: d}
	composer.UseCore(ds)
	composer.UseTerminater(ds)
	composer.UseConcater(ds)
	composer.UseLengthDeferrer(ds)
	composer.UseLocker(d.locks)
	h, err := tusd.NewHandler(tusd.Config{
		StoreComposer: composer,
		BasePath:      Prefix,
		MaxSize:       cfg.MaxFileSize,
		// The daemon's CORS layer answers for every route, tus's with
		// them; and the REST download route serves what was uploaded,
		// with the scopes and the media-type rules of every download.
		Cors:            &tusd.CorsConfig{Disable: true},
		DisableDownload: true,
		NetworkTimeout:  cfg.BodyTimeout,
		Logger:          bridgeLogger(cfg.Logger),
	})
	if err != nil {
		return nil, fmt.Errorf("tus: %w", err)
	}
	d.tus = http.StripPrefix(strings.TrimSuffix(Prefix, "/"), h)
	return d, nil
}

func (d *Door) getPiece() []byte  { return d.pieces.Get().([]byte) }
func (d *Door) putPiece(b []byte) { d.pieces.Put(b) }

// expiresAt is when an upload last written at ctime (nanoseconds since
// the epoch) expires.
func (d *Door) expiresAt(ctime int64) time.Time {
	return time.Unix(0, ctime).Add(d.cfg.Expiry).UTC()
}

// Extensions the thin layer adds to tusd's, and the checksums it takes.
const (
	ownExtensions      = "checksum,expiration"
	checksumAlgorithms = "sha1,sha256,md5"
)

// ServeHTTP serves tus: tusd's handler, with the checksum and expiration
// extensions around it.
func (d *Door) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if d.cfg.Context != nil {
		ctx = d.cfg.Context(r)
	}
	st := &reqState{method: r.Method}
	if r.Method == http.MethodPost {
		if m := r.Header.Get("X-HTTP-Method-Override"); m != "" {
			st.method = m
		}
	}
	if v := r.Header.Get("Upload-Checksum"); v != "" && (st.method == http.MethodPatch || st.method == http.MethodPost) {
		if err := st.parseChecksum(v); err != nil {
			writeError(w, r, err)
			return
		}
	}
	ctx = context.WithValue(ctx, stateKey{}, st)
	d.tus.ServeHTTP(&headerWriter{ResponseWriter: w, st: st}, r.WithContext(ctx))
}

// reqState is what the thin layer and the data store share about one
// request. It is used by the request's goroutine only: tusd calls the
// data store, and writes the response, on it.
type reqState struct {
	method string
	// sumAlgo and sumWant are the PATCH's Upload-Checksum, if any.
	sumAlgo string
	sumWant []byte
	// expires is the upload's Upload-Expires, set by the data store for
	// an upload that is not complete.
	expires time.Time
}

type stateKey struct{}

func stateOf(ctx context.Context) *reqState {
	st, _ := ctx.Value(stateKey{}).(*reqState)
	return st
}

// parseChecksum reads Upload-Checksum: "<algorithm> <base64 digest>".
func (st *reqState) parseChecksum(v string) error {
	algo, sum, ok := strings.Cut(strings.TrimSpace(v), " ")
	want, err := base64.StdEncoding.DecodeString(strings.TrimSpace(sum))
	if !ok || err != nil {
		return malformed("Upload-Checksum", "Upload-Checksum %q: want an algorithm and a base64 digest, such as \"sha1 Kq5sNclPz7QV2+lfQIuc6R7oRu0=\"", v)
	}
	st.sumAlgo = strings.ToLower(algo)
	if st.checksum() == nil {
		return malformed("Upload-Checksum", "checksum algorithm %q: the daemon takes %s", algo, checksumAlgorithms)
	}
	if len(want) != st.checksum().Size() {
		return malformed("Upload-Checksum", "a %s digest has %d bytes, not %d", algo, st.checksum().Size(), len(want))
	}
	st.sumWant = want
	return nil
}

// checksum is a fresh hash of the request's checksum algorithm, nil if it
// sent none.
func (st *reqState) checksum() hash.Hash {
	if st == nil {
		return nil
	}
	switch st.sumAlgo {
	case "sha1":
		return sha1.New()
	case "sha256":
		return sha256.New()
	case "md5":
		return md5.New()
	}
	return nil
}

func (st *reqState) sumMatches(h hash.Hash) bool {
	return string(h.Sum(nil)) == string(st.sumWant)
}

// headerWriter adds the thin layer's headers to tusd's answers: the
// extensions it serves on OPTIONS, and Upload-Expires.
type headerWriter struct {
	http.ResponseWriter
	st   *reqState
	done bool
}

func (w *headerWriter) WriteHeader(code int) {
	if !w.done {
		w.done = true
		h := w.Header()
		if ext := h.Get("Tus-Extension"); ext != "" {
			h.Set("Tus-Extension", ext+","+ownExtensions)
			h.Set("Tus-Checksum-Algorithm", checksumAlgorithms)
		}
		if !w.st.expires.IsZero() && code < 300 {
			h.Set("Upload-Expires", w.st.expires.Format(http.TimeFormat))
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *headerWriter) Write(b []byte) (int, error) {
	if !w.done {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController (tusd's read deadlines) reach the
// connection.
func (w *headerWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// httpError is err as tusd answers it: a tusd.Error with the status of
// err's gRPC code and the gateway's JSON body, its reason as the error
// code. tusd's own errors pass as they are.
func httpError(err error) error {
	var te tusd.Error
	if errors.As(err, &te) {
		return te
	}
	st := grpcstatus.Convert(status.Of(err))
	code := runtime.HTTPStatusFromCode(st.Code())
	reason := st.Code().String()
	for _, d := range st.Details() {
		if info, ok := d.(interface{ GetReason() string }); ok {
			reason = info.GetReason()
		}
	}
	te = tusd.NewError(reason, st.Message(), code)
	te.HTTPResponse.Body = string(status.JSON(st))
	te.HTTPResponse.Header = tusd.HTTPHeader{"Content-Type": "application/json"}
	if delay, ok := status.RetryDelay(st.Err()); ok {
		te.HTTPResponse.Header["Retry-After"] = fmt.Sprint(int(delay.Seconds() + 0.999))
	}
	return te
}

// writeError answers a request the thin layer refuses before tusd sees
// it, as tusd would.
func writeError(w http.ResponseWriter, r *http.Request, err error) {
	var te tusd.Error
	if !errors.As(err, &te) {
		te = httpError(err).(tusd.Error)
	}
	h := w.Header()
	for k, v := range te.HTTPResponse.Header {
		h.Set(k, v)
	}
	h.Set("Tus-Resumable", "1.0.0")
	w.WriteHeader(te.HTTPResponse.StatusCode)
	if r.Method != http.MethodHead {
		w.Write([]byte(te.HTTPResponse.Body))
	}
}
