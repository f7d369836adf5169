// Package e2e holds the tests that build the daemon binary and run it as a
// child process: crashes (SIGKILL), drains (SIGTERM), SIGHUP, descriptors
// running out, traces flushed at exit, the memory soak. The service's own
// tests run the server in process; these run what an operator runs.
package e2e

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

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

// allBytes is n bytes counting up from 0, wrapping: a pattern whose
// misplaced bytes show.
func allBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}
