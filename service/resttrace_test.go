package service

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/gateway"
)

// TestRESTCallContinuesCallersTrace: a REST caller that sends a W3C
// traceparent finds the daemon's spans in its own trace: the HTTP server
// span is the child of the caller's span, the gateway's client span of the
// HTTP span, and the server's span of the gateway's. Without a (valid)
// traceparent a REST call starts a trace of its own, as before. Spans go
// through the SDK's in-memory exporter.
func TestRESTCallContinuesCallersTrace(t *testing.T) {
	const (
		callerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
		callerSpan  = "00f067aa0ba902b7"
		traceparent = "00-" + callerTrace + "-" + callerSpan + "-01"
	)
	exp := tracetest.NewInMemoryExporter()
	// The SDK's default sampler: parent-based, so a sampled caller is sampled.
	d := startDaemon(t, func(c *Config) { c.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)) })
	put := func(traceparent string) testutil.HTTPResult {
		h := map[string]string{"Content-Type": gateway.MIMEOctetStream}
		if traceparent != "" {
			h["traceparent"] = traceparent
		}
		return testutil.DoHTTP(t, http.MethodPut, d.url+"/v1/files/put?offset=0", bytes.NewReader([]byte("hello")), h)
	}
	post := func(traceparent string) testutil.HTTPResult {
		h := map[string]string{"Content-Type": "application/json"}
		if traceparent != "" {
			h["traceparent"] = traceparent
		}
		return testutil.DoHTTP(t, http.MethodPost, d.url+"/v1/files/post:write", strings.NewReader(`{"offset":"0","data":"aGVsbG8="}`), h)
	}
	stat := func(traceparent string) testutil.HTTPResult {
		var h map[string]string
		if traceparent != "" {
			h = map[string]string{"traceparent": traceparent}
		}
		return testutil.DoHTTP(t, http.MethodGet, d.url+"/v1/files/put", nil, h)
	}

	for _, tc := range []struct {
		name        string
		call        func(traceparent string) testutil.HTTPResult
		rpc         string
		traceparent string
		continues   bool // the spans are in the caller's trace
		// direct: the call takes the direct road (service/internal/local):
		// its server span is the HTTP span's child, with no client span.
		direct bool
	}{
		{"raw PUT", put, "filewrite.v1.FileService/Write", traceparent, true, true},
		{"JSON POST :write", post, "filewrite.v1.FileService/Write", traceparent, true, false},
		{"GET", stat, "filewrite.v1.FileService/Stat", traceparent, true, false},
		{"no traceparent", put, "filewrite.v1.FileService/Write", "", false, true},
		{"malformed traceparent", put, "filewrite.v1.FileService/Write", "00-not-a-trace-01", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			exp.Reset()
			if r := tc.call(tc.traceparent); r.Status != http.StatusOK && r.Status != http.StatusCreated {
				t.Fatalf("status %d %s, want 200 or 201", r.Status, r.Body)
			}
			var server, client, httpSpan *tracetest.SpanStub
			testutil.WaitFor(t, "the call's HTTP, client and server spans", func() bool {
				for _, s := range exp.GetSpans() {
					switch {
					case s.Name == tc.rpc && s.SpanKind == trace.SpanKindServer:
						server = &s
					case s.Name == tc.rpc && s.SpanKind == trace.SpanKindClient:
						client = &s
					case strings.HasPrefix(s.Name, "PUT ") || strings.HasPrefix(s.Name, "POST ") || strings.HasPrefix(s.Name, "GET "):
						httpSpan = &s
					}
				}
				return server != nil && (client != nil || tc.direct) && httpSpan != nil
			})
			if tc.direct {
				client = httpSpan // the server span's parent
			} else if got, want := client.Parent.SpanID(), httpSpan.SpanContext.SpanID(); got != want {
				t.Errorf("gateway's client span's parent = %v, want the HTTP server span %v", got, want)
			}
			if got, want := server.Parent.SpanID(), client.SpanContext.SpanID(); got != want {
				t.Errorf("server span's parent = %v, want the gateway's client span (or, direct, the HTTP span) %v", got, want)
			}
			gotTrace := server.SpanContext.TraceID().String()
			if tc.continues {
				if gotTrace != callerTrace {
					t.Errorf("server span in trace %s, want the caller's %s", gotTrace, callerTrace)
				}
				if got := httpSpan.Parent.SpanID().String(); got != callerSpan || !httpSpan.Parent.IsRemote() {
					t.Errorf("HTTP server span's parent = %s (remote %v), want the caller's span %s, remote",
						got, httpSpan.Parent.IsRemote(), callerSpan)
				}
				return
			}
			if gotTrace == callerTrace {
				t.Errorf("server span in the caller's trace %s without a valid traceparent", gotTrace)
			}
			if httpSpan.Parent.IsValid() {
				t.Errorf("HTTP server span has parent %v, want a new trace", httpSpan.Parent.SpanID())
			}
			if got, want := gotTrace, client.SpanContext.TraceID().String(); got != want {
				t.Errorf("server span in trace %s, want the gateway's %s", got, want)
			}
		})
	}
}
