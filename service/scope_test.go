package service

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/gateway"
)

const (
	tokenAdmin = "admin-5e1f"
	tokenRW    = "rw-a-93b2"
	tokenRO    = "ro-a-44c1"
)

// startTenantDaemon starts a daemon with an administrator token, and a
// read-write and a read-only token of tenants/a/, over a root holding a
// file per case inside tenants/a, in tenants/b (another tenant), in
// tenants/ab (a name prefix of a, not inside it), and a link from inside
// tenants/a to tenants/b.
func startTenantDaemon(t *testing.T) (*daemon, string) {
	t.Helper()
	tokens := testutil.WriteTokenFile(t, testutil.Dir(t), "tokens",
		"# the operator",
		tokenAdmin+" name=admin",
		tokenRW+" name=tenant-a prefix=tenants/a/ mode=rw",
		tokenRO+" name=tenant-a-ro prefix=tenants/a mode=ro")
	d := startDaemon(t, func(c *Config) { c.AuthTokenFile = tokens })
	for _, dir := range []string{"tenants/a", "tenants/b", "tenants/ab"} {
		for _, op := range []string{"write", "fsync", "truncate", "fallocate", "read", "stat", "extents", "delete", "rename", "stream", "append"} {
			p := filepath.Join(d.root, dir, op+".bin")
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("original"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.Symlink("../b", filepath.Join(d.root, "tenants/a/link")); err != nil {
		t.Fatal(err)
	}
	return d, tokens
}

// scopedCall is one RPC against the file named by dir and the case.
type scopedCall struct {
	name  string
	write bool // changes the file when allowed
	call  func(ctx context.Context, d *daemon, p string) error
}

func scopedCalls() []scopedCall {
	return []scopedCall{
		{"write", true, func(ctx context.Context, d *daemon, p string) error {
			_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: p, Data: []byte("CHANGED!")})
			return err
		}},
		{"fsync", false, func(ctx context.Context, d *daemon, p string) error {
			_, err := d.client.Fsync(ctx, &filewritev1.FsyncRequest{Path: p})
			return err
		}},
		{"truncate", true, func(ctx context.Context, d *daemon, p string) error {
			_, err := d.client.Truncate(ctx, &filewritev1.TruncateRequest{Path: p, Size: 3})
			return err
		}},
		{"fallocate", true, func(ctx context.Context, d *daemon, p string) error {
			_, err := d.client.Fallocate(ctx, &filewritev1.FallocateRequest{Path: p, Offset: 0, Length: 8192, Mode: filewritev1.FallocateMode_FALLOCATE_MODE_ALLOCATE})
			return err
		}},
		{"read", false, func(ctx context.Context, d *daemon, p string) error {
			_, err := d.client.Read(ctx, &filewritev1.ReadRequest{Path: p, Length: 8})
			return err
		}},
		{"stat", false, func(ctx context.Context, d *daemon, p string) error {
			_, err := d.client.Stat(ctx, &filewritev1.StatRequest{Path: p})
			return err
		}},
		{"extents", false, func(ctx context.Context, d *daemon, p string) error {
			_, err := d.client.Extents(ctx, &filewritev1.ExtentsRequest{Path: p})
			return err
		}},
		{"delete", true, func(ctx context.Context, d *daemon, p string) error {
			_, err := d.client.Delete(ctx, &filewritev1.DeleteRequest{Path: p})
			return err
		}},
		{"rename", true, func(ctx context.Context, d *daemon, p string) error {
			_, err := d.client.Rename(ctx, &filewritev1.RenameRequest{Path: p, NewPath: p + ".moved"})
			return err
		}},
		{"append", true, func(ctx context.Context, d *daemon, p string) error {
			_, err := d.client.Append(ctx, &filewritev1.AppendRequest{Path: p, Data: []byte("MORE")})
			return err
		}},
		{"stream", true, func(ctx context.Context, d *daemon, p string) error {
			stream, err := d.client.WriteStream(ctx)
			if err != nil {
				return err
			}
			if err := stream.Send(&filewritev1.WriteStreamRequest{Path: p, Writes: []*filewritev1.StreamWrite{{Id: 1, Data: []byte("CHANGED!")}}}); err != nil {
				return err
			}
			if err := stream.CloseSend(); err != nil {
				return err
			}
			e := recvAll(stream)
			if e.err == nil && len(e.acks) == 1 && e.acks[0].GetStatus().GetCode() != 0 {
				return statusErrorOf(e.acks[0])
			}
			return e.err
		}},
	}
}

// TestScopedRPCs runs every RPC with a read-write and a read-only token of
// tenants/a on a file inside the prefix, in another tenant's directory, in
// a directory whose name only starts like the prefix, and through a link
// from inside the prefix to the other tenant: allowed as the mode says
// inside, PERMISSION_DENIED elsewhere, and nothing on disk changed by a
// refusal.
func TestScopedRPCs(t *testing.T) {
	d, _ := startTenantDaemon(t)
	for _, c := range scopedCalls() {
		for _, tt := range []struct {
			token, dir string
			want       codes.Code
		}{
			{tokenRW, "tenants/a", codes.OK},
			{tokenRW, "tenants/b", codes.PermissionDenied},
			{tokenRW, "tenants/ab", codes.PermissionDenied},
			{tokenRW, "tenants/a/link", codes.PermissionDenied},
			{tokenRO, "tenants/b", codes.PermissionDenied},
			{tokenRO, "tenants/a/link", codes.PermissionDenied},
			{tokenRO, "tenants/a", map[bool]codes.Code{true: codes.PermissionDenied, false: codes.OK}[c.write || c.name == "fsync"]},
		} {
			name := c.name + " " + map[string]string{tokenRW: "rw", tokenRO: "ro"}[tt.token] + " " + tt.dir
			t.Run(name, func(t *testing.T) {
				before := testutil.Snapshot(t, d.root)
				err := c.call(withAuth(testContext(t), "Bearer "+tt.token), d, tt.dir+"/"+c.name+".bin")
				wantCode(t, name, err, tt.want)
				if tt.want != codes.OK || !c.write {
					testutil.CheckUnchanged(t, d.root, before)
				}
				if tt.want == codes.PermissionDenied {
					if got := reasonOfErr(err); got != filewritev1.ErrorReason_PERMISSION_DENIED_SCOPE.String() {
						t.Errorf("reason %q, want PERMISSION_DENIED_SCOPE", got)
					}
				}
			})
		}
	}
	// The administrator reaches every tenant.
	if err := scopedCalls()[0].call(withAuth(testContext(t), "Bearer "+tokenAdmin), d, "tenants/b/write.bin"); err != nil {
		t.Errorf("admin write to tenants/b: %v", err)
	}
}

func TestScopedRenameAndList(t *testing.T) {
	d, _ := startTenantDaemon(t)
	ctx := withAuth(testContext(t), "Bearer "+tokenRW)
	before := testutil.Snapshot(t, d.root)
	for _, tt := range []struct{ from, to string }{
		{"tenants/a/rename.bin", "tenants/b/stolen.bin"}, // out of the scope
		{"tenants/b/rename.bin", "tenants/a/stolen.bin"}, // into it
	} {
		_, err := d.client.Rename(ctx, &filewritev1.RenameRequest{Path: tt.from, NewPath: tt.to})
		wantCode(t, "rename "+tt.from+" to "+tt.to, err, codes.PermissionDenied)
	}
	testutil.CheckUnchanged(t, d.root, before)

	list := func(dir string) ([]string, error) {
		resp, err := d.client.List(ctx, &filewritev1.ListRequest{Path: dir})
		var names []string
		for _, e := range resp.GetEntries() {
			names = append(names, e.GetName())
		}
		return names, err
	}
	for _, tt := range []struct {
		dir  string
		want []string
		code codes.Code
	}{
		{"", []string{"tenants"}, codes.OK},
		{"tenants", []string{"a"}, codes.OK},
		{"tenants/a", []string{"append.bin", "delete.bin", "extents.bin", "fallocate.bin", "fsync.bin", "link", "read.bin", "rename.bin", "stat.bin", "stream.bin", "truncate.bin", "write.bin"}, codes.OK},
		{"tenants/b", nil, codes.PermissionDenied},
		{"tenants/ab", nil, codes.PermissionDenied},
		{"tenants/a/link", nil, codes.PermissionDenied},
	} {
		got, err := list(tt.dir)
		wantCode(t, "list "+tt.dir, err, tt.code)
		slices.Sort(got)
		if !slices.Equal(got, tt.want) {
			t.Errorf("List(%q) = %q, want %q", tt.dir, got, tt.want)
		}
	}
}

// TestScopedStreamReload narrows and then revokes the credential of an
// open stream: the writes read before each reload are acked, the stream
// ends with PERMISSION_DENIED or UNAUTHENTICATED, and no later write lands.
func TestScopedStreamReload(t *testing.T) {
	for _, tt := range []struct {
		name, newLine string
		want          codes.Code
	}{
		{"narrowed", tokenRW + " name=tenant-a prefix=tenants/c/", codes.PermissionDenied},
		{"made read-only", tokenRW + " name=tenant-a prefix=tenants/a/ mode=ro", codes.PermissionDenied},
		{"revoked", "# " + tokenRW + " revoked", codes.Unauthenticated},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d, tokens := startTenantDaemon(t)
			ctx := withAuth(testContext(t), "Bearer "+tokenRW)
			stream := openStream(t, ctx, d.client, "tenants/a/stream.bin")
			if err := stream.Send(&filewritev1.WriteStreamRequest{Writes: []*filewritev1.StreamWrite{{Id: 1, Data: []byte("BEFORE")}}}); err != nil {
				t.Fatal(err)
			}
			resp, err := stream.Recv()
			if err != nil || len(resp.GetAcks()) != 1 || resp.GetAcks()[0].GetStatus().GetCode() != 0 {
				t.Fatalf("ack of the write before the reload: %v, %v", resp, err)
			}
			if err := os.WriteFile(tokens, []byte(tokenAdmin+"\n"+tt.newLine+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := d.srv.ReloadAuth(); err != nil {
				t.Fatalf("ReloadAuth: %v", err)
			}
			e := recvAll(stream)
			wantCode(t, "the stream after the reload", e.err, tt.want)
			// The stream is over: a write sent now goes nowhere.
			_ = stream.Send(&filewritev1.WriteStreamRequest{Writes: []*filewritev1.StreamWrite{{Id: 2, Offset: 0, Data: []byte("AFTER!")}}})
			if got := string(d.onDisk(t, "tenants/a/stream.bin")); got != "BEFOREal" {
				t.Errorf("file = %q, want the write before the reload only (%q)", got, "BEFOREal")
			}
			// New calls see the new credentials too.
			_, err = d.client.Write(ctx, &filewritev1.WriteRequest{Path: "tenants/a/write.bin", Data: []byte("x")})
			wantCode(t, "a write after the reload", err, tt.want)
		})
	}
}

// TestScopedHTTP drives the REST routes with the read-write token of
// tenants/a: the gateway's calls are checked as gRPC calls are, and
// GET /debug/locks is for the administrator only.
func TestScopedHTTP(t *testing.T) {
	d, _ := startTenantDaemon(t)
	auth := func(tok string, h ...string) map[string]string {
		m := map[string]string{"Authorization": "Bearer " + tok}
		for i := 0; i+1 < len(h); i += 2 {
			m[h[i]] = h[i+1]
		}
		return m
	}
	json := "application/json"
	tests := []struct {
		name, method, path, body string
		header                   map[string]string
		want                     int
	}{
		{"PUT inside", "PUT", "/v1/files/tenants/a/write.bin", "CHANGED!", auth(tokenRW, "Content-Type", gateway.MIMEOctetStream), 200},
		{"PUT outside", "PUT", "/v1/files/tenants/b/write.bin", "CHANGED!", auth(tokenRW, "Content-Type", gateway.MIMEOctetStream), 403},
		{"PUT read-only", "PUT", "/v1/files/tenants/a/write.bin", "CHANGED!", auth(tokenRO, "Content-Type", gateway.MIMEOctetStream), 403},
		{"PUT through the link", "PUT", "/v1/files/tenants/a/link/write.bin", "CHANGED!", auth(tokenRW, "Content-Type", gateway.MIMEOctetStream), 403},
		{"POST :write outside", "POST", "/v1/files/tenants/b/write.bin:write", `{"data":"Q0hBTkdFRCE="}`, auth(tokenRW, "Content-Type", json), 403},
		{"POST :truncate outside", "POST", "/v1/files/tenants/b/truncate.bin:truncate", `{"size":"1"}`, auth(tokenRW, "Content-Type", json), 403},
		{"POST :rename across", "POST", "/v1/files/tenants/a/rename.bin:rename", `{"newPath":"tenants/b/x.bin"}`, auth(tokenRW, "Content-Type", json), 403},
		{"DELETE outside", "DELETE", "/v1/files/tenants/b/delete.bin", "", auth(tokenRW), 403},
		{"GET :read outside", "GET", "/v1/files/tenants/b/read.bin:read?length=8", "", auth(tokenRO), 403},
		{"GET :read inside, read-only", "GET", "/v1/files/tenants/a/read.bin:read?length=8", "", auth(tokenRO), 200},
		{"GET stat outside", "GET", "/v1/files/tenants/ab/stat.bin", "", auth(tokenRO), 403},
		{"GET dirs of another tenant", "GET", "/v1/dirs/tenants/b", "", auth(tokenRO), 403},
		{"POST :fsync outside", "POST", "/v1/files/tenants/b/fsync.bin:fsync", `{}`, auth(tokenRW, "Content-Type", json), 403},
		{"POST :fsync inside, read-only", "POST", "/v1/files/tenants/a/fsync.bin:fsync", `{}`, auth(tokenRO, "Content-Type", json), 403},
		{"POST :fallocate outside", "POST", "/v1/files/tenants/b/fallocate.bin:fallocate", `{"mode":"FALLOCATE_MODE_ALLOCATE","length":"4096"}`, auth(tokenRW, "Content-Type", json), 403},
		{"GET :extents outside", "GET", "/v1/files/tenants/b/extents.bin:extents", "", auth(tokenRO), 403},
		{"GET :extents inside, read-only", "GET", "/v1/files/tenants/a/extents.bin:extents", "", auth(tokenRO), 200},
		{"download outside", "GET", "/v1/files/tenants/b/read.bin?alt=media", "", auth(tokenRW), 403},
		{"download inside, read-only", "GET", "/v1/files/tenants/a/read.bin?alt=media", "", auth(tokenRO), 200},
		{"HEAD download outside", "HEAD", "/v1/files/tenants/ab/read.bin?alt=media", "", auth(tokenRO), 403},
		{"GET /debug/locks, scoped", "GET", "/debug/locks", "", auth(tokenRW), 403},
		{"GET /debug/locks, admin", "GET", "/debug/locks", "", auth(tokenAdmin), 200},
		{"GET /metrics, scoped (no paths there)", "GET", "/metrics", "", auth(tokenRO), 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := testutil.Snapshot(t, d.root)
			r := testutil.DoHTTP(t, tt.method, d.url+tt.path, strings.NewReader(tt.body), tt.header)
			if r.Status != tt.want {
				t.Fatalf("HTTP status %d (%s), want %d", r.Status, r.Body, tt.want)
			}
			if tt.want == http.StatusForbidden {
				if tt.method != "HEAD" { // a HEAD answer has no body
					if e := testutil.ParseErrorBody(t, r); e.Code != codes.PermissionDenied {
						t.Errorf("error body %s, want code %d", r.Body, codes.PermissionDenied)
					}
				}
				testutil.CheckUnchanged(t, d.root, before)
			}
		})
	}
}

// statusErrorOf is a failed ack's status as an error.
func statusErrorOf(a *filewritev1.StreamAck) error {
	return status.ErrorProto(a.GetStatus())
}

// reasonOfErr is the ErrorInfo reason err carries.
func reasonOfErr(err error) string {
	return errorinfo.Reason(err)
}
