package service

import (
	"context"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/codes"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store"
)

// holdGate holds writes to one path inside the store (Options.Hooks)
// while armed, and hands the test each held write's RPC span.
type holdGate struct {
	path    string
	arrived chan holdArrival
	mu      sync.Mutex
	release chan struct{} // nil while disarmed
}

type holdArrival struct {
	span trace.SpanContext
	mode string
}

// newHoldGate makes a disarmed gate; it opens by itself when the test
// ends, so that a failing test leaves no write (and no shutdown) hanging.
func newHoldGate(t *testing.T, path string) *holdGate {
	g := &holdGate{path: path, arrived: make(chan holdArrival, 16)}
	t.Cleanup(g.open)
	return g
}

func (g *holdGate) hooks() *store.Hooks {
	return &store.Hooks{InsideWrite: func(ctx context.Context, path, mode, _ string) {
		g.mu.Lock()
		release := g.release
		g.mu.Unlock()
		if path != g.path || release == nil {
			return
		}
		g.arrived <- holdArrival{trace.SpanContextFromContext(ctx), mode}
		<-release
	}}
}

// arm holds the writes that get inside from now on.
func (g *holdGate) arm() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.release = make(chan struct{})
}

// open lets the held writes go and disarms the gate.
func (g *holdGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.release != nil {
		close(g.release)
		g.release = nil
	}
}

// tracedDaemon is a daemon whose spans go to an in-memory recorder.
type tracedDaemon struct {
	*daemon
	rec    *tracetest.SpanRecorder
	starts *testutil.SpanStarts
}

func startTracedDaemon(t *testing.T, configure func(*Config)) *tracedDaemon {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	starts := testutil.NewSpanStarts(rec)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(starts))
	d := startDaemon(t, func(c *Config) {
		c.TracerProvider = tp
		if configure != nil {
			configure(c)
		}
	})
	return &tracedDaemon{daemon: d, rec: rec, starts: starts}
}

// ended returns the ended spans that match.
func (d *tracedDaemon) ended(match func(sdktrace.ReadOnlySpan) bool) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range d.rec.Ended() {
		if match(s) {
			out = append(out, s)
		}
	}
	return out
}

func named(name string) func(sdktrace.ReadOnlySpan) bool {
	return func(s sdktrace.ReadOnlySpan) bool { return s.Name() == name }
}

// rpcSpan waits for the server span with the given id to end (the stats
// handler ends it after the reply is sent, so it may lag the client) and
// returns it.
func (d *tracedDaemon) rpcSpan(t *testing.T, id trace.SpanID) sdktrace.ReadOnlySpan {
	t.Helper()
	var got sdktrace.ReadOnlySpan
	testutil.WaitFor(t, "the RPC span to end", func() bool {
		spans := d.ended(func(s sdktrace.ReadOnlySpan) bool { return s.SpanContext().SpanID() == id })
		if len(spans) == 1 {
			got = spans[0]
		}
		return got != nil
	})
	if got.SpanKind() != trace.SpanKindServer {
		t.Errorf("span %s is a %v span, want the RPC's server span", got.Name(), got.SpanKind())
	}
	return got
}

// checkWait checks the one wait span called name: a child of the RPC
// called rpc, with attrs, linking to exactly the spans in links. It
// returns the waiter's RPC span.
func (d *tracedDaemon) checkWait(t *testing.T, name, rpc string, attrs map[attribute.Key]string, links ...trace.SpanContext) sdktrace.ReadOnlySpan {
	t.Helper()
	waits := d.ended(named(name))
	if len(waits) != 1 {
		t.Fatalf("%d %s spans, want 1", len(waits), name)
	}
	w := waits[0]
	parent := d.rpcSpan(t, w.Parent().SpanID())
	if parent.Name() != rpc || parent.SpanContext().TraceID() != w.SpanContext().TraceID() {
		t.Errorf("%s: parent %q in trace %v, want %q in the same trace", name, parent.Name(), parent.SpanContext().TraceID(), rpc)
	}
	got := map[attribute.Key]string{}
	for _, kv := range w.Attributes() {
		got[kv.Key] = kv.Value.Emit()
	}
	for k, want := range attrs {
		if got[k] != want {
			t.Errorf("%s: %s = %q, want %q", name, k, got[k], want)
		}
	}
	var gotLinks, wantLinks []string
	for _, l := range w.Links() {
		gotLinks = append(gotLinks, l.SpanContext.TraceID().String()+"/"+l.SpanContext.SpanID().String())
	}
	for _, l := range links {
		wantLinks = append(wantLinks, l.TraceID().String()+"/"+l.SpanID().String())
	}
	if strings.Join(gotLinks, " ") != strings.Join(wantLinks, " ") {
		t.Errorf("%s: links %v, want %v", name, gotLinks, wantLinks)
	}
	return parent
}

// TestLockWaitTrace: an extending Write held inside the store blocks a
// second one. The second Write's trace has a filewrite.lock.wait span under
// its RPC span, linked to the first Write's RPC span; /debug/locks shows
// the holder and the waiter while they exist, and neither afterwards.
func TestLockWaitTrace(t *testing.T) {
	g := newHoldGate(t, "f")
	d := startTracedDaemon(t, func(c *Config) { c.Store.Hooks = g.hooks() })
	ctx := testContext(t)
	g.arm()
	errs := make(chan error, 2)
	write := func(off int64) {
		_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "f", Offset: off, Data: make([]byte, 4096)})
		errs <- err
	}
	go write(0) // extending: exclusive
	holder := <-g.arrived
	if holder.mode != "exclusive" || !holder.span.IsValid() {
		t.Fatalf("held write: mode %s, span %v; want exclusive inside a valid RPC span", holder.mode, holder.span)
	}
	go write(4096)
	d.starts.AwaitStart(t, store.SpanLockWait)

	// Held: the lock view shows who holds and that one waits.
	var f store.FileLocks
	testutil.WaitFor(t, "/debug/locks to show the waiter", func() bool {
		var ok bool
		f, ok = d.getLocks(t).file("f")
		return ok && f.Waiting == 1
	})
	if len(f.Holders) != 1 {
		t.Fatalf("/debug/locks holders of f: %+v, want the held write", f.Holders)
	}
	h := f.Holders[0]
	if h.Mode != "exclusive" || h.Op != "write" || h.Reason != store.ReasonExtending ||
		h.TraceID != holder.span.TraceID().String() || h.SpanID != holder.span.SpanID().String() || h.Since.IsZero() {
		t.Errorf("/debug/locks holder %+v, want an exclusive extending write in trace %v span %v", h, holder.span.TraceID(), holder.span.SpanID())
	}
	if f.Size != 0 {
		t.Errorf("/debug/locks size %d while the first write is held, want 0", f.Size)
	}

	g.open()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	d.checkWait(t, store.SpanLockWait, "filewrite.v1.FileService/Write", map[attribute.Key]string{
		store.AttrLockMode:   "exclusive",
		store.AttrLockReason: store.ReasonExtending,
		store.AttrPolicy:     "unlocked-below-eof",
		store.AttrPath:       "f",
	}, holder.span)

	// Released: nothing holds or waits.
	f, ok := d.getLocks(t).file("f")
	if ok && (len(f.Holders) != 0 || f.Waiting != 0 || f.Inflight != 0) {
		t.Errorf("/debug/locks after both writes: %+v, want no holder, waiter or write in flight", f)
	}
	if ok && f.Size != 8192 {
		t.Errorf("/debug/locks size %d, want 8192", f.Size)
	}
}

// TestInflightWaitTrace: a Truncate waits for a Write below EOF that runs
// without the inode lock; its filewrite.inflight.wait span links to the
// Write's RPC span.
func TestInflightWaitTrace(t *testing.T) {
	g := newHoldGate(t, "f")
	d := startTracedDaemon(t, func(c *Config) { c.Store.Hooks = g.hooks() })
	ctx := testContext(t)
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "f", Data: make([]byte, 8192)}); err != nil {
		t.Fatal(err)
	}
	g.arm()
	errs := make(chan error, 2)
	go func() {
		_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "f", Offset: 4096, Data: make([]byte, 4096)})
		errs <- err
	}()
	writer := <-g.arrived
	if writer.mode != "none" {
		t.Fatalf("held write in mode %s, want none (below EOF, in flight)", writer.mode)
	}
	go func() {
		_, err := d.client.Truncate(ctx, &filewritev1.TruncateRequest{Path: "f", Size: 0})
		errs <- err
	}()
	d.starts.AwaitStart(t, store.SpanInflightWait)
	f, _ := d.getLocks(t).file("f")
	if f.Inflight != 1 || len(f.Holders) != 1 || f.Holders[0].Op != "truncate" {
		t.Errorf("/debug/locks while truncate waits: %+v, want truncate holding and 1 write in flight", f)
	}
	g.open()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	d.checkWait(t, store.SpanInflightWait, "filewrite.v1.FileService/Truncate", map[attribute.Key]string{
		store.AttrLockMode:   "exclusive",
		store.AttrLockReason: store.ReasonTruncate,
		store.AttrPolicy:     "unlocked-below-eof",
		store.AttrPath:       "f",
	}, writer.span)
}

// heldSyncFS blocks every Sync until released, reporting each arrival: a
// group commit's sync then lasts as long as the test needs.
type heldSyncFS struct {
	store.FS
	arrived chan struct{}
	release chan struct{}
}

func (h heldSyncFS) OpenFile(name string, flag int, perm fs.FileMode) (store.File, error) {
	f, err := h.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return heldSyncFile{f, h}, nil
}

type heldSyncFile struct {
	store.File
	h heldSyncFS
}

func (f heldSyncFile) Sync(mode store.SyncMode) error {
	f.h.arrived <- struct{}{}
	<-f.h.release
	return f.File.Sync(mode)
}

// TestFsyncWaitTrace: an Fsync that arrives while another's sync runs
// waits for it (then for its own batch); its filewrite.fsync.wait span
// links to the RPC span of the Fsync whose sync was running.
func TestFsyncWaitTrace(t *testing.T) {
	held := heldSyncFS{arrived: make(chan struct{}, 8), release: make(chan struct{})}
	d := startTracedDaemon(t, func(c *Config) {
		c.WrapFS = func(base store.FS) store.FS { held.FS = base; return held }
	})
	var once sync.Once
	releaseSyncs := func() { once.Do(func() { close(held.release) }) }
	t.Cleanup(releaseSyncs) // before the daemon's shutdown, which syncs
	ctx := testContext(t)
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "f", Data: make([]byte, 4096)}); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	fsync := func() {
		_, err := d.client.Fsync(ctx, &filewritev1.FsyncRequest{Path: "f", DataOnly: true})
		errs <- err
	}
	go fsync()
	<-held.arrived // the first Fsync's sync runs, on its own RPC's goroutine
	go fsync()
	d.starts.AwaitStart(t, store.SpanFsyncWait)
	releaseSyncs()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	fsyncs := d.ended(named("filewrite.v1.FileService/Fsync"))
	waits := d.ended(named(store.SpanFsyncWait))
	if len(waits) != 1 {
		t.Fatalf("%d %s spans, want 1", len(waits), store.SpanFsyncWait)
	}
	var lead trace.SpanContext
	testutil.WaitFor(t, "both Fsync RPC spans to end", func() bool {
		fsyncs = d.ended(named("filewrite.v1.FileService/Fsync"))
		return len(fsyncs) == 2
	})
	for _, s := range fsyncs {
		if s.SpanContext().SpanID() != waits[0].Parent().SpanID() {
			lead = s.SpanContext()
		}
	}
	d.checkWait(t, store.SpanFsyncWait, "filewrite.v1.FileService/Fsync", map[attribute.Key]string{
		store.AttrLockReason: "group",
		store.AttrPolicy:     "unlocked-below-eof",
		store.AttrPath:       "f",
	}, lead)
}

// TestNoWaitSpanUncontended: operations that need not wait make no wait
// span, only their RPC spans.
func TestNoWaitSpanUncontended(t *testing.T) {
	d := startTracedDaemon(t, nil)
	ctx := testContext(t)
	for i, sync := range []filewritev1.SyncMode{
		filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED, // extending: exclusive
		filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED, // below EOF: in flight
		filewritev1.SyncMode_SYNC_MODE_DATA,        // and a sync
	} {
		off := int64(min(i, 1)) * 4096
		if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "f", Offset: off, Data: make([]byte, 4096), Sync: sync}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.client.Truncate(ctx, &filewritev1.TruncateRequest{Path: "f", Size: 4096}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "4 RPC spans", func() bool {
		return len(d.ended(func(s sdktrace.ReadOnlySpan) bool { return s.SpanKind() == trace.SpanKindServer })) == 4
	})
	for _, s := range d.rec.Ended() {
		if s.SpanKind() != trace.SpanKindServer {
			t.Errorf("span %q (%v) for uncontended operations, want only RPC spans", s.Name(), s.SpanKind())
		}
	}
}

// TestServerSpanAttributes: an RPC's server span names the method and the
// outcome, and marks a server's failure as an error; it does not carry the
// daemon's own address (serverStats), the same on every span.
func TestServerSpanAttributes(t *testing.T) {
	d := startTracedDaemon(t, nil)
	ctx := testContext(t)
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "f", Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	_, err := d.client.Stat(ctx, &filewritev1.StatRequest{Path: "missing"})
	wantCode(t, "Stat of a missing file", err, codes.NotFound)
	for _, tt := range []struct{ span, code string }{
		{"filewrite.v1.FileService/Write", "OK"},
		{"filewrite.v1.FileService/Stat", "NOT_FOUND"},
	} {
		var s sdktrace.ReadOnlySpan
		testutil.WaitFor(t, tt.span+"'s span to end", func() bool {
			spans := d.ended(named(tt.span))
			if len(spans) == 1 {
				s = spans[0]
			}
			return s != nil
		})
		got := map[attribute.Key]string{}
		for _, kv := range s.Attributes() {
			got[kv.Key] = kv.Value.Emit()
		}
		want := map[attribute.Key]string{"rpc.method": tt.span, "rpc.system.name": "grpc", "rpc.response.status_code": tt.code}
		if !maps.Equal(got, want) {
			t.Errorf("%s: attributes %v, want %v", tt.span, got, want)
		}
		// NOT_FOUND is the caller's mistake, not the server's failure.
		if s.Status().Code != otelcodes.Unset {
			t.Errorf("%s: status %v, want unset", tt.span, s.Status())
		}
	}
}

// TestFailedRPCLogCarriesTraceID: the log line of a failed RPC names its
// trace, so that an operator can go from the log to the trace.
func TestFailedRPCLogCarriesTraceID(t *testing.T) {
	var logs testutil.LockedBuffer
	d := startTracedDaemon(t, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	_, err := d.client.Read(testContext(t), &filewritev1.ReadRequest{Path: "missing", Length: 1})
	if err == nil {
		t.Fatal("Read of a missing file succeeded")
	}
	var rpc sdktrace.ReadOnlySpan
	testutil.WaitFor(t, "the Read span", func() bool {
		spans := d.ended(named("filewrite.v1.FileService/Read"))
		if len(spans) == 1 {
			rpc = spans[0]
		}
		return rpc != nil
	})
	var line string
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, "msg=rpc") && strings.Contains(l, "FileService/Read") {
			line = l
		}
	}
	for _, want := range []string{
		"code=NotFound",
		"trace_id=" + rpc.SpanContext().TraceID().String(),
		"span_id=" + rpc.SpanContext().SpanID().String(),
	} {
		if !strings.Contains(line, want) {
			t.Errorf("log line %q lacks %s", line, want)
		}
	}
}

// TestTracesFromEnvironment: traces are off unless OTEL_TRACES_EXPORTER
// names an exporter or an OTLP endpoint is set (autoexport alone would
// default to OTLP to localhost, with no endpoint set).
func TestTracesFromEnvironment(t *testing.T) {
	// A collector that is not there: nothing is sent in this test.
	const nowhere = "http://127.0.0.1:1"
	for _, tc := range []struct {
		exporter, endpoint, tracesEndpoint string
		on                                 bool
		fails                              bool
	}{
		{"", "", "", false, false},
		{"", nowhere, "", true, false},
		{"", "", nowhere, true, false},
		{"none", nowhere, "", false, false},
		{"console", "", "", true, false},
		{"otlp", nowhere, "", true, false},
		{"carrier-pigeon", "", "", false, true},
	} {
		t.Run("OTEL_TRACES_EXPORTER="+tc.exporter+",endpoint="+tc.endpoint+",traces_endpoint="+tc.tracesEndpoint, func(t *testing.T) {
			t.Setenv("OTEL_TRACES_EXPORTER", tc.exporter)
			t.Setenv("OTEL_METRICS_EXPORTER", "none")
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", tc.endpoint)
			t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", tc.tracesEndpoint)
			tel, err := newTelemetry(t.Context(), DefaultConfig().TracerProvider)
			if tc.fails {
				if err == nil {
					tel.shutdown(t.Context())
					t.Fatal("newTelemetry succeeded, want an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer tel.shutdown(t.Context())
			_, noop := tel.tracerProvider.(tracenoop.TracerProvider)
			if noop == tc.on {
				t.Errorf("tracer provider %T, want tracing on = %v", tel.tracerProvider, tc.on)
			}
		})
	}
}

// TestRESTCallIsOneTrace: a JSON write goes through the gateway's gRPC
// client into the server; the server's Write span is a child of the
// client's, so a REST call's lock wait sits in one trace with it. (A raw
// PUT takes the direct road: TestRESTRequestHasHTTPServerSpan.)
func TestRESTCallIsOneTrace(t *testing.T) {
	d := startTracedDaemon(t, nil)
	r := testutil.DoHTTP(t, http.MethodPost, d.url+"/v1/files/f:write", strings.NewReader(`{"offset":"0","data":"aGVsbG8="}`), map[string]string{"Content-Type": "application/json"})
	if r.Status != http.StatusOK {
		t.Fatalf("POST :write: %d %s", r.Status, r.Body)
	}
	var server, client sdktrace.ReadOnlySpan
	testutil.WaitFor(t, "the Write's client and server spans", func() bool {
		for _, s := range d.ended(named("filewrite.v1.FileService/Write")) {
			switch s.SpanKind() {
			case trace.SpanKindServer:
				server = s
			case trace.SpanKindClient:
				client = s
			}
		}
		return server != nil && client != nil
	})
	if server.Parent().SpanID() != client.SpanContext().SpanID() || server.SpanContext().TraceID() != client.SpanContext().TraceID() {
		t.Errorf("server span's parent %v in trace %v, want the gateway's client span %v in trace %v",
			server.Parent().SpanID(), server.SpanContext().TraceID(), client.SpanContext().SpanID(), client.SpanContext().TraceID())
	}
}
