//go:build linux

package store

import (
	"context"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
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
	// AttrExtentsSource says where an opened file's extent map came from:
	// "cache" (the extent cache of closed files) or "file" (FIEMAP).
	AttrExtentsSource = attribute.Key("filewrite.extents.source")
	// AttrWait tells the three kinds of wait apart in the wait histogram:
	// "lock", "inflight" or "fsync" (the span name says it on spans).
	AttrWait = attribute.Key("filewrite.wait")
)

// Metric names, as OpenTelemetry instruments. The Prometheus exporter turns
// dots into underscores and appends the unit ("_seconds").
const (
	MetricLockWait       = "filewrite.lock.wait.duration"
	MetricWriteDuration  = "filewrite.write.duration"
	MetricFsyncBatchSize = "filewrite.fsync.batch.size"
	// MetricDirFsyncBatchSize is how many callers, files synced for the
	// first time, one fsync of a directory covered.
	MetricDirFsyncBatchSize = "filewrite.dir.fsync.batch.size"
	MetricInflightWrites    = "filewrite.inflight.writes"
	MetricOpenFiles         = "filewrite.open.files"
	// MetricFileOpens counts files opened, first opens and reopens of
	// files closed to make room alike, by AttrExtentsSource: the opens
	// from "cache" are the extent cache's hits.
	MetricFileOpens = "filewrite.file.opens"
	// MetricFileCloses counts files closed to make room for others
	// (--max-open-files): each is a reopen if the file is used again.
	MetricFileCloses = "filewrite.file.closes"
	// MetricExtentCacheEntries and MetricExtentCacheBytes are the closed
	// files whose extent maps the cache holds, and the memory it counts
	// them as (bounded by --extent-cache-size).
	MetricExtentCacheEntries = "filewrite.extent.cache.entries"
	MetricExtentCacheBytes   = "filewrite.extent.cache.size"
)

// maxLinks bounds the links from a wait span to the spans that held the
// lock: one exclusive holder, or up to this many shared ones (or writes in
// flight).
const maxLinks = 4

// waitBuckets are explicit histogram bounds in seconds, 1µs to 10s.
var waitBuckets = []float64{
	1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4,
	1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

// batchBuckets are the bounds of the histograms of callers per sync.
var batchBuckets = []float64{1, 2, 4, 8, 16, 32, 64, 128, 256}

// Histogram describes one histogram instrument: NewTelemetry builds the
// store's from these, and the daemon shows each at zero before its first
// observation (the OpenTelemetry SDK exports a histogram only once it has
// one, and a Prometheus exporter has no way to ask for an empty one).
type Histogram struct {
	Name        string // the instrument's name, one of the Metric... constants
	Unit        string // UCUM, as metric.WithUnit takes it
	Description string
	Buckets     []float64 // explicit bucket boundaries
}

// The store's histograms.
var (
	histLockWait = Histogram{MetricLockWait, "s",
		"Time an operation waited for an inode lock, in-flight writes or a group-commit sync.", waitBuckets}
	histWriteDuration = Histogram{MetricWriteDuration, "s",
		"Store write latency, lock wait and sync included.", waitBuckets}
	histFsyncBatch = Histogram{MetricFsyncBatchSize, "{caller}",
		"Callers covered by one fdatasync/fsync.", batchBuckets}
	histDirFsyncBatch = Histogram{MetricDirFsyncBatchSize, "{caller}",
		"Callers (files synced for the first time) covered by one fsync of a directory.", batchBuckets}
)

// Histograms returns the store's histograms, each with a copy of its
// buckets.
func Histograms() []Histogram {
	out := []Histogram{histLockWait, histWriteDuration, histFsyncBatch, histDirFsyncBatch}
	for i := range out {
		out[i].Buckets = slices.Clone(out[i].Buckets)
	}
	return out
}

// Float64 makes h with m.
func (h Histogram) Float64(m metric.Meter) (metric.Float64Histogram, error) {
	return m.Float64Histogram(h.Name, metric.WithUnit(h.Unit), metric.WithDescription(h.Description),
		metric.WithExplicitBucketBoundaries(h.Buckets...))
}

// Int64 makes h with m.
func (h Histogram) Int64(m metric.Meter) (metric.Int64Histogram, error) {
	return m.Int64Histogram(h.Name, metric.WithUnit(h.Unit), metric.WithDescription(h.Description),
		metric.WithExplicitBucketBoundaries(h.Buckets...))
}

// Telemetry turns the store's waits into OpenTelemetry spans and metrics.
// Only waits produce spans: an uncontended acquisition costs none. Spans
// and histograms may be shared by several stores; the gauges may not (each
// store observes them without attributes, so one would hide the other):
// give each store its own Telemetry when its gauges matter.
type Telemetry struct {
	tracer    trace.Tracer
	meter     metric.Meter
	lockWait  metric.Float64Histogram
	writeTime metric.Float64Histogram
	batchSize metric.Int64Histogram
	dirBatch  metric.Int64Histogram
	inflight  metric.Int64ObservableGauge
	openFiles metric.Int64ObservableGauge
	opens     metric.Int64Counter
	closes    metric.Int64Counter
	// cacheEntries and cacheBytes observe the extent cache.
	cacheEntries metric.Int64ObservableGauge
	cacheBytes   metric.Int64ObservableGauge

	// waitOpts caches, for each (kind, mode, reason, policy), the option
	// the wait histogram records with, so that a wait with tracing off
	// builds no attributes. The keys are few (a handful of reasons per
	// policy), so it never needs pruning.
	waitOpts sync.Map // waitKey → []metric.RecordOption
}

// waitKey is what a wait's metric attributes are made of.
type waitKey struct {
	kind   string
	mode   lockMode
	reason string
	policy Policy
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
	t := &Telemetry{tracer: tp.Tracer(scope), meter: meter}
	var err error
	if t.lockWait, err = histLockWait.Float64(meter); err != nil {
		return nil, err
	}
	if t.writeTime, err = histWriteDuration.Float64(meter); err != nil {
		return nil, err
	}
	if t.batchSize, err = histFsyncBatch.Int64(meter); err != nil {
		return nil, err
	}
	if t.dirBatch, err = histDirFsyncBatch.Int64(meter); err != nil {
		return nil, err
	}
	if t.inflight, err = meter.Int64ObservableGauge(MetricInflightWrites,
		metric.WithUnit("{write}"),
		metric.WithDescription("Writes running without the inode lock (counted in flight; truncate and punch wait for them), over all open files.")); err != nil {
		return nil, err
	}
	if t.openFiles, err = meter.Int64ObservableGauge(MetricOpenFiles,
		metric.WithUnit("{file}"),
		metric.WithDescription("Files the store holds open (or is opening), idle ones included.")); err != nil {
		return nil, err
	}
	if t.opens, err = meter.Int64Counter(MetricFileOpens,
		metric.WithUnit("{file}"),
		metric.WithDescription("Files opened, first opens and reopens alike, by where the extent map came from: cache (a file closed to make room, reopened unchanged) or file (FIEMAP).")); err != nil {
		return nil, err
	}
	if t.closes, err = meter.Int64Counter(MetricFileCloses,
		metric.WithUnit("{file}"),
		metric.WithDescription("Idle files closed to make room for others (--max-open-files).")); err != nil {
		return nil, err
	}
	// The counters start at 0, each series that can exist, so that a
	// fresh daemon's /metrics shows them before their first file: a rate
	// over a series that appears at its first increment misses that one.
	for _, opts := range extentsSourceOpts {
		t.opens.Add(context.Background(), 0, opts...)
	}
	t.closes.Add(context.Background(), 0)
	if t.cacheEntries, err = meter.Int64ObservableGauge(MetricExtentCacheEntries,
		metric.WithUnit("{file}"),
		metric.WithDescription("Closed files whose extent maps the extent cache holds.")); err != nil {
		return nil, err
	}
	if t.cacheBytes, err = meter.Int64ObservableGauge(MetricExtentCacheBytes,
		metric.WithUnit("By"),
		metric.WithDescription("Memory the extent cache counts its entries as (bounded by --extent-cache-size).")); err != nil {
		return nil, err
	}
	return t, nil
}

var noopTelemetry, _ = NewTelemetry(nil, nil)

// observe registers the gauges of one store, whose figures counts
// returns; the caller unregisters them when the store closes. The callback
// runs on the metrics reader's goroutine at each collection (a Prometheus
// scrape), never on an operation's path.
func (t *Telemetry) observe(counts func() tableGauges) (metric.Registration, error) {
	return t.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		g := counts()
		o.ObserveInt64(t.openFiles, int64(g.open))
		o.ObserveInt64(t.inflight, g.inflight)
		o.ObserveInt64(t.cacheEntries, int64(g.cached))
		o.ObserveInt64(t.cacheBytes, g.cachedBytes)
		return nil
	}, t.openFiles, t.inflight, t.cacheEntries, t.cacheBytes)
}

// extentsSourceOpts are the record options of MetricFileOpens, built once.
var extentsSourceOpts = [2][]metric.AddOption{
	{metric.WithAttributeSet(attribute.NewSet(AttrExtentsSource.String("file")))},
	{metric.WithAttributeSet(attribute.NewSet(AttrExtentsSource.String("cache")))},
}

// recordOpen counts an opened file; fromCache says its extent map came
// from the extent cache.
func (t *Telemetry) recordOpen(fromCache bool) {
	i := 0
	if fromCache {
		i = 1
	}
	t.opens.Add(context.Background(), 1, extentsSourceOpts[i]...)
}

// recordClose counts a file closed to make room.
func (t *Telemetry) recordClose() {
	t.closes.Add(context.Background(), 1)
}

// waitRecordOpts returns the cached record options for k.
func (t *Telemetry) waitRecordOpts(k waitKey) []metric.RecordOption {
	if v, ok := t.waitOpts.Load(k); ok {
		return v.([]metric.RecordOption)
	}
	opts := []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(
		AttrWait.String(k.kind),
		AttrLockMode.String(k.mode.String()),
		AttrLockReason.String(k.reason),
		AttrPolicy.String(k.policy.String()),
	))}
	v, _ := t.waitOpts.LoadOrStore(k, opts)
	return v.([]metric.RecordOption)
}

// waitKinds maps a wait span's name to its AttrWait value.
var waitKinds = map[string]string{
	SpanLockWait:     "lock",
	SpanInflightWait: "inflight",
	SpanFsyncWait:    "fsync",
}

// waitSpan is one traced wait.
type waitSpan struct {
	t     *Telemetry
	span  trace.Span
	start time.Time
	opts  []metric.RecordOption
}

// startWait begins a wait span under ctx's span, linked to the spans the
// caller waits for (holders). Attributes and links are only built when the
// span records; the metric's attribute set comes from a cache.
func (t *Telemetry) startWait(ctx context.Context, name string, mode lockMode, reason string, policy Policy, path string, holders []trace.SpanContext) waitSpan {
	w := waitSpan{t: t, start: time.Now()}
	w.opts = t.waitRecordOpts(waitKey{kind: waitKinds[name], mode: mode, reason: reason, policy: policy})
	// SpanKindInternal is the default: no option to allocate.
	_, w.span = t.tracer.Start(ctx, name)
	if w.span.IsRecording() {
		// The wait kind is the span's name; the span carries the rest.
		w.span.SetAttributes(
			AttrLockMode.String(mode.String()),
			AttrLockReason.String(reason),
			AttrPolicy.String(policy.String()),
			AttrPath.String(path),
		)
		for _, sc := range holders {
			if sc.IsValid() {
				w.span.AddLink(trace.Link{SpanContext: sc})
			}
		}
	}
	return w
}

// end closes the span and records the wait; err is the wait's outcome.
// A traced wait is recorded in its own span's context, so that the
// histogram's exemplar (the SDK keeps one per bucket, of a sampled
// measurement) names the wait span: from a spike of waits on a dashboard
// to the trace of the write that waited, and through the span's links to
// the one that held the lock.
func (w waitSpan) end(ctx context.Context, err error) {
	d := time.Since(w.start)
	if w.span.IsRecording() {
		if err != nil {
			w.span.RecordError(err)
			w.span.SetStatus(codes.Error, err.Error())
		}
		ctx = trace.ContextWithSpan(ctx, w.span)
	}
	w.span.End()
	w.t.lockWait.Record(ctx, d.Seconds(), w.opts...)
}

// recordBatch records how many callers one sync covered.
func (t *Telemetry) recordBatch(callers int) {
	t.batchSize.Record(context.Background(), int64(callers))
}

// recordDirBatch records how many callers one sync of a directory covered.
func (t *Telemetry) recordDirBatch(callers int) {
	t.dirBatch.Record(context.Background(), int64(callers))
}

// syncRecordOpts are the write-latency record options by sync mode, built
// once so that recording a write allocates nothing.
var syncRecordOpts = [...][]metric.RecordOption{
	SyncNone: {metric.WithAttributeSet(attribute.NewSet(AttrSyncMode.String(SyncNone.String())))},
	SyncData: {metric.WithAttributeSet(attribute.NewSet(AttrSyncMode.String(SyncData.String())))},
	SyncFull: {metric.WithAttributeSet(attribute.NewSet(AttrSyncMode.String(SyncFull.String())))},
}
