package service

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/gateway"
)

const (
	tokenAlpha = "alpha-7f3c9b1e"
	tokenBeta  = "beta-2d8e4a60"
)

// startAuthDaemon starts a daemon that accepts tokenAlpha and tokenBeta,
// with a file in its root that rejected requests must leave alone.
func startAuthDaemon(t *testing.T) *daemon {
	t.Helper()
	tokens := testutil.WriteTokenFile(t, testutil.Dir(t), "tokens", tokenAlpha, tokenBeta)
	d := startDaemon(t, func(c *Config) { c.AuthTokenFile = tokens })
	if err := os.WriteFile(filepath.Join(d.root, "existing.bin"), []byte("original"), 0o644); err != nil {
		t.Fatal(err)
	}
	return d
}

func withAuth(ctx context.Context, values ...string) context.Context {
	for _, v := range values {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", v)
	}
	return ctx
}

func TestAuthGRPC(t *testing.T) {
	d := startAuthDaemon(t)
	write := func(ctx context.Context) error {
		_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "existing.bin", Data: []byte("CHANGED!")})
		return err
	}
	truncate := func(ctx context.Context) error {
		_, err := d.client.Truncate(ctx, &filewritev1.TruncateRequest{Path: "existing.bin"})
		return err
	}
	read := func(ctx context.Context) error {
		_, err := d.client.Read(ctx, &filewritev1.ReadRequest{Path: "existing.bin", Length: 8})
		return err
	}
	health := func(ctx context.Context) error {
		_, err := healthpb.NewHealthClient(d.conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	reflect := func(ctx context.Context) error {
		stream, err := reflectionpb.NewServerReflectionClient(d.conn).ServerReflectionInfo(ctx)
		if err != nil {
			return err
		}
		// A Send to a stream the server ended fails with io.EOF; Recv
		// then returns the status.
		if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil && err != io.EOF {
			return err
		}
		_, err = stream.Recv()
		return err
	}
	bearer := "Bearer " + tokenAlpha
	tests := []struct {
		name  string
		call  func(context.Context) error
		auth  []string
		want  codes.Code
		write bool // succeeds by changing existing.bin
	}{
		{"write without a token", write, nil, codes.Unauthenticated, false},
		{"write with a wrong token", write, []string{"Bearer nope"}, codes.Unauthenticated, false},
		{"write with basic auth", write, []string{"Basic " + tokenAlpha}, codes.Unauthenticated, false},
		{"write with two tokens", write, []string{bearer, "Bearer " + tokenBeta}, codes.Unauthenticated, false},
		{"truncate without a token", truncate, nil, codes.Unauthenticated, false},
		{"read without a token", read, nil, codes.Unauthenticated, false},
		{"reflection without a token", reflect, nil, codes.Unauthenticated, false},
		{"health without a token", health, nil, codes.OK, false},
		{"read with a token", read, []string{bearer}, codes.OK, false},
		{"reflection with a token", reflect, []string{bearer}, codes.OK, false},
		{"write with the second token", write, []string{"Bearer " + tokenBeta}, codes.OK, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := testutil.Snapshot(t, d.root)
			err := tt.call(withAuth(testContext(t), tt.auth...))
			wantCode(t, tt.name, err, tt.want)
			if !tt.write {
				testutil.CheckUnchanged(t, d.root, before)
			}
		})
	}
	if got := string(d.onDisk(t, "existing.bin")); got != "CHANGED!" {
		t.Errorf("existing.bin = %q after the one authenticated write, want %q", got, "CHANGED!")
	}
}

func TestAuthHTTP(t *testing.T) {
	d := startAuthDaemon(t)
	octet := func(h ...string) map[string]string {
		m := map[string]string{"Content-Type": gateway.MIMEOctetStream}
		for i := 0; i+1 < len(h); i += 2 {
			m[h[i]] = h[i+1]
		}
		return m
	}
	auth := "Bearer " + tokenAlpha
	tests := []struct {
		name, method, path string
		header             map[string]string
		want               int
	}{
		{"PUT without a token", "PUT", "/v1/files/existing.bin", octet(), 401},
		{"PUT with a wrong token", "PUT", "/v1/files/existing.bin", octet("Authorization", "Bearer nope"), 401},
		{"PUT creating a file, without a token", "PUT", "/v1/files/new/file.bin", octet(), 401},
		{"POST :write without a token", "POST", "/v1/files/existing.bin:write", map[string]string{"Content-Type": "application/json"}, 401},
		{"POST :truncate without a token", "POST", "/v1/files/existing.bin:truncate", nil, 401},
		{"GET :read without a token", "GET", "/v1/files/existing.bin:read?length=8", nil, 401},
		{"GET stat without a token", "GET", "/v1/files/existing.bin", nil, 401},
		{"GET /metrics without a token", "GET", "/metrics", nil, 401},
		{"an unknown route without a token", "GET", "/nope", nil, 401},
		{"token only in Grpc-Metadata-Authorization", "PUT", "/v1/files/existing.bin", octet("Grpc-Metadata-Authorization", auth), 401},
		{"a second, bogus, Grpc-Metadata-Authorization", "PUT", "/v1/files/existing.bin", octet("Authorization", auth, "Grpc-Metadata-Authorization", "Bearer nope"), 401},
		{"GET stat with a token", "GET", "/v1/files/existing.bin", map[string]string{"Authorization": auth}, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := testutil.Snapshot(t, d.root)
			body := ""
			if tt.method != "GET" {
				body = `{"data":"Q0hBTkdFRCE=","size":"0"}`
				if tt.header["Content-Type"] == gateway.MIMEOctetStream {
					body = "CHANGED!"
				}
			}
			r := testutil.DoHTTP(t, tt.method, d.url+tt.path, strings.NewReader(body), tt.header)
			if r.Status != tt.want {
				t.Fatalf("HTTP status %d (%s), want %d", r.Status, r.Body, tt.want)
			}
			if tt.want == http.StatusUnauthorized {
				if e := testutil.ParseErrorBody(t, r); e.Code != codes.Unauthenticated || e.Message == "" {
					t.Errorf("error body %s, want code %d with a message", r.Body, codes.Unauthenticated)
				}
			}
			testutil.CheckUnchanged(t, d.root, before)
		})
	}
	// The 401s above would also come from a gateway that refuses everyone.
	r := testutil.DoHTTP(t, "PUT", d.url+"/v1/files/existing.bin", strings.NewReader("CHANGED!"), octet("Authorization", auth))
	if r.Status != http.StatusOK {
		t.Fatalf("PUT with a token: %d %s, want 200", r.Status, r.Body)
	}
	if got := string(d.onDisk(t, "existing.bin")); got != "CHANGED!" {
		t.Errorf("existing.bin = %q after an authenticated PUT, want CHANGED!", got)
	}
}

func TestReloadAuth(t *testing.T) {
	dir := testutil.Dir(t)
	file := testutil.WriteTokenFile(t, dir, "tokens", tokenAlpha)
	d := startDaemon(t, func(c *Config) { c.AuthTokenFile = file })
	stat := func(token string) error {
		_, err := d.client.Write(withAuth(testContext(t), "Bearer "+token), &filewritev1.WriteRequest{Path: "f", Data: []byte("x")})
		return err
	}
	wantCode(t, "alpha before the reload", stat(tokenAlpha), codes.OK)
	wantCode(t, "beta before the reload", stat(tokenBeta), codes.Unauthenticated)

	testutil.WriteTokenFile(t, dir, "tokens", tokenBeta)
	if err := d.srv.ReloadAuth(); err != nil {
		t.Fatalf("ReloadAuth: %v", err)
	}
	wantCode(t, "alpha after it was removed", stat(tokenAlpha), codes.Unauthenticated)
	wantCode(t, "beta after it was added", stat(tokenBeta), codes.OK)

	// A file left empty by a bad edit does not lock everyone out.
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.srv.ReloadAuth(); err == nil {
		t.Error("ReloadAuth of an empty file succeeded, want an error")
	}
	wantCode(t, "beta after a failed reload", stat(tokenBeta), codes.OK)

	off := startDaemon(t, nil)
	if err := off.srv.ReloadAuth(); err == nil {
		t.Error("ReloadAuth without --auth-token-file succeeded, want an error")
	}
}

func TestIsLoopbackAddr(t *testing.T) {
	tests := []struct {
		addr string
		want bool
	}{
		{"127.0.0.1:50051", true},
		{"127.0.0.2:0", true},
		{"[::1]:8080", true},
		{"localhost:8080", true},
		{"LOCALHOST:8080", true},
		{":50051", false},
		{"0.0.0.0:50051", false},
		{"[::]:8080", false},
		{"10.0.0.1:50051", false},
		{"192.168.1.20:0", false},
		{"[fe80::1%eth0]:0", false},
	}
	for _, tt := range tests {
		got, err := isLoopbackAddr(tt.addr)
		if err != nil || got != tt.want {
			t.Errorf("isLoopbackAddr(%q) = %v, %v; want %v", tt.addr, got, err, tt.want)
		}
	}
	if _, err := isLoopbackAddr("no-port"); err == nil {
		t.Error("isLoopbackAddr without a port succeeded")
	}
}

// TestRefuseExposedListener: without tokens, an address beyond loopback is
// refused with the reason and the way out; with tokens or
// --insecure-listen it is accepted. The accepted cases stop before binding,
// so the test listens on nothing but loopback.
func TestRefuseExposedListener(t *testing.T) {
	dir := testutil.Dir(t)
	tokens := testutil.WriteTokenFile(t, dir, "tokens", tokenAlpha)
	tests := []struct {
		name            string
		grpcAddr        string
		httpAddr        string
		tokens          string
		insecure        bool
		wantErrContains []string
	}{
		{"gRPC on every interface", "0.0.0.0:0", "127.0.0.1:0", "", false,
			[]string{"refusing to listen on 0.0.0.0:0 (gRPC)", "not a loopback address", "--auth-token-file", "--insecure-listen"}},
		{"HTTP with an empty host", "127.0.0.1:0", ":0", "", false, []string{"refusing to listen on :0 (HTTP)"}},
		{"both", "[::]:0", "0.0.0.0:0", "", false, []string{"[::]:0 (gRPC) and 0.0.0.0:0 (HTTP)"}},
		{"loopback only", "127.0.0.1:0", "[::1]:0", "", false, nil},
		{"exposed with tokens", "0.0.0.0:0", ":0", tokens, false, nil},
		{"exposed with --insecure-listen", "0.0.0.0:0", ":0", "", true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.GRPCAddr, cfg.HTTPAddr = tt.grpcAddr, tt.httpAddr
			cfg.AuthTokenFile, cfg.InsecureListen = tt.tokens, tt.insecure
			s := &Server{cfg: cfg, log: slog.New(slog.DiscardHandler)}
			err := s.setupSecurity()
			if tt.wantErrContains == nil {
				if err != nil {
					t.Fatalf("setupSecurity: %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatal("setupSecurity succeeded, want a refusal")
			}
			for _, want := range tt.wantErrContains {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})
	}
	// Start refuses before it opens the root or binds anything.
	cfg := DefaultConfig()
	cfg.Root = filepath.Join(dir, "never-created")
	cfg.GRPCAddr = "0.0.0.0:0"
	if srv, err := Start(cfg); err == nil {
		srv.Shutdown()
		t.Fatal("Start on 0.0.0.0 without tokens succeeded")
	}
	if _, err := os.Stat(cfg.Root); !os.IsNotExist(err) {
		t.Errorf("the refused Start created its root: %v", err)
	}
}

// TestRefusalBeforeBodyIsAnswered: a request refused before its body is
// read (no token; a Host the daemon does not answer to) gets its answer
// while the body it announced never comes, instead of once a timeout
// ends the body.
func TestRefusalBeforeBodyIsAnswered(t *testing.T) {
	authed := startDaemon(t, func(c *Config) {
		c.AuthTokenFile = testutil.WriteTokenFile(t, testutil.Dir(t), "tokens", tokenAlpha)
		c.BodyTimeout = time.Hour
	})
	open := startDaemon(t, func(c *Config) { c.BodyTimeout = time.Hour })
	for _, tt := range []struct {
		name, url, host string
		want            int
	}{
		{"no token", authed.url, "localhost", http.StatusUnauthorized},
		{"unknown Host", open.url, "rebound.example", http.StatusForbidden},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := rawRequest(strings.TrimPrefix(tt.url, "http://"),
				"PUT /v1/files/stalled HTTP/1.1\r\nHost: "+tt.host+"\r\nContent-Type: application/octet-stream\r\nContent-Length: 100\r\n\r\n", nil, 0)
			if err != nil {
				t.Fatalf("no answer while the body stalls: %v", err)
			}
			if resp.StatusCode != tt.want {
				t.Errorf("status %d, want %d", resp.StatusCode, tt.want)
			}
		})
	}
}
