package service

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/client"
	"github.com/filewrite/filewrite/internal/testutil"
)

// startWriteBenchDaemon starts a daemon in this process for the write
// benchmarks: gRPC only, no exporters, a quiet log. It shuts down when the
// benchmark ends.
func startWriteBenchDaemon(b *testing.B) *Server {
	b.Setenv("OTEL_TRACES_EXPORTER", "")
	b.Setenv("OTEL_METRICS_EXPORTER", "")
	cfg := DefaultConfig()
	cfg.Root = filepath.Join(testutil.Dir(b), "root")
	cfg.GRPCAddr = "127.0.0.1:0"
	cfg.HTTPAddr = ""
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := Start(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Shutdown() })
	return srv
}

// BenchmarkWriteStream drives a daemon in this process with 32 callers,
// each with a client.File of its own on one path (one Client), writing
// 4 KiB at random blocks below EOF of a written 64 MiB file; one op is one
// write. Client and daemon share the process, so allocs/op counts both:
// run it with -memprofile and look at the daemon's frames to see the
// daemon's share (the load harness counts the daemon alone, in its own
// process: go -C loadtest run . -scenario stream).
//
//	go test -run '^$' -bench WriteStream -benchtime 200000x -memprofile mem.out ./service/
func BenchmarkWriteStream(b *testing.B) { benchmarkWriteStream(b, client.SyncNone, 1) }

// BenchmarkWriteStreamMany is BenchmarkWriteStream's 32 callers over 8
// Clients, so 8 connections and streams of 4 writes in flight each, as
// the load harness's peer-streams runs them: messages carry few writes,
// and what a message costs shows.
//
//	go test -run '^$' -bench WriteStreamMany -benchtime 100000x ./service/
func BenchmarkWriteStreamMany(b *testing.B) { benchmarkWriteStream(b, client.SyncNone, 8) }

// BenchmarkWriteStreamDurable is BenchmarkWriteStream with every write
// durable (SYNC_MODE_DATA): the stream's syncer and the group commit.
//
//	go test -run '^$' -bench WriteStreamDurable -benchtime 20000x ./service/
func BenchmarkWriteStreamDurable(b *testing.B) { benchmarkWriteStream(b, client.SyncData, 1) }

// benchmarkWriteStream runs the stream benchmarks: 32 callers, caller i
// on Client i mod clients.
func benchmarkWriteStream(b *testing.B, sync client.SyncMode, clients int) {
	const fileSize, bs, callers = 64 << 20, 4096, 32
	srv := startWriteBenchDaemon(b)
	ctx := context.Background()
	cs := make([]*client.Client, clients)
	for i := range cs {
		c, err := client.Dial(srv.GRPCAddr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		cs[i] = c
	}
	files := make([]*client.File, callers)
	for i := range files {
		var err error
		if files[i], err = cs[i%clients].Open(ctx, "f"); err != nil {
			b.Fatal(err)
		}
	}
	// Prepared as the load harness prepares its files, in 1 MiB unary
	// Writes: how a file was first written decides what a 4 KiB
	// overwrite costs the kernel later (docs/benchmarks.md, the stream path).
	conn, err := grpc.NewClient(srv.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	prepareBenchFile(b, filewritev1.NewFileServiceClient(conn), fileSize)
	data := make([]byte, bs)
	runWriteBench(b, fileSize, bs, callers, func(caller int, off int64) error {
		_, _, err := files[caller].Write(ctx, data, off, sync)
		return err
	})
	for _, f := range files {
		f.Close()
	}
}

// BenchmarkWriteUnary is BenchmarkWriteStream's workload through the
// unary Write, one connection per caller, as the load harness's unary
// column runs it.
//
//	go test -run '^$' -bench WriteUnary -benchtime 100000x -cpuprofile cpu.out ./service/
func BenchmarkWriteUnary(b *testing.B) {
	const fileSize, bs, callers = 64 << 20, 4096, 32
	srv := startWriteBenchDaemon(b)
	clients := make([]filewritev1.FileServiceClient, callers)
	for i := range clients {
		conn, err := grpc.NewClient(srv.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		clients[i] = filewritev1.NewFileServiceClient(conn)
	}
	ctx := context.Background()
	prepareBenchFile(b, clients[0], fileSize)
	data := make([]byte, bs)
	runWriteBench(b, fileSize, bs, callers, func(caller int, off int64) error {
		_, err := clients[caller].Write(ctx, &filewritev1.WriteRequest{Path: "f", Offset: off, Data: data})
		return err
	})
}

// prepareBenchFile writes "f" whole, fileSize bytes, in 1 MiB unary Writes.
func prepareBenchFile(b *testing.B, fc filewritev1.FileServiceClient, fileSize int64) {
	chunk := make([]byte, 1<<20)
	for off := int64(0); off < fileSize; off += int64(len(chunk)) {
		if _, err := fc.Write(context.Background(), &filewritev1.WriteRequest{Path: "f", Offset: off, Data: chunk}); err != nil {
			b.Fatal(err)
		}
	}
}

// runWriteBench is the timed part of the write benchmarks: callers
// goroutines write at random blocks of bs bytes below fileSize (each
// caller the same blocks in both benchmarks) until b.N writes are done in
// all. It also reports, per write and for client and daemon together,
// the CPU time of this process, how often a goroutine was woken
// (wakeups/op) and how often a thread slept or was preempted
// (switches/op): other load on a shared machine disturbs these less than
// ns/op, and a hand-off between goroutines shows in the last two.
func runWriteBench(b *testing.B, fileSize, bs int64, callers int, write func(caller int, off int64) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	cpu0, wake0, sw0 := processCPU(b), goroutineWakeups(), threadSwitches(b)
	for i := range callers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			for next.Add(1) <= int64(b.N) {
				if err := write(i, rng.Int64N(fileSize/bs)*bs); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N)/1e3, "cpu-µs/op")
	b.ReportMetric(float64(goroutineWakeups()-wake0)/float64(b.N), "wakeups/op")
	b.ReportMetric(float64(threadSwitches(b)-sw0)/float64(b.N), "switches/op")
}

// goroutineWakeups estimates how many times a goroutine went from
// runnable to running so far. The runtime times one such transition in
// gTrackingPeriod (8) into /sched/latencies:seconds, so its count times 8
// is the estimate.
func goroutineWakeups() float64 {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	var n uint64
	for _, c := range s[0].Value.Float64Histogram().Counts {
		n += c
	}
	return float64(n) * 8
}

// threadSwitches is the context switches of this process's threads so
// far, voluntary and not (those of threads that exited are lost; Go
// seldom ends a thread).
func threadSwitches(b *testing.B) int64 {
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil || len(tasks) == 0 {
		b.Fatalf("/proc/self/task: %v", err)
	}
	var n int64
	for _, t := range tasks {
		data, err := os.ReadFile(t)
		if err != nil {
			continue // the thread exited meanwhile
		}
		for line := range strings.Lines(string(data)) {
			k, v, _ := strings.Cut(line, ":")
			if k == "voluntary_ctxt_switches" || k == "nonvoluntary_ctxt_switches" {
				c, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				n += c
			}
		}
	}
	return n
}
