package service

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/gateway"
)

// TestLimits: each limit refuses a request with its reason, a code that
// says whether waiting helps (RESOURCE_EXHAUSTED only for the limits that
// pass as other requests end; INVALID_ARGUMENT and OUT_OF_RANGE for a
// request that can never succeed as it is), the limit and its flag in the
// ErrorInfo and the message, and the refused request changes nothing.
// The open-file and waiter limits need a file held busy: a write to
// "busy.bin" is held inside the store until the check is done.
func TestLimits(t *testing.T) {
	const (
		maxRequest = 4096
		maxFile    = 1 << 20
	)
	write := func(path string, off int64, n int) func(*daemon, context.Context) error {
		return func(d *daemon, ctx context.Context) error {
			_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: path, Offset: off, Data: make([]byte, n)})
			return err
		}
	}
	tests := []struct {
		name  string
		limit func(*Config)
		// busy holds a write to busy.bin inside the store, and, with a
		// waiter limit, queues one more behind it, before call runs.
		busy      bool
		queueOne  bool
		call      func(*daemon, context.Context) error
		code      codes.Code
		reason    string
		wantLimit string
		wantMsg   []string
	}{
		{
			name:      "request size",
			limit:     func(c *Config) { c.Store.MaxRequestBytes = maxRequest },
			call:      write("new.bin", 0, maxRequest+1),
			code:      codes.InvalidArgument,
			reason:    "REQUEST_TOO_LARGE",
			wantLimit: "4096",
			wantMsg:   []string{"request size limit exceeded", "4097 bytes", "4096"},
		},
		{
			name:  "read size",
			limit: func(c *Config) { c.Store.MaxRequestBytes = maxRequest },
			call: func(d *daemon, ctx context.Context) error {
				_, err := d.client.Read(ctx, &filewritev1.ReadRequest{Path: "existing.bin", Length: maxRequest + 1})
				return err
			},
			code: codes.InvalidArgument, reason: "REQUEST_TOO_LARGE", wantLimit: "4096",
			wantMsg: []string{"request size limit exceeded", "4096"},
		},
		{
			name:      "file size, write",
			limit:     func(c *Config) { c.Store.MaxFileSize = maxFile },
			call:      write("existing.bin", maxFile-1, 2),
			code:      codes.OutOfRange,
			reason:    "FILE_TOO_LARGE",
			wantLimit: "1048576",
			wantMsg:   []string{"file size limit exceeded", "1048577", "1048576"},
		},
		{
			name:  "file size, truncate",
			limit: func(c *Config) { c.Store.MaxFileSize = maxFile },
			call: func(d *daemon, ctx context.Context) error {
				_, err := d.client.Truncate(ctx, &filewritev1.TruncateRequest{Path: "new.bin", Size: maxFile + 1})
				return err
			},
			code: codes.OutOfRange, reason: "FILE_TOO_LARGE", wantLimit: "1048576",
			wantMsg: []string{"file size limit exceeded", "1048576"},
		},
		{
			name:  "file size, fallocate",
			limit: func(c *Config) { c.Store.MaxFileSize = maxFile },
			call: func(d *daemon, ctx context.Context) error {
				_, err := d.client.Fallocate(ctx, &filewritev1.FallocateRequest{Path: "new.bin",
					Mode: filewritev1.FallocateMode_FALLOCATE_MODE_KEEP_SIZE, Offset: 1, Length: maxFile})
				return err
			},
			code: codes.OutOfRange, reason: "FILE_TOO_LARGE", wantLimit: "1048576",
			wantMsg: []string{"file size limit exceeded", "1048576"},
		},
		{
			name:      "open files",
			limit:     func(c *Config) { c.Store.MaxOpenFiles = 1 },
			busy:      true,
			call:      write("new.bin", 0, 10),
			code:      codes.ResourceExhausted,
			reason:    "TOO_MANY_OPEN_FILES",
			wantLimit: "1",
			wantMsg:   []string{"open file limit reached", "the limit is 1 (--max-open-files)"},
		},
		{
			name:      "waiters per file",
			limit:     func(c *Config) { c.Store.MaxWaitersPerFile = 1 },
			busy:      true,
			queueOne:  true,
			call:      write("busy.bin", 1<<16, 10),
			code:      codes.ResourceExhausted,
			reason:    "TOO_MANY_WAITERS",
			wantLimit: "1",
			wantMsg:   []string{"per-file waiter limit reached", "the limit is 1 (--max-waiters-per-file)"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gate := newWriteGate("busy.bin")
			d := startDaemon(t, func(c *Config) {
				tt.limit(c)
				c.Store.Hooks = gate.hooks()
			})
			defer gate.open()
			ctx := testContext(t)
			if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "existing.bin", Data: []byte("original")}); err != nil {
				t.Fatal(err)
			}
			var inFlight []chan error
			send := func(off int64) {
				done := make(chan error, 1)
				inFlight = append(inFlight, done)
				go func() {
					_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "busy.bin", Offset: off, Data: []byte("busy")})
					done <- err
				}()
			}
			if tt.busy {
				// The first write extends the file, so it holds the
				// lock exclusively while the gate holds it.
				send(0)
				gate.waitEntered(t, ctx)
			}
			if tt.queueOne {
				send(100)
				for d.waiting("busy.bin") < 1 {
					time.Sleep(time.Millisecond)
				}
			}
			before := testutil.Snapshot(t, d.root)

			err := tt.call(d, ctx)
			wantCode(t, tt.name, err, tt.code)
			info := errorinfo.From(err)
			if info.GetReason() != tt.reason || info.GetMetadata()["limit"] != tt.wantLimit || !strings.HasPrefix(info.GetMetadata()["flag"], "--max-") {
				t.Errorf("ErrorInfo %v, want reason %s with limit %s and its flag", info, tt.reason, tt.wantLimit)
			}
			msg := status.Convert(err).Message()
			for _, want := range tt.wantMsg {
				if !strings.Contains(msg, want) {
					t.Errorf("message %q does not name the limit (%q)", msg, want)
				}
			}
			testutil.CheckUnchanged(t, d.root, before)

			// The held requests were not hurt by the refusal.
			gate.open()
			for i, done := range inFlight {
				if err := <-done; err != nil {
					t.Errorf("held write %d: %v", i, err)
				}
			}
			if tt.queueOne {
				if got := d.onDisk(t, "busy.bin"); len(got) != 104 {
					t.Errorf("busy.bin is %d bytes, want 104: the refused write must not land later", len(got))
				}
			}
		})
	}
}

// TestLimitsHTTP: the same limits reach REST users as 400 (a status
// clients do not retry) with the limit named.
func TestLimitsHTTP(t *testing.T) {
	d := startDaemon(t, func(c *Config) {
		c.Store.MaxRequestBytes = 4096
		c.Store.MaxFileSize = 1 << 20
	})
	octet := map[string]string{"Content-Type": gateway.MIMEOctetStream}
	jsonType := map[string]string{"Content-Type": "application/json"}
	tests := []struct {
		name, method, path string
		body               string
		header             map[string]string
		code               codes.Code
		reason             string
		want               string
	}{
		// A raw PUT's body is no one Write: it may pass --max-request-bytes
		// (TestRawPutOfAnySize), a JSON write's data may not.
		{"JSON write over --max-request-bytes", "POST", "/v1/files/a.bin:write", `{"data":"` + base64.StdEncoding.EncodeToString(make([]byte, 4097)) + `"}`, jsonType,
			codes.InvalidArgument, "REQUEST_TOO_LARGE", "--max-request-bytes"},
		{"write past --max-file-size", "PUT", "/v1/files/a.bin?offset=1048575", "xy", octet, codes.OutOfRange, "FILE_TOO_LARGE", "maximum file size is 1048576"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := testutil.Snapshot(t, d.root)
			r := testutil.DoHTTP(t, tt.method, d.url+tt.path, strings.NewReader(tt.body), tt.header)
			if r.Status != 400 {
				t.Fatalf("status %d (%s), want 400", r.Status, r.Body)
			}
			if e := testutil.ParseErrorBody(t, r); e.Code != tt.code || !strings.Contains(e.Message, tt.want) {
				t.Errorf("error %+v, want %v naming %q", e, tt.code, tt.want)
			}
			if !strings.Contains(string(r.Body), `"reason":"`+tt.reason+`"`) {
				t.Errorf("body %s does not carry the reason %s", r.Body, tt.reason)
			}
			testutil.CheckUnchanged(t, d.root, before)
		})
	}
}
