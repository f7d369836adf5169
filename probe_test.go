package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service"
)

// startDaemon starts a real daemon in this process on loopback ports the
// kernel picks, with args added to its flags.
func startDaemon(t *testing.T, args ...string) *service.Server {
	t.Helper()
	args = append([]string{"--root", filepath.Join(testutil.Dir(t), "root"),
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, args...)
	cfg, err := parseFlags(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := service.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown() })
	return srv
}

func probe(args ...string) (code int, stdout, stderr string) {
	var out, errs strings.Builder
	code = runProbe(args, &out, &errs)
	return code, out.String(), errs.String()
}

// TestProbeGRPC: the probe answers 0 while the daemon serves, with tokens
// required or not (health is open), and 1 once it has shut down.
func TestProbeGRPC(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("s3cret-token-for-the-probe-test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"no auth", nil},
		{"auth", []string{"--auth-token-file", tokens}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := startDaemon(t, tt.args...)
			addr := srv.GRPCAddr().String()
			for _, svc := range []string{"", "filewrite.v1.FileService"} {
				code, out, errs := probe("--grpc-addr", addr, "--service", svc)
				if code != probeServing || !strings.Contains(out, "SERVING") {
					t.Errorf("probe of %q while serving: exit %d, stdout %q, stderr %q; want 0 and SERVING", svc, code, out, errs)
				}
			}
			if err := srv.Shutdown(); err != nil {
				t.Fatal(err)
			}
			if code, out, errs := probe("--grpc-addr", addr, "--timeout", "2s"); code != probeNotServing {
				t.Errorf("probe after shutdown: exit %d, stdout %q, stderr %q; want %d", code, out, errs, probeNotServing)
			}
		})
	}
}

// TestProbeTLS: against a daemon serving TLS, the probe speaks TLS with
// --tls-ca (verifying the daemon's certificate) or --tls-no-verify, and
// fails in plaintext or with a CA that did not sign the certificate.
func TestProbeTLS(t *testing.T) {
	dir := t.TempDir()
	cert := testutil.NewCert(t, dir, "daemon")
	other := testutil.NewCert(t, dir, "other")
	srv := startDaemon(t, "--tls-cert", cert.CertFile, "--tls-key", cert.KeyFile)
	addr := srv.GRPCAddr().String()
	for _, tt := range []struct {
		args []string
		want int
	}{
		{[]string{"--tls-ca", cert.CertFile}, probeServing},
		{[]string{"--tls-no-verify"}, probeServing},
		{nil, probeNotServing},
		{[]string{"--tls-ca", other.CertFile}, probeNotServing},
	} {
		args := append([]string{"--grpc-addr", addr, "--timeout", "3s"}, tt.args...)
		if code, out, errs := probe(args...); code != tt.want {
			t.Errorf("probe %q: exit %d, stdout %q, stderr %q; want %d", tt.args, code, out, errs, tt.want)
		}
	}
}

// TestProbeGRPCAddrFromEnv: inside the daemon's container the probe needs
// no flags: it reads the daemon's own FILEWRITE_GRPC_ADDR, and probes a
// wildcard listen address on loopback.
func TestProbeGRPCAddrFromEnv(t *testing.T) {
	srv := startDaemon(t)
	_, port, _ := strings.Cut(srv.GRPCAddr().String(), ":")
	t.Setenv("FILEWRITE_GRPC_ADDR", "0.0.0.0:"+port)
	if code, out, errs := probe(); code != probeServing {
		t.Errorf("probe with FILEWRITE_GRPC_ADDR=0.0.0.0:%s: exit %d, stdout %q, stderr %q; want 0", port, code, out, errs)
	}
}

// TestProbeReadyz: with --http-addr the probe asks a real daemon's
// /readyz, which needs no token even when tokens are on.
func TestProbeReadyz(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("s3cret-token-for-the-readyz-test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := startDaemon(t, "--auth-token-file", tokens)
	addr := srv.HTTPAddr().String()
	if code, out, errs := probe("--http-addr", addr); code != probeServing || !strings.Contains(out, "200") {
		t.Errorf("probe of /readyz while serving: exit %d, stdout %q, stderr %q; want 0 and 200", code, out, errs)
	}
	if err := srv.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := probe("--http-addr", addr, "--timeout", "2s"); code != probeNotServing {
		t.Errorf("probe of /readyz after shutdown: exit %d, stdout %q, stderr %q; want %d", code, out, errs, probeNotServing)
	}
}

// TestProbeHTTP: with --http-addr the probe asks GET /readyz, and only a
// 2xx answer is serving.
func TestProbeHTTP(t *testing.T) {
	ready := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" || r.Method != http.MethodGet {
			http.NotFound(w, r)
			return
		}
		if !ready {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	if code, out, errs := probe("--http-addr", addr); code != probeServing || !strings.Contains(out, "200") {
		t.Errorf("probe of a ready /readyz: exit %d, stdout %q, stderr %q; want 0 and 200", code, out, errs)
	}
	ready = false
	if code, out, errs := probe("--http-addr", addr); code != probeNotServing || !strings.Contains(errs, "503") {
		t.Errorf("probe of a draining /readyz: exit %d, stdout %q, stderr %q; want 1 and 503", code, out, errs)
	}
}

func TestProbeRejects(t *testing.T) {
	for _, args := range [][]string{
		{"--timeout", "0s"},
		{"extra"},
		{"--tls-ca", filepath.Join(t.TempDir(), "missing.pem")},
	} {
		if code, _, _ := probe(args...); code == probeServing {
			t.Errorf("probe %q: exit 0, want a failure", args)
		}
	}
}

func TestLoopbackFor(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"0.0.0.0:50051", "127.0.0.1:50051"},
		{":50051", "127.0.0.1:50051"},
		{"[::]:50051", "[::1]:50051"},
		{"10.0.0.5:50051", "10.0.0.5:50051"},
		{"filewrite:50051", "filewrite:50051"},
		{"unix:/run/filewrite.sock", "unix:/run/filewrite.sock"},
	} {
		if got := loopbackFor(tt.in); got != tt.want {
			t.Errorf("loopbackFor(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
