package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/contrib/propagators/autoprop"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/stats"

	"github.com/filewrite/filewrite/service/internal/admit"
	"github.com/filewrite/filewrite/service/internal/rpc"
	"github.com/filewrite/filewrite/store"
)

// telemetryFlushTimeout bounds the flush of spans and metrics on shutdown.
const telemetryFlushTimeout = 5 * time.Second

// serviceScope is the instrumentation scope of the service package's own
// metrics.
const serviceScope = "github.com/filewrite/filewrite/service"

// serviceName is the service.name of the daemon's spans and metrics unless
// OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES says otherwise.
const serviceName = "filewrite"

// telemetry is the daemon's OpenTelemetry: the providers that the RPC
// spans (otelgrpc), the store's wait spans and every metric go through, and
// the /metrics handler. Traces are exported as the OTEL_* environment
// variables say and are off unless OTEL_TRACES_EXPORTER names an exporter
// or an OTLP endpoint is set; metrics are always collected for /metrics,
// and also pushed when OTEL_METRICS_EXPORTER names an exporter.
type telemetry struct {
	tracerProvider trace.TracerProvider
	// tracesTo says where spans go, for the start log: "off", or the
	// exporter and, for OTLP, its protocol and endpoint.
	tracesTo      string
	meterProvider *sdkmetric.MeterProvider
	// propagator carries trace context in gRPC metadata and HTTP headers,
	// so that a client's trace continues into the daemon and the gateway's
	// call into the gRPC server stays one trace: OTEL_PROPAGATORS's
	// (autoprop), W3C traceparent and baggage by default.
	propagator propagation.TextMapPropagator
	metrics    http.Handler // GET /metrics
	store      *store.Telemetry
	// shutdowns flush and stop what newTelemetry created (not a
	// TracerProvider given in Config), in order.
	shutdowns []func(context.Context) error
}

// newTelemetry builds the providers. A TracerProvider given (tp, from
// Config.TracerProvider) is used as it is (tests pass an in-memory one)
// and is not shut down by the daemon.
func newTelemetry(ctx context.Context, tp trace.TracerProvider) (_ *telemetry, err error) {
	t := &telemetry{}
	defer func() {
		if err != nil {
			err = errors.Join(err, t.shutdown(ctx))
		}
	}()
	// Later options win: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// override the default name.
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(serviceName)),
		resource.WithFromEnv(),
		resource.WithTelemetrySDK(),
	)
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}

	if t.propagator, err = propagatorFromEnv(); err != nil {
		return nil, err
	}
	t.tracerProvider, t.tracesTo = tp, "the tracer provider in Config"
	if t.tracerProvider == nil {
		if t.tracerProvider, t.tracesTo, err = t.tracesFromEnv(ctx, res); err != nil {
			return nil, err
		}
	}
	if err := t.startMetrics(ctx, res); err != nil {
		return nil, err
	}
	if t.store, err = store.NewTelemetry(t.tracerProvider, t.meterProvider); err != nil {
		return nil, fmt.Errorf("store telemetry: %w", err)
	}
	return t, nil
}

// propagatorFromEnv is the propagator OTEL_PROPAGATORS names (autoprop:
// tracecontext, baggage, b3, b3multi, jaeger, xray, ottrace, none), W3C
// trace context and baggage when it is unset. An unknown name is refused
// at start, as an unknown exporter is, where autoprop's own
// NewTextMapPropagator would report it to otel's error handler and go on
// with the default.
func propagatorFromEnv() (propagation.TextMapPropagator, error) {
	v := strings.TrimSpace(os.Getenv("OTEL_PROPAGATORS"))
	if v == "" {
		return autoprop.NewTextMapPropagator(), nil
	}
	var names []string
	for n := range strings.SplitSeq(v, ",") {
		names = append(names, strings.TrimSpace(n))
	}
	p, err := autoprop.TextMapPropagator(names...)
	if err != nil {
		return nil, fmt.Errorf("OTEL_PROPAGATORS=%q: %w", v, err)
	}
	return p, nil
}

// tracesFromEnv is autoexport's span exporter, except that traces are off
// when neither OTEL_TRACES_EXPORTER nor an OTLP endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set:
// autoexport's own default is OTLP to localhost, a collector nobody asked
// for. An endpoint alone means OTLP, as the OpenTelemetry specification's
// default exporter is. With no exporter the tracer provider is the no-op
// one, so that spans cost nothing at all. It returns where spans go.
func (t *telemetry) tracesFromEnv(ctx context.Context, res *resource.Resource) (trace.TracerProvider, string, error) {
	exp, err := autoexport.NewSpanExporter(ctx, autoexport.WithFallbackSpanExporter(
		func(ctx context.Context) (sdktrace.SpanExporter, error) {
			if otlpTracesEndpoint() == "" {
				return noSpans{}, nil
			}
			return autoexport.NewSpanExporter(ctx) // its default: OTLP
		}))
	if err != nil {
		return nil, "", fmt.Errorf("trace exporter (OTEL_TRACES_EXPORTER): %w", err)
	}
	if _, off := exp.(noSpans); off || autoexport.IsNoneSpanExporter(exp) {
		return tracenoop.NewTracerProvider(), "off", nil
	}
	// The sampler comes from OTEL_TRACES_SAMPLER and
	// OTEL_TRACES_SAMPLER_ARG (default parentbased_always_on); batch
	// sizes and delays from OTEL_BSP_*.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	t.shutdowns = append(t.shutdowns, tp.Shutdown)
	return tp, tracesDestination(), nil
}

// otlpTracesEndpoint is the OTLP endpoint the environment sets for traces,
// "" when none.
func otlpTracesEndpoint() string {
	return cmp.Or(os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT"))
}

// tracesDestination describes, for the start log, the exporter that
// autoexport built from the environment: its name and, for OTLP, the
// protocol and endpoint with autoexport's and the OTLP exporters'
// defaults.
func tracesDestination() string {
	name := cmp.Or(os.Getenv("OTEL_TRACES_EXPORTER"), "otlp")
	if name != "otlp" {
		return name
	}
	proto := cmp.Or(os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"), "http/protobuf")
	endpoint := otlpTracesEndpoint()
	if endpoint == "" {
		endpoint = "http://localhost:4318"
		if proto == "grpc" {
			endpoint = "localhost:4317"
		}
	}
	return "otlp " + proto + " " + endpoint
}

// noSpans stands for "no exporter configured".
type noSpans struct{}

func (noSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (noSpans) Shutdown(context.Context) error                             { return nil }

// startMetrics makes the meter provider: always read by the Prometheus
// exporter behind /metrics, with its own registry (so that two daemons in
// one process, as in tests, do not collide), and by whatever
// OTEL_METRICS_EXPORTER names (none by default).
func (t *telemetry) startMetrics(ctx context.Context, res *resource.Resource) error {
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return fmt.Errorf("register Go metrics: %w", err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return fmt.Errorf("register process metrics: %w", err)
	}
	prom, err := otelprom.New(
		otelprom.WithRegisterer(reg),
		// Classic Prometheus names (filewrite_lock_wait_duration_seconds),
		// whatever the client library's default validation scheme.
		otelprom.WithTranslationStrategy(promTranslation),
		// No otel_scope_name/otel_scope_version labels on every series:
		// each metric's name already says whose it is, and the labels
		// double what a scrape carries.
		otelprom.WithoutScopeInfo(),
	)
	if err != nil {
		return fmt.Errorf("prometheus exporter: %w", err)
	}
	opts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(prom)}
	pushed, err := autoexport.NewMetricReader(ctx, autoexport.WithFallbackMetricReader(
		func(context.Context) (sdkmetric.Reader, error) { return nil, nil }))
	if err != nil {
		return fmt.Errorf("metric exporter (OTEL_METRICS_EXPORTER): %w", err)
	}
	if pushed != nil && !autoexport.IsNoneMetricReader(pushed) {
		opts = append(opts, sdkmetric.WithReader(pushed))
	}
	t.meterProvider = sdkmetric.NewMeterProvider(opts...)
	t.shutdowns = append(t.shutdowns, t.meterProvider.Shutdown)
	if err := registerBuildInfo(t.meterProvider.Meter(serviceScope), ReadBuildInfo()); err != nil {
		return fmt.Errorf("build info metric: %w", err)
	}
	gatherer, err := newZeroHistograms(reg, append(store.Histograms(), rpc.HistStreamWrites, rpc.HistStreamHeld))
	if err != nil {
		return err
	}
	// OpenMetrics when the scraper asks for it (Prometheus does), which
	// carries the histograms' exemplars: the trace id of a sampled
	// measurement, per bucket. The classic text format has no place for
	// them.
	t.metrics = promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{EnableOpenMetrics: true})
	return nil
}

// Metric names of the in-flight budget (--max-inflight-bytes).
const (
	MetricBudgetHeld     = "filewrite.inflight.budget.held"
	MetricBudgetCapacity = "filewrite.inflight.budget.capacity"
	MetricBudgetWaiting  = "filewrite.inflight.budget.waiting"
)

// registerBudgetGauges makes the gauges of the daemon's in-flight budget
// with m: what requests in flight hold of it, its size, and how many wait
// for room. They are read at each collection (a scrape), never on a
// request's path.
func registerBudgetGauges(m metric.Meter, b *admit.Budget) error {
	for _, g := range []struct {
		name, unit, desc string
		value            func() int64
	}{
		{MetricBudgetHeld, "By", "Bytes that requests in flight hold of --max-inflight-bytes: messages being received, REST bodies, Reads, the writes WriteStreams hold unacknowledged.", b.Held},
		{MetricBudgetCapacity, "By", "--max-inflight-bytes: the most that requests in flight may hold; past it they wait.", b.Capacity},
		{MetricBudgetWaiting, "{request}", "Requests (or WriteStream messages) waiting for room in --max-inflight-bytes.", b.Waiting},
	} {
		if _, err := m.Int64ObservableGauge(g.name, metric.WithUnit(g.unit), metric.WithDescription(g.desc),
			metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
				o.Observe(g.value())
				return nil
			})); err != nil {
			return err
		}
	}
	return nil
}

// serverHandler is the gRPC server's stats handler: one span per RPC (the
// parent of the store's wait spans) and the rpc.server.* metrics.
func (t *telemetry) serverHandler() stats.Handler {
	return serverStats{otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(t.tracerProvider),
		otelgrpc.WithMeterProvider(t.meterProvider),
		otelgrpc.WithPropagators(t.propagator),
	)}
}

// serverStats hands otelgrpc's server handler only the end of each RPC,
// which is where it sets the span's status and records the call's
// duration. Of the other events a server sees, otelgrpc uses only the
// incoming headers, to put the daemon's own address on every span
// (server.address, server.port): the same two attributes on every span of
// a daemon, which its resource already names, and in a profile of traced
// unary Writes (issue 39) a third of what tracing allocated per call,
// counting their formatting, the growth of each span's attributes and
// their conversion by the OTLP exporter. The payload events it ignores
// unless asked for message events, which the daemon does not ask.
type serverStats struct{ stats.Handler }

func (h serverStats) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.End); ok {
		h.Handler.HandleRPC(ctx, s)
	}
}

// clientHandler is the gateway's: its client span is the parent of the
// server's, so a REST call is one trace.
func (t *telemetry) clientHandler() stats.Handler {
	return otelgrpc.NewClientHandler(
		otelgrpc.WithTracerProvider(t.tracerProvider),
		otelgrpc.WithMeterProvider(t.meterProvider),
		otelgrpc.WithPropagators(t.propagator),
	)
}

// httpServerHandler wraps the REST gateway in otelhttp: one server span
// per request, the parent of the gateway's gRPC client span, carrying the
// HTTP method, route, status and client address, and the http.server.*
// metrics. Its name is the method and the route, never the file's path
// (span names are for grouping: "PUT /v1/files/{path}", "POST
// /v1/files/{path}:write").
func (t *telemetry) httpServerHandler(h http.Handler) http.Handler {
	return otelhttp.NewHandler(h, "filewrite",
		otelhttp.WithTracerProvider(t.tracerProvider),
		otelhttp.WithMeterProvider(t.meterProvider),
		otelhttp.WithPropagators(t.propagator),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
			return r.Method + " " + restRoute(r.URL.Path)
		}),
	)
}

// restRoute is the route of a REST path: the file's path replaced by
// {path}, a custom method (":write") kept. A file whose name ends in a
// colon and letters looks like one; the span name is then wrong, never
// the file's name.
func restRoute(p string) string {
	const files = "/v1/files/"
	rest, ok := strings.CutPrefix(p, files)
	if !ok {
		return p
	}
	route := files + "{path}"
	// A custom method is lower-case letters; anything else after a colon
	// is part of a file's name, which must not reach a span name.
	if i := strings.LastIndexByte(rest, ':'); i >= 0 && i+1 < len(rest) &&
		strings.Trim(rest[i+1:], "abcdefghijklmnopqrstuvwxyz") == "" {
		route += rest[i:]
	}
	return route
}

// shutdown flushes the spans and metrics still buffered and stops the
// exporters. It is called once the servers stopped and the store closed,
// so that the last RPCs' spans are among those flushed.
func (t *telemetry) shutdown(ctx context.Context) error {
	var errs []error
	for _, f := range t.shutdowns {
		errs = append(errs, f(ctx))
	}
	t.shutdowns = nil
	return errors.Join(errs...)
}

// traceAttrs returns the trace and span ids of ctx's span for a log line,
// none when there is no valid span (tracing off and no trace context from
// the client).
func traceAttrs(ctx context.Context) []slog.Attr {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return nil
	}
	return []slog.Attr{
		slog.String("trace_id", sc.TraceID().String()),
		slog.String("span_id", sc.SpanID().String()),
	}
}
