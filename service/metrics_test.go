package service

import (
	"math"
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
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

	fams = d.scrape(t)
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
