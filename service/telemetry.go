package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/stats"

	"github.com/filewrite/filewrite/store"
)

// telemetryFlushTimeout bounds the flush of spans and metrics on shutdown.
const telemetryFlushTimeout = 5 * time.Second

// serviceName is the service.name of the daemon's spans and metrics unless
// OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES says otherwise.
const serviceName = "filewrite"

// telemetry is the daemon's OpenTelemetry: the providers that the RPC
// spans (otelgrpc), the store's wait spans and every metric go through, and
// the /metrics handler. Traces are exported as the OTEL_* environment
// variables say and are off unless OTEL_TRACES_EXPORTER names an exporter;
// metrics are always collected for /metrics, and also pushed when
// OTEL_METRICS_EXPORTER names an exporter.
type telemetry struct {
	tracerProvider trace.TracerProvider
	meterProvider  *sdkmetric.MeterProvider
	// propagator carries trace context in gRPC metadata (W3C traceparent
	// and baggage), so that a client's trace continues into the daemon and
	// the gateway's call into the gRPC server stays one trace.
	propagator propagation.TextMapPropagator
	metrics    http.Handler // GET /metrics
	store      *store.Telemetry
	// shutdowns flush and stop what newTelemetry created (not a
	// TracerProvider given in Config), in order.
	shutdowns []func(context.Context) error
}

// newTelemetry builds the providers. A TracerProvider given in cfg is used
// as it is (tests pass an in-memory one) and is not shut down by the
// daemon.
func newTelemetry(ctx context.Context, cfg Config) (_ *telemetry, err error) {
	t := &telemetry{
		propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}
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

	t.tracerProvider = cfg.TracerProvider
	if t.tracerProvider == nil {
		if t.tracerProvider, err = t.tracesFromEnv(ctx, res); err != nil {
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

// tracesFromEnv is autoexport's span exporter, except that an unset
// OTEL_TRACES_EXPORTER means no tracing (autoexport's own default is OTLP,
// which would send to a collector nobody asked for). With no exporter the
// tracer provider is the no-op one, so that spans cost nothing at all.
func (t *telemetry) tracesFromEnv(ctx context.Context, res *resource.Resource) (trace.TracerProvider, error) {
	exp, err := autoexport.NewSpanExporter(ctx, autoexport.WithFallbackSpanExporter(
		func(context.Context) (sdktrace.SpanExporter, error) { return noSpans{}, nil }))
	if err != nil {
		return nil, fmt.Errorf("trace exporter (OTEL_TRACES_EXPORTER): %w", err)
	}
	if _, off := exp.(noSpans); off || autoexport.IsNoneSpanExporter(exp) {
		return tracenoop.NewTracerProvider(), nil
	}
	// The sampler comes from OTEL_TRACES_SAMPLER and
	// OTEL_TRACES_SAMPLER_ARG (default parentbased_always_on); batch
	// sizes and delays from OTEL_BSP_*.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	t.shutdowns = append(t.shutdowns, tp.Shutdown)
	return tp, nil
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
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes),
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
	t.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	return nil
}

// serverHandler is the gRPC server's stats handler: one span per RPC (the
// parent of the store's wait spans) and the rpc.server.* metrics.
func (t *telemetry) serverHandler() stats.Handler {
	return otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(t.tracerProvider),
		otelgrpc.WithMeterProvider(t.meterProvider),
		otelgrpc.WithPropagators(t.propagator),
	)
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
