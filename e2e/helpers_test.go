// Package e2e holds the tests that build the daemon binary and run it as a
// child process: crashes (SIGKILL), drains (SIGTERM), SIGHUP, descriptors
// running out, traces flushed at exit, the memory soak. The service's own
// tests run the server in process; these run what an operator runs.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/filewrite/filewrite/internal/daemonproc"
	"github.com/filewrite/filewrite/internal/testutil"
)

// daemonBin is the daemon binary every test runs, built once by TestMain
// (with -race when the tests run with it) into a directory on the project
// filesystem.
var daemonBin string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp(".", "testdata-tmp-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		if daemonBin, err = daemonproc.Build(context.Background(), dir, raceEnabled); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		// The daemon's own leaks are the in-process packages' to find;
		// here, the tests' (their clients, their watchers of the child).
		return testutil.RunAndFindLeaks(m)
	}())
}

// The tokens the tests' token files hold.
const (
	tokenAlpha = "alpha-7f3c9b1e"
	tokenBeta  = "beta-2d8e4a60"
)

// mimeOctetStream is the Content-Type of raw bytes over REST.
const mimeOctetStream = "application/octet-stream"

// withAuth adds authorization metadata, one value per argument, to ctx.
func withAuth(ctx context.Context, values ...string) context.Context {
	for _, v := range values {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", v)
	}
	return ctx
}

// wantCode fails the test unless err has the gRPC code want.
func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("%s: code %v (%v), want %v", what, got, err, want)
	}
}

// soakLength is how long a soak runs: def, or the Go duration in the
// variable env. It skips the soak under -short, as it builds and runs the
// daemon.
func soakLength(t *testing.T, env string, def time.Duration) time.Duration {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the daemon")
	}
	v := os.Getenv(env)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", env, v, err)
	}
	return d
}

// allBytes is n bytes counting up from 0, wrapping: a pattern whose
// misplaced bytes show.
func allBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

// startFresh starts the daemon binary on a fresh root, with args after
// --root, and returns a context that ends after timeout (or with the
// test), the root, and the running daemon with its log.
func startFresh(t testing.TB, timeout time.Duration, args ...string) (context.Context, string, *daemonproc.Process, *testutil.LockedBuffer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	t.Cleanup(cancel)
	root := filepath.Join(testutil.Dir(t), "root")
	proc, logs := testutil.StartDaemon(t, ctx, daemonBin, append([]string{"--root", root}, args...)...)
	return ctx, root, proc, logs
}

// checkAppendedOnce reads the file at path, of fixed-size records, and
// checks that every append acknowledged (offsets[w][i], errs[w][i] of
// appender w's i'th record, record(w, i)) lies at its offset and is in
// the file exactly once. Up to maxZeros zero-filled records may remain:
// ranges reserved by appends that a kill cut off before their bytes
// landed.
func checkAppendedOnce(t *testing.T, path string, size int, record func(w, i int) []byte, offsets [][]int64, errs [][]error, maxZeros int) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got)%size != 0 {
		t.Fatalf("the file is %d bytes, not a whole number of %d-byte records", len(got), size)
	}
	seen := map[string]int{}
	zeros := 0
	for off := 0; off < len(got); off += size {
		r := got[off : off+size]
		if bytes.Count(r, []byte{0}) == size {
			zeros++
			continue
		}
		seen[string(r)]++
	}
	for w := range offsets {
		for i := range offsets[w] {
			if errs[w][i] != nil {
				t.Errorf("appender %d, record %d: %v, want nil with retries", w, i, errs[w][i])
				continue
			}
			off := offsets[w][i]
			if off < 0 || off+int64(size) > int64(len(got)) || !bytes.Equal(got[off:off+int64(size)], record(w, i)) {
				t.Errorf("appender %d, record %d: acknowledged at %d, which does not hold it", w, i, off)
			}
			if n := seen[string(record(w, i))]; n != 1 {
				t.Errorf("appender %d, record %d: in the file %d times, want once", w, i, n)
			}
		}
	}
	if zeros > maxZeros {
		t.Errorf("%d zero records: want at most %d (one append in flight per appender at each kill)", zeros, maxZeros)
	}
	t.Logf("%d records, %d zero records", len(got)/size, zeros)
}
