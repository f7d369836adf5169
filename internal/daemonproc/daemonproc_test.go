package daemonproc

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"
)

// TestStartCtxBoundsWaitAfterLongLine: a daemon that writes a line too
// long to scan and then runs on without logging its addresses is killed
// once ctx ends, as one that logs nothing is; Start does not wait for it
// to exit by itself.
func TestStartCtxBoundsWaitAfterLongLine(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	script := `head -c 2000000 /dev/zero | tr '\0' x >&2; echo >&2; exec sleep 60`
	p, err := Start(ctx, "/bin/sh", []string{"-c", script}, io.Discard)
	if err == nil {
		p.Kill()
		t.Fatal("Start returned a process that logged no addresses")
	}
	if got, want := err, context.DeadlineExceeded; !errors.Is(got, want) {
		t.Errorf("Start: got %v, want an error wrapping %v", got, want)
	}
}

// TestStartEnv: the daemon inherits the environment with env added, a
// name given in env winning over the inherited one.
func TestStartEnv(t *testing.T) {
	t.Setenv("DAEMONPROC_TEST_A", "inherited")
	t.Setenv("DAEMONPROC_TEST_B", "inherited")
	script := `echo "msg=listening protocol=grpc addr=$DAEMONPROC_TEST_A/$DAEMONPROC_TEST_B" >&2; exec sleep 60`
	p, err := StartEnv(t.Context(), "/bin/sh", []string{"-c", script, "--http-addr="}, []string{"DAEMONPROC_TEST_B=given"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop(time.Second)
	if got, want := p.GRPCAddr, "inherited/given"; got != want {
		t.Errorf("the daemon saw %q, want %q", got, want)
	}
}
