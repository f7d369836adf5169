package service

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/gateway"
	"github.com/filewrite/filewrite/service/internal/rpc"
	"github.com/filewrite/filewrite/store"
)

// documentedMetrics are the filewrite_* metrics that docs/operations.md
// lists in its metrics table.
func documentedMetrics(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range regexp.MustCompile("(?m)^\\| `(filewrite_[a-z_]+)` \\|").FindAllSubmatch(doc, -1) {
		names = append(names, string(m[1]))
	}
	if len(names) < 10 {
		t.Fatalf("docs/operations.md lists %d filewrite_* metrics, want its metrics table", len(names))
	}
	return names
}

// TestMetricsOnFreshDaemon: before any request, /metrics has every
// documented metric (at 0; build info at 1 with its labels, the budget's
// capacity at --max-inflight-bytes), and no series carries otel_scope_*
// labels.
func TestMetricsOnFreshDaemon(t *testing.T) {
	t.Setenv("OTEL_METRICS_EXPORTER", "none")
	d := startDaemon(t, nil)
	fams := d.scrape(t)
	for _, name := range documentedMetrics(t) {
		fam := fams[name]
		if fam == nil {
			t.Errorf("%s missing from a fresh daemon's /metrics", name)
			continue
		}
		want := 0.0
		switch name {
		case "filewrite_build_info":
			continue
		case "filewrite_inflight_budget_capacity_bytes":
			want = DefaultMaxInflightBytes
		}
		for _, m := range fam.GetMetric() {
			if v := metricValue(m); v != want {
				t.Errorf("%s%v = %v on a fresh daemon, want %v", name, m.GetLabel(), v, want)
			}
		}
	}
	b := ReadBuildInfo()
	info := series(fams, "filewrite_build_info", map[string]string{"version": b.Version, "commit": b.Commit, "go_version": b.GoVersion})
	if info.GetGauge().GetValue() != 1 {
		t.Errorf("filewrite_build_info{version=%q,commit=%q,go_version=%q} = %v, want 1", b.Version, b.Commit, b.GoVersion, info)
	}
	for name, fam := range fams {
		for _, m := range fam.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.HasPrefix(l.GetName(), "otel_scope_") {
					t.Fatalf("%s has label %s=%q, want no otel_scope_* labels", name, l.GetName(), l.GetValue())
				}
			}
		}
	}
}

// metricValue is a series' value: a counter's or gauge's, a histogram's
// count.
func metricValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return -1
}

// TestZeroHistogramsMatchTheReal: once used, a histogram has the help and
// the buckets its zero stand-in had, and the stand-in is gone (one family,
// only the real series).
func TestZeroHistogramsMatchTheReal(t *testing.T) {
	t.Setenv("OTEL_METRICS_EXPORTER", "none")
	zeros, err := newZeroHistograms(prometheus.NewRegistry(), append(store.Histograms(), rpc.HistStreamWrites, rpc.HistStreamHeld))
	if err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, nil)
	ctx := testContext(t)
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "f", Data: []byte("x"), Sync: filewritev1.SyncMode_SYNC_MODE_DATA}); err != nil {
		t.Fatal(err)
	}
	stream, err := d.client.WriteStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&filewritev1.WriteStreamRequest{Path: "f", Writes: []*filewritev1.StreamWrite{{Id: 1, Data: []byte("y")}}}); err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetAcks()) > 0 {
			break
		}
	}
	stream.CloseSend()
	fams := d.scrape(t)
	for _, name := range []string{"filewrite_write_duration_seconds", "filewrite_fsync_batch_size",
		"filewrite_dir_fsync_batch_size", "filewrite_stream_message_writes", "filewrite_stream_held_bytes"} {
		i := slices.IndexFunc(zeros.zeros, func(f *dto.MetricFamily) bool { return f.GetName() == name })
		real := fams[name]
		if i < 0 || real == nil {
			t.Errorf("%s: zero stand-in %v, after use %v; want both", name, i >= 0, real != nil)
			continue
		}
		zero := zeros.zeros[i]
		if zero.GetHelp() != real.GetHelp() {
			t.Errorf("%s: help %q at zero, %q after use", name, zero.GetHelp(), real.GetHelp())
		}
		for _, m := range real.GetMetric() {
			if m.GetHistogram().GetSampleCount() == 0 {
				t.Errorf("%s: a series with no observation after use: %v (the zero stand-in stayed)", name, m)
			}
			if got, want := bounds(m.GetHistogram()), bounds(zero.GetMetric()[0].GetHistogram()); !slices.Equal(got, want) {
				t.Errorf("%s: buckets %v after use, %v at zero", name, got, want)
			}
		}
	}
}

func bounds(h *dto.Histogram) []float64 {
	var out []float64
	for _, b := range h.GetBucket() {
		out = append(out, b.GetUpperBound())
	}
	return out
}

// TestStartLogSaysWhereTracesGo: the start line says traces=off, or the
// exporter and endpoint.
func TestStartLogSaysWhereTracesGo(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"off", nil, "traces=off"},
		{"endpoint alone", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, `traces="otlp http/protobuf http://127.0.0.1:1"`},
		{"grpc", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, `traces="otlp grpc http://127.0.0.1:1"`},
		{"none wins over an endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, "traces=off"},
		{"console", map[string]string{"OTEL_TRACES_EXPORTER": "console"}, "traces=console"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
				"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
				t.Setenv(k, tc.env[k])
			}
			t.Setenv("OTEL_METRICS_EXPORTER", "none")
			var logs testutil.LockedBuffer
			startDaemon(t, func(c *Config) {
				c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			})
			var line string
			for l := range strings.Lines(logs.String()) {
				if strings.Contains(l, `msg="filewrite started"`) {
					line = l
				}
			}
			if !strings.Contains(line, " "+tc.want+" ") {
				t.Errorf("start line %q lacks %s", line, tc.want)
			}
		})
	}
}

// TestPropagatorsFromEnvironment: OTEL_PROPAGATORS chooses the header a
// REST caller's trace arrives in (B3 here), and an unknown name stops the
// start.
func TestPropagatorsFromEnvironment(t *testing.T) {
	const callerTrace, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	t.Setenv("OTEL_PROPAGATORS", "b3")
	exp := tracetest.NewInMemoryExporter()
	d := startDaemon(t, func(c *Config) { c.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)) })
	if r := testutil.DoHTTP(t, http.MethodPut, d.url+"/v1/files/f?offset=0", strings.NewReader("x"),
		map[string]string{"Content-Type": gateway.MIMEOctetStream, "b3": callerTrace + "-" + callerSpan + "-1"}); r.Status != http.StatusCreated {
		t.Fatalf("PUT: %d %s", r.Status, r.Body)
	}
	var server *tracetest.SpanStub
	testutil.WaitFor(t, "the Write's server span", func() bool {
		for _, s := range exp.GetSpans() {
			if s.Name == "filewrite.v1.FileService/Write" && s.SpanKind == trace.SpanKindServer {
				server = &s
			}
		}
		return server != nil
	})
	if got := server.SpanContext.TraceID().String(); got != callerTrace {
		t.Errorf("with OTEL_PROPAGATORS=b3 the Write's span is in trace %s, want the B3 caller's %s", got, callerTrace)
	}

	t.Setenv("OTEL_PROPAGATORS", "tracecontext,carrier-pigeon")
	if tel, err := newTelemetry(t.Context(), DefaultConfig().TracerProvider); err == nil || !strings.Contains(err.Error(), "carrier-pigeon") {
		if err == nil {
			tel.shutdown(t.Context())
		}
		t.Errorf("OTEL_PROPAGATORS with an unknown name: %v, want an error naming it", err)
	}
}

// TestRESTRequestHasHTTPServerSpan: a REST call's trace is an HTTP server
// span named by method and route (not the file's name), the gateway's
// gRPC client span under it, and the gRPC server span under that.
func TestRESTRequestHasHTTPServerSpan(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	d := startDaemon(t, func(c *Config) { c.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)) })
	for _, tc := range []struct {
		method, path, ctype, body string
		span, rpc                 string
		// status is what the request answers; direct, that it takes the
		// direct road: its server span is the HTTP span's child, with no
		// client span.
		status int
		direct bool
	}{
		{http.MethodPut, "/v1/files/dir/secret-name?offset=0", gateway.MIMEOctetStream, "x", "PUT /v1/files/{path}", "filewrite.v1.FileService/Write", http.StatusCreated, true},
		{http.MethodPost, "/v1/files/dir/secret-name:write", "application/json", `{"offset":"0","data":"eA=="}`, "POST /v1/files/{path}:write", "filewrite.v1.FileService/Write", http.StatusOK, false},
	} {
		exp.Reset()
		if r := testutil.DoHTTP(t, tc.method, d.url+tc.path, strings.NewReader(tc.body), map[string]string{"Content-Type": tc.ctype}); r.Status != tc.status {
			t.Fatalf("%s %s: %d %s, want %d", tc.method, tc.path, r.Status, r.Body, tc.status)
		}
		var httpSpan, client, server *tracetest.SpanStub
		testutil.WaitFor(t, "the HTTP, client and server spans", func() bool {
			for _, s := range exp.GetSpans() {
				switch {
				case s.Name == tc.span && s.SpanKind == trace.SpanKindServer:
					httpSpan = &s
				case s.Name == tc.rpc && s.SpanKind == trace.SpanKindClient:
					client = &s
				case s.Name == tc.rpc && s.SpanKind == trace.SpanKindServer:
					server = &s
				}
			}
			return httpSpan != nil && (client != nil || tc.direct) && server != nil
		})
		if httpSpan.Parent.IsValid() {
			t.Errorf("%s: HTTP span has parent %v, want a trace root", tc.span, httpSpan.Parent.SpanID())
		}
		if tc.direct {
			client = httpSpan // the server span's parent
		} else if client.Parent.SpanID() != httpSpan.SpanContext.SpanID() {
			t.Errorf("%s: gateway's client span's parent %v, want the HTTP server span %v", tc.span, client.Parent.SpanID(), httpSpan.SpanContext.SpanID())
		}
		if server.Parent.SpanID() != client.SpanContext.SpanID() {
			t.Errorf("%s: gRPC server span's parent %v, want the client span %v", tc.span, server.Parent.SpanID(), client.SpanContext.SpanID())
		}
		attrs := map[string]string{}
		for _, kv := range httpSpan.Attributes {
			attrs[string(kv.Key)] = kv.Value.Emit()
		}
		if attrs["http.response.status_code"] != strconv.Itoa(tc.status) || attrs["http.request.method"] != tc.method {
			t.Errorf("%s: attributes %v, want method %s and status %d", tc.span, attrs, tc.method, tc.status)
		}
	}
	for _, tc := range []struct{ path, want string }{
		{"/v1/files/a/b", "/v1/files/{path}"},
		{"/v1/files/a/b:read", "/v1/files/{path}:read"},
		{"/v1/files/a:2/b", "/v1/files/{path}"},
		{"/v1/files/a/b:Secret1", "/v1/files/{path}"},
		{"/v1/files:list", "/v1/files:list"},
	} {
		if got := restRoute(tc.path); got != tc.want {
			t.Errorf("restRoute(%q) = %q, want %q", tc.path, got, tc.want)
		}
	}
}

// TestRPCLogNamesPeerAndPath: an RPC's log line names the caller and the
// file, for a gRPC call the client's address and for a REST call the HTTP
// client's (not the in-process pipe), with the elapsed time as a duration
// string even in JSON.
func TestRPCLogNamesPeerAndPath(t *testing.T) {
	var logs testutil.LockedBuffer
	d := startDaemon(t, func(c *Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	ctx := testContext(t)
	// The gRPC client's own address, as the daemon sees it.
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "grpc-file", Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	stream, err := d.client.WriteStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&filewritev1.WriteStreamRequest{Path: "stream-file", Writes: []*filewritev1.StreamWrite{{Id: 1, Data: []byte("x")}}}); err != nil {
		t.Fatal(err)
	}
	stream.CloseSend()
	for {
		if _, err := stream.Recv(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if r := testutil.DoHTTP(t, http.MethodPut, d.url+"/v1/files/rest-file?offset=0", bytes.NewReader([]byte("x")),
		map[string]string{"Content-Type": gateway.MIMEOctetStream, "X-Forwarded-For": "203.0.113.9"}); r.Status != http.StatusCreated {
		t.Fatalf("PUT: %d %s", r.Status, r.Body)
	}
	type rpcLine struct {
		Msg, Method, Path, Peer, Elapsed string
	}
	var lines []rpcLine
	for l := range strings.Lines(logs.String()) {
		var rec rpcLine
		if json.Unmarshal([]byte(l), &rec) == nil && rec.Msg == "rpc" {
			lines = append(lines, rec)
		}
	}
	// The stream's line is written once its handler returns, after the
	// client has seen the stream end.
	testutil.WaitFor(t, "the stream's log line", func() bool {
		return strings.Contains(logs.String(), `"path":"stream-file"`)
	})
	for l := range strings.Lines(logs.String()) {
		var rec rpcLine
		if json.Unmarshal([]byte(l), &rec) == nil && rec.Msg == "rpc" && rec.Path == "stream-file" {
			lines = append(lines, rec)
		}
	}
	for _, path := range []string{"grpc-file", "stream-file", "rest-file"} {
		i := slices.IndexFunc(lines, func(r rpcLine) bool { return r.Path == path })
		if i < 0 {
			t.Errorf("no rpc log line with path %q in %v", path, lines)
			continue
		}
		// A gRPC peer is host:port. A REST caller's is the host the HTTP
		// connection came from (grpc-gateway forwards no port), and what
		// the caller put in X-Forwarded-For itself is not believed.
		host := lines[i].Peer
		if path != "rest-file" {
			var err error
			if host, _, err = net.SplitHostPort(lines[i].Peer); err != nil {
				t.Errorf("rpc line for %s: peer %q, want host:port", path, lines[i].Peer)
			}
		}
		if host != "127.0.0.1" {
			t.Errorf("rpc line for %s: peer %q, want 127.0.0.1", path, lines[i].Peer)
		}
		if !regexp.MustCompile(`^[0-9.]+(ns|µs|ms|s)$`).MatchString(lines[i].Elapsed) {
			t.Errorf("rpc line for %s: elapsed %q, want a Go duration string", path, lines[i].Elapsed)
		}
	}
}
