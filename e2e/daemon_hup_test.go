package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
)

// TestDaemonSurvivesSIGHUP runs the binary with and without tokens. A
// SIGHUP while it serves leaves it serving (reloading the tokens or saying
// why it does nothing), and a stream of SIGHUPs from SIGTERM until it
// exits, final sync included, does not stop it from syncing and exiting 0.
func TestDaemonSurvivesSIGHUP(t *testing.T) {
	dir := testutil.Dir(t)
	tokens := testutil.WriteTokenFile(t, dir, "tokens", tokenAlpha)
	tests := []struct {
		name    string
		args    []string
		wantLog string // what the log says of a SIGHUP while serving
	}{
		{"without --auth-token-file", nil, "SIGHUP ignored"},
		{"with --auth-token-file", []string{"--auth-token-file", tokens}, "auth tokens reloaded"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			root := filepath.Join(dir, "root", string(rune('a'+i)))
			proc, logs := testutil.StartDaemon(t, ctx, daemonBin, append([]string{"--root", root}, tt.args...)...)
			grpcAddr := proc.GRPCAddr
			conn := testutil.PlaintextConn(t, grpcAddr)
			authCtx := withAuth(ctx, "Bearer "+tokenAlpha)
			exited := make(chan error, 1)
			go func() { exited <- proc.Wait() }()

			if err := proc.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			for !strings.Contains(logs.String(), tt.wantLog) {
				select {
				case err := <-exited:
					t.Fatalf("SIGHUP while serving: the daemon exited (%v)\n%s", err, logs)
				case <-ctx.Done():
					t.Fatalf("after SIGHUP the log does not say %q:\n%s", tt.wantLog, logs)
				case <-time.After(5 * time.Millisecond):
				}
			}
			if resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("health after SIGHUP: %v, %v; want SERVING\n%s", resp.GetStatus(), err, logs)
			}

			// Unsynced data, so that the final sync has work to do while
			// the SIGHUPs arrive.
			c := filewritev1.NewFileServiceClient(conn)
			chunk := allBytes(16 << 20)
			for i := range 8 {
				if _, err := c.Write(authCtx, &filewritev1.WriteRequest{Path: "dirty.bin", Offset: int64(i * len(chunk)), Data: chunk}); err != nil {
					t.Fatalf("write %d: %v", i, err)
				}
			}

			if err := proc.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			sent := 0
			var err error
		hups:
			for {
				select {
				case err = <-exited:
					break hups
				default:
				}
				if proc.Signal(syscall.SIGHUP) == nil {
					sent++
				}
				time.Sleep(100 * time.Microsecond)
			}
			t.Logf("%d SIGHUPs sent between SIGTERM and the exit", sent)
			if err != nil {
				t.Fatalf("exit with SIGHUPs arriving through the shutdown: %v, want exit status 0\n%s", err, logs)
			}
			if !strings.Contains(logs.String(), "all files synced") {
				t.Errorf("the log does not say the files were synced:\n%s", logs)
			}
			if fi, err := os.Stat(filepath.Join(root, "dirty.bin")); err != nil || fi.Size() != 8*int64(len(chunk)) {
				t.Errorf("dirty.bin after exit: %v, %v; want %d bytes", fi, err, 8*len(chunk))
			}
		})
	}
}
