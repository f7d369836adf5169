package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/auth"
	"github.com/filewrite/filewrite/service/internal/status"
)

// tokenAlpha is the token TestGatewayForwardsAuthorization accepts.
const tokenAlpha = "alpha-7f3c9b1e"

// fakeFiles is an in-memory FileService that records its requests, so
// that the gateway's routing and codecs are tested on their own; the real
// store is tested end to end in e2e_test.go.
type fakeFiles struct {
	filewritev1.UnimplementedFileServiceServer

	mu    sync.Mutex
	files map[string][]byte // guarded by mu
	last  proto.Message     // the last request; guarded by mu
	all   []proto.Message   // every request, in order; guarded by mu
	fail  error             // if set, every RPC returns it; guarded by mu
}

func (f *fakeFiles) record(req proto.Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.last = proto.Clone(req)
	f.all = append(f.all, f.last)
	return f.fail
}

// requests returns the requests recorded since the last call, in order.
func (f *fakeFiles) requests() []proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	all := f.all
	f.all = nil
	return all
}

func (f *fakeFiles) lastRequest() proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last
}

func (f *fakeFiles) Write(_ context.Context, req *filewritev1.WriteRequest) (*filewritev1.WriteResponse, error) {
	if err := f.record(req); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	data := f.files[req.Path]
	if end := req.Offset + int64(len(req.Data)); end > int64(len(data)) {
		data = append(data, make([]byte, end-int64(len(data)))...)
	}
	copy(data[req.Offset:], req.Data)
	f.files[req.Path] = data
	return &filewritev1.WriteResponse{BytesWritten: int64(len(req.Data)), Size: int64(len(data))}, nil
}

func (f *fakeFiles) Read(_ context.Context, req *filewritev1.ReadRequest) (*filewritev1.ReadResponse, error) {
	if err := f.record(req); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	data, ok := f.files[req.Path]
	if !ok {
		return nil, grpcstatus.Errorf(codes.NotFound, "%s: file not found", req.Path)
	}
	lo := min(req.Offset, int64(len(data)))
	hi := min(lo+req.Length, int64(len(data)))
	return &filewritev1.ReadResponse{Data: data[lo:hi]}, nil
}

func (f *fakeFiles) Fsync(_ context.Context, req *filewritev1.FsyncRequest) (*filewritev1.FsyncResponse, error) {
	return &filewritev1.FsyncResponse{}, f.record(req)
}

func (f *fakeFiles) Truncate(_ context.Context, req *filewritev1.TruncateRequest) (*filewritev1.TruncateResponse, error) {
	return &filewritev1.TruncateResponse{}, f.record(req)
}

func (f *fakeFiles) Fallocate(_ context.Context, req *filewritev1.FallocateRequest) (*filewritev1.FallocateResponse, error) {
	return &filewritev1.FallocateResponse{Size: 1}, f.record(req)
}

func (f *fakeFiles) Stat(_ context.Context, req *filewritev1.StatRequest) (*filewritev1.StatResponse, error) {
	return &filewritev1.StatResponse{Size: 2}, f.record(req)
}

func (f *fakeFiles) Delete(_ context.Context, req *filewritev1.DeleteRequest) (*filewritev1.DeleteResponse, error) {
	return &filewritev1.DeleteResponse{}, f.record(req)
}

func (f *fakeFiles) Rename(_ context.Context, req *filewritev1.RenameRequest) (*filewritev1.RenameResponse, error) {
	return &filewritev1.RenameResponse{}, f.record(req)
}

func (f *fakeFiles) List(_ context.Context, req *filewritev1.ListRequest) (*filewritev1.ListResponse, error) {
	return &filewritev1.ListResponse{}, f.record(req)
}

func (f *fakeFiles) Extents(_ context.Context, req *filewritev1.ExtentsRequest) (*filewritev1.ExtentsResponse, error) {
	return &filewritev1.ExtentsResponse{}, f.record(req)
}

// startFakeGateway serves fake over a real gRPC server on loopback and the
// gateway over a real HTTP server, with a data limit of maxRequestBytes.
func startFakeGateway(t *testing.T, maxRequestBytes int64) (*fakeFiles, string) {
	t.Helper()
	fake := &fakeFiles{files: map[string][]byte{}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(status.MaxMessageBytes(maxRequestBytes)))
	filewritev1.RegisterFileServiceServer(srv, fake)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)

	limit := status.MaxMessageBytes(maxRequestBytes)
	conn, err := grpc.NewClient(lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(limit), grpc.MaxCallSendMsgSize(limit)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	h, err := New(context.Background(), conn, Config{MaxRequestBytes: maxRequestBytes, MaxFileSize: math.MaxInt64})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	return fake, hs.URL
}

func TestGatewayRoutes(t *testing.T) {
	fake, base := startFakeGateway(t, 1<<20)
	const p = "/v1/files/dir/sub/f.bin"
	json := map[string]string{"Content-Type": "application/json"}
	tests := []struct {
		method, url, body string
		want              proto.Message
	}{
		{"POST", p + ":write", `{"offset":"7","data":"aGk=","sync":"SYNC_MODE_DATA"}`,
			&filewritev1.WriteRequest{Path: "dir/sub/f.bin", Offset: 7, Data: []byte("hi"), Sync: filewritev1.SyncMode_SYNC_MODE_DATA}},
		{"POST", p + ":fsync", `{"dataOnly":true}`,
			&filewritev1.FsyncRequest{Path: "dir/sub/f.bin", DataOnly: true}},
		{"POST", p + ":truncate", `{"size":"4096"}`,
			&filewritev1.TruncateRequest{Path: "dir/sub/f.bin", Size: 4096}},
		// Whitespace after the object is not "text after it".
		{"POST", p + ":truncate", "{\"size\":\"8\"}\r\n  \n",
			&filewritev1.TruncateRequest{Path: "dir/sub/f.bin", Size: 8}},
		{"POST", p + ":fallocate", `{"mode":"FALLOCATE_MODE_PUNCH_HOLE","offset":"4096","length":"8192"}`,
			&filewritev1.FallocateRequest{Path: "dir/sub/f.bin", Mode: filewritev1.FallocateMode_FALLOCATE_MODE_PUNCH_HOLE, Offset: 4096, Length: 8192}},
		// Stat's {path=**} must not swallow the ":read" and ":extents" verbs.
		{"GET", p, "", &filewritev1.StatRequest{Path: "dir/sub/f.bin"}},
		{"GET", p + ":read?offset=3&length=5", "", &filewritev1.ReadRequest{Path: "dir/sub/f.bin", Offset: 3, Length: 5}},
		{"GET", p + ":extents?offset=0&length=65536", "", &filewritev1.ExtentsRequest{Path: "dir/sub/f.bin", Length: 65536}},
		{"GET", "/v1/files/top:read?length=1", "", &filewritev1.ReadRequest{Path: "top", Length: 1}},
		{"GET", "/v1/files/top", "", &filewritev1.StatRequest{Path: "top"}},
		// DELETE and the raw PUT share Stat's pattern, on other methods.
		{"DELETE", p, "", &filewritev1.DeleteRequest{Path: "dir/sub/f.bin"}},
		{"DELETE", p + "?sync=true", "", &filewritev1.DeleteRequest{Path: "dir/sub/f.bin", Sync: true}},
		{"DELETE", "/v1/files/top", "", &filewritev1.DeleteRequest{Path: "top"}},
		{"POST", p + ":rename", `{"newPath":"other/g.bin","noReplace":true,"sync":true}`,
			&filewritev1.RenameRequest{Path: "dir/sub/f.bin", NewPath: "other/g.bin", NoReplace: true, Sync: true}},
		{"POST", p + ":rename", `{"new_path":"g.bin"}`, &filewritev1.RenameRequest{Path: "dir/sub/f.bin", NewPath: "g.bin"}},
		{"GET", "/v1/dirs", "", &filewritev1.ListRequest{}},
		{"GET", "/v1/dirs?pageSize=5&pageToken=abc", "", &filewritev1.ListRequest{PageSize: 5, PageToken: "abc"}},
		{"GET", "/v1/dirs/dir/sub", "", &filewritev1.ListRequest{Path: "dir/sub"}},
		{"GET", "/v1/dirs/dir?page_size=7", "", &filewritev1.ListRequest{Path: "dir", PageSize: 7}},
	}
	fake.files["dir/sub/f.bin"] = []byte("0123456789")
	fake.files["top"] = []byte("x")
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.url, func(t *testing.T) {
			var body io.Reader
			if tt.body != "" {
				body = strings.NewReader(tt.body)
			}
			r := testutil.DoHTTP(t, tt.method, base+tt.url, body, json)
			if r.Status != http.StatusOK {
				t.Fatalf("status = %d (%s), want 200", r.Status, r.Body)
			}
			if got := fake.lastRequest(); !proto.Equal(got, tt.want) {
				t.Errorf("the gateway called the server with %T %v, want %T %v", got, got, tt.want, tt.want)
			}
		})
	}
}

func TestGatewayRawRoundTrip(t *testing.T) {
	fake, base := startFakeGateway(t, 1<<20)
	data := testutil.AllBytes(256*16 + 7)
	url := base + "/v1/files/raw/all.bin"

	r := testutil.DoHTTP(t, "PUT", url+"?offset=3&sync=full", bytes.NewReader(data), map[string]string{"Content-Type": MIMEOctetStream})
	if r.Status != http.StatusOK {
		t.Fatalf("PUT status = %d (%s), want 200", r.Status, r.Body)
	}
	var wr struct {
		BytesWritten string `json:"bytesWritten"`
		Size         string `json:"size"`
	}
	if err := json.Unmarshal(r.Body, &wr); err != nil || wr.BytesWritten != "4103" || wr.Size != "4106" {
		t.Errorf("PUT answered %s (%v), want bytesWritten 4103 and size 4106 as JSON", r.Body, err)
	}
	want := &filewritev1.WriteRequest{Path: "raw/all.bin", Offset: 3, Data: data, Sync: filewritev1.SyncMode_SYNC_MODE_FULL, ContentType: MIMEOctetStream}
	if got := fake.lastRequest(); !proto.Equal(got, want) {
		t.Errorf("PUT became a different Write (path %q offset %d, %d bytes)", got.(*filewritev1.WriteRequest).Path,
			got.(*filewritev1.WriteRequest).Offset, len(got.(*filewritev1.WriteRequest).Data))
	}

	r = testutil.DoHTTP(t, "GET", url+":read?offset=3&length=100000", nil, map[string]string{"Accept": MIMEOctetStream})
	if r.Status != http.StatusOK || r.ContentType != MIMEOctetStream {
		t.Fatalf("raw read: status %d, Content-Type %q, want 200 %s", r.Status, r.ContentType, MIMEOctetStream)
	}
	if !bytes.Equal(r.Body, data) {
		t.Errorf("raw read returned %d bytes that differ from the %d written", len(r.Body), len(data))
	}

	// Without the Accept header, :read stays JSON.
	r = testutil.DoHTTP(t, "GET", url+":read?offset=3&length=3", nil, nil)
	if r.Status != http.StatusOK || string(r.Body) != `{"data":"AAEC"}` {
		t.Errorf("JSON read: status %d body %s, want 200 {\"data\":\"AAEC\"}", r.Status, r.Body)
	}

	// An error to a raw reader is JSON, never bytes that look like a file.
	r = testutil.DoHTTP(t, "GET", base+"/v1/files/missing:read?length=1", nil, map[string]string{"Accept": MIMEOctetStream})
	if r.Status != http.StatusNotFound {
		t.Errorf("raw read of a missing file: status %d, want 404", r.Status)
	}
	if e := testutil.ParseErrorBody(t, r); e.Code != codes.NotFound {
		t.Errorf("raw read of a missing file: code %v, want NotFound", e.Code)
	}
}

func TestGatewayRawPutParameters(t *testing.T) {
	fake, base := startFakeGateway(t, 1<<20)
	octet := map[string]string{"Content-Type": MIMEOctetStream}
	for _, tt := range []struct {
		query string
		want  filewritev1.SyncMode
	}{
		{"", filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED},
		{"?sync=none", filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED},
		{"?sync=data", filewritev1.SyncMode_SYNC_MODE_DATA},
		{"?sync=full", filewritev1.SyncMode_SYNC_MODE_FULL},
		{"?sync=SYNC_MODE_DATA", filewritev1.SyncMode_SYNC_MODE_DATA},
		{"?offset=5&sync=data", filewritev1.SyncMode_SYNC_MODE_DATA},
	} {
		r := testutil.DoHTTP(t, "PUT", base+"/v1/files/p"+tt.query, strings.NewReader("x"), octet)
		if r.Status != http.StatusOK {
			t.Errorf("PUT %s: status %d (%s), want 200", tt.query, r.Status, r.Body)
			continue
		}
		if got := fake.lastRequest().(*filewritev1.WriteRequest).Sync; got != tt.want {
			t.Errorf("PUT %s: sync %v, want %v", tt.query, got, tt.want)
		}
	}
	// curl --data-binary sends no Content-Type only when told to; a missing
	// one is taken as raw bytes.
	if r := testutil.DoHTTP(t, "PUT", base+"/v1/files/p", strings.NewReader("x"), nil); r.Status != http.StatusOK {
		t.Errorf("PUT without Content-Type: status %d (%s), want 200", r.Status, r.Body)
	}
}

// withRange is the headers of a raw PUT with the Content-Range cr.
func withRange(cr string) map[string]string {
	return map[string]string{"Content-Type": MIMEOctetStream, "Content-Range": cr}
}

func TestGatewayRejects(t *testing.T) {
	const limit = 1 << 16
	fake, base := startFakeGateway(t, limit)
	octet := map[string]string{"Content-Type": MIMEOctetStream}
	json := map[string]string{"Content-Type": "application/json"}
	// chunked hides the length, so that the limit is enforced while reading.
	chunked := func(b []byte) io.Reader { return io.MultiReader(bytes.NewReader(b)) }
	bigJSON := `{"data":"` + strings.Repeat("A", 4*limit) + `"}`
	tests := []struct {
		name       string
		method     string
		url        string
		body       io.Reader
		header     map[string]string
		wantStatus int
		wantCode   codes.Code
	}{
		// A raw PUT's body may pass --max-request-bytes (it goes in
		// pieces); a Content-Range that does not fit it writes nothing.
		{"Content-Range of another unit", "PUT", "/v1/files/p", strings.NewReader("x"), withRange("items 0-0/1"), 400, codes.InvalidArgument},
		{"Content-Range ending before it starts", "PUT", "/v1/files/p", strings.NewReader("x"), withRange("bytes 5-3/10"), 400, codes.InvalidArgument},
		{"Content-Range reaching its length", "PUT", "/v1/files/p", strings.NewReader("12345678901"), withRange("bytes 0-10/10"), 400, codes.InvalidArgument},
		{"Content-Range unlike the body's length", "PUT", "/v1/files/p", strings.NewReader("12345"), withRange("bytes 0-9/*"), 400, codes.InvalidArgument},
		{"Content-Range unlike the offset", "PUT", "/v1/files/p?offset=3", strings.NewReader("x"), withRange("bytes 0-0/1"), 400, codes.InvalidArgument},
		{"Content-Range of a chunked body", "PUT", "/v1/files/p", chunked([]byte("x")), withRange("bytes 0-0/1"), 400, codes.InvalidArgument},
		{"Content-Range of no bytes", "PUT", "/v1/files/p", strings.NewReader("x"), withRange("bytes */10"), 400, codes.InvalidArgument},
		{"JSON body over the limit", "POST", "/v1/files/p:write", strings.NewReader(bigJSON), json, 400, codes.InvalidArgument},
		{"chunked JSON body over the limit", "POST", "/v1/files/p:write", chunked([]byte(bigJSON)), json, 400, codes.InvalidArgument},
		{"offset not a number", "PUT", "/v1/files/p?offset=ten", strings.NewReader("x"), octet, 400, codes.InvalidArgument},
		{"offset overflowing int64", "PUT", "/v1/files/p?offset=9223372036854775808", strings.NewReader("x"), octet, 400, codes.InvalidArgument},
		{"unknown raw sync", "PUT", "/v1/files/p?sync=fast", strings.NewReader("x"), octet, 400, codes.InvalidArgument},
		{"unknown JSON sync name", "POST", "/v1/files/p:write", strings.NewReader(`{"sync":"SYNC_MODE_FAST"}`), json, 400, codes.InvalidArgument},
		{"misspelled JSON field", "POST", "/v1/files/p:write", strings.NewReader(`{"offest":"1"}`), json, 400, codes.InvalidArgument},
		{"octet-stream body to a JSON route", "POST", "/v1/files/p:write", strings.NewReader("x"), octet, 415, codes.InvalidArgument},
		{"form body to a JSON route", "POST", "/v1/files/p:truncate", strings.NewReader(`{"size":"0"}`), map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415, codes.InvalidArgument},
		{"text/plain body to a JSON route", "POST", "/v1/files/p:truncate", strings.NewReader(`{"size":"0"}`), map[string]string{"Content-Type": "text/plain"}, 415, codes.InvalidArgument},
		{"POST without Content-Type", "POST", "/v1/files/p:truncate", nil, nil, 415, codes.InvalidArgument},
		{"malformed JSON", "POST", "/v1/files/p:truncate", strings.NewReader(`{"size":`), json, 400, codes.InvalidArgument},
		// A misspelled, repeated or empty parameter would otherwise write at
		// offset 0 or skip the sync the caller asked for.
		{"misspelled raw offset", "PUT", "/v1/files/p?ofset=16", strings.NewReader("x"), octet, 400, codes.InvalidArgument},
		{"misspelled raw sync", "PUT", "/v1/files/p?offset=16&snyc=full", strings.NewReader("x"), octet, 400, codes.InvalidArgument},
		{"repeated raw offset", "PUT", "/v1/files/p?offset=16&offset=0", strings.NewReader("x"), octet, 400, codes.InvalidArgument},
		{"repeated raw sync", "PUT", "/v1/files/p?sync=full&sync=none", strings.NewReader("x"), octet, 400, codes.InvalidArgument},
		{"empty raw offset", "PUT", "/v1/files/p?offset=", strings.NewReader("x"), octet, 400, codes.InvalidArgument},
		{"empty raw sync", "PUT", "/v1/files/p?sync=", strings.NewReader("x"), octet, 400, codes.InvalidArgument},
		{"malformed raw query", "PUT", "/v1/files/p?offset=%zz", strings.NewReader("x"), octet, 400, codes.InvalidArgument},
		{"another JSON object after the body", "POST", "/v1/files/p:write", strings.NewReader(`{"data":"eA=="}{"sync":"BOGUS"}`), json, 400, codes.InvalidArgument},
		{"text after the JSON body", "POST", "/v1/files/p:truncate", strings.NewReader(`{"size":"1"} x`), json, 400, codes.InvalidArgument},
		{"misspelled query parameter", "GET", "/v1/files/p:read?ofset=1&length=1", nil, nil, 400, codes.InvalidArgument},
		{"repeated query parameter", "GET", "/v1/files/p:read?offset=1&offset=2&length=1", nil, nil, 400, codes.InvalidArgument},
		{"path in the query", "GET", "/v1/files/p:read?path=q&length=1", nil, nil, 400, codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake.mu.Lock()
			fake.last = nil
			fake.mu.Unlock()
			r := testutil.DoHTTP(t, tt.method, base+tt.url, tt.body, tt.header)
			if r.Status != tt.wantStatus {
				t.Errorf("status = %d (%s), want %d", r.Status, r.Body, tt.wantStatus)
			}
			if e := testutil.ParseErrorBody(t, r); e.Code != tt.wantCode || e.Message == "" {
				t.Errorf("error body = %+v, want code %v and a message", e, tt.wantCode)
			}
			if got := fake.lastRequest(); got != nil {
				t.Errorf("a rejected request reached the server: %v", got)
			}
		})
	}

	// Exactly at the limit is accepted.
	r := testutil.DoHTTP(t, "PUT", base+"/v1/files/p", bytes.NewReader(make([]byte, limit)), octet)
	if r.Status != http.StatusOK {
		t.Errorf("raw body of exactly --max-request-bytes: status %d (%s), want 200", r.Status, r.Body)
	}
}

// TestGatewayErrorStatuses pins the HTTP status and JSON body each gRPC
// code reaches REST clients with.
func TestGatewayErrorStatuses(t *testing.T) {
	fake, base := startFakeGateway(t, 1<<20)
	for _, tt := range []struct {
		code codes.Code
		want int
	}{
		{codes.InvalidArgument, 400},
		{codes.NotFound, 404},
		{codes.ResourceExhausted, 429},
		{codes.FailedPrecondition, 400},
		{codes.Unavailable, 503},
		{codes.DataLoss, 500},
		{codes.Internal, 500},
		{codes.DeadlineExceeded, 504},
		{codes.Canceled, 499},
	} {
		fake.mu.Lock()
		fake.fail = grpcstatus.Error(tt.code, "from the server")
		fake.mu.Unlock()
		for _, method := range []string{"GET", "PUT"} {
			r := testutil.DoHTTP(t, method, base+"/v1/files/p", strings.NewReader("x"), map[string]string{"Content-Type": MIMEOctetStream})
			if r.Status != tt.want {
				t.Errorf("%s with %v: HTTP %d, want %d", method, tt.code, r.Status, tt.want)
			}
			if e := testutil.ParseErrorBody(t, r); e.Code != tt.code || e.Message != "from the server" {
				t.Errorf("%s with %v: body %+v, want the code and the server's message", method, tt.code, e)
			}
		}
	}
}

// TestWithReasonHTTP: whatever reaches the gateway's error handler leaves
// it as a status with an ErrorInfo: an error that is no status (a reply
// grpc-gateway's marshaler could not encode) is classified as status.Of
// classifies it, keeping the HTTP status it was wrapped with, and a
// status with a reason passes as it is.
func TestWithReasonHTTP(t *testing.T) {
	refused := status.Refusal(filewritev1.ErrorReason_FILE_NOT_FOUND, nil, "missing")
	tests := []struct {
		name     string
		err      error
		code     codes.Code
		reason   string
		httpCode int // 0: not wrapped
	}{
		{"plain error", errors.New("proto: string field contains invalid UTF-8"), codes.Internal, "IO_ERROR", 0},
		{"context error", fmt.Errorf("write reply: %w", context.Canceled), codes.Canceled, "CANCELLED", 0},
		{"status without a reason", grpcstatus.Error(codes.InvalidArgument, "not JSON"), codes.InvalidArgument, "REQUEST_MALFORMED", 0},
		{"status with a reason", refused, codes.NotFound, "FILE_NOT_FOUND", 0},
		{"wrapped plain error", &runtime.HTTPStatusError{HTTPStatus: 418, Err: errors.New("odd")}, codes.Internal, "IO_ERROR", 418},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := withReasonHTTP(tt.err)
			httpCode := 0
			if he, ok := got.(*runtime.HTTPStatusError); ok {
				httpCode, got = he.HTTPStatus, he.Err
			}
			if httpCode != tt.httpCode {
				t.Errorf("HTTP status %d, want %d", httpCode, tt.httpCode)
			}
			if grpcstatus.Code(got) != tt.code || errorinfo.Reason(got) != tt.reason {
				t.Errorf("got %v (reason %q), want %v with reason %q", got, errorinfo.Reason(got), tt.code, tt.reason)
			}
		})
	}
}

// TestGatewayForwardsAuthorization runs the gateway without the HTTP
// middleware in front, against a gRPC server that checks tokens: the
// caller's token reaches the server through the gateway's connection, and
// a caller without one gets 401 from the server's verdict, so the gateway
// is no way around authentication.
func TestGatewayForwardsAuthorization(t *testing.T) {
	dir := testutil.Dir(t)
	a, err := auth.NewTokens(testutil.WriteTokenFile(t, dir, "tokens", tokenAlpha), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	fake := &fakeFiles{files: map[string][]byte{}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.InTapHandle(a.Tap))
	filewritev1.RegisterFileServiceServer(srv, fake)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	h, err := New(context.Background(), testutil.PlaintextConn(t, lis.Addr().String()), Config{MaxRequestBytes: 1 << 20, MaxFileSize: math.MaxInt64})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)

	tests := []struct {
		name         string
		method, path string
		token        string
		want         int
	}{
		{"raw PUT, no token", "PUT", "/v1/files/a", "", http.StatusUnauthorized},
		{"raw PUT, wrong token", "PUT", "/v1/files/a", "nope", http.StatusUnauthorized},
		{"raw PUT, valid token", "PUT", "/v1/files/a", tokenAlpha, http.StatusOK},
		{"JSON stat, no token", "GET", "/v1/files/a", "", http.StatusUnauthorized},
		{"JSON stat, valid token", "GET", "/v1/files/a", tokenAlpha, http.StatusOK},
		{"JSON truncate, wrong token", "POST", "/v1/files/a:truncate", "nope", http.StatusUnauthorized},
		{"JSON truncate, valid token", "POST", "/v1/files/a:truncate", tokenAlpha, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake.mu.Lock()
			fake.last = nil
			fake.mu.Unlock()
			header := map[string]string{}
			body := "{}"
			if tt.method == "PUT" {
				header["Content-Type"] = MIMEOctetStream
				body = "data"
			} else {
				header["Content-Type"] = "application/json"
			}
			if tt.token != "" {
				header["Authorization"] = "Bearer " + tt.token
			}
			r := testutil.DoHTTP(t, tt.method, hs.URL+tt.path, strings.NewReader(body), header)
			if r.Status != tt.want {
				t.Fatalf("%s %s: %d %s, want %d", tt.method, tt.path, r.Status, r.Body, tt.want)
			}
			if reached := fake.lastRequest() != nil; reached != (tt.want == http.StatusOK) {
				t.Errorf("the request reached the service: %v, want %v", reached, tt.want == http.StatusOK)
			}
		})
	}
}
