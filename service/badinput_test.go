package service

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/gateway"
)

// Limits of the daemon that the bad-input tests run against.
const (
	testMaxFileSize     = 1 << 20
	testMaxRequestBytes = 64 << 10
)

// startBadInputDaemon starts a daemon with small limits over a root that
// holds a file, a directory and symlinks leading out of the root, next to a
// directory outside it that no request may touch.
func startBadInputDaemon(t *testing.T) *daemon {
	t.Helper()
	d := startDaemon(t, func(c *Config) {
		c.Store.MaxFileSize = testMaxFileSize
		c.Store.MaxRequestBytes = testMaxRequestBytes
	})
	outside := filepath.Join(d.dir, "outside")
	for _, err := range []error{
		os.WriteFile(filepath.Join(d.root, "existing.bin"), []byte("original contents"), 0o644),
		os.Mkdir(filepath.Join(d.root, "dir"), 0o755),
		os.Mkdir(outside, 0o755),
		os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644),
		os.Symlink("../outside", filepath.Join(d.root, "escape-dir")),
		os.Symlink("../outside/secret", filepath.Join(d.root, "escape-file")),
		os.Symlink(filepath.Join(outside, "secret"), filepath.Join(d.root, "escape-abs")),
		os.Symlink("loop", filepath.Join(d.root, "loop")),
		os.Symlink("missingdir/f", filepath.Join(d.root, "dangling")),
		syscall.Mkfifo(filepath.Join(d.root, "fifo"), 0o644),
		syscall.Mknod(filepath.Join(d.root, "socket"), syscall.S_IFSOCK|0o644, 0),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func TestBadInputGRPC(t *testing.T) {
	d := startBadInputDaemon(t)
	c := d.client
	type call func(context.Context) error
	write := func(path string, off int64, data []byte, sync filewritev1.SyncMode) call {
		return func(ctx context.Context) error {
			_, err := c.Write(ctx, &filewritev1.WriteRequest{Path: path, Offset: off, Data: data, Sync: sync})
			return err
		}
	}
	w := func(path string, off int64, data string) call { return write(path, off, []byte(data), 0) }
	truncate := func(path string, size int64) call {
		return func(ctx context.Context) error {
			_, err := c.Truncate(ctx, &filewritev1.TruncateRequest{Path: path, Size: size})
			return err
		}
	}
	fallocate := func(path string, mode filewritev1.FallocateMode, off, length int64) call {
		return func(ctx context.Context) error {
			_, err := c.Fallocate(ctx, &filewritev1.FallocateRequest{Path: path, Mode: mode, Offset: off, Length: length})
			return err
		}
	}
	read := func(path string, off, length int64) call {
		return func(ctx context.Context) error {
			_, err := c.Read(ctx, &filewritev1.ReadRequest{Path: path, Offset: off, Length: length})
			return err
		}
	}
	stat := func(path string) call {
		return func(ctx context.Context) error {
			_, err := c.Stat(ctx, &filewritev1.StatRequest{Path: path})
			return err
		}
	}
	extents := func(path string, off, length int64) call {
		return func(ctx context.Context) error {
			_, err := c.Extents(ctx, &filewritev1.ExtentsRequest{Path: path, Offset: off, Length: length})
			return err
		}
	}
	fsync := func(path string) call {
		return func(ctx context.Context) error {
			_, err := c.Fsync(ctx, &filewritev1.FsyncRequest{Path: path})
			return err
		}
	}
	const (
		ex       = "existing.bin"
		allocate = filewritev1.FallocateMode_FALLOCATE_MODE_ALLOCATE
		punch    = filewritev1.FallocateMode_FALLOCATE_MODE_PUNCH_HOLE
	)
	absolute := filepath.Join(d.dir, "outside", "secret")
	long255 := strings.Repeat("y", 256)
	tests := []struct {
		name string
		call call
		want codes.Code
	}{
		{"write: empty path", w("", 0, "x"), codes.InvalidArgument},
		{"write: absolute path", w(absolute, 0, "x"), codes.InvalidArgument},
		{"write: .. out of the root", w("../outside/secret", 0, "x"), codes.InvalidArgument},
		{"write: .. inside the root", w("dir/../existing.bin", 0, "x"), codes.InvalidArgument},
		{"write: NUL in the path", w("existing.bin\x00.txt", 0, "x"), codes.InvalidArgument},
		{"write: 5000-byte path", w(strings.Repeat("a", 5000), 0, "x"), codes.InvalidArgument},
		{"write: unclean path", w("dir//new.bin", 0, "x"), codes.InvalidArgument},
		{"write: a directory", w("dir", 0, "x"), codes.InvalidArgument},
		{"write: symlink to a directory outside", w("escape-dir/new.bin", 0, "x"), codes.InvalidArgument},
		{"write: symlink to a file outside", w("escape-file", 0, "x"), codes.InvalidArgument},
		{"write: absolute symlink to a file outside", w("escape-abs", 0, "x"), codes.InvalidArgument},
		{"write: negative offset", w(ex, -1, "x"), codes.InvalidArgument},
		{"write: offset+length overflows int64", w(ex, math.MaxInt64-1, "abcd"), codes.InvalidArgument},
		{"write: past --max-file-size", w(ex, testMaxFileSize-2, "abcd"), codes.OutOfRange},
		{"write: data over --max-request-bytes", write(ex, 0, make([]byte, testMaxRequestBytes+1), 0), codes.InvalidArgument},
		{"write: message over the transport limit", write(ex, 0, make([]byte, 3*testMaxRequestBytes), 0), codes.ResourceExhausted},
		{"write: unknown sync mode", write(ex, 0, []byte("x"), 99), codes.InvalidArgument},
		{"truncate: negative size", truncate(ex, -1), codes.InvalidArgument},
		{"truncate: past --max-file-size", truncate(ex, testMaxFileSize+1), codes.OutOfRange},
		{"truncate: empty path", truncate("", 0), codes.InvalidArgument},
		{"truncate: symlink to a file outside", truncate("escape-file", 0), codes.InvalidArgument},
		{"fallocate: unspecified mode", fallocate(ex, 0, 0, 10), codes.InvalidArgument},
		{"fallocate: unknown mode", fallocate(ex, 99, 0, 10), codes.InvalidArgument},
		{"fallocate: negative offset", fallocate(ex, allocate, -1, 10), codes.InvalidArgument},
		{"fallocate: negative length", fallocate(ex, allocate, 0, -10), codes.InvalidArgument},
		{"fallocate: zero length", fallocate(ex, allocate, 0, 0), codes.InvalidArgument},
		{"fallocate: offset+length overflows int64", fallocate(ex, allocate, math.MaxInt64, 10), codes.InvalidArgument},
		{"fallocate: past --max-file-size", fallocate(ex, allocate, 0, testMaxFileSize+1), codes.OutOfRange},
		{"fallocate: symlink to a file outside", fallocate("escape-file", punch, 0, 4096), codes.InvalidArgument},
		{"fallocate: .. path", fallocate("../outside/secret", punch, 0, 4096), codes.InvalidArgument},
		{"read: negative offset", read(ex, -1, 1), codes.InvalidArgument},
		{"read: negative length", read(ex, 0, -1), codes.InvalidArgument},
		{"read: offset+length overflows int64", read(ex, math.MaxInt64, 10), codes.InvalidArgument},
		{"read: length over --max-request-bytes", read(ex, 0, testMaxRequestBytes+1), codes.InvalidArgument},
		{"read: missing file", read("missing.bin", 0, 1), codes.NotFound},
		{"read: symlink to a file outside", read("escape-file", 0, 10), codes.InvalidArgument},
		{"read: NUL in the path", read("a\x00", 0, 1), codes.InvalidArgument},
		{"stat: missing file", stat("missing.bin"), codes.NotFound},
		{"stat: empty path", stat(""), codes.InvalidArgument},
		{"stat: absolute path", stat(absolute), codes.InvalidArgument},
		{"extents: missing file", extents("missing.bin", 0, 0), codes.NotFound},
		{"extents: negative offset", extents(ex, -1, 0), codes.InvalidArgument},
		{"extents: negative length", extents(ex, 0, -1), codes.InvalidArgument},
		{"extents: offset+length overflows int64", extents(ex, math.MaxInt64, 10), codes.InvalidArgument},
		{"fsync: missing file", fsync("missing.bin"), codes.NotFound},
		{"fsync: .. path", fsync(".."), codes.InvalidArgument},
		{"fsync: 5000-byte path", fsync(strings.Repeat("b", 5000)), codes.InvalidArgument},
		// Refused before the directories above are made, or they stay.
		{"write: element over 255 bytes", w("leak1/leak2/"+long255, 0, "x"), codes.InvalidArgument},
		{"truncate: element over 255 bytes", truncate("leak1/leak2/"+long255, 0), codes.InvalidArgument},
		{"fallocate: element over 255 bytes", fallocate("dir/leak/"+long255, allocate, 0, 4096), codes.InvalidArgument},
		{"write: a FIFO", w("fifo", 0, "x"), codes.InvalidArgument},
		{"read: a FIFO", read("fifo", 0, 1), codes.InvalidArgument},
		{"write: a unix socket", w("socket", 0, "x"), codes.InvalidArgument},
		{"stat: a unix socket", stat("socket"), codes.InvalidArgument},
		{"read: a unix socket", read("socket", 0, 1), codes.InvalidArgument},
		{"write: a symlink loop", w("loop", 0, "x"), codes.InvalidArgument},
		{"write: a symlink to a missing directory", w("dangling", 0, "x"), codes.InvalidArgument},
		{"truncate: a symlink to a missing directory", truncate("dangling", 0), codes.InvalidArgument},
		{"read: a symlink to a missing directory", read("dangling", 0, 1), codes.NotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := testutil.Snapshot(t, d.dir)
			err := tt.call(testContext(t))
			wantCode(t, tt.name, err, tt.want)
			testutil.CheckUnchanged(t, d.dir, before)
		})
	}
}

func TestBadInputHTTP(t *testing.T) {
	d := startBadInputDaemon(t)
	octet := map[string]string{"Content-Type": gateway.MIMEOctetStream}
	json := map[string]string{"Content-Type": "application/json"}
	b64 := base64.StdEncoding.EncodeToString
	long := strings.Repeat("a", 5000)
	tests := []struct {
		name       string
		method     string
		path       string
		body       []byte
		header     map[string]string
		wantStatus int
		wantCode   codes.Code
	}{
		{"PUT: empty path", "PUT", "/v1/files/", []byte("x"), octet, 400, codes.InvalidArgument},
		{"PUT: absolute path", "PUT", "/v1/files/" + filepath.Join(d.dir, "outside", "secret"), []byte("x"), octet, 400, codes.InvalidArgument},
		{"PUT: escaped ..", "PUT", "/v1/files/dir/%2E%2E/existing.bin", []byte("x"), octet, 400, codes.InvalidArgument},
		{"PUT: escaped .. out of the root", "PUT", "/v1/files/%2E%2E/outside/secret", []byte("x"), octet, 400, codes.InvalidArgument},
		{"PUT: NUL in the path", "PUT", "/v1/files/existing.bin%00.txt", []byte("x"), octet, 400, codes.InvalidArgument},
		{"PUT: 5000-byte path", "PUT", "/v1/files/" + long, []byte("x"), octet, 400, codes.InvalidArgument},
		{"PUT: symlink to a file outside", "PUT", "/v1/files/escape-file", []byte("x"), octet, 400, codes.InvalidArgument},
		{"PUT: symlink to a directory outside", "PUT", "/v1/files/escape-dir/new.bin", []byte("x"), octet, 400, codes.InvalidArgument},
		{"PUT: negative offset", "PUT", "/v1/files/existing.bin?offset=-1", []byte("x"), octet, 400, codes.InvalidArgument},
		{"PUT: offset+length overflows int64", "PUT", fmt.Sprintf("/v1/files/existing.bin?offset=%d", int64(math.MaxInt64-1)), []byte("abcd"), octet, 400, codes.InvalidArgument},
		{"PUT: past --max-file-size", "PUT", fmt.Sprintf("/v1/files/existing.bin?offset=%d", testMaxFileSize-2), []byte("abcd"), octet, 400, codes.OutOfRange},
		// A PUT's body may pass --max-request-bytes (it goes in pieces:
		// TestRawPutOfAnySize); a Content-Range that does not fit it
		// may not.
		{"PUT: Content-Range unlike the body", "PUT", "/v1/files/existing.bin", make([]byte, 10), map[string]string{"Content-Type": gateway.MIMEOctetStream, "Content-Range": "bytes 0-19/*"}, 400, codes.InvalidArgument},
		{"PUT: unknown sync", "PUT", "/v1/files/existing.bin?sync=later", []byte("x"), octet, 400, codes.InvalidArgument},
		{"PUT: element over 255 bytes", "PUT", "/v1/files/leak1/leak2/" + strings.Repeat("y", 256), []byte("x"), octet, 400, codes.InvalidArgument},
		{"PUT: a FIFO", "PUT", "/v1/files/fifo", []byte("x"), octet, 400, codes.InvalidArgument},
		{"GET stat: a unix socket", "GET", "/v1/files/socket", nil, nil, 400, codes.InvalidArgument},
		{"POST :write: data over --max-request-bytes", "POST", "/v1/files/existing.bin:write",
			[]byte(`{"data":"` + b64(make([]byte, testMaxRequestBytes+1)) + `"}`), json, 400, codes.InvalidArgument},
		{"POST :write: unknown sync number", "POST", "/v1/files/existing.bin:write", []byte(`{"data":"eA==","sync":99}`), json, 400, codes.InvalidArgument},
		{"POST :write: unknown sync name", "POST", "/v1/files/existing.bin:write", []byte(`{"data":"eA==","sync":"SYNC_MODE_LATER"}`), json, 400, codes.InvalidArgument},
		{"POST :write: negative offset", "POST", "/v1/files/existing.bin:write", []byte(`{"offset":"-5","data":"eA=="}`), json, 400, codes.InvalidArgument},
		{"POST :truncate: negative size", "POST", "/v1/files/existing.bin:truncate", []byte(`{"size":"-1"}`), json, 400, codes.InvalidArgument},
		{"POST :truncate: past --max-file-size", "POST", "/v1/files/existing.bin:truncate", []byte(fmt.Sprintf(`{"size":"%d"}`, testMaxFileSize+1)), json, 400, codes.OutOfRange},
		{"POST :fallocate: no mode", "POST", "/v1/files/existing.bin:fallocate", []byte(`{"length":"10"}`), json, 400, codes.InvalidArgument},
		{"POST :fallocate: unknown mode", "POST", "/v1/files/existing.bin:fallocate", []byte(`{"mode":42,"length":"10"}`), json, 400, codes.InvalidArgument},
		{"POST :fsync: missing file", "POST", "/v1/files/missing.bin:fsync", []byte(`{}`), json, 404, codes.NotFound},
		{"GET :read: missing file", "GET", "/v1/files/missing.bin:read?length=1", nil, nil, 404, codes.NotFound},
		{"GET :read: negative offset", "GET", "/v1/files/existing.bin:read?offset=-1&length=1", nil, nil, 400, codes.InvalidArgument},
		{"GET :read: length over --max-request-bytes", "GET", fmt.Sprintf("/v1/files/existing.bin:read?length=%d", testMaxRequestBytes+1), nil, nil, 400, codes.InvalidArgument},
		{"GET :read: symlink to a file outside", "GET", "/v1/files/escape-file:read?length=10", nil, map[string]string{"Accept": gateway.MIMEOctetStream}, 400, codes.InvalidArgument},
		{"GET stat: missing file", "GET", "/v1/files/missing.bin", nil, nil, 404, codes.NotFound},
		{"GET :extents: missing file", "GET", "/v1/files/missing.bin:extents", nil, nil, 404, codes.NotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := testutil.Snapshot(t, d.dir)
			r := testutil.DoHTTP(t, tt.method, d.url+tt.path, bytes.NewReader(tt.body), tt.header)
			if r.Status != tt.wantStatus {
				t.Errorf("HTTP status %d (%s), want %d", r.Status, r.Body, tt.wantStatus)
			}
			if e := testutil.ParseErrorBody(t, r); e.Code != tt.wantCode || e.Message == "" {
				t.Errorf("error body %+v, want code %v with a message", e, tt.wantCode)
			}
			testutil.CheckUnchanged(t, d.dir, before)
		})
	}
	// The checks above would pass on a gateway that rejects everything.
	if r := testutil.DoHTTP(t, "PUT", d.url+"/v1/files/existing.bin?offset=9", strings.NewReader("CONTENTS"), octet); r.Status != http.StatusOK {
		t.Fatalf("a good PUT after the bad ones: %d %s", r.Status, r.Body)
	}
	if got := d.onDisk(t, "existing.bin"); string(got) != "original CONTENTS" {
		t.Errorf("existing.bin = %q after a good PUT, want \"original CONTENTS\"", got)
	}
}

// TestErrorMessagesNameNoRootPath: an error from the filesystem names the
// file by its path below the root, on both protocols, never by the
// daemon's own path to it. Offsets past what ext4 allows in a file (16 TiB)
// get EFBIG from the kernel itself.
func TestErrorMessagesNameNoRootPath(t *testing.T) {
	d := startDaemon(t, func(c *Config) { c.Store.MaxFileSize = 1 << 62 })
	ctx := testContext(t)
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "sub/big", Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "sub/big", Offset: 1 << 60, Data: []byte("x")})
	msgs := map[string]string{"gRPC Write": status.Convert(err).Message()}
	_, err = d.client.Truncate(ctx, &filewritev1.TruncateRequest{Path: "sub/big", Size: 1 << 60})
	msgs["gRPC Truncate"] = status.Convert(err).Message()
	r := testutil.DoHTTP(t, "PUT", d.url+fmt.Sprintf("/v1/files/sub/big?offset=%d", int64(1)<<60), strings.NewReader("x"), map[string]string{"Content-Type": gateway.MIMEOctetStream})
	msgs["REST PUT"] = testutil.ParseErrorBody(t, r).Message
	for what, msg := range msgs {
		if !strings.Contains(msg, "sub/big") || strings.Contains(msg, d.root) || strings.Contains(msg, d.dir) {
			t.Errorf("%s: %q, want the path below the root (sub/big) and not the root's (%s)", what, msg, d.root)
		}
	}
}
