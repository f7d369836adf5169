package e2e

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
)

// TestBinaryOperability runs what an operator runs: --version, a daemon
// configured by FILEWRITE_* variables (with a flag overriding one), its
// /metrics with the build info, and "filewrite probe" against it while it
// serves and after it has stopped.
func TestBinaryOperability(t *testing.T) {
	dir := testutil.Dir(t)
	bin := daemonBin
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil || !strings.HasPrefix(string(out), "filewrite ") || !strings.Contains(string(out), runtime.Version()) {
		t.Errorf("filewrite --version: %q, %v; want a line naming filewrite and %s", out, err, runtime.Version())
	}

	// The root comes from the environment; the log level from both, the
	// flag winning. An unknown FILEWRITE_ variable is ignored.
	root := filepath.Join(dir, "env-root")
	t.Setenv("FILEWRITE_ROOT", root)
	t.Setenv("FILEWRITE_LOG_LEVEL", "chatty") // refused if it were read
	t.Setenv("FILEWRITE_NOT_A_FLAG", "ignored")
	proc, logs := testutil.StartDaemon(t, ctx, bin, "--log-level", "info", "--log-format", "json")
	conn := testutil.PlaintextConn(t, proc.GRPCAddr)
	if _, err := filewritev1.NewFileServiceClient(conn).Write(ctx, &filewritev1.WriteRequest{Path: "f", Data: []byte("x")}); err != nil {
		t.Fatalf("Write: %v\n%s", err, logs)
	}
	if _, err := os.Stat(filepath.Join(root, "f")); err != nil {
		t.Errorf("the write did not land below FILEWRITE_ROOT: %v", err)
	}
	if !strings.Contains(logs.String(), `"traces":"off"`) {
		t.Errorf("start log does not say traces are off:\n%s", logs)
	}

	resp, err := http.Get("http://" + proc.HTTPAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(metrics, []byte("filewrite_build_info{")) || bytes.Contains(metrics, []byte("otel_scope_")) {
		t.Errorf("/metrics: build info present %v, otel_scope_ labels present %v; want true, false",
			bytes.Contains(metrics, []byte("filewrite_build_info{")), bytes.Contains(metrics, []byte("otel_scope_")))
	}

	probe := func() (int, string) {
		cmd := exec.CommandContext(ctx, bin, "probe", "--grpc-addr", proc.GRPCAddr, "--timeout", "5s")
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode(), string(out)
		}
		if err != nil {
			t.Fatalf("filewrite probe: %v", err)
		}
		return 0, string(out)
	}
	if code, out := probe(); code != 0 || !strings.Contains(out, "SERVING") {
		t.Errorf("probe of a serving daemon: exit %d, %q; want 0 and SERVING", code, out)
	}
	if err := proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := proc.Wait(); err != nil {
		t.Fatalf("daemon exit: %v\n%s", err, logs)
	}
	if code, out := probe(); code != 1 {
		t.Errorf("probe of a stopped daemon: exit %d, %q; want 1", code, out)
	}
}
