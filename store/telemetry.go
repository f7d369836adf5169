package store

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// Span names of the waits the store traces.
const (
	SpanLockWait     = "filewrite.lock.wait"
	SpanInflightWait = "filewrite.inflight.wait"
	SpanFsyncWait    = "filewrite.fsync.wait"
)

// Attribute keys on wait spans and metrics.
const (
	AttrLockMode   = attribute.Key("filewrite.lock.mode")
	AttrLockReason = attribute.Key("filewrite.lock.reason")
	AttrPolicy     = attribute.Key("filewrite.policy")
	AttrPath       = attribute.Key("filewrite.path")
	AttrSyncMode   = attribute.Key("filewrite.sync")
)

// maxLinks bounds the links from a wait span to the spans that held the
// lock: one exclusive holder, or up to this many shared ones.
const maxLinks = 4

// waitBuckets are explicit histogram bounds in seconds, 1µs to 10s.
var waitBuckets = []float64{
	1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4,
	1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

// Telemetry turns the store's waits into OpenTelemetry spans and metrics.
// Only waits produce spans: an uncontended acquisition costs none.
type Telemetry struct {
	tracer    trace.Tracer
	lockWait  metric.Float64Histogram
	writeTime metric.Float64Histogram
	batchSize metric.Int64Histogram
}

// NewTelemetry builds the instruments from the given providers; nil
// providers mean no-op ones.
func NewTelemetry(tp trace.TracerProvider, mp metric.MeterProvider) (*Telemetry, error) {
	if tp == nil {
		tp = tracenoop.NewTracerProvider()
	}
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	}
	const scope = "github.com/filewrite/filewrite/store"
	meter := mp.Meter(scope)
	t := &Telemetry{tracer: tp.Tracer(scope)}
	var err error
	if t.lockWait, err = meter.Float64Histogram("filewrite.lock.wait.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Time an operation waited for an inode lock, in-flight writes or a group-commit sync."),
		metric.WithExplicitBucketBoundaries(waitBuckets...)); err != nil {
		return nil, err
	}
	if t.writeTime, err = meter.Float64Histogram("filewrite.write.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Store write latency, lock wait and sync included."),
		metric.WithExplicitBucketBoundaries(waitBuckets...)); err != nil {
		return nil, err
	}
	if t.batchSize, err = meter.Int64Histogram("filewrite.fsync.batch.size",
		metric.WithUnit("{caller}"),
		metric.WithDescription("Callers covered by one fdatasync/fsync."),
		metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64, 128, 256)); err != nil {
		return nil, err
	}
	return t, nil
}

var noopTelemetry, _ = NewTelemetry(nil, nil)

// waitSpan is one traced wait; the zero value (from a nil *Telemetry path) is
// inert.
type waitSpan struct {
	t     *Telemetry
	span  trace.Span
	start time.Time
	attrs []attribute.KeyValue
}

// startWait begins a wait span under ctx's span. Attributes and links are
// only built when the span records.
func (t *Telemetry) startWait(ctx context.Context, name string, mode lockMode, reason string, policy Policy, path string, holders []trace.SpanContext) waitSpan {
	w := waitSpan{t: t, start: time.Now()}
	_, w.span = t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal))
	w.attrs = []attribute.KeyValue{
		AttrLockMode.String(mode.String()),
		AttrLockReason.String(reason),
		AttrPolicy.String(policy.String()),
	}
	if w.span.IsRecording() {
		w.span.SetAttributes(w.attrs...)
		w.span.SetAttributes(AttrPath.String(path))
		for _, sc := range holders {
			if sc.IsValid() {
				w.span.AddLink(trace.Link{SpanContext: sc})
			}
		}
	}
	return w
}

// end closes the span and records the wait; err is the wait's outcome.
func (w waitSpan) end(ctx context.Context, err error) {
	d := time.Since(w.start)
	if err != nil && w.span.IsRecording() {
		w.span.RecordError(err)
	}
	w.span.End()
	w.t.lockWait.Record(ctx, d.Seconds(), metric.WithAttributes(w.attrs...))
}

// recordBatch records how many callers one sync covered.
func (t *Telemetry) recordBatch(callers int) {
	t.batchSize.Record(context.Background(), int64(callers))
}

// syncAttrSets are the write-latency attribute sets by sync mode, built once.
var syncAttrSets = [...]attribute.Set{
	SyncNone: attribute.NewSet(AttrSyncMode.String(SyncNone.String())),
	SyncData: attribute.NewSet(AttrSyncMode.String(SyncData.String())),
	SyncFull: attribute.NewSet(AttrSyncMode.String(SyncFull.String())),
}
