package service

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/gateway"
	"github.com/filewrite/filewrite/service/internal/rpc"
	"github.com/filewrite/filewrite/service/internal/status"
	"github.com/filewrite/filewrite/store"
)

// TestNamespaceGRPC: Delete, Rename and List over a real loopback
// connection, starting with the atomic-publish idiom (write a temporary
// file, Fsync it, Rename it over the target with sync, List).
func TestNamespaceGRPC(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	c := d.client

	if _, err := c.Write(ctx, &filewritev1.WriteRequest{Path: "ckpt/step-1", Data: []byte("old")}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(ctx, &filewritev1.WriteRequest{Path: "ckpt/.step-1.tmp", Data: []byte("new checkpoint")}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Fsync(ctx, &filewritev1.FsyncRequest{Path: "ckpt/.step-1.tmp"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Rename(ctx, &filewritev1.RenameRequest{Path: "ckpt/.step-1.tmp", NewPath: "ckpt/step-1", Sync: true}); err != nil {
		t.Fatal(err)
	}
	l, err := c.List(ctx, &filewritev1.ListRequest{Path: "ckpt"})
	want := []*filewritev1.DirEntry{{Name: "step-1", Size: 14}}
	if err != nil || !slices.EqualFunc(l.GetEntries(), want, eqEntry) || l.GetNextPageToken() != "" {
		t.Fatalf("List(ckpt) = %v, %v; want %v and no next page", l, err, want)
	}
	if got := d.onDisk(t, "ckpt/step-1"); string(got) != "new checkpoint" {
		t.Errorf("the published file holds %q", got)
	}

	// Rename into new directories, Delete with sync, Fsync of a directory.
	if _, err := c.Rename(ctx, &filewritev1.RenameRequest{Path: "ckpt/step-1", NewPath: "archive/2026/step-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Fsync(ctx, &filewritev1.FsyncRequest{Path: "archive/2026"}); err != nil {
		t.Errorf("Fsync of a directory: %v", err)
	}
	if _, err := c.Delete(ctx, &filewritev1.DeleteRequest{Path: "archive/2026/step-1", Sync: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(d.root, "archive/2026/step-1")); !os.IsNotExist(err) {
		t.Errorf("the deleted file: %v, want it gone", err)
	}
	if _, err := c.Stat(ctx, &filewritev1.StatRequest{Path: "archive/2026/step-1"}); grpcstatus.Code(err) != codes.NotFound {
		t.Errorf("Stat of the deleted file: %v, want NOT_FOUND", err)
	}

	// Paging, in name order.
	var names []string
	for i := range 5 {
		name := fmt.Sprintf("many/f%d", 4-i)
		names = append([]string{filepath.Base(name)}, names...)
		if _, err := c.Write(ctx, &filewritev1.WriteRequest{Path: name, Data: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	pages := 0
	for tok := ""; ; pages++ {
		l, err := c.List(ctx, &filewritev1.ListRequest{Path: "many", PageSize: 2, PageToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range l.GetEntries() {
			got = append(got, e.GetName())
		}
		if tok = l.GetNextPageToken(); tok == "" {
			break
		}
	}
	if !slices.Equal(got, names) || pages != 2 {
		t.Errorf("paged List = %v after %d more pages, want %v in 3 pages", got, pages, names)
	}
	root, err := c.List(ctx, &filewritev1.ListRequest{})
	want = []*filewritev1.DirEntry{{Name: "archive", IsDir: true}, {Name: "ckpt", IsDir: true}, {Name: "many", IsDir: true}}
	if err != nil || !slices.EqualFunc(root.GetEntries(), want, eqEntry) {
		t.Errorf("List of the root = %v, %v; want %v", root, err, want)
	}

	// Refusals, each changing nothing.
	if _, err := c.Write(ctx, &filewritev1.WriteRequest{Path: "other", Data: []byte("o")}); err != nil {
		t.Fatal(err)
	}
	before := testutil.Snapshot(t, d.root)
	for _, tt := range []struct {
		name string
		call func() error
		want codes.Code
		msg  string
	}{
		{"rename without replacing", func() error {
			_, err := c.Rename(ctx, &filewritev1.RenameRequest{Path: "other", NewPath: "many/f0", NoReplace: true})
			return err
		}, codes.AlreadyExists, ""},
		{"rename onto a directory", func() error {
			_, err := c.Rename(ctx, &filewritev1.RenameRequest{Path: "other", NewPath: "many"})
			return err
		}, codes.InvalidArgument, ""},
		{"rename a directory", func() error {
			_, err := c.Rename(ctx, &filewritev1.RenameRequest{Path: "many", NewPath: "x"})
			return err
		}, codes.InvalidArgument, ""},
		{"rename a missing file", func() error {
			_, err := c.Rename(ctx, &filewritev1.RenameRequest{Path: "missing", NewPath: "new/dir/x"})
			return err
		}, codes.NotFound, ""},
		{"rename out of the root", func() error {
			_, err := c.Rename(ctx, &filewritev1.RenameRequest{Path: "other", NewPath: "../outside"})
			return err
		}, codes.InvalidArgument, ""},
		{"delete a directory", func() error {
			_, err := c.Delete(ctx, &filewritev1.DeleteRequest{Path: "many"})
			return err
		}, codes.InvalidArgument, ""},
		{"delete a missing file", func() error {
			_, err := c.Delete(ctx, &filewritev1.DeleteRequest{Path: "missing", Sync: true})
			return err
		}, codes.NotFound, ""},
		{"list a missing directory", func() error {
			_, err := c.List(ctx, &filewritev1.ListRequest{Path: "missing"})
			return err
		}, codes.NotFound, ""},
		{"list a file", func() error {
			_, err := c.List(ctx, &filewritev1.ListRequest{Path: "other"})
			return err
		}, codes.InvalidArgument, "not a directory"},
		{"page size over the maximum", func() error {
			_, err := c.List(ctx, &filewritev1.ListRequest{PageSize: 10001})
			return err
		}, codes.InvalidArgument, "10000"},
		{"negative page size", func() error {
			_, err := c.List(ctx, &filewritev1.ListRequest{PageSize: -1})
			return err
		}, codes.InvalidArgument, "10000"},
		{"made-up page token", func() error {
			_, err := c.List(ctx, &filewritev1.ListRequest{PageToken: "f2"})
			return err
		}, codes.InvalidArgument, "page token"},
	} {
		err := tt.call()
		if grpcstatus.Code(err) != tt.want || !strings.Contains(grpcstatus.Convert(err).Message(), tt.msg) {
			t.Errorf("%s: %v, want %v saying %q", tt.name, err, tt.want, tt.msg)
		}
	}
	testutil.CheckUnchanged(t, d.root, before)
}

func eqEntry(a, b *filewritev1.DirEntry) bool { return proto.Equal(a, b) }

// TestNamespaceHTTP: the same calls over the REST gateway, the
// atomic-publish idiom written with curl's routes.
func TestNamespaceHTTP(t *testing.T) {
	d := startDaemon(t, nil)
	octet := map[string]string{"Content-Type": gateway.MIMEOctetStream}
	if r := testutil.DoHTTP(t, "PUT", d.url+"/v1/files/pub/report.json", strings.NewReader("v1"), octet); r.Status != 201 {
		t.Fatalf("PUT: %d %s", r.Status, r.Body)
	}
	if r := testutil.DoHTTP(t, "PUT", d.url+"/v1/files/pub/.report.json.tmp", strings.NewReader("version 2"), octet); r.Status != 201 {
		t.Fatalf("PUT: %d %s", r.Status, r.Body)
	}
	if s := d.call(t, "POST", "/v1/files/pub/.report.json.tmp:fsync", `{}`, nil); s != 200 {
		t.Fatalf("POST :fsync = %d", s)
	}
	if s := d.call(t, "POST", "/v1/files/pub/.report.json.tmp:rename", `{"newPath":"pub/report.json","sync":true}`, nil); s != 200 {
		t.Fatalf("POST :rename = %d", s)
	}
	var l filewritev1.ListResponse
	want := []*filewritev1.DirEntry{{Name: "report.json", Size: 9}}
	if s := d.call(t, "GET", "/v1/dirs/pub", "", &l); s != 200 || !slices.EqualFunc(l.GetEntries(), want, eqEntry) {
		t.Fatalf("GET /v1/dirs/pub = %d %v, want %v", s, l.GetEntries(), want)
	}
	// The JSON a curl user sees: every field, camelCase, next page token
	// empty on the last page.
	r := testutil.DoHTTP(t, "GET", d.url+"/v1/dirs", nil, nil)
	var raw map[string]any
	if err := json.Unmarshal(r.Body, &raw); err != nil || r.Status != 200 {
		t.Fatalf("GET /v1/dirs = %d %s: %v", r.Status, r.Body, err)
	}
	if got := fmt.Sprint(raw); got != "map[entries:[map[isDir:true name:pub size:0]] nextPageToken:]" {
		t.Errorf("GET /v1/dirs answered %s", r.Body)
	}
	if got := d.onDisk(t, "pub/report.json"); string(got) != "version 2" {
		t.Errorf("published file holds %q", got)
	}

	for _, tt := range []struct {
		method, path, body string
		want               int
	}{
		{"POST", "/v1/files/pub/report.json:rename", `{"newPath":"pub/copy","noReplace":true}`, 200},
		{"PUT", "/v1/files/pub/report.json", "again", http.StatusCreated}, // made anew: the rename took it away
		{"POST", "/v1/files/pub/report.json:rename", `{"newPath":"pub/copy","noReplace":true}`, http.StatusConflict},
		{"POST", "/v1/files/pub/report.json:rename", `{"newPath":"pub"}`, http.StatusBadRequest},
		{"POST", "/v1/files/pub/report.json:rename", `{"newPath":"x","bogus":1}`, http.StatusBadRequest},
		{"DELETE", "/v1/files/pub/copy?sync=true", "", 200},
		{"DELETE", "/v1/files/pub/copy", "", http.StatusNotFound},
		{"DELETE", "/v1/files/pub", "", http.StatusBadRequest},
		{"DELETE", "/v1/files/pub/report.json?snyc=true", "", http.StatusBadRequest},
		{"GET", "/v1/dirs/missing", "", http.StatusNotFound},
		{"GET", "/v1/dirs?pageSize=10001", "", http.StatusBadRequest},
		{"GET", "/v1/dirs?pageSize=1", "", 200},
	} {
		var r testutil.HTTPResult
		if tt.method == "PUT" {
			r = testutil.DoHTTP(t, "PUT", d.url+tt.path, strings.NewReader(tt.body), octet)
		} else {
			var body *bytes.Reader
			if tt.body != "" {
				body = bytes.NewReader([]byte(tt.body))
			}
			if body != nil {
				r = testutil.DoHTTP(t, tt.method, d.url+tt.path, body, map[string]string{"Content-Type": "application/json"})
			} else {
				r = testutil.DoHTTP(t, tt.method, d.url+tt.path, nil, nil)
			}
		}
		if r.Status != tt.want {
			t.Errorf("%s %s %s = %d %s, want %d", tt.method, tt.path, tt.body, r.Status, r.Body, tt.want)
		}
	}
	if _, err := os.Stat(filepath.Join(d.root, "pub/copy")); !os.IsNotExist(err) {
		t.Errorf("pub/copy after DELETE: %v, want it gone", err)
	}
}

// TestListPageSize: the page size a List asks the store for, under a reply
// limit that holds perReply entries.
func TestListPageSize(t *testing.T) {
	tests := []struct {
		pageSize, perReply int32
		want               int
	}{
		{0, 20000, store.DefaultListPageSize},
		{0, 50, 50},
		{7, 50, 7},
		{store.MaxListPageSize, 20000, store.MaxListPageSize},
		{store.MaxListPageSize, 50, 50},
		{store.MaxListPageSize + 1, 50, store.MaxListPageSize + 1}, // for the store to refuse
		{-1, 50, -1},
	}
	for _, tt := range tests {
		if got := rpc.ListPageSize(&filewritev1.ListRequest{PageSize: tt.pageSize}, int(tt.perReply)); got != tt.want {
			t.Errorf("listPageSize(%d, per reply %d) = %d, want %d", tt.pageSize, tt.perReply, got, tt.want)
		}
	}
	// A full page of the longest names fits under the default limit.
	if got := rpc.EntriesPerReply(status.MaxMessageBytes(store.DefaultMaxRequestBytes)); got < store.MaxListPageSize {
		t.Errorf("entries per reply under the default limit = %d, want at least %d", got, store.MaxListPageSize)
	}
}

// TestListPageFitsInAReply: with a small --max-request-bytes, a page of
// long names stops short of what page_size asks, with a next page token,
// and paging still lists every entry once.
func TestListPageFitsInAReply(t *testing.T) {
	d := startDaemon(t, func(c *Config) { c.Store.MaxRequestBytes = 1 }) // replies of 64 KiB and a byte
	ctx := testContext(t)
	const files = 300
	long := strings.Repeat("n", store.MaxNameLen-4)
	for i := range files {
		if err := os.WriteFile(filepath.Join(d.root, fmt.Sprintf("%s%04d", long, i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	first, err := d.client.List(ctx, &filewritev1.ListRequest{PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(first.GetEntries()); n >= files || first.GetNextPageToken() == "" {
		t.Fatalf("first page: %d entries, next %q; want fewer than %d and a next page", n, first.GetNextPageToken(), files)
	}
	seen := map[string]bool{}
	for tok := ""; ; {
		l, err := d.client.List(ctx, &filewritev1.ListRequest{PageSize: 1000, PageToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range l.GetEntries() {
			if seen[e.GetName()] {
				t.Errorf("%s listed twice", e.GetName())
			}
			seen[e.GetName()] = true
		}
		if tok = l.GetNextPageToken(); tok == "" {
			break
		}
	}
	if len(seen) != files {
		t.Errorf("listed %d entries, want %d", len(seen), files)
	}
}

// TestListNameNotUTF8: a directory holding a name that is not valid UTF-8
// (made outside the daemon) lists without it, over gRPC and REST alike,
// instead of failing every page that would include it with INTERNAL (a
// protobuf string must be UTF-8); the daemon logs the name once, however
// often the directory is listed.
func TestListNameNotUTF8(t *testing.T) {
	var logs testutil.LockedBuffer
	d := startDaemon(t, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	ctx := testContext(t)
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "dir/ok", Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.root, "dir", "bad\xff"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	want := []*filewritev1.DirEntry{{Name: "ok", Size: 1}}
	for range 2 {
		l, err := d.client.List(ctx, &filewritev1.ListRequest{Path: "dir"})
		if err != nil || !slices.EqualFunc(l.GetEntries(), want, eqEntry) {
			t.Fatalf("List(dir) = %v, %v; want %v", l, err, want)
		}
	}
	resp, err := http.Get(d.url + "/v1/dirs/dir")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"ok"`) {
		t.Errorf("GET /v1/dirs/dir = %d %s; want 200 listing ok", resp.StatusCode, body)
	}
	if n := strings.Count(logs.String(), `bad\\xff`); n != 1 {
		t.Errorf("the name was logged %d times, want once; log:\n%s", n, logs.String())
	}
}

// TestWriteStreamFollowsRenameAndEndsOnDelete: a WriteStream writes on to
// its file under the new name after a Rename, repeating the path it was
// opened with if it likes, and ends with NOT_FOUND once the file is
// deleted, having acked every write it read before.
func TestWriteStreamFollowsRenameAndEndsOnDelete(t *testing.T) {
	for _, how := range []string{"delete", "rename over"} {
		t.Run(how, func(t *testing.T) {
			d := startDaemon(t, nil)
			ctx := testContext(t)
			c := d.client
			stream := openStream(t, ctx, c, "s/a")
			send := func(path string, ws ...*filewritev1.StreamWrite) {
				t.Helper()
				if err := stream.Send(&filewritev1.WriteStreamRequest{Path: path, Writes: ws}); err != nil {
					t.Fatal(err)
				}
			}
			recvAck := func(id uint64) {
				t.Helper()
				resp, err := stream.Recv()
				if err != nil || len(resp.GetAcks()) != 1 || resp.GetAcks()[0].GetId() != id || resp.GetAcks()[0].GetStatus() != nil {
					t.Fatalf("ack of write %d: %v, %v", id, resp, err)
				}
			}
			send("", streamWriteOf(1, 0, []byte("one "), filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED))
			recvAck(1)
			if _, err := c.Rename(ctx, &filewritev1.RenameRequest{Path: "s/a", NewPath: "s/b"}); err != nil {
				t.Fatal(err)
			}
			send("s/a", streamWriteOf(2, 4, []byte("two"), filewritev1.SyncMode_SYNC_MODE_DATA))
			recvAck(2)
			if got := d.onDisk(t, "s/b"); string(got) != "one two" {
				t.Fatalf("after the rename, s/b holds %q, want %q", got, "one two")
			}
			if _, err := os.Stat(filepath.Join(d.root, "s/a")); !os.IsNotExist(err) {
				t.Fatalf("s/a after the rename: %v, want no file", err)
			}
			switch how {
			case "delete":
				if _, err := c.Delete(ctx, &filewritev1.DeleteRequest{Path: "s/b"}); err != nil {
					t.Fatal(err)
				}
			default:
				if _, err := c.Write(ctx, &filewritev1.WriteRequest{Path: "s/other", Data: []byte("other")}); err != nil {
					t.Fatal(err)
				}
				if _, err := c.Rename(ctx, &filewritev1.RenameRequest{Path: "s/other", NewPath: "s/b"}); err != nil {
					t.Fatal(err)
				}
			}
			// The stream ends by itself; a write sent meanwhile, if read,
			// is acked NOT_FOUND, and nothing reaches a file.
			_ = stream.Send(&filewritev1.WriteStreamRequest{Writes: []*filewritev1.StreamWrite{
				streamWriteOf(3, 0, []byte("lost"), filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED),
			}})
			e := recvAll(stream)
			if grpcstatus.Code(e.err) != codes.NotFound {
				t.Fatalf("stream ended with %v, want NOT_FOUND", e.err)
			}
			for _, a := range e.acks {
				if a.GetId() != 3 || codes.Code(a.GetStatus().GetCode()) != codes.NotFound {
					t.Errorf("ack after the %s: %v, want only write 3's, NOT_FOUND", how, a)
				}
			}
			if how == "rename over" {
				if got := d.onDisk(t, "s/b"); string(got) != "other" {
					t.Errorf("s/b holds %q, want the file renamed over it", got)
				}
			}
		})
	}
}

// TestFsyncOfADirectory: Fsync of a directory's path, over gRPC and over
// REST, fsyncs that directory (one more sample of the directory fsync
// histogram each, data_only or not): how a client makes durable a Rename
// or Delete made without sync. A missing directory is NOT_FOUND.
func TestFsyncOfADirectory(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_METRICS_EXPORTER", "")
	d := startDaemon(t, nil)
	ctx := testContext(t)
	c := d.client
	if _, err := c.Write(ctx, &filewritev1.WriteRequest{Path: "pub/.a.tmp", Data: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Rename(ctx, &filewritev1.RenameRequest{Path: "pub/.a.tmp", NewPath: "pub/a"}); err != nil {
		t.Fatal(err)
	}
	dirSyncs := func() uint64 {
		return series(d.scrape(t), "filewrite_dir_fsync_batch_size", nil).GetHistogram().GetSampleCount()
	}
	grpcFsync := func(req *filewritev1.FsyncRequest) func() error {
		return func() error { _, err := c.Fsync(ctx, req); return err }
	}
	restFsync := func(path, body string) func() error {
		return func() error {
			if s := d.call(t, "POST", "/v1/files/"+path+":fsync", body, nil); s != http.StatusOK {
				return fmt.Errorf("HTTP %d", s)
			}
			return nil
		}
	}
	for _, tt := range []struct {
		name string
		call func() error
	}{
		{"gRPC", grpcFsync(&filewritev1.FsyncRequest{Path: "pub"})},
		{"gRPC, data_only", grpcFsync(&filewritev1.FsyncRequest{Path: "pub", DataOnly: true})},
		{"REST", restFsync("pub", `{}`)},
		{"REST, dataOnly", restFsync("pub", `{"dataOnly":true}`)},
	} {
		before := dirSyncs()
		if err := tt.call(); err != nil {
			t.Errorf("%s: Fsync of a directory: %v", tt.name, err)
			continue
		}
		if got := dirSyncs() - before; got != 1 {
			t.Errorf("%s: Fsync of a directory made %d directory fsyncs, want 1", tt.name, got)
		}
	}
	if _, err := c.Fsync(ctx, &filewritev1.FsyncRequest{Path: "nodir"}); grpcstatus.Code(err) != codes.NotFound {
		t.Errorf("gRPC Fsync of a missing directory: %v, want NOT_FOUND", err)
	}
	if s := d.call(t, "POST", "/v1/files/nodir:fsync", `{}`, nil); s != http.StatusNotFound {
		t.Errorf("REST Fsync of a missing directory: %d, want 404", s)
	}
}
