package service

import (
	"crypto/tls"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
)

// TestTLS serves both listeners with TLS: a client that trusts the
// certificate gets through on gRPC and on REST (whose gateway reaches the
// gRPC listener over TLS too), a plaintext client gets nowhere.
func TestTLS(t *testing.T) {
	dir := testutil.Dir(t)
	cert := testutil.NewCert(t, dir, "server")
	d := startDaemon(t, func(c *Config) { c.TLSCert, c.TLSKey = cert.CertFile, cert.KeyFile })
	ctx := testContext(t)

	conn, err := grpc.NewClient(d.srv.GRPCAddr().String(), grpc.WithTransportCredentials(credentials.NewTLS(cert.ClientTLS())))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := filewritev1.NewFileServiceClient(conn).Write(ctx, &filewritev1.WriteRequest{Path: "tls.bin", Data: []byte("over TLS")}); err != nil {
		t.Fatalf("Write over TLS: %v", err)
	}

	https := &http.Client{Transport: &http.Transport{TLSClientConfig: cert.ClientTLS(), ForceAttemptHTTP2: true}}
	addr := d.srv.HTTPAddr().String()
	resp, err := https.Get("https://" + addr + "/v1/files/tls.bin:read?length=100")
	if err != nil {
		t.Fatalf("REST read over HTTPS: %v", err)
	}
	body := testutil.ReadAll(t, resp)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"data":"b3ZlciBUTFM="`) {
		t.Errorf("REST read over HTTPS = %d %s, want 200 with the data written over gRPC", resp.StatusCode, body)
	}
	if resp.ProtoMajor != 2 {
		t.Errorf("REST over HTTPS spoke %s, want HTTP/2", resp.Proto)
	}

	// d.client speaks plaintext to the TLS listener.
	_, err = d.client.Stat(ctx, &filewritev1.StatRequest{Path: "tls.bin"})
	wantCode(t, "Stat in plaintext against the TLS listener", err, codes.Unavailable)
	// Go's TLS server recognises a plaintext HTTP request and answers it a
	// bare 400 itself; the gateway never sees it.
	if resp, err := http.Get("http://" + addr + "/v1/files/tls.bin"); err == nil {
		body := testutil.ReadAll(t, resp)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "HTTPS") {
			t.Errorf("plain HTTP against the TLS listener answered %d %s, want a failed connection or 400", resp.StatusCode, body)
		}
	}
	// A client that does not trust the certificate refuses the server.
	untrusting, err := grpc.NewClient(d.srv.GRPCAddr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	defer untrusting.Close()
	_, err = healthpb.NewHealthClient(untrusting).Check(ctx, &healthpb.HealthCheckRequest{})
	wantCode(t, "health from a client that does not trust the certificate", err, codes.Unavailable)
}

func TestStartRejectsBadTLS(t *testing.T) {
	dir := testutil.Dir(t)
	cert := testutil.NewCert(t, dir, "server")
	other := testutil.NewCert(t, dir, "other")
	tests := []struct {
		name      string
		cert, key string
		want      string
	}{
		{"cert without key", cert.CertFile, "", "--tls-cert and --tls-key"},
		{"key without cert", "", cert.KeyFile, "--tls-cert and --tls-key"},
		{"missing files", filepath.Join(dir, "nope.crt"), filepath.Join(dir, "nope.key"), "load TLS certificate"},
		{"key of another certificate", cert.CertFile, other.KeyFile, "load TLS certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Root = filepath.Join(dir, "root")
			cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
			cfg.TLSCert, cfg.TLSKey = tt.cert, tt.key
			srv, err := Start(cfg)
			if err == nil {
				srv.Shutdown()
				t.Fatalf("Start with %s succeeded, want an error", tt.name)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Start: %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
}
