package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/internal/shard"
	"github.com/filewrite/filewrite/service/internal/admit"
	"github.com/filewrite/filewrite/service/internal/auth"
	"github.com/filewrite/filewrite/service/internal/local"
	"github.com/filewrite/filewrite/service/internal/status"
)

// MIMEOctetStream is the media type of raw bytes, in a PUT body and in a
// download.
const MIMEOctetStream = "application/octet-stream"

// New serves FileService as REST over conn: the JSON routes of the
// proto's google.api.http annotations, plus the raw-bytes routes (PUT of an
// application/octet-stream body, and ":read" answered as raw bytes when
// asked with "Accept: application/octet-stream"). Errors are gRPC statuses
// turned into HTTP statuses with a JSON body by grpc-gateway.
//
// The gateway calls the gRPC server rather than the store directly, so that
// a REST call gets the same interceptors, limits, telemetry and draining as
// a gRPC one. The raw PUT and :read stream their data in chunks, so that
// what they hold does not grow with what they move (stream.go).
func New(ctx context.Context, conn grpc.ClientConnInterface, cfg Config) (http.Handler, error) {
	g := &gateway{
		client: filewritev1.NewFileServiceClient(conn),
		Config: cfg,
		// A JSON body carries data as base64: 4 bytes for every 3.
		maxBodyBytes: 4*((cfg.MaxRequestBytes+2)/3) + status.MessageOverhead,
		pieceBytes:   min(cfg.MaxRequestBytes, putPieceBytes),
	}
	g.files = clientFiles{g.client}
	if cfg.Local != nil {
		g.files = cfg.Local
	}
	muxOpts := []runtime.ServeMuxOption{
		runtime.WithMarshalerOption(runtime.MIMEWildcard, strictJSON{jsonMarshaler}),
		runtime.WithMarshalerOption(MIMEOctetStream, rawMarshaler{json: jsonMarshaler}),
		runtime.WithErrorHandler(g.handleError),
		runtime.WithRoutingErrorHandler(g.handleRoutingError),
		// The gRPC server's headers and trailers are its own business
		// (content-type application/grpc and the like), not the HTTP
		// client's.
		runtime.WithOutgoingHeaderMatcher(dropMetadata),
		runtime.WithOutgoingTrailerMatcher(dropMetadata),
		runtime.WithWriteContentLength(),
		runtime.WithMetadata(auth.GatewayMetadata),
		useStrictQuery(),
		// The routing header a proxy set (HAProxy: the file path of the
		// URL) goes on to the gRPC call, whose interceptor checks that it
		// names the path the gateway decoded (pathheader.go).
		runtime.WithIncomingHeaderMatcher(func(key string) (string, bool) {
			if strings.EqualFold(key, shard.Header) {
				return shard.Header, true
			}
			return runtime.DefaultHeaderMatcher(key)
		}),
		runtime.WithForwardResponseOption(appendOffsetHeader),
		runtime.WithForwardResponseOption(etagHeader),
	}
	g.mux = runtime.NewServeMux(muxOpts...)
	// The raw append shares its route with the JSON one: serveHTTP sends
	// it here by its Content-Type.
	g.rawAppend = runtime.NewServeMux(muxOpts...)
	if err := g.rawAppend.HandlePath(http.MethodPost, appendPattern, g.appendRaw); err != nil {
		return nil, fmt.Errorf("register raw append route: %w", err)
	}
	if err := filewritev1.RegisterFileServiceHandlerClient(ctx, g.mux, g.client); err != nil {
		return nil, fmt.Errorf("register REST routes: %w", err)
	}
	// Registered after the generated routes, so they win (grpc-gateway
	// tries the latest registration first).
	if err := g.mux.HandlePath(http.MethodPut, "/v1/files/{path=**}", g.putRaw); err != nil {
		return nil, fmt.Errorf("register raw PUT route: %w", err)
	}
	if err := g.mux.HandlePath(http.MethodGet, readPattern, g.readStreamed); err != nil {
		return nil, fmt.Errorf("register streamed read route: %w", err)
	}
	var err error
	if g.media, err = g.newMediaMux(); err != nil {
		return nil, err
	}
	if g.routes, err = newRouteTable(ctx); err != nil {
		return nil, err
	}
	return http.HandlerFunc(g.serveHTTP), nil
}

// Config is what the gateway needs of the daemon's configuration.
type Config struct {
	MaxRequestBytes int64 // --max-request-bytes: the data of one Write or Read
	MaxFileSize     int64 // --max-file-size, checked before a raw PUT writes anything
	// BodyTimeout is --body-timeout: each BodyProgressBytes of a request
	// body must arrive within it. 0: no deadline.
	BodyTimeout time.Duration
	// Budget is --max-inflight-bytes, shared with the gRPC server; nil:
	// unbounded.
	Budget *admit.Budget
	// Local is the direct road to the FileService, which the routes that
	// move bytes take; nil: they too call the gRPC server.
	Local *local.Files
	// LastModifiedDelay is how long after a change a file goes without a
	// Last-Modified: DefaultLastModifiedDelay for the daemon, 0 for tests
	// that need one at once.
	LastModifiedDelay time.Duration
}

type gateway struct {
	Config
	mux       *runtime.ServeMux
	media     *runtime.ServeMux // the requests with alt (newMediaMux)
	rawAppend *runtime.ServeMux // appends of raw bytes (appendRaw)
	routes    *routeTable       // which methods a path takes, for 405's Allow
	client    filewritev1.FileServiceClient
	files     Files // Local, or client
	// pieceBytes is the most one Write of a raw PUT carries (putPieceBytes).
	pieceBytes   int64
	maxBodyBytes int64 // the HTTP body that can carry maxRequestBytes of data
}

// jsonMarshaler is grpc-gateway's default JSON codec except that it rejects
// unknown fields and enum names instead of dropping them: dropped, a
// misspelled "SYNC_MODE_FULL" would become a write that syncs nothing.
var jsonMarshaler = &runtime.HTTPBodyMarshaler{Marshaler: jsonPb}

var jsonPb = &runtime.JSONPb{
	MarshalOptions:   protojson.MarshalOptions{EmitUnpopulated: true},
	UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
}

// dropMetadata keeps gRPC metadata out of HTTP responses.
func dropMetadata(string) (string, bool) { return "", false }

func (g *gateway) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodHead {
		// Served as the GET it asks the headers of; net/http writes no
		// body for it, as the original request is HEAD.
		get := r.WithContext(context.WithValue(r.Context(), headKey{}, true))
		get.Method = http.MethodGet
		r = get
	}
	if !utf8.ValidString(r.URL.Path) {
		// It would reach the gRPC client as a path that proto3 cannot
		// encode, and fail there as INTERNAL.
		_, out := runtime.MarshalerForRequest(g.mux, r)
		runtime.HTTPError(r.Context(), g.mux, out, w, r, status.Refusal(filewritev1.ErrorReason_PATH_INVALID, map[string]string{errorinfo.KeyField: "path"}, "path %q is not valid UTF-8", r.URL.Path))
		return
	}
	if allow, wrong := g.routes.wrongVerbMethod(r); wrong {
		g.methodNotAllowed(w, r, allow)
		return
	}
	if err := checkContentType(r); err != nil {
		g.fail(w, r, &runtime.HTTPStatusError{HTTPStatus: http.StatusUnsupportedMediaType, Err: err})
		return
	}
	// A raw PUT's body is the bytes themselves, of any length: it is
	// written in pieces as it arrives (putRaw). Every other body is read
	// whole.
	bodyLimit := g.maxBodyBytes
	if r.Method == http.MethodPut {
		bodyLimit = math.MaxInt64
	}
	if r.ContentLength > bodyLimit {
		_, out := runtime.MarshalerForRequest(g.mux, r)
		runtime.HTTPError(r.Context(), g.mux, out, w, r, g.bodyTooLarge())
		return
	}
	// The streaming routes take their fixed share before the body is
	// read: a chunk on each step, whatever they move. A JSON body takes
	// its share once it has arrived (HoldBody): a request whose body has
	// not come holds none of the budget, whatever length it announced.
	hold := g.holds(r)
	if err := g.Budget.Acquire(r.Context(), hold); err != nil {
		_, out := runtime.MarshalerForRequest(g.mux, r)
		runtime.HTTPError(r.Context(), g.mux, out, w, r, status.Of(err))
		return
	}
	defer g.Budget.Release(hold)
	if r.Body != nil && r.Body != http.NoBody {
		// A chunked body has no length to check up front.
		body := newRequestBody(w, r.Body, bodyLimit, g.BodyTimeout)
		r.Body = body
		if hold == 0 {
			bh := &bodyHold{budget: g.Budget, body: body}
			defer bh.release()
			r = r.WithContext(context.WithValue(r.Context(), bodyHoldKey{}, bh))
		}
	}
	if r.Method == http.MethodGet && hasAlt(r) {
		g.media.ServeHTTP(w, r)
		return
	}
	if isRawAppend(r) {
		// It decides its preconditions itself, whichever road it takes.
		g.rawAppend.ServeHTTP(w, r)
		return
	}
	if (r.Method == http.MethodPost || r.Method == http.MethodDelete) && hasConditions(r.Header) {
		// For Preconditions, on the JSON routes' calls.
		r = r.WithContext(context.WithValue(r.Context(), conditionsKey{}, &conditionedRequest{g: g, r: r}))
	}
	g.mux.ServeHTTP(w, r)
}

// bodyHold is a JSON request's share of the budget: jsonBodyCopies of the
// body it has read, taken by HoldBody when the request, decoded, goes to
// the gRPC server, and given back when the request ends. It is used only
// by the goroutine serving the request (the gateway's gRPC calls are made
// on it).
type bodyHold struct {
	budget *admit.Budget
	body   *requestBody
	held   int64
}

type bodyHoldKey struct{}

// HoldBody is the unary interceptor of the gateway's connection to its
// gRPC server: a call made for a JSON request first takes the request's
// share of the budget, for the body read until then, waiting if need be.
// While it waits it holds the body read and decoded outside the budget:
// a few times what its client sent (docs/guarantees.md).
func HoldBody(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if bh, ok := ctx.Value(bodyHoldKey{}).(*bodyHold); ok {
		if more := jsonBodyCopies*bh.body.read - bh.held; more > 0 {
			if err := bh.budget.Acquire(ctx, more); err != nil {
				return status.Of(err)
			}
			bh.held += more
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (bh *bodyHold) release() {
	bh.budget.Release(bh.held)
	bh.held = 0
}

// What a REST request holds of the budget (see admit.Budget). A JSON
// body is held many times over: read whole, copied out as the one JSON
// value, decoded from base64, encoded as a gRPC message, then received and
// decoded by the gRPC server in the same process. The streaming routes
// take the direct road (local.Files) and hold what they read: a raw PUT
// one piece, :read a chunk and its reply, a download a chunk where it
// cannot send from the file's descriptor; over gRPC (no direct road),
// one chunk on each of the steps above.
const (
	jsonBodyCopies = 6
	chunkCopies    = 6
	localCopies    = 2
)

// holds is what r takes before its body is read: the streaming routes'
// fixed share; 0 for the JSON routes and the raw append, whose body is
// read whole before its one call (bodyHold).
func (g *gateway) holds(r *http.Request) int64 {
	copies := int64(chunkCopies)
	if g.Local != nil {
		copies = localCopies
	}
	switch {
	case r.Method == http.MethodPut:
		if g.Local != nil {
			return g.pieceBytes
		}
		return copies * g.pieceBytes
	case r.Method == http.MethodGet && (strings.HasSuffix(r.URL.Path, ":read") || hasAlt(r)):
		if isHead(r.Context()) && hasAlt(r) {
			return 0 // a download's HEAD reads no byte
		}
		return copies * ReadChunkBytes
	}
	return 0
}

func (g *gateway) bodyTooLarge() error {
	return status.Refusal(filewritev1.ErrorReason_REQUEST_TOO_LARGE, g.requestLimit(),
		"request body exceeds %d bytes: --max-request-bytes is %d bytes of data, which JSON carries as base64",
		g.maxBodyBytes, g.MaxRequestBytes)
}

// requestLimit is the ErrorInfo metadata of a REQUEST_TOO_LARGE refusal
// of a body: what is too large is the data it carries.
func (g *gateway) requestLimit() map[string]string {
	return map[string]string{errorinfo.KeyLimit: strconv.FormatInt(g.MaxRequestBytes, 10), errorinfo.KeyField: "data"}
}

// handleError reports an over-long chunked body as REQUEST_TOO_LARGE and
// a stalled one as 408: the generated handlers turn every body-decoding
// error into INVALID_ARGUMENT. A status that came without an ErrorInfo
// (grpc-gateway's own, such as a body that is not JSON) gets the reason
// its code implies, and one that says to retry sets Retry-After. The body
// is the status with its details, as grpc-gateway writes it.
func (g *gateway) handleError(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	if b, ok := r.Body.(*requestBody); ok {
		if berr := g.bodyError(b, nil); berr != nil {
			err = berr
		}
	}
	err = withReasonHTTP(err)
	if _, ok := err.(*runtime.HTTPStatusError); !ok {
		if code, ok := status.HTTPStatus(err); ok {
			// A failed precondition is 412 whoever found it: the
			// gateway, or the store on a condition the request set.
			err = &runtime.HTTPStatusError{HTTPStatus: code, Err: err}
		}
	}
	if d, ok := status.RetryDelay(err); ok {
		w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(d.Seconds())), 10))
	}
	runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, err)
}

// withReasonHTTP is withReason for an error that reaches the gateway's
// error handler, which may wrap a status in a *runtime.HTTPStatusError.
// An error that is no status (grpc-gateway's own, such as a reply its
// marshaler could not encode) becomes one through status.Of, which
// grpc-gateway would answer as UNKNOWN without a reason.
func withReasonHTTP(err error) error {
	if he, ok := err.(*runtime.HTTPStatusError); ok {
		return &runtime.HTTPStatusError{HTTPStatus: he.HTTPStatus, Err: withReasonHTTP(he.Err)}
	}
	return status.Of(err)
}

// bodyError is the error to answer for a body that failed to arrive: too
// large, too slow, or err as it came.
func (g *gateway) bodyError(b *requestBody, err error) error {
	switch {
	case b.exceeded:
		return g.bodyTooLarge()
	case b.timedOut:
		return &runtime.HTTPStatusError{
			HTTPStatus: http.StatusRequestTimeout,
			Err: status.Refusal(filewritev1.ErrorReason_BODY_TIMEOUT, map[string]string{errorinfo.KeyLimit: g.BodyTimeout.String()},
				"request body: less than %d bytes arrived in %v (--body-timeout)", BodyProgressBytes, g.BodyTimeout),
		}
	case err != nil:
		return status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, nil, "read request body: %v", err)
	}
	return nil
}

// BodyProgressBytes is how much of a request body must arrive within each
// --body-timeout: a body that trickles in a byte at a time holds its
// connection and its share of the budget as surely as one that stops.
const BodyProgressBytes = 64 << 10

// requestBody is a request body that fails once more than remaining bytes
// arrive, or once BodyProgressBytes take longer than timeout to arrive,
// and remembers which. It is read only by the goroutine serving the
// request.
type requestBody struct {
	io.ReadCloser
	remaining int64
	exceeded  bool
	// read counts the bytes read so far.
	read int64

	rc       *http.ResponseController
	timeout  time.Duration
	progress int64 // bytes since the deadline was last pushed back
	timedOut bool
}

var errBodyTooLarge = errors.New("request body too large")

func newRequestBody(w http.ResponseWriter, body io.ReadCloser, limit int64, timeout time.Duration) *requestBody {
	b := &requestBody{ReadCloser: body, remaining: limit, timeout: timeout}
	if timeout > 0 {
		b.rc = http.NewResponseController(w)
		b.extend()
	}
	return b
}

// extend pushes the read deadline back by timeout. A server that cannot
// set deadlines (none of net/http's) leaves the body without one.
func (b *requestBody) extend() {
	if b.rc.SetReadDeadline(time.Now().Add(b.timeout)) != nil {
		b.rc = nil
	}
	b.progress = 0
}

func (b *requestBody) Read(p []byte) (int, error) {
	if b.exceeded {
		return 0, errBodyTooLarge
	}
	// Ask for one byte more than allowed to tell "exactly at the limit"
	// from "over it".
	if int64(len(p))-1 > b.remaining { // a limit of MaxInt64 is no limit
		p = p[:b.remaining+1]
	}
	n, err := b.ReadCloser.Read(p)
	if b.rc != nil {
		b.progress += int64(n)
		switch {
		case err == io.EOF:
			// The server reads on in the background once the body is
			// done, and a deadline passing there would cancel the
			// request.
			b.rc.SetReadDeadline(time.Time{})
			b.rc = nil
		case errors.Is(err, os.ErrDeadlineExceeded):
			b.timedOut = true
		case b.progress >= BodyProgressBytes:
			b.extend()
		}
	}
	if int64(n) > b.remaining {
		b.exceeded = true
		n = int(b.remaining)
		b.remaining = 0
		b.read += int64(n)
		return n, errBodyTooLarge
	}
	b.remaining -= int64(n)
	b.read += int64(n)
	return n, err
}

// parseRawSync accepts the short names of the raw route (none, data, full)
// as well as the enum's own names.
func parseRawSync(s string) (filewritev1.SyncMode, error) {
	switch s {
	case "", "none":
		return filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED, nil
	case "data":
		return filewritev1.SyncMode_SYNC_MODE_DATA, nil
	case "full":
		return filewritev1.SyncMode_SYNC_MODE_FULL, nil
	}
	if v, ok := filewritev1.SyncMode_value[s]; ok {
		return filewritev1.SyncMode(v), nil
	}
	return 0, status.Refusal(filewritev1.ErrorReason_MODE_INVALID, map[string]string{errorinfo.KeyField: "sync"}, "sync %q: want none, data or full", s)
}
