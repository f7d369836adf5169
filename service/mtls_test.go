package service

import (
	"crypto/tls"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/auth"
	"github.com/filewrite/filewrite/service/internal/gateway"
)

// TestClientCertificates runs a daemon with --tls-client-ca: a certificate
// mapped by a cert= line reaches its scope over gRPC and REST, one without
// a mapping gets nothing, and a REST client cannot claim a certificate
// identity with a header.
func TestClientCertificates(t *testing.T) {
	dir := testutil.Dir(t)
	server := testutil.NewCert(t, dir, "server")
	ca := testutil.NewCA(t, dir)
	tokens := testutil.WriteTokenFile(t, dir, "tokens",
		tokenAdmin,
		"cert=spiffe://example.org/job-a name=job-a prefix=tenants/a/")
	d := startDaemon(t, func(c *Config) {
		c.TLSCert, c.TLSKey, c.TLSClientCA = server.CertFile, server.KeyFile, ca.File
		c.AuthTokenFile = tokens
	})
	for _, p := range []string{"tenants/a/x.bin", "tenants/b/x.bin"} {
		if err := os.MkdirAll(filepath.Join(d.root, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d.root, p), []byte("original"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tlsWith := func(certs ...tls.Certificate) *tls.Config {
		c := server.ClientTLS()
		c.Certificates = certs
		return c
	}
	mapped := tlsWith(ca.Issue(t, "spiffe://example.org/job-a"))
	unmapped := tlsWith(ca.Issue(t, "spiffe://example.org/stranger"))

	ctx := testContext(t)
	for _, tt := range []struct {
		name string
		conf *tls.Config
		path string
		want codes.Code
	}{
		{"mapped, inside", mapped, "tenants/a/x.bin", codes.OK},
		{"mapped, outside", mapped, "tenants/b/x.bin", codes.PermissionDenied},
		{"unmapped", unmapped, "tenants/a/x.bin", codes.Unauthenticated},
		{"no certificate, no token", tlsWith(), "tenants/a/x.bin", codes.Unauthenticated},
	} {
		t.Run("gRPC "+tt.name, func(t *testing.T) {
			conn, err := grpc.NewClient(d.srv.GRPCAddr().String(), grpc.WithTransportCredentials(credentials.NewTLS(tt.conf)))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			before := testutil.Snapshot(t, d.root)
			_, err = filewritev1.NewFileServiceClient(conn).Write(ctx, &filewritev1.WriteRequest{Path: tt.path, Data: []byte("CHANGED!")})
			wantCode(t, tt.name, err, tt.want)
			if tt.want != codes.OK {
				testutil.CheckUnchanged(t, d.root, before)
			}
		})
	}
	addr := d.srv.HTTPAddr().String()
	for _, tt := range []struct {
		name   string
		conf   *tls.Config
		path   string
		header map[string]string
		want   int
	}{
		{"mapped, inside", mapped, "tenants/a/x.bin", nil, 200},
		{"mapped, outside", mapped, "tenants/b/x.bin", nil, 403},
		{"unmapped", unmapped, "tenants/a/x.bin", nil, 401},
		{"unmapped, claiming the mapped identity", unmapped, "tenants/a/x.bin",
			map[string]string{"Grpc-Metadata-" + auth.GatewayCertMetadata: "spiffe://example.org/job-a", auth.GatewayCertMetadata: "spiffe://example.org/job-a"}, 401},
		{"no certificate, claiming the mapped identity", tlsWith(), "tenants/a/x.bin",
			map[string]string{"Grpc-Metadata-" + auth.GatewayCertMetadata: "spiffe://example.org/job-a", auth.GatewayCertMetadata: "spiffe://example.org/job-a"}, 401},
	} {
		t.Run("REST "+tt.name, func(t *testing.T) {
			hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tt.conf, ForceAttemptHTTP2: true}}
			req, err := http.NewRequestWithContext(ctx, "PUT", "https://"+addr+"/v1/files/"+tt.path, strings.NewReader("REST-PUT"))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", gateway.MIMEOctetStream)
			for k, v := range tt.header {
				req.Header.Set(k, v)
			}
			before := testutil.Snapshot(t, d.root)
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body := testutil.ReadAll(t, resp)
			if resp.StatusCode != tt.want {
				t.Fatalf("PUT %s: %d %s, want %d", tt.path, resp.StatusCode, body, tt.want)
			}
			if tt.want != 200 {
				testutil.CheckUnchanged(t, d.root, before)
			}
		})
	}
	if got := string(d.onDisk(t, "tenants/a/x.bin")); got != "REST-PUT" {
		t.Errorf("tenants/a/x.bin = %q, want the mapped certificate's REST write", got)
	}
}

func TestClientCANeedsTLSAndTokens(t *testing.T) {
	dir := testutil.Dir(t)
	cfg := DefaultConfig()
	cfg.Root = filepath.Join(dir, "root")
	cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.TLSClientCA = testutil.NewCA(t, dir).File
	if srv, err := Start(cfg); err == nil {
		srv.Shutdown()
		t.Fatal("Start with --tls-client-ca alone succeeded")
	} else if !strings.Contains(err.Error(), "--tls-client-ca needs") {
		t.Errorf("Start: %v, want it to say what --tls-client-ca needs", err)
	}
}
