package main

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// exportRequest is an OTLP trace export whose resources hold scopes of
// the given numbers of spans, with the other fields that surround them
// filled in, as an exporter sends them.
func exportRequest(spansPerScope ...[]int) *coltracepb.ExportTraceServiceRequest {
	req := &coltracepb.ExportTraceServiceRequest{}
	for _, scopes := range spansPerScope {
		rs := &tracepb.ResourceSpans{
			Resource: &resourcepb.Resource{Attributes: []*commonpb.KeyValue{{Key: "service.name",
				Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: "filewrite"}}}}},
			SchemaUrl: "https://opentelemetry.io/schemas/1.43.0",
		}
		for _, n := range scopes {
			ss := &tracepb.ScopeSpans{Scope: &commonpb.InstrumentationScope{Name: "otelgrpc", Version: "0.72.0"}}
			for range n {
				ss.Spans = append(ss.Spans, &tracepb.Span{
					TraceId: bytes.Repeat([]byte{1}, 16), SpanId: bytes.Repeat([]byte{2}, 8),
					Name: "filewrite.v1.FileService/Write", Kind: tracepb.Span_SPAN_KIND_SERVER,
					Attributes: []*commonpb.KeyValue{{Key: "rpc.method",
						Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: "Write"}}}},
					Status: &tracepb.Status{Code: tracepb.Status_STATUS_CODE_UNSET},
				})
			}
			rs.ScopeSpans = append(rs.ScopeSpans, ss)
		}
		req.ResourceSpans = append(req.ResourceSpans, rs)
	}
	return req
}

func TestSpansIn(t *testing.T) {
	for _, tt := range []struct {
		name string
		req  *coltracepb.ExportTraceServiceRequest
		want int
	}{
		{"empty", exportRequest(), 0},
		{"one", exportRequest([]int{1}), 1},
		{"scopes", exportRequest([]int{3, 0, 2}), 5},
		{"resources", exportRequest([]int{512}, []int{1, 1}, nil), 514},
	} {
		b, err := proto.Marshal(tt.req)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := spansIn(b); err != nil || got != tt.want {
			t.Errorf("%s: spansIn = %d, %v; want %d", tt.name, got, err, tt.want)
		}
	}
	if _, err := spansIn([]byte{0x0a, 0x05, 0x12}); err == nil {
		t.Errorf("spansIn of a truncated message succeeded")
	}
}

// TestOTLPSink: the sink answers an export as a collector does, plain or
// gzipped, and counts its spans; it refuses what is not an export.
func TestOTLPSink(t *testing.T) {
	sink, err := startOTLPSink()
	if err != nil {
		t.Fatal(err)
	}
	defer sink.close()
	body, err := proto.Marshal(exportRequest([]int{2, 1}))
	if err != nil {
		t.Fatal(err)
	}
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	zw.Write(body)
	zw.Close()
	for _, tt := range []struct {
		name, encoding string
		body           []byte
		status         int
	}{
		{"plain", "", body, http.StatusOK},
		{"gzip", "gzip", zipped.Bytes(), http.StatusOK},
		{"garbage", "", []byte{0x0a, 0x05, 0x12}, http.StatusBadRequest},
	} {
		req, _ := http.NewRequest(http.MethodPost, sink.endpoint()+"/v1/traces", bytes.NewReader(tt.body))
		req.Header.Set("Content-Type", "application/x-protobuf")
		if tt.encoding != "" {
			req.Header.Set("Content-Encoding", tt.encoding)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.status {
			t.Errorf("%s: %s, want %d", tt.name, resp.Status, tt.status)
		}
		if tt.status == http.StatusOK && resp.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("%s: Content-Type %q, want application/x-protobuf", tt.name, resp.Header.Get("Content-Type"))
		}
	}
	if got, want := sink.counts(), (sinkCounts{exports: 2, bytes: 2 * int64(len(body)), spans: 6}); got != want {
		t.Errorf("sink counted %+v, want %+v", got, want)
	}
}

// TestTracingScenario runs the tracing comparison briefly, with the
// daemons' profiles: the traced daemon's unary Writes reach the sink about
// one span each, the sampled one's about one in a hundred, the untraced
// one's none. The daemons send their batches every 50 ms here
// (OTEL_BSP_SCHEDULE_DELAY passes through), so that a short run sees
// them.
func TestTracingScenario(t *testing.T) {
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	sum, out, table := shortRun(t, "tracing", func(o *options) { o.profile = true })
	if len(sum.Comparisons) != 1 {
		t.Fatalf("%d comparisons, want 1", len(sum.Comparisons))
	}
	c := sum.Comparisons[0]
	checkComparison(t, out, table, c, []string{"untraced", "untraced-stream", "traced", "traced-stream", "sampled", "sampled-stream"},
		[]string{"traced/untraced", "traced-stream/untraced-stream", "sampled/untraced", "sampled-stream/untraced-stream"}, 2)
	spans := map[string]float64{}
	for _, col := range c.Columns {
		spans[col.Name] = col.SpansPerOp
	}
	if got := spans["traced"]; got < 0.5 || got > 1.5 {
		t.Errorf("traced unary Writes: %.3f spans per Write reached the sink, want about 1", got)
	}
	if got := spans["sampled"]; got > 0.2 {
		t.Errorf("sampled unary Writes: %.3f spans per Write reached the sink, want about 0.01", got)
	}
	if spans["untraced"] != 0 || spans["untraced-stream"] != 0 {
		t.Errorf("the untraced daemon's spans reached the sink: %v", spans)
	}
	for _, kind := range []string{"cpu", "allocs"} {
		p := filepath.Join(out, "tracing", "r1-traced."+kind+".pprof")
		if fi, err := os.Stat(p); err != nil || fi.Size() == 0 {
			t.Errorf("-profile: %s: %v", p, err)
		}
	}
}
