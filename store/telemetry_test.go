//go:build linux

package store

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/filewrite/filewrite/internal/testutil"
)

// tracedStore is a store whose telemetry records into an in-memory span
// recorder and a manual metric reader.
type tracedStore struct {
	*Store
	tp      *sdktrace.TracerProvider
	rec     *tracetest.SpanRecorder
	starts  *testutil.SpanStarts
	metrics *sdkmetric.ManualReader
}

func newTracedStore(t *testing.T, fsys func(FS) FS, opts Options) *tracedStore {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	starts := testutil.NewSpanStarts(rec)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(starts))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tel, err := NewTelemetry(tp, mp)
	if err != nil {
		t.Fatal(err)
	}
	opts.Telemetry = tel
	s, _ := newWrappedStore(t, fsys, opts)
	return &tracedStore{Store: s, tp: tp, rec: rec, starts: starts, metrics: reader}
}

// op starts a span standing for an RPC and returns a context carrying it.
func (ts *tracedStore) op(name string) (context.Context, trace.Span) {
	return ts.tp.Tracer("test").Start(context.Background(), name)
}

// waitSpans returns the ended spans called name.
func (ts *tracedStore) waitSpans(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range ts.rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// oneSpan is the one ended span named name, failing the test unless
// there is exactly one.
func (ts *tracedStore) oneSpan(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	spans := ts.waitSpans(name)
	if len(spans) != 1 {
		t.Fatalf("%d %s spans, want 1", len(spans), name)
	}
	return spans[0]
}

// checkWaitSpan checks that ws is a child of parent, carries the wait's
// attributes, and links to each of holders.
func checkWaitSpan(t *testing.T, ws sdktrace.ReadOnlySpan, parent trace.SpanContext, attrs map[attribute.Key]string, holders ...trace.SpanContext) {
	t.Helper()
	if got := ws.Parent(); got.SpanID() != parent.SpanID() || got.TraceID() != parent.TraceID() {
		t.Errorf("%s: parent %v/%v, want the waiter's span %v/%v", ws.Name(), got.TraceID(), got.SpanID(), parent.TraceID(), parent.SpanID())
	}
	got := map[attribute.Key]string{}
	for _, kv := range ws.Attributes() {
		got[kv.Key] = kv.Value.Emit()
	}
	for k, want := range attrs {
		if got[k] != want {
			t.Errorf("%s: %s = %q, want %q", ws.Name(), k, got[k], want)
		}
	}
	linked := map[trace.SpanID]bool{}
	for _, l := range ws.Links() {
		linked[l.SpanContext.SpanID()] = true
	}
	for _, h := range holders {
		if !linked[h.SpanID()] {
			t.Errorf("%s: links %v, want one to the holder's span %v", ws.Name(), ws.Links(), h.SpanID())
		}
	}
	if len(ws.Links()) != len(holders) {
		t.Errorf("%s: %d links, want %d", ws.Name(), len(ws.Links()), len(holders))
	}
}

func TestLockWaitSpanLinksToHolder(t *testing.T) {
	g := newGate(t, 1)
	ts := newTracedStore(t, nil, Options{Policy: PolicyUnlockedBelowEOF, Hooks: g.hooks()})
	holdCtx, holdSpan := ts.op("holder")
	done := make(chan error, 1)
	go func() {
		_, err := ts.Write(holdCtx, "f", 0, make([]byte, 4096), SyncNone) // extending: exclusive
		done <- err
	}()
	<-g.arrived
	waitCtx, waitSpan := ts.op("waiter")
	waited := make(chan error, 1)
	go func() {
		_, err := ts.Write(waitCtx, "f", 4096, make([]byte, 4096), SyncNone)
		waited <- err
	}()
	ts.starts.AwaitStart(t, SpanLockWait)
	g.open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	<-g.arrived // the waiter got in
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	ws := ts.oneSpan(t, SpanLockWait)
	checkWaitSpan(t, ws, waitSpan.SpanContext(), map[attribute.Key]string{
		AttrLockMode:   "exclusive",
		AttrLockReason: ReasonExtending,
		AttrPolicy:     "unlocked-below-eof",
		AttrPath:       "f",
	}, holdSpan.SpanContext())
}

func TestInflightWaitSpanLinksToWriters(t *testing.T) {
	const writers = 3
	g := newGate(t, writers)
	ts := newTracedStore(t, nil, Options{Policy: PolicyUnlockedBelowEOF, Hooks: g.hooks()})
	g.open() // let the setup write through
	ctx := context.Background()
	if _, err := ts.Write(ctx, "f", 0, make([]byte, writers*4096), SyncNone); err != nil {
		t.Fatal(err)
	}
	<-g.arrived
	g = newGate(t, writers)
	ts.opts.Hooks.InsideWrite = g.hooks().InsideWrite // nothing else runs yet

	var holders []trace.SpanContext
	done := make(chan error, writers)
	for i := range writers {
		wctx, span := ts.op("writer")
		holders = append(holders, span.SpanContext())
		go func() {
			_, err := ts.Write(wctx, "f", int64(i)*4096, make([]byte, 4096), SyncNone) // below EOF: in flight
			done <- err
		}()
	}
	for range writers {
		if mode := <-g.arrived; mode != "none" {
			t.Fatalf("writer inside in mode %s, want none (in flight)", mode)
		}
	}
	tctx, tspan := ts.op("truncate")
	truncated := make(chan error, 1)
	go func() { truncated <- ts.Truncate(tctx, "f", 0) }()
	ts.starts.AwaitStart(t, SpanInflightWait)
	g.open()
	for range writers {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if err := <-truncated; err != nil {
		t.Fatal(err)
	}
	ws := ts.oneSpan(t, SpanInflightWait)
	// Each writer's slot is its shard's: writers that share a shard leave
	// one link between them, so at least one and at most all link.
	links := ws.Links()
	if len(links) == 0 || len(links) > writers {
		t.Errorf("%d links, want 1 to %d", len(links), writers)
	}
	for _, l := range links {
		found := false
		for _, h := range holders {
			found = found || h.SpanID() == l.SpanContext.SpanID()
		}
		if !found {
			t.Errorf("link to %v, which is no writer's span", l.SpanContext.SpanID())
		}
	}
	var linked []trace.SpanContext
	for _, l := range links {
		linked = append(linked, l.SpanContext)
	}
	checkWaitSpan(t, ws, tspan.SpanContext(), map[attribute.Key]string{
		AttrLockMode:   "exclusive",
		AttrLockReason: ReasonTruncate,
		AttrPolicy:     "unlocked-below-eof",
	}, linked...)
}

// syncHolds blocks every Sync of a heldSyncFile until the test releases
// it, reporting each arrival: it makes a group commit's sync last as long
// as a test needs.
type syncHolds struct {
	arrived chan struct{}
	release chan struct{}
}

type heldSyncFile struct {
	File
	h syncHolds
}

func (f heldSyncFile) Sync(mode SyncMode) error {
	f.h.arrived <- struct{}{}
	<-f.h.release
	return f.File.Sync(mode)
}

func TestFsyncWaitSpanLinksToRunningSync(t *testing.T) {
	held := syncHolds{arrived: make(chan struct{}, 4), release: make(chan struct{})}
	ts := newTracedStore(t, func(base FS) FS {
		return fileWrapFS{base, func(f File) File { return heldSyncFile{f, held} }}
	}, Options{Fsync: FsyncGroup})
	t.Cleanup(func() {
		select {
		case <-held.release:
		default:
			close(held.release)
		}
	})
	ctx := context.Background()
	if _, err := ts.Write(ctx, "f", 0, make([]byte, 4096), SyncNone); err != nil {
		t.Fatal(err)
	}
	leadCtx, leadSpan := ts.op("lead")
	done := make(chan error, 2)
	go func() { done <- ts.Fsync(leadCtx, "f", SyncData) }()
	<-held.arrived // the lead's sync runs
	waitCtx, waitSpan := ts.op("follower")
	go func() { done <- ts.Fsync(waitCtx, "f", SyncData) }()
	ts.starts.AwaitStart(t, SpanFsyncWait)
	close(held.release)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	ws := ts.oneSpan(t, SpanFsyncWait)
	checkWaitSpan(t, ws, waitSpan.SpanContext(), map[attribute.Key]string{
		AttrLockReason: "group",
		AttrPolicy:     DefaultPolicy.String(),
	}, leadSpan.SpanContext())
}

func TestUncontendedWriteHasNoWaitSpan(t *testing.T) {
	ts := newTracedStore(t, nil, Options{})
	ctx, span := ts.op("write")
	for i := range 4 {
		// Extending (exclusive), then below EOF (in flight), then synced.
		if _, err := ts.Write(ctx, "f", int64(i%2)*4096, make([]byte, 4096), SyncMode(i%3)); err != nil {
			t.Fatal(err)
		}
	}
	if err := ts.Truncate(ctx, "f", 0); err != nil {
		t.Fatal(err)
	}
	span.End()
	for _, s := range ts.rec.Ended() {
		if s.Name() != "write" {
			t.Errorf("span %q for uncontended operations, want none", s.Name())
		}
	}
}

// gaugeValue returns the last collected value of an int64 gauge.
func gaugeValue(t *testing.T, rm metricdata.ResourceMetrics, name string) (int64, bool) {
	t.Helper()
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			g, ok := m.Data.(metricdata.Gauge[int64])
			if !ok || len(g.DataPoints) != 1 {
				t.Fatalf("%s: %T with %v, want one int64 gauge point", name, m.Data, m.Data)
			}
			return g.DataPoints[0].Value, true
		}
	}
	return 0, false
}

func TestGauges(t *testing.T) {
	g := newGate(t, 2)
	ts := newTracedStore(t, nil, Options{Hooks: g.hooks()})
	g.open()
	ctx := context.Background()
	for _, name := range []string{"a", "b", "c"} {
		if _, err := ts.Write(ctx, name, 0, make([]byte, 8192), SyncNone); err != nil {
			t.Fatal(err)
		}
		<-g.arrived
	}
	g = newGate(t, 2)
	ts.opts.Hooks.InsideWrite = g.hooks().InsideWrite
	done := make(chan error, 2)
	for i := range 2 {
		go func() {
			_, err := ts.Write(ctx, "a", int64(i)*4096, make([]byte, 4096), SyncNone)
			done <- err
		}()
		<-g.arrived
	}
	collect := func() (open, inflight int64) {
		var rm metricdata.ResourceMetrics
		if err := ts.metrics.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		var ok bool
		if open, ok = gaugeValue(t, rm, MetricOpenFiles); !ok {
			t.Fatalf("no %s gauge", MetricOpenFiles)
		}
		if inflight, ok = gaugeValue(t, rm, MetricInflightWrites); !ok {
			t.Fatalf("no %s gauge", MetricInflightWrites)
		}
		return open, inflight
	}
	if open, inflight := collect(); open != 3 || inflight != 2 {
		t.Errorf("while 2 writes are held: open files %d, in-flight writes %d; want 3, 2", open, inflight)
	}
	g.open()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if open, inflight := collect(); open != 3 || inflight != 0 {
		t.Errorf("after: open files %d, in-flight writes %d; want 3, 0", open, inflight)
	}
}

// TestWaitWithoutTracingAllocates bounds what a wait costs with tracing
// off: the metric's attributes come from a cache and no span attribute or
// link is built. The one allocation is the no-op tracer's: its Start
// returns a context carrying its span, which the store does not use.
func TestWaitWithoutTracingAllocates(t *testing.T) {
	tel, err := NewTelemetry(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	holders := []trace.SpanContext{{}}
	allocs := testing.AllocsPerRun(100, func() {
		w := tel.startWait(ctx, SpanLockWait, lockExclusive, ReasonExtending, PolicyUnlockedBelowEOF, "f", holders)
		w.end(ctx, nil)
	})
	if allocs > 1 {
		t.Errorf("a wait with tracing off allocates %v times, want at most 1", allocs)
	}
}

// TestLockWaitLinksSharedHolders: a truncate waiting behind shared holders
// links to at most maxLinks of them.
func TestLockWaitLinksSharedHolders(t *testing.T) {
	const holders = maxLinks + 1
	g := newGate(t, holders)
	ts := newTracedStore(t, nil, Options{Policy: PolicySharedWritten, Hooks: g.hooks()})
	g.open()
	ctx := context.Background()
	if _, err := ts.Write(ctx, "f", 0, make([]byte, holders*4096), SyncNone); err != nil {
		t.Fatal(err)
	}
	<-g.arrived
	g = newGate(t, holders)
	ts.opts.Hooks.InsideWrite = g.hooks().InsideWrite

	spans := map[trace.SpanID]bool{}
	done := make(chan error, holders+1)
	for i := range holders {
		wctx, span := ts.op("overwrite")
		spans[span.SpanContext().SpanID()] = true
		go func() {
			_, err := ts.Write(wctx, "f", int64(i)*4096, make([]byte, 4096), SyncNone)
			done <- err
		}()
	}
	for range holders {
		if mode := <-g.arrived; mode != "shared" {
			t.Fatalf("overwrite inside in mode %s, want shared", mode)
		}
	}
	tctx, _ := ts.op("truncate")
	go func() { done <- ts.Truncate(tctx, "f", 0) }()
	ts.starts.AwaitStart(t, SpanLockWait)
	g.open()
	for range holders + 1 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	ws := ts.oneSpan(t, SpanLockWait)
	links := ws.Links()
	if len(links) != maxLinks {
		t.Errorf("%d links from a wait behind %d shared holders, want %d", len(links), holders, maxLinks)
	}
	for _, l := range links {
		if !spans[l.SpanContext.SpanID()] {
			t.Errorf("link to %v, which is no holder's span", l.SpanContext.SpanID())
		}
	}
}

// TestDeleteAndRenameLockWaitSpans: a Delete or Rename that waits for a
// writer holding the file's lock gets a lock wait span (and histogram
// sample) with its own reason, linked to the writer.
func TestDeleteAndRenameLockWaitSpans(t *testing.T) {
	ops := map[string]func(ctx context.Context, s *Store) error{
		ReasonDelete: func(ctx context.Context, s *Store) error { return s.Delete(ctx, "f", false) },
		ReasonRename: func(ctx context.Context, s *Store) error { return s.Rename(ctx, "f", "g", false, false) },
	}
	for _, reason := range []string{ReasonDelete, ReasonRename} {
		t.Run(reason, func(t *testing.T) {
			g := newGate(t, 1)
			ts := newTracedStore(t, nil, Options{Policy: PolicyUnlockedBelowEOF, Hooks: g.hooks()})
			holdCtx, holdSpan := ts.op("holder")
			done := make(chan error, 1)
			go func() {
				_, err := ts.Write(holdCtx, "f", 0, make([]byte, 4096), SyncNone) // extending: exclusive
				done <- err
			}()
			<-g.arrived
			waitCtx, waitSpan := ts.op(reason)
			waited := make(chan error, 1)
			go func() { waited <- ops[reason](waitCtx, ts.Store) }()
			ts.starts.AwaitStart(t, SpanLockWait)
			g.open()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if err := <-waited; err != nil {
				t.Fatal(err)
			}
			ws := ts.oneSpan(t, SpanLockWait)
			checkWaitSpan(t, ws, waitSpan.SpanContext(), map[attribute.Key]string{
				AttrLockMode:   "exclusive",
				AttrLockReason: reason,
				AttrPolicy:     "unlocked-below-eof",
				AttrPath:       "f",
			}, holdSpan.SpanContext())
			var rm metricdata.ResourceMetrics
			if err := ts.metrics.Collect(context.Background(), &rm); err != nil {
				t.Fatal(err)
			}
			if n := waitCount(rm, "lock", reason); n != 1 {
				t.Errorf("lock wait histogram: %d samples with reason %s, want 1", n, reason)
			}
		})
	}
}

// waitCount is how many waits of kind ("lock", "inflight", "fsync") with
// reason the wait histogram holds.
func waitCount(rm metricdata.ResourceMetrics, kind, reason string) uint64 {
	var n uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			h, ok := m.Data.(metricdata.Histogram[float64])
			if m.Name != MetricLockWait || !ok {
				continue
			}
			for _, dp := range h.DataPoints {
				k, _ := dp.Attributes.Value(AttrWait)
				r, _ := dp.Attributes.Value(AttrLockReason)
				if k.AsString() == kind && r.AsString() == reason {
					n += dp.Count
				}
			}
		}
	}
	return n
}
