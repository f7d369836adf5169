package service

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"unicode/utf8"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

const mimeOctetStream = "application/octet-stream"

// newGateway serves FileService as REST over conn: the JSON routes of the
// proto's google.api.http annotations, plus the raw-bytes routes (PUT of an
// application/octet-stream body, and ":read" answered as raw bytes when
// asked with "Accept: application/octet-stream"). Errors are gRPC statuses
// turned into HTTP statuses with a JSON body by grpc-gateway.
//
// The gateway calls the gRPC server rather than the store directly, so that
// a REST call gets the same interceptors, limits, telemetry and draining as
// a gRPC one.
func newGateway(ctx context.Context, conn grpc.ClientConnInterface, maxRequestBytes int64) (http.Handler, error) {
	g := &gateway{
		client:          filewritev1.NewFileServiceClient(conn),
		maxRequestBytes: maxRequestBytes,
		// A JSON body carries data as base64: 4 bytes for every 3.
		maxBodyBytes: 4*((maxRequestBytes+2)/3) + messageOverhead,
	}
	g.mux = runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, strictJSON{jsonMarshaler}),
		runtime.WithMarshalerOption(mimeOctetStream, rawMarshaler{json: jsonMarshaler}),
		runtime.WithErrorHandler(g.handleError),
		runtime.WithWriteContentLength(),
		useStrictQuery(),
	)
	if err := filewritev1.RegisterFileServiceHandlerClient(ctx, g.mux, g.client); err != nil {
		return nil, fmt.Errorf("register REST routes: %w", err)
	}
	if err := g.mux.HandlePath(http.MethodPut, "/v1/files/{path=**}", g.putRaw); err != nil {
		return nil, fmt.Errorf("register raw PUT route: %w", err)
	}
	return http.HandlerFunc(g.serveHTTP), nil
}

type gateway struct {
	mux             *runtime.ServeMux
	client          filewritev1.FileServiceClient
	maxRequestBytes int64 // --max-request-bytes: the data of one Write
	maxBodyBytes    int64 // the HTTP body that can carry that much data
}

// jsonMarshaler is grpc-gateway's default JSON codec except that it rejects
// unknown fields and enum names instead of dropping them: dropped, a
// misspelled "SYNC_MODE_FULL" would become a write that syncs nothing.
var jsonMarshaler = &runtime.HTTPBodyMarshaler{Marshaler: jsonPb}

var jsonPb = &runtime.JSONPb{
	MarshalOptions:   protojson.MarshalOptions{EmitUnpopulated: true},
	UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
}

func (g *gateway) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if !utf8.ValidString(r.URL.Path) {
		// It would reach the gRPC client as a path that proto3 cannot
		// encode, and fail there as INTERNAL.
		_, out := runtime.MarshalerForRequest(g.mux, r)
		runtime.HTTPError(r.Context(), g.mux, out, w, r, status.Errorf(codes.InvalidArgument, "path %q is not valid UTF-8", r.URL.Path))
		return
	}
	if r.ContentLength > g.maxBodyBytes {
		_, out := runtime.MarshalerForRequest(g.mux, r)
		runtime.HTTPError(r.Context(), g.mux, out, w, r, g.bodyTooLarge())
		return
	}
	if r.Body != nil && r.Body != http.NoBody {
		// A chunked body has no length to check up front.
		r.Body = &limitedBody{ReadCloser: r.Body, remaining: g.maxBodyBytes}
	}
	g.mux.ServeHTTP(w, r)
}

func (g *gateway) bodyTooLarge() error {
	return status.Errorf(codes.ResourceExhausted,
		"request body exceeds %d bytes: --max-request-bytes is %d bytes of data, which JSON carries as base64",
		g.maxBodyBytes, g.maxRequestBytes)
}

// handleError reports an over-long chunked body as RESOURCE_EXHAUSTED: the
// generated handlers turn every body-decoding error into INVALID_ARGUMENT.
func (g *gateway) handleError(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	if b, ok := r.Body.(*limitedBody); ok && b.exceeded {
		err = g.bodyTooLarge()
	}
	runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, err)
}

// limitedBody fails a read once more than remaining bytes arrive, and
// remembers that it did. It is read only by the goroutine serving the
// request.
type limitedBody struct {
	io.ReadCloser
	remaining int64
	exceeded  bool
}

var errBodyTooLarge = errors.New("request body too large")

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.exceeded {
		return 0, errBodyTooLarge
	}
	// Ask for one byte more than allowed to tell "exactly at the limit"
	// from "over it".
	if int64(len(p)) > b.remaining+1 {
		p = p[:b.remaining+1]
	}
	n, err := b.ReadCloser.Read(p)
	if int64(n) > b.remaining {
		b.exceeded = true
		n = int(b.remaining)
		b.remaining = 0
		return n, errBodyTooLarge
	}
	b.remaining -= int64(n)
	return n, err
}

// putRaw is PUT /v1/files/{path}?offset=N&sync=none|data|full: a Write of
// the application/octet-stream body, for clients (curl) that should not
// have to base64 their data. It answers like POST :write.
func (g *gateway) putRaw(w http.ResponseWriter, r *http.Request, pathParams map[string]string) {
	ctx := r.Context()
	_, out := runtime.MarshalerForRequest(g.mux, r)
	fail := func(err error) { runtime.HTTPError(ctx, g.mux, out, w, r, err) }

	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != mimeOctetStream {
			fail(&runtime.HTTPStatusError{
				HTTPStatus: http.StatusUnsupportedMediaType,
				Err: status.Errorf(codes.InvalidArgument,
					"PUT takes an %s body, not %q; JSON writes go to POST /v1/files/{path}:write", mimeOctetStream, ct),
			})
			return
		}
	}
	req := &filewritev1.WriteRequest{Path: pathParams["path"]}
	var err error
	if req.Offset, req.Sync, err = rawWriteQuery(r.URL.RawQuery); err != nil {
		fail(err)
		return
	}

	if r.ContentLength > g.maxRequestBytes {
		fail(g.dataTooLarge(r.ContentLength))
		return
	}
	data, err := readBody(r, g.maxRequestBytes)
	if err != nil {
		fail(err)
		return
	}
	if int64(len(data)) > g.maxRequestBytes {
		fail(g.dataTooLarge(-1))
		return
	}
	req.Data = data

	ctx, err = runtime.AnnotateContext(ctx, g.mux, r, filewritev1.FileService_Write_FullMethodName,
		runtime.WithHTTPPathPattern("/v1/files/{path=**}"))
	if err != nil {
		fail(err)
		return
	}
	var md runtime.ServerMetadata
	resp, err := g.client.Write(ctx, req, grpc.Header(&md.HeaderMD), grpc.Trailer(&md.TrailerMD))
	ctx = runtime.NewServerMetadataContext(ctx, md)
	if err != nil {
		runtime.HTTPError(ctx, g.mux, out, w, r, err)
		return
	}
	runtime.ForwardResponseMessage(ctx, g.mux, out, w, r, resp)
}

func (g *gateway) dataTooLarge(n int64) error {
	if n < 0 {
		return status.Errorf(codes.ResourceExhausted, "body exceeds --max-request-bytes (%d bytes)", g.maxRequestBytes)
	}
	return status.Errorf(codes.ResourceExhausted, "body of %d bytes exceeds --max-request-bytes (%d bytes)", n, g.maxRequestBytes)
}

// readBody reads at most limit+1 bytes, so that the caller can tell a body
// over the limit without holding all of it. A known Content-Length (already
// checked against limit) sizes the buffer once.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength) + bytes.MinRead)
	}
	if _, err := buf.ReadFrom(io.LimitReader(r.Body, limit+1)); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "read request body: %v", err)
	}
	return buf.Bytes(), nil
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
	return 0, status.Errorf(codes.InvalidArgument, "sync %q: want none, data or full", s)
}
