package e2e

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
)

// TestDaemonSecurity runs the binary with tokens and TLS, reloads the
// tokens with SIGHUP, and checks that it refuses an exposed listener
// without tokens.
func TestDaemonSecurity(t *testing.T) {
	dir := testutil.Dir(t)

	t.Run("refuses a listener beyond loopback without tokens", func(t *testing.T) {
		root := filepath.Join(dir, "refused")
		cmd := exec.Command(daemonBin, "--root", root, "--grpc-addr", "0.0.0.0:0", "--http-addr", "")
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 0 {
			t.Fatalf("daemon on 0.0.0.0 without tokens: %v, want a non-zero exit\n%s", err, out)
		}
		for _, want := range []string{"refusing to listen on 0.0.0.0:0", "not a loopback address", "--auth-token-file", "--insecure-listen"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("the daemon's refusal does not say %q:\n%s", want, out)
			}
		}
		if _, err := os.Stat(root); !os.IsNotExist(err) {
			t.Errorf("the refused daemon created its root: %v", err)
		}
	})

	t.Run("TLS, tokens and SIGHUP", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		cert := testutil.NewCert(t, dir, "daemon")
		tokens := testutil.WriteTokenFile(t, dir, "tokens", tokenAlpha)
		proc, logs := testutil.StartDaemon(t, ctx, daemonBin, "--root", filepath.Join(dir, "root"),
			"--auth-token-file", tokens, "--tls-cert", cert.CertFile, "--tls-key", cert.KeyFile)
		grpcAddr, httpAddr := proc.GRPCAddr, proc.HTTPAddr
		conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(cert.ClientTLS())))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		c := filewritev1.NewFileServiceClient(conn)
		write := func(token string) error {
			_, err := c.Write(withAuth(ctx, "Bearer "+token), &filewritev1.WriteRequest{Path: "f", Data: []byte("x")})
			return err
		}
		https := &http.Client{Transport: &http.Transport{TLSClientConfig: cert.ClientTLS()}}
		stat := func(token string) int {
			req, err := http.NewRequestWithContext(ctx, "GET", "https://"+httpAddr+"/v1/files/f", nil)
			if err != nil {
				t.Fatal(err)
			}
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := https.Do(req)
			if err != nil {
				t.Fatalf("GET over HTTPS: %v", err)
			}
			testutil.ReadAll(t, resp)
			return resp.StatusCode
		}

		wantCode(t, "alpha before SIGHUP", write(tokenAlpha), codes.OK)
		wantCode(t, "beta before SIGHUP", write(tokenBeta), codes.Unauthenticated)
		if got := stat(tokenAlpha); got != http.StatusOK {
			t.Errorf("REST stat with alpha: %d, want 200", got)
		}

		testutil.WriteTokenFile(t, dir, "tokens", tokenBeta)
		if err := proc.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		for !strings.Contains(logs.String(), "auth tokens reloaded") {
			select {
			case <-ctx.Done():
				t.Fatalf("no reload logged after SIGHUP:\n%s", logs)
			case <-time.After(5 * time.Millisecond):
			}
		}
		wantCode(t, "alpha after SIGHUP", write(tokenAlpha), codes.Unauthenticated)
		wantCode(t, "beta after SIGHUP", write(tokenBeta), codes.OK)
		for token, want := range map[string]int{tokenAlpha: 401, tokenBeta: 200, "": 401} {
			if got := stat(token); got != want {
				t.Errorf("REST stat with token %q after SIGHUP: %d, want %d", token, got, want)
			}
		}

		if err := proc.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := proc.Wait(); err != nil {
			t.Errorf("exit after SIGTERM: %v, want 0\n%s", err, logs)
		}
	})
}
