package client_test

import (
	"context"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/filewrite/filewrite/client"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service"
)

// TestDialOptions: WithDialOptions adds to Dial's own options rather than
// replace them (a reply larger than gRPC's default 4 MiB receive limit
// still comes through), and client-side otelgrpc given through it makes
// the daemon's spans children of the client's, in one trace. WithRetry's
// service config and an interceptor of the caller's work together.
func TestDialOptions(t *testing.T) {
	daemonSpans := tracetest.NewSpanRecorder()
	daemonTP := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(daemonSpans))
	d := startDaemon(t, func(c *service.Config) { c.TracerProvider = daemonTP })
	clientSpans := tracetest.NewSpanRecorder()
	clientTP := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(clientSpans))
	var calls atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		calls.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c := dial(t, d.addr, client.WithRetry(2), client.WithMaxMessageBytes(16<<20), client.WithDialOptions(
		grpc.WithStatsHandler(otelgrpc.NewClientHandler(
			otelgrpc.WithTracerProvider(clientTP),
			otelgrpc.WithPropagators(propagation.TraceContext{}))),
		grpc.WithChainUnaryInterceptor(count),
	))
	ctx := testContext(t)
	f := openFile(t, ctx, c, "dial/f")
	defer f.Close()
	data := pattern(8<<20, 9)
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if n, err := f.ReadAt(make([]byte, len(data)), 0); n != len(data) || err != nil {
		t.Fatalf("ReadAt of 8 MiB in one reply: %d, %v", n, err)
	}
	if _, err := f.Stat(ctx); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 2 {
		t.Errorf("the caller's interceptor saw %d unary calls, want 2 (Read, Stat)", calls.Load())
	}
	var stat trace.SpanContext
	for _, s := range clientSpans.Ended() {
		if s.Name() == "filewrite.v1.FileService/Stat" && s.SpanKind() == trace.SpanKindClient {
			stat = s.SpanContext()
		}
	}
	if !stat.IsValid() {
		t.Fatal("no client span of Stat")
	}
	// The daemon ends its span once the reply is sent: maybe after the
	// client has it.
	testutil.WaitFor(t, "a daemon span of Stat, child of the client's", func() bool {
		for _, s := range daemonSpans.Ended() {
			if s.SpanKind() == trace.SpanKindServer && s.Parent().SpanID() == stat.SpanID() && s.SpanContext().TraceID() == stat.TraceID() {
				return true
			}
		}
		return false
	})
}
