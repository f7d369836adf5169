package e2e

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
)

// otlpSink is an OTLP/HTTP trace receiver on loopback: it records the
// service name and span names it is sent.
type otlpSink struct {
	mu       sync.Mutex
	services []string
	spans    []string
}

func (s *otlpSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var req coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &req)
	}
	if r.URL.Path != "/v1/traces" || err != nil {
		http.Error(w, "want an OTLP protobuf POST to /v1/traces", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	for _, rs := range req.GetResourceSpans() {
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				s.services = append(s.services, kv.GetValue().GetStringValue())
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				s.spans = append(s.spans, sp.GetName())
			}
		}
	}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Write(out)
}

// TestDaemonExportsTracesOnShutdown runs the real binary with traces sent
// over OTLP as the standard environment variables say, with a batch delay
// far longer than the test: the spans arrive only because the shutdown
// flushes them.
func TestDaemonExportsTracesOnShutdown(t *testing.T) {
	sink := &otlpSink{}
	collector := httptest.NewServer(sink)
	defer collector.Close()
	for k, v := range map[string]string{
		"OTEL_TRACES_EXPORTER":        "otlp",
		"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
		"OTEL_EXPORTER_OTLP_ENDPOINT": collector.URL,
		"OTEL_BSP_SCHEDULE_DELAY":     "3600000", // ms: an hour
		"OTEL_SERVICE_NAME":           "filewrite-test",
		"OTEL_METRICS_EXPORTER":       "",
	} {
		t.Setenv(k, v) // inherited by the daemon
	}
	dir := testutil.Dir(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	proc, logs := testutil.StartDaemon(t, ctx, daemonBin, "--root", filepath.Join(dir, "root"))
	grpcAddr := proc.GRPCAddr
	conn := testutil.PlaintextConn(t, grpcAddr)
	if _, err := filewritev1.NewFileServiceClient(conn).Write(ctx, &filewritev1.WriteRequest{Path: "f", Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if err := proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := proc.Wait(); err != nil {
		t.Fatalf("daemon exit: %v\n%s", err, logs)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if !slices.Contains(sink.spans, "filewrite.v1.FileService/Write") {
		t.Errorf("spans received: %v, want the Write's\n%s", sink.spans, logs)
	}
	if len(sink.services) == 0 || sink.services[0] != "filewrite-test" {
		t.Errorf("service names received: %v, want filewrite-test (OTEL_SERVICE_NAME)", sink.services)
	}
}
