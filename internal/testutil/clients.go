package testutil

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// The clients below are shared by the service's in-process tests and the
// e2e tests that run the daemon binary: both talk to a daemon over real
// sockets and need the same certificates, tokens and held requests.

// PlaintextConn dials addr without TLS and closes the connection when the
// test ends.
func PlaintextConn(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// ReadAll reads and closes a response body.
func ReadAll(t testing.TB, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read response body: %v", err)
	}
	return string(b)
}

// WriteTokenFile writes tokens, one per line, to dir/name (mode 0600), in
// the daemon's --auth-token-file format.
func WriteTokenFile(t testing.TB, dir, name string, tokens ...string) string {
	t.Helper()
	file := filepath.Join(dir, name)
	if err := os.WriteFile(file, []byte(strings.Join(tokens, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// Cert is a self-signed certificate made at run time, written as PEM
// files into a test's directory.
type Cert struct {
	CertFile, KeyFile string
	Pool              *x509.CertPool // trusts exactly this certificate
}

// NewCert makes a self-signed certificate for 127.0.0.1, ::1 and
// localhost, and writes it to dir/name.crt and its key to dir/name.key.
func NewCert(t testing.TB, dir, name string) Cert {
	t.Helper()
	key, serial := newKey(t)
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
	c := Cert{CertFile: filepath.Join(dir, name+".crt"), KeyFile: filepath.Join(dir, name+".key")}
	if err := os.WriteFile(c.CertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.KeyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	parsed, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	c.Pool = x509.NewCertPool()
	c.Pool.AddCert(parsed)
	return c
}

// ClientTLS is a client configuration that trusts c alone.
func (c Cert) ClientTLS() *tls.Config {
	return &tls.Config{RootCAs: c.Pool, MinVersion: tls.VersionTLS12}
}

// HeldPut is a raw PUT whose body the test holds back: Reading is closed
// once the daemon's handler has begun to read the body ("Expect:
// 100-continue" says when), Send lets the body go, and Done gives the
// answer.
type HeldPut struct {
	Reading chan struct{}
	Done    chan PutResult
	body    []byte
	pw      *io.PipeWriter
}

// PutResult is a HeldPut's answer.
type PutResult struct {
	Status int
	Body   string
	Err    error
}

// StartHeldPut sends a PUT of body to url, a file's raw PUT, without its
// body; the client waits up to wait for the handler to ask for it.
func StartHeldPut(t testing.TB, ctx context.Context, url string, body []byte, wait time.Duration) *HeldPut {
	t.Helper()
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(ctx, "PUT", url, pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(body))
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Expect", "100-continue")
	p := &HeldPut{Reading: make(chan struct{}), Done: make(chan PutResult, 1), body: body, pw: pw}
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{Got100Continue: func() { close(p.Reading) }}))
	client := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: wait}}
	go func() {
		resp, err := client.Do(req)
		if err != nil {
			p.Done <- PutResult{Err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		p.Done <- PutResult{resp.StatusCode, string(b), err}
	}()
	return p
}

// Send lets the body go.
func (p *HeldPut) Send() {
	go func() {
		p.pw.Write(p.body)
		p.pw.Close()
	}()
}

// WatchHealth opens a health Watch on conn and returns a function that
// waits until the watch reports want.
func WatchHealth(t testing.TB, ctx context.Context, conn *grpc.ClientConn) func(want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatalf("health Watch: %v", err)
	}
	return func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for {
			resp, err := stream.Recv()
			if err != nil {
				t.Fatalf("health Watch, waiting for %v: %v", want, err)
			}
			if resp.GetStatus() == want {
				return
			}
		}
	}
}

// OnceEncoded is a client codec (grpc.ForceCodecV2) that sends one
// message, Msg, as the bytes Wire encoded once: under the race detector,
// encoding 64 MiB sixteen times takes longer than the rest of a test.
type OnceEncoded struct {
	Msg  proto.Message
	Wire []byte
}

func (c *OnceEncoded) Name() string { return "proto" }

func (c *OnceEncoded) Marshal(v any) (mem.BufferSlice, error) {
	if v != c.Msg {
		return nil, errors.New("OnceEncoded sends only the message it was made with")
	}
	return mem.BufferSlice{mem.SliceBuffer(c.Wire)}, nil
}

func (c *OnceEncoded) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

// newKey is a fresh P-256 key and a random serial number for a
// certificate of it.
func newKey(t testing.TB) (*ecdsa.PrivateKey, *big.Int) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	return key, serial
}

// CA is a certificate authority made at run time, which issues client
// certificates (mTLS tests).
type CA struct {
	File string // its certificate, PEM, for --tls-client-ca
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA makes a CA and writes its certificate to dir/client-ca.crt.
func NewCA(t testing.TB, dir string) *CA {
	t.Helper()
	key, serial := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "filewrite test client CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{File: filepath.Join(dir, "client-ca.crt"), cert: cert, key: key}
	if err := os.WriteFile(ca.File, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return ca
}

// Issue makes a client certificate whose first URI SAN is uri.
func (ca *CA) Issue(t testing.TB, uri string) tls.Certificate {
	t.Helper()
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	key, serial := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "ignored when there is a URI"},
		URIs:         []*url.URL{u},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
