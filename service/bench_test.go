package service

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
)

// BenchmarkTracing measures what tracing costs a busy daemon: 8 writers
// send 4 KiB Writes at random offsets below EOF of a 64 MiB file (the
// default policy runs them without the inode lock) through the real gRPC
// server on loopback, to a daemon with tracing off (the default) and to
// one with every RPC sampled and its spans batched to an in-memory
// exporter. Each b.N iteration runs one round on each, in alternating
// order, so both see the same machine; the figures are medians over
// rounds, the ratio the median of per-round ratios. Run it with
// -benchtime=Nx for N rounds:
//
//	go test -run '^$' -bench Tracing -benchtime 10x ./service/
func BenchmarkTracing(b *testing.B) {
	const fileSize, bs, workers, perRound = 64 << 20, 4096, 8, 4000
	spans := tracetest.NewInMemoryExporter()
	sides := []struct {
		name string
		tp   trace.TracerProvider
	}{
		{"off", nil}, // from the environment: off unless OTEL_TRACES_EXPORTER is set
		{"on", sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(spans))},
	}
	b.Setenv("OTEL_TRACES_EXPORTER", "")
	b.Setenv("OTEL_METRICS_EXPORTER", "")
	ctx := context.Background()
	clients := make([]filewritev1.FileServiceClient, len(sides))
	for i, side := range sides {
		clients[i] = startBenchDaemon(b, side.tp)
		chunk := make([]byte, 4<<20)
		for off := int64(0); off < fileSize; off += int64(len(chunk)) {
			if _, err := clients[i].Write(ctx, &filewritev1.WriteRequest{Path: "f", Offset: off, Data: chunk}); err != nil {
				b.Fatal(err)
			}
		}
	}
	data := make([]byte, bs)
	rates := make([][]float64, len(sides))
	cpuPerWrite := make([][]float64, len(sides))
	b.ResetTimer()
	for round := range b.N {
		for k := range sides {
			// Alternate which side goes first, and start each side on a
			// collected heap: both daemons share this process's garbage
			// collector, which would otherwise make one side pay for the
			// other's allocations (the traced side's spans).
			i := (k + round) % len(sides)
			b.StopTimer()
			runtime.GC()
			b.StartTimer()
			var next atomic.Int64
			var wg sync.WaitGroup
			cpu0 := processCPU(b)
			start := time.Now()
			for w := range workers {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
					for next.Add(1) <= perRound {
						req := &filewritev1.WriteRequest{Path: "f", Offset: rng.Int64N(fileSize/bs) * bs, Data: data}
						if _, err := clients[i].Write(ctx, req); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			rates[i] = append(rates[i], perRound/time.Since(start).Seconds())
			cpuPerWrite[i] = append(cpuPerWrite[i], (processCPU(b)-cpu0).Seconds()/perRound)
			// Drop the exported spans (nobody looks at them), so that the
			// next round, on either side, starts without them in the heap.
			spans.Reset()
		}
	}
	b.StopTimer()
	median := func(xs []float64) float64 {
		xs = slices.Clone(xs)
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	var ratio, cpuRatio []float64
	for r := range rates[0] {
		ratio = append(ratio, rates[1][r]/rates[0][r])
		cpuRatio = append(cpuRatio, cpuPerWrite[0][r]/cpuPerWrite[1][r])
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(median(rates[0]), "off-writes/s")
	b.ReportMetric(median(rates[1]), "on-writes/s")
	b.ReportMetric(median(ratio), "x-on/off")
	// CPU time per write of this process (client and daemon), which other
	// processes on a shared machine do not disturb as they disturb
	// throughput: off/on is the throughput ratio of a CPU-bound daemon.
	b.ReportMetric(median(cpuPerWrite[0])*1e6, "off-cpu-µs/write")
	b.ReportMetric(median(cpuPerWrite[1])*1e6, "on-cpu-µs/write")
	b.ReportMetric(median(cpuRatio), "x-cpu-off/on")
}

// processCPU is the user and system CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// startBenchDaemon starts a daemon on loopback with the given tracer
// provider (nil: from the environment) and returns a client of it.
func startBenchDaemon(b *testing.B, tp trace.TracerProvider) filewritev1.FileServiceClient {
	b.Helper()
	dir := testutil.Dir(b)
	cfg := DefaultConfig()
	cfg.Root = filepath.Join(dir, "root")
	cfg.GRPCAddr = "127.0.0.1:0"
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.TracerProvider = tp
	srv, err := Start(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := srv.Shutdown(); err != nil {
			b.Error(err)
		}
		if p, ok := tp.(*sdktrace.TracerProvider); ok {
			p.Shutdown(context.Background())
		}
	})
	conn, err := grpc.NewClient(srv.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return filewritev1.NewFileServiceClient(conn)
}
