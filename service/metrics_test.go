package service

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.opentelemetry.io/otel/trace"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store"
)

// scrape fetches /metrics over HTTP and parses it.
func (d *daemon) scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(d.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// series finds the metric of family name whose labels include want.
func series(fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	fam := fams[name]
	if fam == nil {
		return nil
	}
	for _, m := range fam.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			match = match && labels[k] == v
		}
		if match {
			return m
		}
	}
	return nil
}

// TestMetricsAfterContendedRun scrapes /metrics over HTTP after writes
// that waited for the lock, for writes in flight and for a sync.
func TestMetricsAfterContendedRun(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "") // metrics do not need tracing
	t.Setenv("OTEL_METRICS_EXPORTER", "")
	g := newHoldGate(t, "f")
	d := startDaemon(t, func(c *Config) { c.Store.Hooks = g.hooks() })
	ctx := testContext(t)
	errs := make(chan error, 4)
	write := func(off int64, sync filewritev1.SyncMode) {
		_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "f", Offset: off, Data: make([]byte, 4096), Sync: sync})
		errs <- err
	}
	// A lock wait: an extending write waits for a held one.
	g.arm()
	go write(0, filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED)
	<-g.arrived
	go write(4096, filewritev1.SyncMode_SYNC_MODE_DATA)
	testutil.WaitFor(t, "the second write to wait", func() bool { f, _ := d.getLocks(t).file("f"); return f.Waiting == 1 })
	g.open()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// An in-flight wait: a truncate waits for a held write below EOF. The
	// gauge counts the held write while it is held.
	g.arm()
	go write(0, filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED)
	<-g.arrived
	fams := d.scrape(t)
	if m := series(fams, "filewrite_inflight_writes", nil); m.GetGauge().GetValue() != 1 {
		t.Errorf("filewrite_inflight_writes = %v while one write is held in flight, want 1", m)
	}
	if m := series(fams, "filewrite_open_files", nil); m.GetGauge().GetValue() != 1 {
		t.Errorf("filewrite_open_files = %v, want 1", m)
	}
	go func() {
		_, err := d.client.Truncate(ctx, &filewritev1.TruncateRequest{Path: "f", Size: 4096})
		errs <- err
	}()
	testutil.WaitFor(t, "the truncate to hold the lock", func() bool {
		f, _ := d.getLocks(t).file("f")
		return len(f.Holders) == 1 && f.Holders[0].Op == "truncate"
	})
	g.open()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}

	// The server records an RPC's duration at its end, which may come
	// just after the client has the reply.
	testutil.WaitFor(t, "the Writes' rpc_server_call_duration_seconds on /metrics", func() bool {
		fams = d.scrape(t)
		return series(fams, "rpc_server_call_duration_seconds", map[string]string{"rpc_method": "filewrite.v1.FileService/Write"}) != nil
	})
	for _, tc := range []struct {
		family string
		labels map[string]string
	}{
		{"filewrite_lock_wait_duration_seconds", map[string]string{
			"filewrite_wait": "lock", "filewrite_lock_mode": "exclusive", "filewrite_lock_reason": "extending", "filewrite_policy": "unlocked-below-eof"}},
		{"filewrite_write_duration_seconds", map[string]string{"filewrite_sync": "none"}},
		{"filewrite_write_duration_seconds", map[string]string{"filewrite_sync": "data"}},
		{"filewrite_fsync_batch_size", nil},
		{"rpc_server_call_duration_seconds", map[string]string{"rpc_method": "filewrite.v1.FileService/Write"}},
	} {
		m := series(fams, tc.family, tc.labels)
		if m == nil {
			t.Errorf("no %s series with labels %v", tc.family, tc.labels)
			continue
		}
		if n := m.GetHistogram().GetSampleCount(); n == 0 {
			t.Errorf("%s%v: count %d, want > 0", tc.family, tc.labels, n)
		}
		if tc.family == "filewrite_lock_wait_duration_seconds" {
			// The bounds are 1µs to 10s.
			b := m.GetHistogram().GetBucket()
			if n := len(b); n > 0 && math.IsInf(b[n-1].GetUpperBound(), 1) {
				b = b[:n-1]
			}
			if len(b) == 0 || b[0].GetUpperBound() != 1e-6 || b[len(b)-1].GetUpperBound() != 10 {
				t.Errorf("%s buckets %v, want 1e-06 up to 10", tc.family, b)
			}
		}
	}
	if m := series(fams, "filewrite_inflight_writes", nil); m.GetGauge().GetValue() != 0 {
		t.Errorf("filewrite_inflight_writes = %v after, want 0", m)
	}
	// One file, opened once, with its extent map from the file; nothing
	// was closed for room, so the extent cache is empty.
	if m := series(fams, "filewrite_file_opens_total", map[string]string{"filewrite_extents_source": "file"}); m.GetCounter().GetValue() != 1 {
		t.Errorf("filewrite_file_opens_total{filewrite_extents_source=file} = %v, want 1", m)
	}
	for _, gauge := range []string{"filewrite_extent_cache_entries", "filewrite_extent_cache_size_bytes"} {
		if m := series(fams, gauge, nil); m == nil || m.GetGauge().GetValue() != 0 {
			t.Errorf("%s = %v, want 0", gauge, m)
		}
	}
}

// scrapeAs fetches /metrics asking for the given exposition format (an
// Accept header) and returns the response's content type and body.
func (d *daemon) scrapeAs(t *testing.T, accept string) (string, []byte) {
	t.Helper()
	r := testutil.DoHTTP(t, http.MethodGet, d.url+"/metrics", nil, map[string]string{"Accept": accept})
	if r.Status != http.StatusOK {
		t.Fatalf("GET /metrics (Accept: %s): %d", accept, r.Status)
	}
	return r.ContentType, r.Body
}

// exemplarsOf returns the exemplars of the buckets of the histogram
// series m, as label maps.
func exemplarsOf(m *dto.Metric) []map[string]string {
	var out []map[string]string
	for _, b := range m.GetHistogram().GetBucket() {
		if e := b.GetExemplar(); e != nil {
			labels := map[string]string{}
			for _, l := range e.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out = append(out, labels)
		}
	}
	return out
}

// TestExemplarsAfterContendedWrites: with tracing on (the real SDK, spans
// to memory), a write that waited for the lock leaves an exemplar on the
// lock-wait histogram naming its wait span, and the Writes leave
// exemplars on the RPC duration histogram naming their server spans. A
// scraper that asks for OpenMetrics (as Prometheus does) gets them; the
// classic text format, which has no place for them, stays as it was.
func TestExemplarsAfterContendedWrites(t *testing.T) {
	g := newHoldGate(t, "f")
	d := startTracedDaemon(t, func(c *Config) { c.Store.Hooks = g.hooks() })
	ctx := testContext(t)
	errs := make(chan error, 2)
	write := func(off int64) {
		_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "f", Offset: off, Data: make([]byte, 4096)})
		errs <- err
	}
	g.arm()
	go write(0) // extending: exclusive, held inside the store
	<-g.arrived
	go write(4096) // waits for the lock
	d.starts.AwaitStart(t, store.SpanLockWait)
	g.open()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	waits := d.ended(named(store.SpanLockWait))
	if len(waits) != 1 {
		t.Fatalf("%d lock wait spans, want 1", len(waits))
	}
	wait := waits[0].SpanContext()
	var writes []trace.SpanContext
	testutil.WaitFor(t, "both Writes' server spans to end", func() bool {
		writes = writes[:0]
		for _, s := range d.ended(named("filewrite.v1.FileService/Write")) {
			writes = append(writes, s.SpanContext())
		}
		return len(writes) == 2
	})

	// Decoded from the protobuf exposition, which carries the same
	// exemplars as OpenMetrics, so that they can be checked field by field.
	ct, body := d.scrapeAs(t, `application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited`)
	dec := expfmt.NewDecoder(bytes.NewReader(body), expfmt.Format(ct))
	fams := map[string]*dto.MetricFamily{}
	for {
		var f dto.MetricFamily
		if err := dec.Decode(&f); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decode /metrics as %s: %v", ct, err)
		}
		fams[f.GetName()] = &f
	}
	lockWaits := series(fams, "filewrite_lock_wait_duration_seconds", map[string]string{
		"filewrite_wait": "lock", "filewrite_lock_mode": "exclusive", "filewrite_lock_reason": "extending"})
	want := map[string]string{"trace_id": wait.TraceID().String(), "span_id": wait.SpanID().String()}
	if got := exemplarsOf(lockWaits); len(got) != 1 || !maps.Equal(got[0], want) {
		t.Errorf("lock wait exemplars %v, want one: %v (the wait span)", got, want)
	}
	rpcs := series(fams, "rpc_server_call_duration_seconds", map[string]string{"rpc_method": "filewrite.v1.FileService/Write"})
	got := exemplarsOf(rpcs)
	if len(got) == 0 {
		t.Errorf("no exemplar on the Write RPCs' duration histogram, want one per bucket they fell in")
	}
	for _, e := range got {
		if !slices.ContainsFunc(writes, func(sc trace.SpanContext) bool {
			return e["trace_id"] == sc.TraceID().String() && e["span_id"] == sc.SpanID().String()
		}) {
			t.Errorf("RPC duration exemplar %v names none of the Writes' server spans %v", e, writes)
		}
	}

	// OpenMetrics, as Prometheus asks for it: the exemplar follows the
	// bucket's count after a '#'.
	ct, body = d.scrapeAs(t, "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
	if !strings.HasPrefix(ct, "application/openmetrics-text") || !bytes.HasSuffix(body, []byte("# EOF\n")) {
		t.Fatalf("GET /metrics as OpenMetrics: %s, body ending %q", ct, body[max(0, len(body)-20):])
	}
	if !slices.ContainsFunc(strings.Split(string(body), "\n"), func(line string) bool {
		_, ex, ok := strings.Cut(line, " # {")
		return ok && strings.HasPrefix(line, "filewrite_lock_wait_duration_seconds_bucket{") &&
			strings.Contains(ex, fmt.Sprintf(`trace_id="%s"`, wait.TraceID())) && strings.Contains(ex, fmt.Sprintf(`span_id="%s"`, wait.SpanID()))
	}) {
		t.Errorf("OpenMetrics exposition lacks the lock wait's exemplar (trace %s, span %s):\n%s", wait.TraceID(), wait.SpanID(), body)
	}
	// The classic text format (curl, promtool) carries none.
	if _, body := d.scrapeAs(t, "*/*"); bytes.Contains(body, []byte("trace_id")) {
		t.Errorf("the classic text exposition carries exemplars")
	}
}

// TestBudgetGauges: the in-flight budget's gauges say its size, and what
// a call holds of it while the call runs; nothing once it is done.
func TestBudgetGauges(t *testing.T) {
	g := newHoldGate(t, "f")
	d := startDaemon(t, func(c *Config) { c.Store.Hooks = g.hooks(); c.MaxInflightBytes = 512 << 20 })
	ctx := testContext(t)
	g.arm()
	errs := make(chan error, 1)
	go func() {
		_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "f", Data: make([]byte, 1<<20)})
		errs <- err
	}()
	<-g.arrived
	gauge := func(fams map[string]*dto.MetricFamily, name string) float64 {
		m := series(fams, name, nil)
		if m == nil {
			t.Fatalf("no %s on /metrics", name)
		}
		return m.GetGauge().GetValue()
	}
	fams := d.scrape(t)
	if got := gauge(fams, "filewrite_inflight_budget_capacity_bytes"); got != 512<<20 {
		t.Errorf("capacity %v, want %d", got, 512<<20)
	}
	if got := gauge(fams, "filewrite_inflight_budget_held_bytes"); got < 1<<20 {
		t.Errorf("held %v while a Write of 1 MiB runs, want at least %d", got, 1<<20)
	}
	g.open()
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the Write's hold to be given back", func() bool {
		return gauge(d.scrape(t), "filewrite_inflight_budget_held_bytes") == 0
	})
	if got := gauge(d.scrape(t), "filewrite_inflight_budget_waiting"); got != 0 {
		t.Errorf("waiting %v, want 0", got)
	}
}
