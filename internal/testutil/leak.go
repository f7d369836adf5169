package testutil

import (
	"fmt"
	"net/http"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// The goroutine leak check of every test package that starts goroutines,
// as grpc-go's internal/grpctest and etcd's testutil/leak.go have: once
// the package's tests pass, no goroutine of theirs, nor of the code they
// ran, may be left. A stream's reader, workers and syncers, a server's
// accept loops, a watcher that was never told to stop: each is a leak in
// a daemon that runs for months, and here it fails the package.

// backgroundGoroutines are goroutines that outlive the tests by design,
// started by a library and stopped by nothing the tests own: not leaks.
// grpc-go and the OpenTelemetry SDK, at the versions in go.mod, need no
// entry: neither starts a goroutine for the process as a whole, and what
// the tests start they stop (connections, servers, the tracer and meter
// providers they make). An entry goes here, with why, only for a
// library's goroutine that ends by itself or lives for the process;
// never for a goroutine of the module's own code, whose leak is a bug.
var backgroundGoroutines = []goleak.Option{
	// tusd gives each request's data store calls a context that ends
	// GracefulRequestCompletionTimeout (10 s, the default the uploads
	// door keeps) after the request's own: one goroutine per request
	// waits that long after the request is done, and then ends.
	goleak.IgnoreTopFunction("github.com/tus/tusd/v2/pkg/handler.newDelayedContext.func1"),
	// ghz's runner.Run (the load harness's) waits for a SIGINT in a
	// goroutine that nothing ends, one per run: the harness is a process
	// of a few runs, and each such goroutine costs a few KiB.
	goleak.IgnoreTopFunction("github.com/bojand/ghz/runner.Run.func1"),
}

// LeakOptions are goleak's options for this module: the known background
// goroutines ignored, and, for a check inside a test (goleak.VerifyNone
// at its end), the test's own goroutine too.
func LeakOptions(extra ...goleak.Option) []goleak.Option {
	return append(append([]goleak.Option(nil), backgroundGoroutines...), extra...)
}

// FindLeaks returns an error naming the goroutines left running beside the
// caller's, none of them known to be in the background. Idle keep-alive
// connections of http.DefaultClient are closed first: they wait in its
// pool for a next request by design, and are closed by the client, not
// by the code under test.
func FindLeaks(extra ...goleak.Option) error {
	http.DefaultClient.CloseIdleConnections()
	return goleak.Find(LeakOptions(extra...)...)
}

// VerifyNoLeaks is a test package's TestMain, or its last step: it runs
// the tests and, if they passed, fails the package when goroutines are
// left (FindLeaks). goleak retries for a while, so goroutines that are
// ending as the last test returns are not counted.
func VerifyNoLeaks(m *testing.M) {
	os.Exit(RunAndFindLeaks(m))
}

// RunAndFindLeaks runs m's tests and then looks for leaks, returning the
// exit code: for a TestMain that has more to do after the tests (remove
// what it built) before it exits.
func RunAndFindLeaks(m *testing.M) int {
	code := m.Run()
	if code != 0 {
		return code
	}
	if err := FindLeaks(); err != nil {
		fmt.Fprintf(os.Stderr, "goroutines left running after the tests passed:\n%v\n", err)
		return 1
	}
	return 0
}
