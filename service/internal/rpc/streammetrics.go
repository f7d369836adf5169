package rpc

import (
	"context"
	"sync/atomic"

	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"

	"github.com/filewrite/filewrite/store"
)

// Metric names of the stream path (Prometheus: dots become underscores,
// the unit is appended).
const (
	MetricStreamsOpen      = "filewrite.streams.open"
	MetricStreamWrites     = "filewrite.stream.message.writes"
	MetricStreamHeld       = "filewrite.stream.held"
	MetricStreamsHeldTotal = "filewrite.streams.held"
)

// The stream path's histograms; like the store's (store.Histograms), /metrics
// shows them at zero before their first observation.
var (
	HistStreamWrites = store.Histogram{Name: MetricStreamWrites, Unit: "{write}",
		Description: "Writes carried by one WriteStream message.",
		Buckets:     []float64{0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 1024}}
	HistStreamHeld = store.Histogram{Name: MetricStreamHeld, Unit: "By",
		Description: "Bytes of unacknowledged writes (data plus a fixed overhead each) a WriteStream holds when it reads a message; it reads none at --max-stream-bytes.",
		Buckets:     []float64{0, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20}}
)

// streamMetrics are the WriteStream instruments: how many streams are
// open, how many writes each message carries, and how many bytes of
// unacknowledged writes a stream holds (each time it reads a message, and
// over all streams now: the streams' part of --max-inflight-bytes).
type streamMetrics struct {
	open   metric.Int64UpDownCounter
	writes metric.Int64Histogram
	held   metric.Int64Histogram
}

// newStreamMetrics registers the instruments with meter (nil: no-op), the
// total held bytes read from daemonHeld at each collection.
func newStreamMetrics(meter metric.Meter, daemonHeld *atomic.Int64) (*streamMetrics, error) {
	if meter == nil {
		meter = metricnoop.NewMeterProvider().Meter("")
	}
	m := &streamMetrics{}
	var err error
	if m.open, err = meter.Int64UpDownCounter(MetricStreamsOpen,
		metric.WithUnit("{stream}"),
		metric.WithDescription("WriteStreams open.")); err != nil {
		return nil, err
	}
	// Like every counter, it starts at 0 on a fresh daemon's /metrics.
	m.open.Add(context.Background(), 0)
	if m.writes, err = HistStreamWrites.Int64(meter); err != nil {
		return nil, err
	}
	if m.held, err = HistStreamHeld.Int64(meter); err != nil {
		return nil, err
	}
	if _, err = meter.Int64ObservableGauge(MetricStreamsHeldTotal,
		metric.WithUnit("By"),
		metric.WithDescription("Bytes of unacknowledged writes held by all WriteStreams now."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(daemonHeld.Load())
			return nil
		})); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *streamMetrics) opened(ctx context.Context) { m.open.Add(ctx, 1) }
func (m *streamMetrics) closed(ctx context.Context) { m.open.Add(ctx, -1) }

// message records a message read: its writes and what the stream held
// before it.
func (m *streamMetrics) message(ctx context.Context, writes int, held int64) {
	m.writes.Record(ctx, int64(writes))
	m.held.Record(ctx, held)
}
