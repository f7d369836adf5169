package service

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
)

// testCert is a self-signed certificate made at run time, written as PEM
// files into the test's directory.
type testCert struct {
	certFile, keyFile string
	pool              *x509.CertPool // trusts exactly this certificate
}

// newTestCert makes a self-signed certificate for 127.0.0.1 and localhost.
func newTestCert(t *testing.T, dir, name string) testCert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	c := testCert{certFile: filepath.Join(dir, name+".crt"), keyFile: filepath.Join(dir, name+".key")}
	if err := os.WriteFile(c.certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	parsed, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	c.pool = x509.NewCertPool()
	c.pool.AddCert(parsed)
	return c
}

func (c testCert) clientTLS() *tls.Config {
	return &tls.Config{RootCAs: c.pool, MinVersion: tls.VersionTLS12}
}

// TestTLS serves both listeners with TLS: a client that trusts the
// certificate gets through on gRPC and on REST (whose gateway reaches the
// gRPC listener over TLS too), a plaintext client gets nowhere.
func TestTLS(t *testing.T) {
	dir := testutil.Dir(t)
	cert := newTestCert(t, dir, "server")
	d := startDaemon(t, func(c *Config) { c.TLSCert, c.TLSKey = cert.certFile, cert.keyFile })
	ctx := testContext(t)

	conn, err := grpc.NewClient(d.srv.GRPCAddr().String(), grpc.WithTransportCredentials(credentials.NewTLS(cert.clientTLS())))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := filewritev1.NewFileServiceClient(conn).Write(ctx, &filewritev1.WriteRequest{Path: "tls.bin", Data: []byte("over TLS")}); err != nil {
		t.Fatalf("Write over TLS: %v", err)
	}

	https := &http.Client{Transport: &http.Transport{TLSClientConfig: cert.clientTLS(), ForceAttemptHTTP2: true}}
	addr := d.srv.HTTPAddr().String()
	resp, err := https.Get("https://" + addr + "/v1/files/tls.bin:read?length=100")
	if err != nil {
		t.Fatalf("REST read over HTTPS: %v", err)
	}
	body := readAll(t, resp)
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
		body := readAll(t, resp)
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
	cert := newTestCert(t, dir, "server")
	other := newTestCert(t, dir, "other")
	tests := []struct {
		name      string
		cert, key string
		want      string
	}{
		{"cert without key", cert.certFile, "", "--tls-cert and --tls-key"},
		{"key without cert", "", cert.keyFile, "--tls-cert and --tls-key"},
		{"missing files", filepath.Join(dir, "nope.crt"), filepath.Join(dir, "nope.key"), "load TLS certificate"},
		{"key of another certificate", cert.certFile, other.keyFile, "load TLS certificate"},
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

// plaintextConn dials addr without TLS.
func plaintextConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
