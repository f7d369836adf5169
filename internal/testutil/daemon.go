package testutil

import (
	"context"
	"testing"

	"github.com/filewrite/filewrite/internal/daemonproc"
)

// BuildDaemon builds the daemon binary into dir, with the race detector if
// race, and returns its path.
func BuildDaemon(t testing.TB, dir string, race bool) string {
	t.Helper()
	bin, err := daemonproc.Build(t.Context(), dir, race)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// StartDaemon runs the daemon binary bin on loopback ports the kernel
// picks (--grpc-addr and --http-addr 127.0.0.1:0, before args, which may
// override them) and returns it once it has logged its addresses, with
// its log, which fills as it runs. ctx bounds the wait for the addresses.
// The daemon is killed when the test ends, unless it has exited by then.
func StartDaemon(t testing.TB, ctx context.Context, bin string, args ...string) (*daemonproc.Process, *LockedBuffer) {
	t.Helper()
	log := &LockedBuffer{}
	p, err := daemonproc.Start(ctx, bin, append([]string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, args...), log)
	if err != nil {
		t.Fatalf("%v:\n%s", err, log)
	}
	t.Cleanup(func() {
		p.Kill()
		p.Wait()
	})
	return p, log
}
