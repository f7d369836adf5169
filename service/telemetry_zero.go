package service

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/proto"

	"github.com/filewrite/filewrite/store"
)

// promTranslation is how OpenTelemetry names become Prometheus names on
// /metrics (filewrite.lock.wait.duration in seconds is
// filewrite_lock_wait_duration_seconds), whatever the client library's
// default validation scheme: the exporter and the zero histograms below
// use the same.
var promTranslation = otlptranslator.UnderscoreEscapingWithSuffixes

// zeroHistograms is the daemon's Prometheus gatherer with its histograms
// shown at zero until their first observation: the OpenTelemetry SDK
// exports a histogram only once it has a data point, and a dashboard or
// an absent() alert should not have to tell "never happened" from "not
// exported". Counters and gauges need no help: they are set to 0 where
// they are made. A family that has data is passed through as it is; the
// zero one has a single series with no labels.
type zeroHistograms struct {
	prometheus.Gatherer
	zeros []*dto.MetricFamily // sorted by name
}

func newZeroHistograms(g prometheus.Gatherer, hists []store.Histogram) (*zeroHistograms, error) {
	namer := otlptranslator.NewMetricNamer("", promTranslation)
	z := &zeroHistograms{Gatherer: g}
	for _, h := range hists {
		name, err := namer.Build(otlptranslator.Metric{Name: h.Name, Unit: h.Unit, Type: otlptranslator.MetricTypeHistogram})
		if err != nil {
			return nil, fmt.Errorf("prometheus name of %s: %w", h.Name, err)
		}
		hist := &dto.Histogram{SampleCount: proto.Uint64(0), SampleSum: proto.Float64(0)}
		// +Inf too, as the exporter writes it.
		for _, b := range append(slices.Clone(h.Buckets), math.Inf(1)) {
			hist.Bucket = append(hist.Bucket, &dto.Bucket{UpperBound: proto.Float64(b), CumulativeCount: proto.Uint64(0)})
		}
		z.zeros = append(z.zeros, &dto.MetricFamily{
			Name:   proto.String(name),
			Help:   proto.String(h.Description),
			Type:   dto.MetricType_HISTOGRAM.Enum(),
			Metric: []*dto.Metric{{Histogram: hist}},
		})
	}
	slices.SortFunc(z.zeros, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
	return z, nil
}

// Gather adds the zero families that the real gather lacks, keeping the
// families sorted by name as prometheus.Registry returns them.
func (z *zeroHistograms) Gather() ([]*dto.MetricFamily, error) {
	fams, err := z.Gatherer.Gather()
	if err != nil {
		return fams, err
	}
	added := false
	for _, zf := range z.zeros {
		if !slices.ContainsFunc(fams, func(f *dto.MetricFamily) bool { return f.GetName() == zf.GetName() }) {
			fams = append(fams, zf)
			added = true
		}
	}
	if added {
		slices.SortFunc(fams, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
	}
	return fams, nil
}

// MetricBuildInfo is a gauge of 1 whose attributes say which build runs
// (Prometheus: filewrite_build_info{version, commit, go_version}), the
// usual way to put a version on a dashboard or join it to other series.
const MetricBuildInfo = "filewrite.build.info"

// registerBuildInfo makes the build-info gauge with m.
func registerBuildInfo(m metric.Meter, b BuildInfo) error {
	attrs := metric.WithAttributeSet(attribute.NewSet(
		attribute.String("version", b.Version),
		attribute.String("commit", b.Commit),
		attribute.String("go_version", b.GoVersion),
	))
	_, err := m.Int64ObservableGauge(MetricBuildInfo,
		metric.WithDescription("Always 1; its labels say which build of filewrite runs: version, commit and Go version."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(1, attrs)
			return nil
		}))
	return err
}
