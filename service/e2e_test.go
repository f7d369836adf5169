package service

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/gateway"
	"github.com/filewrite/filewrite/store"
)

// daemon is a Server started in-process on loopback ports picked by the
// kernel, with a gRPC client and the gateway's base URL.
type daemon struct {
	dir    string // the test's directory: root/ and outside/
	root   string // the store's root, dir/root
	srv    *Server
	client filewritev1.FileServiceClient
	conn   *grpc.ClientConn
	url    string // http://host:port of the gateway
}

func startDaemon(t *testing.T, configure func(*Config)) *daemon {
	t.Helper()
	dir := testutil.Dir(t)
	cfg := DefaultConfig()
	cfg.Root = filepath.Join(dir, "root")
	cfg.GRPCAddr = "127.0.0.1:0"
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.DrainTimeout = 10 * time.Second
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	if configure != nil {
		configure(&cfg)
	}
	srv, err := Start(cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Shutdown(); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	conn, err := grpc.NewClient(srv.GRPCAddr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	d := &daemon{dir: dir, root: cfg.Root, srv: srv, client: filewritev1.NewFileServiceClient(conn), conn: conn}
	if a := srv.HTTPAddr(); a != nil {
		d.url = "http://" + a.String()
	}
	return d
}

// restStatus is the google.rpc.Status of a REST error body.
func restStatus(t *testing.T, body []byte) *status.Status {
	t.Helper()
	var st spb.Status
	if err := protojson.Unmarshal(body, &st); err != nil {
		t.Fatalf("body %s is no google.rpc.Status: %v", body, err)
	}
	return status.FromProto(&st)
}

func testContext(t *testing.T) context.Context {
	return testutil.Context(t)
}

// onDisk is the file at name below the root, read behind the daemon's back.
func (d *daemon) onDisk(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(d.root, name))
	if err != nil {
		t.Fatalf("read %s on disk: %v", name, err)
	}
	return b
}

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("%s: code %v (%v), want %v", what, got, err, want)
	}
}

func TestHealthAndReflection(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	health := healthpb.NewHealthClient(d.conn)
	for _, svc := range []string{"", "filewrite.v1.FileService"} {
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health of %q = %v, %v; want SERVING", svc, resp.GetStatus(), err)
		}
	}

	stream, err := reflectionpb.NewServerReflectionClient(d.conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req := &reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}
	if err := stream.Send(req); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	for _, want := range []string{"filewrite.v1.FileService", "grpc.health.v1.Health"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v, want %s among them", names, want)
		}
	}
}

func TestStartWithoutGateway(t *testing.T) {
	d := startDaemon(t, func(c *Config) { c.HTTPAddr = "" })
	if a := d.srv.HTTPAddr(); a != nil {
		t.Errorf("HTTPAddr() = %v with an empty --http-addr, want nil", a)
	}
}

// TestStartRejectsBadConfig: Start refuses what it cannot use, a setting
// that Validate refuses with a *ConfigError that names it.
func TestStartRejectsBadConfig(t *testing.T) {
	for _, tt := range []struct {
		name      string
		configure func(*Config)
		field     string // the ConfigError's, "" where the error is not Validate's
	}{
		{"no root", func(c *Config) { c.Root = "" }, "Root"},
		{"negative request limit", func(c *Config) { c.Store.MaxRequestBytes = -1 }, "Store.MaxRequestBytes"},
		{"request limit over 1 GiB", func(c *Config) { c.Store.MaxRequestBytes = MaxRequestBytesLimit + 1 }, "Store.MaxRequestBytes"},
		{"negative file size limit", func(c *Config) { c.Store.MaxFileSize = -1 }, "Store.MaxFileSize"},
		{"negative open files", func(c *Config) { c.Store.MaxOpenFiles = -1 }, "Store.MaxOpenFiles"},
		{"more open files than descriptors", func(c *Config) { c.Store.MaxOpenFiles = int(store.NoFileLimit()) }, "Store.MaxOpenFiles"},
		{"direct open files past the descriptors", func(c *Config) {
			c.Store.IO, c.Store.MaxOpenFiles = store.IODirect, int(store.NoFileLimit())/2
		}, "Store.MaxOpenFiles"},
		{"negative waiters per file", func(c *Config) { c.Store.MaxWaitersPerFile = -1 }, "Store.MaxWaitersPerFile"},
		{"zero stream bytes", func(c *Config) { c.MaxStreamBytes = 0 }, "MaxStreamBytes"},
		{"negative shutdown delay", func(c *Config) { c.ShutdownDelay = -time.Second }, "ShutdownDelay"},
		{"budget below one message", func(c *Config) { c.MaxInflightBytes = 1 }, "MaxInflightBytes"},
		{"unusable gRPC address", func(c *Config) { c.GRPCAddr = "256.0.0.1:0" }, ""},
		{"trace URL template without {trace_id}", func(c *Config) { c.TraceURLTemplate = "http://jaeger:16686/search" }, "TraceURLTemplate"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Root = filepath.Join(testutil.Dir(t), "root")
			cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
			tt.configure(&cfg)
			srv, err := Start(cfg)
			if err == nil {
				srv.Shutdown()
				t.Fatalf("Start succeeded, want an error")
			}
			if tt.field == "" {
				return
			}
			if ce, ok := errors.AsType[*ConfigError](err); !ok || ce.Field != tt.field {
				t.Errorf("Start = %v, want a *ConfigError of %s", err, tt.field)
			}
		})
	}
}

// TestStartTakesStoreDefaults: a store option left 0 in Config is the
// store's default, as for any user of store.Options (the daemon refuses a
// flag of 0 before it gets here).
func TestStartTakesStoreDefaults(t *testing.T) {
	d := startDaemon(t, func(c *Config) {
		c.Store.MaxRequestBytes, c.Store.MaxFileSize, c.Store.MaxOpenFiles = 0, 0, 0
	})
	got := d.srv.store.Options()
	if want := store.DefaultOptions(); got.MaxRequestBytes != want.MaxRequestBytes || got.MaxFileSize != want.MaxFileSize || got.MaxOpenFiles != want.MaxOpenFiles {
		t.Errorf("limits in force %d, %d, %d; want the store's defaults %d, %d, %d",
			got.MaxRequestBytes, got.MaxFileSize, got.MaxOpenFiles, want.MaxRequestBytes, want.MaxFileSize, want.MaxOpenFiles)
	}
	if got, want := d.srv.cfg.Store.MaxRequestBytes, store.DefaultMaxRequestBytes; got != int64(want) {
		t.Errorf("the listeners' request limit is %d, want the store's default %d", got, want)
	}
}

// TestGRPCRoundTrip calls every RPC over a real loopback connection and
// checks both the answers and the bytes on disk.
func TestGRPCRoundTrip(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	c := d.client

	w, err := c.Write(ctx, &filewritev1.WriteRequest{Path: "dir/a.bin", Data: []byte("hello")})
	if err != nil || w.GetBytesWritten() != 5 || w.GetSize() != 5 {
		t.Fatalf("Write = %v, %v; want 5 bytes written, size 5", w, err)
	}
	w, err = c.Write(ctx, &filewritev1.WriteRequest{Path: "dir/a.bin", Offset: 10, Data: []byte("world"), Sync: filewritev1.SyncMode_SYNC_MODE_DATA})
	if err != nil || w.GetSize() != 15 {
		t.Fatalf("extending Write = %v, %v; want size 15", w, err)
	}
	if _, err := c.Write(ctx, &filewritev1.WriteRequest{Path: "dir/a.bin", Data: []byte("H"), Sync: filewritev1.SyncMode_SYNC_MODE_FULL}); err != nil {
		t.Fatalf("Write with SYNC_MODE_FULL: %v", err)
	}
	want := []byte("Hello\x00\x00\x00\x00\x00world")
	if got := d.onDisk(t, "dir/a.bin"); !bytes.Equal(got, want) {
		t.Fatalf("on disk %q, want %q", got, want)
	}

	for _, tt := range []struct {
		off, length int64
		want        string
	}{
		{0, 100, string(want)},
		{12, 2, "rl"},
		{15, 10, ""},
		{1 << 30, 1, ""},
	} {
		r, err := c.Read(ctx, &filewritev1.ReadRequest{Path: "dir/a.bin", Offset: tt.off, Length: tt.length})
		if err != nil || string(r.GetData()) != tt.want {
			t.Errorf("Read(%d, %d) = %q, %v; want %q", tt.off, tt.length, r.GetData(), err, tt.want)
		}
	}

	for _, dataOnly := range []bool{true, false} {
		if _, err := c.Fsync(ctx, &filewritev1.FsyncRequest{Path: "dir/a.bin", DataOnly: dataOnly}); err != nil {
			t.Errorf("Fsync(data_only=%v): %v", dataOnly, err)
		}
	}

	st, err := c.Stat(ctx, &filewritev1.StatRequest{Path: "dir/a.bin"})
	if err != nil || st.GetSize() != 15 || st.GetBlockSize() <= 0 || st.GetAllocatedBytes() <= 0 {
		t.Fatalf("Stat = %v, %v; want size 15 and a block size and allocation", st, err)
	}
	bs := int64(st.GetBlockSize())

	if _, err := c.Truncate(ctx, &filewritev1.TruncateRequest{Path: "dir/a.bin", Size: 3}); err != nil {
		t.Fatalf("Truncate: %v", err)
	}
	if got := d.onDisk(t, "dir/a.bin"); string(got) != "Hel" {
		t.Errorf("after Truncate to 3, on disk %q, want \"Hel\"", got)
	}
	if _, err := c.Truncate(ctx, &filewritev1.TruncateRequest{Path: "new/t.bin", Size: 100}); err != nil {
		t.Fatalf("Truncate of a new file: %v", err)
	}
	if got := d.onDisk(t, "new/t.bin"); !bytes.Equal(got, make([]byte, 100)) {
		t.Errorf("a file created by Truncate to 100 holds %q, want 100 zeros", got)
	}

	// Holes and written blocks.
	if _, err := c.Write(ctx, &filewritev1.WriteRequest{Path: "holes.bin", Offset: 2 * bs, Data: bytes.Repeat([]byte{'w'}, int(bs))}); err != nil {
		t.Fatal(err)
	}
	wantExtents(t, c, "holes.bin", 0, 0, []*filewritev1.Extent{
		{Offset: 0, Length: 2 * bs, State: filewritev1.ExtentState_EXTENT_STATE_HOLE},
		{Offset: 2 * bs, Length: bs, State: filewritev1.ExtentState_EXTENT_STATE_WRITTEN},
	})
	wantExtents(t, c, "holes.bin", bs, bs+1, []*filewritev1.Extent{
		{Offset: bs, Length: bs, State: filewritev1.ExtentState_EXTENT_STATE_HOLE},
		{Offset: 2 * bs, Length: 1, State: filewritev1.ExtentState_EXTENT_STATE_WRITTEN},
	})

	// Every fallocate mode.
	fa := func(mode filewritev1.FallocateMode, off, length, wantSize int64) {
		t.Helper()
		r, err := c.Fallocate(ctx, &filewritev1.FallocateRequest{Path: "f.bin", Mode: mode, Offset: off, Length: length})
		if err != nil || r.GetSize() != wantSize {
			t.Fatalf("Fallocate(%v, %d, %d) = %v, %v; want size %d", mode, off, length, r, err, wantSize)
		}
		if fi, err := os.Stat(filepath.Join(d.root, "f.bin")); err != nil || fi.Size() != wantSize {
			t.Fatalf("after Fallocate(%v), size on disk %v (%v), want %d", mode, fi.Size(), err, wantSize)
		}
	}
	fa(filewritev1.FallocateMode_FALLOCATE_MODE_ALLOCATE, 0, 2*bs, 2*bs)
	wantExtents(t, c, "f.bin", 0, 0, []*filewritev1.Extent{
		{Offset: 0, Length: 2 * bs, State: filewritev1.ExtentState_EXTENT_STATE_UNWRITTEN},
	})
	fa(filewritev1.FallocateMode_FALLOCATE_MODE_KEEP_SIZE, 2*bs, 2*bs, 2*bs)
	if st, err := c.Stat(ctx, &filewritev1.StatRequest{Path: "f.bin"}); err != nil || st.GetAllocatedBytes() < 4*bs {
		t.Errorf("after KEEP_SIZE, Stat = %v, %v; want at least %d bytes allocated", st, err, 4*bs)
	}
	if _, err := c.Write(ctx, &filewritev1.WriteRequest{Path: "f.bin", Data: bytes.Repeat([]byte{'x'}, int(2*bs))}); err != nil {
		t.Fatal(err)
	}
	wantExtents(t, c, "f.bin", 0, 0, []*filewritev1.Extent{
		{Offset: 0, Length: 2 * bs, State: filewritev1.ExtentState_EXTENT_STATE_WRITTEN},
	})
	fa(filewritev1.FallocateMode_FALLOCATE_MODE_PUNCH_HOLE, 0, bs, 2*bs)
	fa(filewritev1.FallocateMode_FALLOCATE_MODE_ZERO_RANGE, bs, bs, 2*bs)
	wantExtents(t, c, "f.bin", 0, 0, []*filewritev1.Extent{
		{Offset: 0, Length: bs, State: filewritev1.ExtentState_EXTENT_STATE_HOLE},
		{Offset: bs, Length: bs, State: filewritev1.ExtentState_EXTENT_STATE_UNWRITTEN},
	})
	if got := d.onDisk(t, "f.bin"); !bytes.Equal(got, make([]byte, 2*bs)) {
		t.Errorf("after PUNCH_HOLE and ZERO_RANGE over the whole file, it is not all zeros")
	}
	r, err := c.Read(ctx, &filewritev1.ReadRequest{Path: "f.bin", Length: 2 * bs})
	if err != nil || !bytes.Equal(r.GetData(), make([]byte, 2*bs)) {
		t.Errorf("Read after PUNCH_HOLE and ZERO_RANGE: %d bytes, %v; want %d zeros", len(r.GetData()), err, 2*bs)
	}
}

func wantExtents(t *testing.T, c filewritev1.FileServiceClient, path string, off, length int64, want []*filewritev1.Extent) {
	t.Helper()
	r, err := c.Extents(context.Background(), &filewritev1.ExtentsRequest{Path: path, Offset: off, Length: length})
	if err != nil {
		t.Fatalf("Extents(%s, %d, %d): %v", path, off, length, err)
	}
	if !slices.EqualFunc(r.GetExtents(), want, func(a, b *filewritev1.Extent) bool { return proto.Equal(a, b) }) {
		t.Errorf("Extents(%s, %d, %d) = %v, want %v", path, off, length, r.GetExtents(), want)
	}
}

// call sends one JSON request to the gateway and decodes the answer into
// resp (nil to ignore it), returning the HTTP status.
func (d *daemon) call(t *testing.T, method, path, body string, resp proto.Message) int {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r := testutil.DoHTTP(t, method, d.url+path, rd, map[string]string{"Content-Type": "application/json"})
	if r.Status == http.StatusOK && resp != nil {
		if err := protojson.Unmarshal(r.Body, resp); err != nil {
			t.Fatalf("%s %s answered %s: %v", method, path, r.Body, err)
		}
	}
	if r.Status != http.StatusOK {
		t.Logf("%s %s: %d %s", method, path, r.Status, r.Body)
	}
	return r.Status
}

// TestHTTPRoundTrip calls every REST route with JSON over the real gateway.
func TestHTTPRoundTrip(t *testing.T) {
	d := startDaemon(t, nil)
	b64 := base64.StdEncoding.EncodeToString

	var w filewritev1.WriteResponse
	if s := d.call(t, "POST", "/v1/files/j/a.bin:write", `{"offset":"2","data":"`+b64([]byte("json"))+`","sync":"SYNC_MODE_DATA"}`, &w); s != 200 || w.GetSize() != 6 || w.GetBytesWritten() != 4 {
		t.Fatalf("POST :write = %d %v, want 200 with size 6", s, &w)
	}
	if got := d.onDisk(t, "j/a.bin"); string(got) != "\x00\x00json" {
		t.Errorf("on disk %q, want \"\\x00\\x00json\"", got)
	}
	var r filewritev1.ReadResponse
	if s := d.call(t, "GET", "/v1/files/j/a.bin:read?offset=2&length=10", "", &r); s != 200 || string(r.GetData()) != "json" {
		t.Errorf("GET :read = %d %q, want 200 \"json\"", s, r.GetData())
	}
	if s := d.call(t, "POST", "/v1/files/j/a.bin:fsync", `{"dataOnly":true}`, nil); s != 200 {
		t.Errorf("POST :fsync = %d, want 200", s)
	}
	if s := d.call(t, "POST", "/v1/files/j/a.bin:fsync", `{}`, nil); s != 200 {
		t.Errorf("POST :fsync without a body field = %d, want 200", s)
	}
	var st filewritev1.StatResponse
	if s := d.call(t, "GET", "/v1/files/j/a.bin", "", &st); s != 200 || st.GetSize() != 6 || st.GetBlockSize() <= 0 {
		t.Errorf("GET stat = %d %v, want 200 with size 6", s, &st)
	}
	bs := int64(st.GetBlockSize())
	if s := d.call(t, "POST", "/v1/files/j/a.bin:truncate", `{"size":"4"}`, nil); s != 200 {
		t.Errorf("POST :truncate = %d, want 200", s)
	}
	if got := d.onDisk(t, "j/a.bin"); string(got) != "\x00\x00js" {
		t.Errorf("after :truncate to 4, on disk %q", got)
	}
	var fa filewritev1.FallocateResponse
	body := fmt.Sprintf(`{"mode":"FALLOCATE_MODE_ALLOCATE","offset":"0","length":"%d"}`, 2*bs)
	if s := d.call(t, "POST", "/v1/files/j/f.bin:fallocate", body, &fa); s != 200 || fa.GetSize() != 2*bs {
		t.Errorf("POST :fallocate = %d %v, want 200 with size %d", s, &fa, 2*bs)
	}
	var ex filewritev1.ExtentsResponse
	want := []*filewritev1.Extent{{Offset: 0, Length: 2 * bs, State: filewritev1.ExtentState_EXTENT_STATE_UNWRITTEN}}
	if s := d.call(t, "GET", "/v1/files/j/f.bin:extents", "", &ex); s != 200 ||
		!slices.EqualFunc(ex.GetExtents(), want, func(a, b *filewritev1.Extent) bool { return proto.Equal(a, b) }) {
		t.Errorf("GET :extents = %d %v, want 200 %v", s, ex.GetExtents(), want)
	}
}

// TestRawRoundTrip writes every byte value with the raw PUT and reads it
// back raw, over gRPC, and from the disk, byte for byte.
func TestRawRoundTrip(t *testing.T) {
	d := startDaemon(t, nil)
	data := testutil.AllBytes(256*64 + 5)
	octet := map[string]string{"Content-Type": gateway.MIMEOctetStream}

	if r := testutil.DoHTTP(t, "PUT", d.url+"/v1/files/raw/all.bin?sync=data", bytes.NewReader(data), octet); r.Status != 201 {
		t.Fatalf("PUT: %d %s, want 201 (it creates the file)", r.Status, r.Body)
	}
	// An overwrite in the middle, at an offset.
	patch := testutil.AllBytes(256)
	slices.Reverse(patch)
	if r := testutil.DoHTTP(t, "PUT", d.url+"/v1/files/raw/all.bin?offset=1000&sync=full", bytes.NewReader(patch), octet); r.Status != 200 {
		t.Fatalf("PUT at offset 1000: %d %s, want 200", r.Status, r.Body)
	}
	copy(data[1000:], patch)

	r := testutil.DoHTTP(t, "GET", d.url+fmt.Sprintf("/v1/files/raw/all.bin:read?length=%d", len(data)+10), nil,
		map[string]string{"Accept": gateway.MIMEOctetStream})
	if r.Status != 200 || r.ContentType != gateway.MIMEOctetStream {
		t.Fatalf("raw read: %d %q, want 200 %s", r.Status, r.ContentType, gateway.MIMEOctetStream)
	}
	if !bytes.Equal(r.Body, data) {
		t.Errorf("raw read: %d bytes that differ from the %d written", len(r.Body), len(data))
	}
	g, err := d.client.Read(testContext(t), &filewritev1.ReadRequest{Path: "raw/all.bin", Length: int64(len(data))})
	if err != nil || !bytes.Equal(g.GetData(), data) {
		t.Errorf("gRPC read of the raw write: %d bytes, %v; want the %d written", len(g.GetData()), err, len(data))
	}
	if got := d.onDisk(t, "raw/all.bin"); !bytes.Equal(got, data) {
		t.Errorf("on disk: %d bytes that differ from the %d written", len(got), len(data))
	}
}

// TestGRPCOnUnixSocket: --grpc-addr unix:PATH serves gRPC on a unix socket,
// the gateway reaches it there, a socket file left by a dead daemon is
// replaced, and one a live daemon answers on is not.
func TestGRPCOnUnixSocket(t *testing.T) {
	dir := testutil.Dir(t)
	sock := filepath.Join(dir, "grpc.sock")
	// A dead daemon's socket: bound, then left behind.
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()

	d := startDaemon(t, func(c *Config) { c.GRPCAddr = "unix:" + sock })
	ctx := testContext(t)
	conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := filewritev1.NewFileServiceClient(conn)
	if _, err := client.Write(ctx, &filewritev1.WriteRequest{Path: "unix/f", Data: []byte("over a unix socket")}); err != nil {
		t.Fatalf("Write over the unix socket: %v", err)
	}
	resp, err := http.Get(d.url + "/v1/files/unix/f:read?offset=0&length=100")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), base64.StdEncoding.EncodeToString([]byte("over a unix socket"))) {
		t.Errorf("Read through the gateway: %s %s", resp.Status, body)
	}

	cfg := DefaultConfig()
	cfg.Root = filepath.Join(dir, "root2")
	cfg.GRPCAddr = "unix:" + sock
	cfg.HTTPAddr = ""
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if srv, err := Start(cfg); err == nil {
		srv.Shutdown()
		t.Fatal("a second daemon started on the socket of a live one")
	}
}
