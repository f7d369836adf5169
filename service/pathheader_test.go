package service

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/shard"
)

// withPathHeader adds the routing header, one value per argument.
func withPathHeader(ctx context.Context, values ...string) context.Context {
	for _, v := range values {
		ctx = metadata.AppendToOutgoingContext(ctx, shard.Header, v)
	}
	return ctx
}

// TestPathHeader: a call whose routing header is present must name its
// own path, in any percent-encoding; one that names another file is
// FAILED_PRECONDITION and changes nothing. Without the header a call is
// served (unless --require-path-header); List is never checked.
func TestPathHeader(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	for i, tt := range []struct {
		name   string
		path   string
		header []string
		want   codes.Code
	}{
		{"none", "a b:c%41.bin", nil, codes.OK},
		{"the routing key", "a b:c%41.bin", []string{shard.RoutingKey("a b:c%41.bin")}, codes.OK},
		{"another encoding of the path", "a b:c%41.bin", []string{"a%20b%3ac%2541.bin"}, codes.OK},
		{"the routing key of a name not in ASCII", "ünï/ファイル", []string{shard.RoutingKey("ünï/ファイル")}, codes.OK},
		{"another file", "a b:c%41.bin", []string{"other.bin"}, codes.FailedPrecondition},
		{"the path undecoded", "a b:c%41.bin", []string{"a b:c%41.bin"}, codes.FailedPrecondition}, // decodes to "a b:cA.bin"
		{"not an encoding", "a b:c%41.bin", []string{"a%zz"}, codes.FailedPrecondition},
		{"two values", "a b:c%41.bin", []string{shard.RoutingKey("a b:c%41.bin"), shard.RoutingKey("a b:c%41.bin")}, codes.FailedPrecondition},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := fmt.Sprintf("case%d/%s", i, tt.path)
			var header []string
			for _, h := range tt.header {
				header = append(header, fmt.Sprintf("case%d/%s", i, h))
			}
			_, err := d.client.Write(withPathHeader(ctx, header...), &filewritev1.WriteRequest{Path: path, Data: []byte("x")})
			if got := status.Code(err); got != tt.want {
				t.Fatalf("Write with %s %q: %v, want %v", shard.Header, header, err, tt.want)
			}
			_, statErr := os.Stat(filepath.Join(d.root, path))
			if created := statErr == nil; created != (tt.want == codes.OK) {
				t.Errorf("file created: %v after %v", created, err)
			}
			if tt.want == codes.OK {
				return
			}
			// WriteStream checks its first message's path the same way.
			stream, err := d.client.WriteStream(withPathHeader(ctx, header...))
			if err != nil {
				t.Fatal(err)
			}
			if err := stream.Send(&filewritev1.WriteStreamRequest{Path: path, Writes: []*filewritev1.StreamWrite{{Id: 1, Data: []byte("x")}}}); err != nil && err != io.EOF {
				t.Fatal(err)
			}
			if _, err := stream.Recv(); status.Code(err) != tt.want {
				t.Errorf("WriteStream with %s %q: %v, want %v", shard.Header, header, err, tt.want)
			}
			if _, err := os.Stat(filepath.Join(d.root, path)); err == nil {
				t.Error("the refused stream created the file")
			}
		})
	}
	// List names no file: its header, if any, is not its business.
	if _, err := d.client.List(withPathHeader(ctx, "anything"), &filewritev1.ListRequest{}); err != nil {
		t.Errorf("List with a header of another path: %v", err)
	}
	// A Rename is routed by its old path.
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "old", Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.Rename(withPathHeader(ctx, "new"), &filewritev1.RenameRequest{Path: "old", NewPath: "new"}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("Rename routed by its new path: %v, want FAILED_PRECONDITION", err)
	}
	if _, err := d.client.Rename(withPathHeader(ctx, "old"), &filewritev1.RenameRequest{Path: "old", NewPath: "new"}); err != nil {
		t.Errorf("Rename routed by its old path: %v", err)
	}
}

// TestRequirePathHeader: with --require-path-header, a call on a file
// without the routing header is refused, on gRPC and through the
// gateway; List and health are served without it, and REST passes on the
// header a proxy set, checked like a gRPC one.
func TestRequirePathHeader(t *testing.T) {
	d := startDaemon(t, func(c *Config) { c.RequirePathHeader = true })
	ctx := testContext(t)
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "f", Data: []byte("x")}); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "--require-path-header") {
		t.Errorf("Write without the header: %v, want FAILED_PRECONDITION naming the flag", err)
	}
	stream, err := d.client.WriteStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("WriteStream without the header: %v, want FAILED_PRECONDITION", err)
	}
	if _, err := d.client.Write(withPathHeader(ctx, "f"), &filewritev1.WriteRequest{Path: "f", Data: []byte("x")}); err != nil {
		t.Errorf("Write with the header: %v", err)
	}
	if _, err := d.client.List(ctx, &filewritev1.ListRequest{}); err != nil {
		t.Errorf("List without the header: %v", err)
	}
	if _, err := healthpb.NewHealthClient(d.conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health Check without the header: %v", err)
	}

	for _, tt := range []struct {
		name, header string
		want         int
	}{
		{"none", "", http.StatusBadRequest},
		{"the path", "g%3Ah", http.StatusCreated},
		{"another path", "g", http.StatusBadRequest},
	} {
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, d.url+"/v1/files/g:h", strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		if tt.header != "" {
			req.Header.Set(shard.Header, tt.header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("REST PUT with header %q: %d, want %d", tt.header, resp.StatusCode, tt.want)
		}
	}
	resp, err := http.Get(d.url + "/v1/dirs")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("REST List without the header: %d, want 200", resp.StatusCode)
	}
}
