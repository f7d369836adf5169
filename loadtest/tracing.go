package main

import (
	"context"
	"fmt"
	"slices"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/client"
)

// tracedSampleRatio is the ratio the "sampled" column's daemon samples new
// traces at: the setting docs/operations.md suggests for high rates.
const tracedSampleRatio = "0.01"

// tracing: what tracing costs (issue 39). The same daemon binary, started
// three times: without tracing, with every trace sampled and exported over
// OTLP/HTTP to the harness's sink (otlpSink), and sampling 1% of new
// traces (OTEL_TRACES_SAMPLER=parentbased_traceidratio). 32 callers write
// bs at random blocks below EOF of one file, unary (ghz, which sends no
// trace context, so every call starts a trace) or through one WriteStream
// (the client package, one Client and a File per caller, so up to 32
// writes in flight on one stream). Each ratio's denominator runs again just
// before its numerator (paired): the difference measured is a fifth at
// most, and a shared machine drifts by as much over a round. The daemons
// serve /metrics on loopback for their allocations per write, and the sink
// counts the spans that reached it.
func (e *env) tracing(sink *otlpSink) *comparison {
	const path = "loadtest/tracing.dat"
	bs := e.bs(4 << 10)
	size := e.fileSize(64<<20, bs)
	flags := []string{"--http-addr", "127.0.0.1:0"}
	// Each column says all that decides its tracing, whatever the
	// harness's own environment says; OTEL_BSP_* pass through from it.
	untraced := []string{"OTEL_TRACES_EXPORTER=none"}
	otlp := []string{"OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf", "OTEL_EXPORTER_OTLP_ENDPOINT=" + sink.endpoint()}
	traced := append(slices.Clone(otlp), "OTEL_TRACES_SAMPLER=parentbased_always_on")
	sampled := append(slices.Clone(otlp), "OTEL_TRACES_SAMPLER=parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG="+tracedSampleRatio)
	prepare := func(ctx context.Context, s *session) error { return writeFile(ctx, s.client, path, size) }
	run := countSpans(sink, ghzWrites(path, size, filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED))
	stream := countSpans(sink, clientWrites(path, size, client.SyncNone))
	col := func(name string, env []string) column {
		return column{name: name, daemon: flags, env: env, before: prepare, run: run, stream: stream}
	}
	return &comparison{
		name:        "tracing",
		preparation: writtenPreparation(size) + ", before every run",
		title: fmt.Sprintf("%s writes at random blocks below EOF of a %s file: untraced vs traced (every trace, OTLP/HTTP to a sink that discards) vs sampled (%s of new traces)",
			sizeName(bs), sizeName(size), tracedSampleRatio),
		clients: e.clients(32), bs: bs, byServer: true, paired: true,
		columns: []column{col("untraced", untraced), col("traced", traced), col("sampled", sampled)},
		ratios:  [][2]string{{"traced", "untraced"}, {"sampled", "untraced"}},
	}
}

// countSpans wraps run so that its result says how many spans reached the
// sink during it. They are counted as they arrive: the daemon sends a
// batch once it holds 512 spans or 5 s after its first (OTEL_BSP_*), so
// the spans of a run's last moments count in the next run of the same
// daemon, and a run of a sampled daemon may see none at all.
func countSpans(sink *otlpSink, run func(context.Context, *session) (*runResult, error)) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		before := sink.counts()
		r, err := run(ctx, s)
		if err != nil {
			return r, err
		}
		r.Spans = sink.counts().spans - before.spans
		return r, nil
	}
}
