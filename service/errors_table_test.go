package service

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/internal/shard"
	"github.com/filewrite/filewrite/internal/streamwire"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/gateway"
	"github.com/filewrite/filewrite/service/internal/status"
	"github.com/filewrite/filewrite/store/faultfs"
)

// docReason is one row of a reason table in docs/errors.md.
type docReason struct {
	reason   string
	code     codes.Code
	http     int
	retry    bool     // "yes": a RetryInfo, and Retry-After over REST
	required []string // metadata keys always present
	optional []string // metadata keys in parentheses
}

// readErrorsDoc parses the tables of docs/errors.md: the reasons the
// daemon returns, and those reserved (a "### Reserved" table, when some
// are).
func readErrorsDoc(t *testing.T) (returned, reserved []docReason) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", "errors.md"))
	if err != nil {
		t.Fatal(err)
	}
	inReserved := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "### Reserved") {
			inReserved = true
		}
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cols := strings.Split(strings.Trim(line, "|"), "|")
		if len(cols) != 6 {
			t.Fatalf("docs/errors.md: %d columns, want 6: %s", len(cols), line)
		}
		for i := range cols {
			cols[i] = strings.TrimSpace(cols[i])
		}
		var r docReason
		r.reason = strings.Trim(cols[0], "`")
		if err := r.code.UnmarshalJSON([]byte(strconv.Quote(cols[1]))); err != nil {
			t.Fatalf("docs/errors.md: code %q of %s: %v", cols[1], r.reason, err)
		}
		if r.http, err = strconv.Atoi(regexp.MustCompile(`^\d+`).FindString(cols[2])); err != nil {
			t.Fatalf("docs/errors.md: HTTP status %q of %s", cols[2], r.reason)
		}
		r.retry = strings.HasPrefix(cols[3], "yes")
		optional := false
		for _, key := range strings.Split(cols[4], ",") {
			key = strings.TrimSpace(key)
			if strings.HasPrefix(key, "(") {
				optional = true
			}
			name := strings.Trim(key, "()")
			switch {
			case name == "":
			case optional:
				r.optional = append(r.optional, name)
			default:
				r.required = append(r.required, name)
			}
			if strings.HasSuffix(key, ")") {
				optional = false
			}
		}
		if inReserved {
			reserved = append(reserved, r)
		} else {
			returned = append(returned, r)
		}
	}
	if len(returned) == 0 {
		t.Fatal("docs/errors.md: no reason the daemon returns found")
	}
	return returned, reserved
}

// restResult is a REST answer as a client sees it.
type restResult struct {
	status     int
	retryAfter string
	body       []byte
}

// errorsEnv is the daemons the refusals of the table are provoked on.
type errorsEnv struct {
	d    *daemon // limits, faults, and a write to held.bin held in the store
	ffs  *faultfs.FS
	gate *writeGate
	// lim allows one open file and one waiter, and holds a write to
	// busy.bin with another queued behind it.
	lim     *daemon
	limGate *writeGate
	auth    *daemon // with a token file
	body    *daemon // with a short --body-timeout
}

const (
	errorsMaxRequest = 4096
	errorsMaxFile    = 1 << 20
	errorsToken      = "errors-table-token"
	errorsScoped     = "errors-scoped-token"
)

func startErrorsEnv(t *testing.T) *errorsEnv {
	env := &errorsEnv{gate: newWriteGate("held.bin"), limGate: newWriteGate("busy.bin")}
	var ffs **faultfs.FS
	env.d = startDaemon(t, func(c *Config) {
		c.Store.MaxRequestBytes = errorsMaxRequest
		c.Store.MaxFileSize = errorsMaxFile
		c.Store.Hooks = env.gate.hooks()
		c.MaxFilesPerStream = 1
		ffs = withFaultFS(c)
	})
	env.ffs = *ffs
	t.Cleanup(env.gate.open) // before the daemon's Shutdown, which waits for it
	env.lim = startDaemon(t, func(c *Config) {
		c.Store.MaxOpenFiles = 1
		c.Store.MaxWaitersPerFile = 1
		c.Store.Hooks = env.limGate.hooks()
	})
	t.Cleanup(env.limGate.open)
	tokens := testutil.WriteTokenFile(t, t.TempDir(), "tokens", errorsToken, errorsScoped+" name=scoped prefix=mine/")
	env.auth = startDaemon(t, func(c *Config) { c.AuthTokenFile = tokens })
	env.body = startDaemon(t, func(c *Config) { c.BodyTimeout = 200 * time.Millisecond })

	ctx := testContext(t)
	d := env.d
	for _, p := range []string{"existing", "other", "dir/f", "badsync", "nofalloc"} {
		if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: p, Data: []byte("contents")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(d.root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(d.dir, filepath.Join(d.root, "escape")); err != nil {
		t.Fatal(err)
	}
	env.ffs.Inject(faultfs.Rule{Op: faultfs.OpOpen, Path: "nodesc", Err: syscall.EMFILE})
	env.ffs.Inject(faultfs.Rule{Op: faultfs.OpWrite, Path: "full", Err: syscall.ENOSPC})
	env.ffs.Inject(faultfs.Rule{Op: faultfs.OpWrite, Path: "eio", Err: syscall.EIO})
	badSync := env.ffs.Inject(faultfs.Rule{Op: faultfs.OpSync, Path: "badsync", Err: syscall.EIO})
	t.Cleanup(func() {
		// Before the daemon's Shutdown, whose sync of badsync would
		// report the failure again until a later sync succeeds.
		badSync.Remove()
		env.d.client.Fsync(context.Background(), &filewritev1.FsyncRequest{Path: "badsync"})
	})
	env.ffs.Inject(faultfs.Rule{Op: faultfs.OpFallocate, Path: "nofalloc", Err: syscall.EOPNOTSUPP})

	// A write held in held.bin's lock, for requests to wait behind.
	go d.client.Write(ctx, &filewritev1.WriteRequest{Path: "held.bin", Data: []byte("held")})
	env.gate.waitEntered(t, ctx)

	// busy.bin: the one open file, in use, and one request queued for it.
	lim := env.lim
	go lim.client.Write(ctx, &filewritev1.WriteRequest{Path: "busy.bin", Data: []byte("busy")})
	env.limGate.waitEntered(t, ctx)
	go lim.client.Write(ctx, &filewritev1.WriteRequest{Path: "busy.bin", Offset: 100, Data: []byte("queued")})
	for lim.waiting("busy.bin") < 1 {
		time.Sleep(time.Millisecond)
	}
	return env
}

// rest sends one request to d's gateway.
func (d *daemon) rest(t *testing.T, method, path, body string, header map[string]string) restResult {
	t.Helper()
	req, err := http.NewRequest(method, d.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" && header["Content-Type"] == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	if h := header["Host"]; h != "" {
		req.Host = h // Go sends req.Host, never a Host header
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return restResult{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: b}
}

var octetHeader = map[string]string{"Content-Type": gateway.MIMEOctetStream}

// firstStreamError runs a WriteStream of msgs on c and returns the first write
// error an ack carries, or else the status the stream ends with. before,
// if set, runs once the first message's writes are acked.
func firstStreamError(ctx context.Context, c filewritev1.FileServiceClient, before func(), msgs ...*filewritev1.WriteStreamRequest) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.WriteStream(ctx)
	if err != nil {
		return err
	}
	for i, m := range msgs {
		if err := stream.Send(m); err != nil {
			break
		}
		if i == 0 && before != nil {
			for acked := 0; acked < len(m.GetWrites()); {
				resp, err := stream.Recv()
				if err != nil {
					return err
				}
				acked += len(resp.GetAcks())
			}
			before()
		}
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		for _, f := range resp.GetFiles() {
			if f.GetStatus().GetCode() != 0 {
				return grpcstatus.ErrorProto(f.GetStatus())
			}
		}
		for _, a := range resp.GetAcks() {
			if a.GetStatus().GetCode() != 0 {
				return grpcstatus.ErrorProto(a.GetStatus())
			}
		}
	}
}

// errorScenario provokes one reason: over gRPC, over REST, or both. A
// transport without a way to provoke it is nil, and says why in skip.
type errorScenario struct {
	grpc func(t *testing.T, env *errorsEnv, ctx context.Context) error
	rest func(t *testing.T, env *errorsEnv) restResult
	skip string
}

func errorScenarios() map[string]errorScenario {
	write := func(path string, off int64, data string) func(*testing.T, *errorsEnv, context.Context) error {
		return func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
			_, err := env.d.client.Write(ctx, &filewritev1.WriteRequest{Path: path, Offset: off, Data: []byte(data)})
			return err
		}
	}
	put := func(path, body string) func(*testing.T, *errorsEnv) restResult {
		return func(t *testing.T, env *errorsEnv) restResult {
			return env.d.rest(t, "PUT", "/v1/files/"+path, body, octetHeader)
		}
	}
	get := func(path string) func(*testing.T, *errorsEnv) restResult {
		return func(t *testing.T, env *errorsEnv) restResult { return env.d.rest(t, "GET", path, "", nil) }
	}
	stat := func(path string) func(*testing.T, *errorsEnv, context.Context) error {
		return func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
			_, err := env.d.client.Stat(ctx, &filewritev1.StatRequest{Path: path})
			return err
		}
	}
	sw := func(id uint64, off int64, data string) *filewritev1.StreamWrite {
		return &filewritev1.StreamWrite{Id: id, Offset: off, Data: []byte(data)}
	}
	long := strings.Repeat("n", 256)
	return map[string]errorScenario{
		"PATH_INVALID":      {grpc: write("a/../b", 0, "x"), rest: get("/v1/files/%ff")},
		"PATH_TOO_LONG":     {grpc: stat(long), rest: get("/v1/files/" + long)},
		"PATH_ESCAPES_ROOT": {grpc: stat("escape/root/existing"), rest: get("/v1/files/escape/root/existing")},
		"IS_A_DIRECTORY":    {grpc: write("dir", 0, "x"), rest: put("dir", "x")},
		// Stat of a FIFO answers; writing one is what is refused.
		"NOT_A_REGULAR_FILE": {grpc: write("fifo", 0, "x"), rest: put("fifo", "x")},
		"RANGE_INVALID": {
			grpc: func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
				_, err := env.d.client.Truncate(ctx, &filewritev1.TruncateRequest{Path: "existing", Size: -1})
				return err
			},
			rest: func(t *testing.T, env *errorsEnv) restResult {
				return env.d.rest(t, "POST", "/v1/files/existing:truncate", `{"size":"-1"}`, nil)
			},
		},
		"MODE_INVALID": {
			grpc: func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
				_, err := env.d.client.Fallocate(ctx, &filewritev1.FallocateRequest{Path: "existing", Length: 4096})
				return err
			},
			rest: put("existing?sync=sometimes", "x"),
		},
		"PAGE_INVALID": {
			grpc: func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
				_, err := env.d.client.List(ctx, &filewritev1.ListRequest{PageSize: -1})
				return err
			},
			rest: get("/v1/files/existing:extents?page_token=bogus"),
		},
		"REQUEST_MALFORMED": {
			grpc: func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
				var resp []byte
				return env.d.conn.Invoke(ctx, filewritev1.FileService_Write_FullMethodName, &malformedRequests[0].wire, &resp, grpc.ForceCodecV2(wireCodec{}))
			},
			rest: func(t *testing.T, env *errorsEnv) restResult {
				return env.d.rest(t, "POST", "/v1/files/existing:write", "not JSON", nil)
			},
		},
		"REQUEST_TOO_LARGE": {
			grpc: func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
				_, err := env.d.client.Read(ctx, &filewritev1.ReadRequest{Path: "existing", Length: errorsMaxRequest + 1})
				return err
			},
			// A raw append is one Write (a PUT's body goes in pieces).
			rest: func(t *testing.T, env *errorsEnv) restResult {
				return env.d.rest(t, "POST", "/v1/files/big:append", strings.Repeat("x", errorsMaxRequest+1), octetHeader)
			},
		},
		"CRC_MISMATCH": {
			grpc: func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
				w := sw(1, 0, "data")
				w.Crc32C = new(uint32)
				return firstStreamError(ctx, env.d.client, nil, &filewritev1.WriteStreamRequest{Path: "crc", Writes: []*filewritev1.StreamWrite{w}})
			},
			rest: func(t *testing.T, env *errorsEnv) restResult {
				return env.d.rest(t, "PUT", "/v1/files/crc", "data", map[string]string{"Content-Digest": "crc32c=:AAAAAA==:", "Content-Type": gateway.MIMEOctetStream})
			},
		},
		"TOO_MANY_WRITES_IN_MESSAGE": {
			grpc: func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
				ws := make([]*filewritev1.StreamWrite, streamwire.MaxWritesPerMessage+1)
				for i := range ws {
					ws[i] = &filewritev1.StreamWrite{Id: uint64(i)}
				}
				return firstStreamError(ctx, env.d.client, nil, &filewritev1.WriteStreamRequest{Path: "many", Writes: ws})
			},
			skip: "WriteStream only",
		},
		"WRITE_ID_IN_USE": {
			grpc: func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
				return firstStreamError(ctx, env.d.client, nil, &filewritev1.WriteStreamRequest{Path: "ids",
					Writes: []*filewritev1.StreamWrite{sw(7, 0, "a"), sw(7, 1, "b")}})
			},
			skip: "WriteStream only",
		},
		"STREAM_PATH_CHANGED": {
			grpc: func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
				return firstStreamError(ctx, env.d.client, nil,
					&filewritev1.WriteStreamRequest{Path: "s1", Writes: []*filewritev1.StreamWrite{sw(1, 0, "a")}},
					&filewritev1.WriteStreamRequest{Path: "s2", Writes: []*filewritev1.StreamWrite{sw(2, 0, "b")}})
			},
			skip: "WriteStream only",
		},
		"APPEND_OFFSET_MISMATCH": {
			grpc: func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
				off := int64(999999)
				_, err := env.d.client.Append(ctx, &filewritev1.AppendRequest{Path: "existing", Data: []byte("x"), ExpectedOffset: &off})
				return err
			},
			rest: func(t *testing.T, env *errorsEnv) restResult {
				return env.d.rest(t, "POST", "/v1/files/existing:append?expected_offset=999999", "x", octetHeader)
			},
		},
		"APPEND_ID_REUSED": {
			grpc: func(t *testing.T, env *errorsEnv, ctx context.Context) error {
				if _, err := env.d.client.Append(ctx, &filewritev1.AppendRequest{Path: "log", Data: []byte("first"), AppendId: "grpc-1"}); err != nil {
					t.Fatal(err)
				}
				_, err := env.d.client.Append(ctx, &filewritev1.AppendRequest{Path: "log", Data: []byte("other"), AppendId: "grpc-1"})
				return err
			},
			rest: func(t *testing.T, env *errorsEnv) restResult {
				if r := env.d.rest(t, "POST", "/v1/files/log:append?append_id=rest-1", "first", octetHeader); r.status != http.StatusOK {
					t.Fatalf("first append: %d %s", r.status, r.body)
				}
				return env.d.rest(t, "POST", "/v1/files/log:append", `{"data":"b3RoZXI=","appendId":"rest-1"}`, nil)
			},
		},
		"PATH_HEADER_MISMATCH": {
			grpc: func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
				_, err := env.d.client.Write(withPathHeader(ctx, "other"), &filewritev1.WriteRequest{Path: "routed", Data: []byte("x")})
				return err
			},
			rest: func(t *testing.T, env *errorsEnv) restResult {
				return env.d.rest(t, "PUT", "/v1/files/routed", "x", map[string]string{"Content-Type": gateway.MIMEOctetStream, shard.Header: "other"})
			},
		},
		"FILE_TOO_LARGE": {grpc: write("big", errorsMaxFile, "x"), rest: put(fmt.Sprintf("big?offset=%d", errorsMaxFile-1), "xy")},
		"FILE_NOT_FOUND": {grpc: stat("missing"), rest: get("/v1/files/missing")},
		"TOO_MANY_FILES_ON_STREAM": {
			grpc: func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
				return firstStreamError(ctx, env.d.client, nil, &filewritev1.WriteStreamRequest{Files: []*filewritev1.StreamFile{
					{Index: 1, Path: "one-of-many"}, {Index: 2, Path: "two-of-many"},
				}})
			},
			skip: "WriteStream only",
		},
		"FILE_DELETED": {
			grpc: func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
				return firstStreamError(ctx, env.d.client, func() {
					env.d.client.Delete(ctx, &filewritev1.DeleteRequest{Path: "doomed"})
				}, &filewritev1.WriteStreamRequest{Path: "doomed", Writes: []*filewritev1.StreamWrite{sw(1, 0, "a")}})
			},
			skip: "WriteStream only",
		},
		"ALREADY_EXISTS": {
			grpc: func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
				_, err := env.d.client.Rename(ctx, &filewritev1.RenameRequest{Path: "existing", NewPath: "other", NoReplace: true})
				return err
			},
			rest: func(t *testing.T, env *errorsEnv) restResult {
				return env.d.rest(t, "POST", "/v1/files/existing:rename", `{"newPath":"other","noReplace":true}`, nil)
			},
		},
		"TOO_MANY_OPEN_FILES": {
			grpc: func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
				_, err := env.lim.client.Write(ctx, &filewritev1.WriteRequest{Path: "another.bin", Data: []byte("x")})
				return err
			},
			rest: func(t *testing.T, env *errorsEnv) restResult {
				return env.lim.rest(t, "PUT", "/v1/files/another.bin", "x", octetHeader)
			},
		},
		"TOO_MANY_WAITERS": {
			grpc: func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
				_, err := env.lim.client.Write(ctx, &filewritev1.WriteRequest{Path: "busy.bin", Offset: 200, Data: []byte("x")})
				return err
			},
			rest: func(t *testing.T, env *errorsEnv) restResult {
				return env.lim.rest(t, "PUT", "/v1/files/busy.bin?offset=200", "x", octetHeader)
			},
		},
		"NO_DESCRIPTORS": {grpc: write("nodesc", 0, "x"), rest: put("nodesc", "x")},
		"NO_SPACE":       {grpc: write("full", 0, "x"), rest: put("full", "x")},
		"UNSUPPORTED_BY_FILESYSTEM": {
			grpc: func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
				_, err := env.d.client.Fallocate(ctx, &filewritev1.FallocateRequest{Path: "nofalloc",
					Mode: filewritev1.FallocateMode_FALLOCATE_MODE_ALLOCATE, Length: 4096})
				return err
			},
			rest: func(t *testing.T, env *errorsEnv) restResult {
				return env.d.rest(t, "POST", "/v1/files/nofalloc:fallocate", `{"mode":"FALLOCATE_MODE_ALLOCATE","length":"4096"}`, nil)
			},
		},
		"SYNC_FAILED": {
			grpc: func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
				_, err := env.d.client.Fsync(ctx, &filewritev1.FsyncRequest{Path: "badsync"})
				return err
			},
			rest: func(t *testing.T, env *errorsEnv) restResult {
				return env.d.rest(t, "POST", "/v1/files/badsync:fsync", `{}`, nil)
			},
		},
		"FILE_REMOVED_OUTSIDE": {
			grpc: func(t *testing.T, env *errorsEnv, ctx context.Context) error {
				env.removeOutside(t, ctx, "removed")
				_, err := env.d.client.Write(ctx, &filewritev1.WriteRequest{Path: "removed", Data: []byte("lost"),
					Sync: filewritev1.SyncMode_SYNC_MODE_DATA})
				return err
			},
			rest: func(t *testing.T, env *errorsEnv) restResult {
				env.removeOutside(t, testContext(t), "removed")
				return env.d.rest(t, "PUT", "/v1/files/removed?sync=data", "lost", octetHeader)
			},
		},
		"FILE_CHANGED_OUTSIDE": {
			grpc: func(t *testing.T, env *errorsEnv, ctx context.Context) error {
				env.cutOutside(t, ctx, "cut-grpc")
				_, err := env.d.client.Stat(ctx, &filewritev1.StatRequest{Path: "cut-grpc"})
				return err
			},
			rest: func(t *testing.T, env *errorsEnv) restResult {
				env.cutOutside(t, testContext(t), "cut-rest")
				return env.d.rest(t, "POST", "/v1/files/cut-rest:fsync", `{}`, nil)
			},
		},
		"IO_ERROR":      {grpc: write("eio", 0, "x"), rest: put("eio", "x")},
		"TOKEN_MISSING": {grpc: authCall(""), rest: authREST("")},
		"TOKEN_INVALID": {grpc: authCall("Bearer wrong"), rest: authREST("Bearer wrong")},
		// Stat of "x", outside the scoped token's prefix.
		"PERMISSION_DENIED_SCOPE": {grpc: authCall("Bearer " + errorsScoped), rest: authREST("Bearer " + errorsScoped)},
		"TOKEN_REVOKED":           {skip: "a reload must fall between a call's admission and its check; TestScopedStreamReload ends a stream with it"},
		"SHUTTING_DOWN": {
			grpc: func(t *testing.T, env *errorsEnv, ctx context.Context) error {
				d := startDaemon(t, nil)
				return firstStreamError(ctx, d.client, func() { go d.srv.Shutdown() },
					&filewritev1.WriteStreamRequest{Path: "draining", Writes: []*filewritev1.StreamWrite{sw(1, 0, "a")}})
			},
			skip: "the HTTP server stops taking requests when the drain begins",
		},
		"STREAM_IDLE": {
			grpc: func(t *testing.T, env *errorsEnv, ctx context.Context) error {
				d := startDaemon(t, func(c *Config) { c.StreamIdleTimeout = 20 * time.Millisecond })
				return firstStreamError(ctx, d.client, nil,
					&filewritev1.WriteStreamRequest{Path: "idle", Writes: []*filewritev1.StreamWrite{sw(1, 0, "a")}})
			},
			skip: "WriteStream only",
		},
		"PRECONDITION_FAILED": {
			grpc: func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
				_, err := env.d.client.Write(ctx, &filewritev1.WriteRequest{Path: "existing", Data: []byte("x"), IfGenerationMatch: new(int64)})
				return err
			},
			rest: func(t *testing.T, env *errorsEnv) restResult {
				return env.d.rest(t, "PUT", "/v1/files/existing", "x", map[string]string{"If-None-Match": "*", "Content-Type": gateway.MIMEOctetStream})
			},
		},
		"ETAG_MISMATCH": {
			grpc: func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
				other := int64(1234)
				_, err := env.d.client.Truncate(ctx, &filewritev1.TruncateRequest{Path: "existing", Size: 1, IfGenerationMatch: &other})
				return err
			},
			rest: func(t *testing.T, env *errorsEnv) restResult {
				return env.d.rest(t, "GET", "/v1/files/existing?alt=media", "", map[string]string{"If-Match": `"1234"`})
			},
		},
		"RANGE_NOT_SATISFIABLE": {
			rest: func(t *testing.T, env *errorsEnv) restResult {
				return env.d.rest(t, "GET", "/v1/files/existing?alt=media", "", map[string]string{"Range": "bytes=999-"})
			},
			skip: "downloads only",
		},
		"ORIGIN_NOT_ALLOWED": {
			rest: func(t *testing.T, env *errorsEnv) restResult {
				return env.d.rest(t, "GET", "/v1/dirs", "", map[string]string{"Origin": "http://evil.example"})
			},
			skip: "REST only",
		},
		"HOST_NOT_ALLOWED": {
			rest: func(t *testing.T, env *errorsEnv) restResult {
				return env.d.rest(t, "GET", "/v1/dirs", "", map[string]string{"Host": "rebound.example"})
			},
			skip: "REST only",
		},
		"METHOD_NOT_ALLOWED": {
			rest: func(t *testing.T, env *errorsEnv) restResult {
				return env.d.rest(t, "GET", "/v1/files/existing:truncate", "", nil)
			},
			skip: "REST only",
		},
		"ROUTE_NOT_FOUND": {
			rest: func(t *testing.T, env *errorsEnv) restResult {
				return env.d.rest(t, "GET", "/v1/nothing/here", "", nil)
			},
			skip: "REST only",
		},
		"CANCELLED": {skip: "the caller's own cancellation ends its call before the daemon's answer arrives (TestToStatus)"},
		"DEADLINE_EXCEEDED": {
			rest: func(t *testing.T, env *errorsEnv) restResult {
				// Waits behind the held write for held.bin's lock.
				return env.d.rest(t, "PUT", "/v1/files/held.bin", "late", map[string]string{
					"Content-Type": gateway.MIMEOctetStream, "Grpc-Timeout": "100m"})
			},
			skip: "a gRPC client's own deadline ends its call first",
		},
		"INFLIGHT_BUDGET": {skip: "a caller's deadline ends its call as the daemon gives up waiting (TestToStatus)"},
		"BODY_TIMEOUT": {
			rest: func(t *testing.T, env *errorsEnv) restResult {
				resp, err := rawRequest(strings.TrimPrefix(env.body.url, "http://"),
					"PUT /v1/files/stalled HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: 100\r\n\r\n", nil, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return restResult{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: b}
			},
			skip: "REST only",
		},
	}
}

// removeOutside writes name through the daemon and removes it behind its
// back, so that its next sync finds it gone.
func (env *errorsEnv) removeOutside(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if _, err := env.d.client.Write(ctx, &filewritev1.WriteRequest{Path: name, Data: []byte("first")}); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(env.d.root, name)); err != nil {
		t.Fatal(err)
	}
}

// cutOutside writes name and truncates it from outside the daemon.
func (env *errorsEnv) cutOutside(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if _, err := env.d.client.Write(ctx, &filewritev1.WriteRequest{Path: name, Data: make([]byte, 4000)}); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(env.d.root, name), 10); err != nil {
		t.Fatal(err)
	}
}

func authCall(authorization string) func(*testing.T, *errorsEnv, context.Context) error {
	return func(_ *testing.T, env *errorsEnv, ctx context.Context) error {
		if authorization != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", authorization)
		}
		_, err := env.auth.client.Stat(ctx, &filewritev1.StatRequest{Path: "x"})
		return err
	}
}

func authREST(authorization string) func(*testing.T, *errorsEnv) restResult {
	return func(t *testing.T, env *errorsEnv) restResult {
		h := map[string]string{}
		if authorization != "" {
			h["Authorization"] = authorization
		}
		return env.auth.rest(t, "GET", "/v1/files/x", "", h)
	}
}

// TestErrorsTable: docs/errors.md lists every ErrorReason once; each
// reason it says the daemon returns is one the daemon's table
// (status.Rules) has, with the same code and retry advice, and none it
// reserves is; and each is provoked on a running daemon, over gRPC and
// over REST where it has a route, answering with the code, HTTP status,
// metadata keys, BadRequest and RetryInfo (Retry-After) its row says.
func TestErrorsTable(t *testing.T) {
	returned, reserved := readErrorsDoc(t)
	seen := map[string]bool{}
	for _, r := range slices.Concat(returned, reserved) {
		if _, ok := filewritev1.ErrorReason_value[r.reason]; !ok {
			t.Errorf("docs/errors.md: %s is no ErrorReason", r.reason)
		}
		if seen[r.reason] {
			t.Errorf("docs/errors.md: %s listed twice", r.reason)
		}
		seen[r.reason] = true
	}
	for name, v := range filewritev1.ErrorReason_value {
		if v != 0 && !seen[name] {
			t.Errorf("docs/errors.md does not list ErrorReason %s", name)
		}
	}
	for _, r := range reserved {
		if _, ok := status.Rules[filewritev1.ErrorReason(filewritev1.ErrorReason_value[r.reason])]; ok {
			t.Errorf("docs/errors.md: %s is listed as reserved, but the daemon returns it", r.reason)
		}
	}
	for reason := range status.Rules {
		if !slices.ContainsFunc(returned, func(r docReason) bool { return r.reason == reason.String() }) {
			t.Errorf("the daemon returns %s, but docs/errors.md does not list it as returned", reason)
		}
	}

	env := startErrorsEnv(t)
	scenarios := errorScenarios()
	for _, row := range returned {
		t.Run(row.reason, func(t *testing.T) {
			rule, ok := status.Rules[filewritev1.ErrorReason(filewritev1.ErrorReason_value[row.reason])]
			if !ok {
				t.Fatalf("documented as returned, but the daemon has no rule for it")
			}
			if rule.Code != row.code || (rule.Retry > 0) != row.retry {
				t.Errorf("the daemon's rule is %v, retry %v; docs/errors.md says %v, retry %v", rule.Code, rule.Retry, row.code, row.retry)
			}
			sc, ok := scenarios[row.reason]
			if !ok {
				t.Fatalf("no scenario provokes it: add one to errorScenarios")
			}
			if sc.grpc == nil && sc.rest == nil {
				t.Logf("not provoked over either transport: %s", sc.skip)
			}
			if sc.grpc != nil {
				err := sc.grpc(t, env, testContext(t))
				st, ok := grpcstatus.FromError(err)
				if !ok || err == nil {
					t.Fatalf("gRPC: %v, want a status", err)
				}
				checkDocumentedStatus(t, "gRPC", row, st.Proto())
			}
			if sc.rest != nil {
				res := sc.rest(t, env)
				if res.status != row.http {
					t.Errorf("REST: HTTP %d, want %d (%s)", res.status, row.http, res.body)
				}
				if (res.retryAfter != "") != row.retry {
					t.Errorf("REST: Retry-After %q, want one: %v", res.retryAfter, row.retry)
				}
				var st spb.Status
				if err := protojson.Unmarshal(res.body, &st); err != nil {
					t.Fatalf("REST: body %s is no google.rpc.Status: %v", res.body, err)
				}
				checkDocumentedStatus(t, "REST", row, &st)
			}
		})
	}
}

// checkDocumentedStatus checks st against its row of docs/errors.md.
func checkDocumentedStatus(t *testing.T, via string, row docReason, st *spb.Status) {
	t.Helper()
	s := grpcstatus.FromProto(st)
	if s.Code() != row.code {
		t.Errorf("%s: code %v (%s), want %v", via, s.Code(), s.Message(), row.code)
	}
	info := errorinfo.From(s.Err())
	if info.GetReason() != row.reason || info.GetDomain() != errorinfo.Domain {
		t.Fatalf("%s: ErrorInfo %v (%s), want reason %s of domain %s", via, info, s.Message(), row.reason, errorinfo.Domain)
	}
	md := info.GetMetadata()
	for _, k := range row.required {
		if md[k] == "" {
			t.Errorf("%s: metadata %v lacks %q", via, md, k)
		}
	}
	for k := range md {
		if !slices.Contains(row.required, k) && !slices.Contains(row.optional, k) {
			t.Errorf("%s: metadata key %q is not documented", via, k)
		}
	}
	if flag := md[errorinfo.KeyFlag]; flag != "" && !strings.Contains(s.Message(), flag) {
		t.Errorf("%s: message %q does not name the flag %s", via, s.Message(), flag)
	}
	var field string
	var retry bool
	for _, d := range s.Details() {
		switch d := d.(type) {
		case *errdetails.BadRequest:
			field = d.GetFieldViolations()[0].GetField()
		case *errdetails.RetryInfo:
			retry = d.GetRetryDelay().AsDuration() > 0
		}
	}
	if want := md[errorinfo.KeyField]; row.code == codes.InvalidArgument && field != want {
		t.Errorf("%s: BadRequest field %q, want %q", via, field, want)
	}
	if retry != row.retry {
		t.Errorf("%s: RetryInfo given: %v, want %v", via, retry, row.retry)
	}
}

// TestStreamMessageOverTransportLimit: a WriteStream message over gRPC's
// own limit (twice --max-request-bytes plus 64 KiB) ends the stream with
// gRPC's RESOURCE_EXHAUSTED and no reason: grpc-go writes that status
// itself as the message arrives, before the daemon's code can answer, as
// docs/errors.md says under "Statuses without a reason".
func TestStreamMessageOverTransportLimit(t *testing.T) {
	d := startDaemon(t, func(c *Config) { c.Store.MaxRequestBytes = errorsMaxRequest })
	ctx := testContext(t)
	big := make([]byte, transportRecvBytes(errorsMaxRequest)+1)
	err := firstStreamError(ctx, d.client, nil, &filewritev1.WriteStreamRequest{Path: "big",
		Writes: []*filewritev1.StreamWrite{{Id: 1, Data: big}}})
	if grpcstatus.Code(err) != codes.ResourceExhausted || errorinfo.Reason(err) != "" {
		t.Errorf("stream ended with %v (reason %q), want gRPC's RESOURCE_EXHAUSTED without a reason", err, errorinfo.Reason(err))
	}
}
