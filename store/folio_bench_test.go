//go:build linux

package store

import (
	"context"
	"math/rand/v2"
	"slices"
	"syscall"
	"testing"
	"time"
)

// BenchmarkPreparedChunk: does the size of the writes that first filled a
// file change what later 4 KiB overwrites of it cost, and what would the
// store pay to split large writes? Each round truncates the file to 0,
// writes it whole (64 MiB) in chunks of one size through Write, syncs it,
// then 4 writers overwrite 4 KiB at random blocks: once with 1 MiB chunks
// (what a client writing large buffers gets today) and once with 16 KiB
// chunks (what the store would make of those buffers if it split them).
// It reports, as medians over rounds, the CPU time of this process per
// overwrite and per MiB of preparation for each side, and the overwrite
// rate: CPU time is what other load on a shared machine disturbs least.
//
//	go test -run '^$' -bench PreparedChunk -benchtime 5x ./store/
func BenchmarkPreparedChunk(b *testing.B) {
	const fileSize, bs, workers, perRound = 64 << 20, 4096, 4, 100000
	ctx := context.Background()
	chunks := []struct {
		name string
		size int
	}{{"1m", 1 << 20}, {"16k", 16 << 10}}
	s := openBenchStore(b, Options{})
	data := make([]byte, bs)
	type round struct{ prepUSPerMiB, usPerWrite, rate float64 }
	rounds := map[string][]round{}
	b.ResetTimer()
	for range b.N {
		for _, c := range chunks {
			path := "f-" + c.name
			if _, err := s.Stat(ctx, path); err == nil {
				if err := s.Truncate(ctx, path, 0); err != nil {
					b.Fatal(err)
				}
			}
			chunk := make([]byte, c.size)
			cpu0 := cpuTime(b)
			for off := int64(0); off < fileSize; off += int64(len(chunk)) {
				if _, err := s.Write(ctx, path, off, chunk, SyncNone); err != nil {
					b.Fatal(err)
				}
			}
			prep := cpuTime(b) - cpu0
			if err := s.Fsync(ctx, path, SyncFull); err != nil {
				b.Fatal(err)
			}
			cpu0 = cpuTime(b)
			r := runWorkers(b, workers, perRound, func(_ int, rng *rand.Rand) error {
				_, err := s.Write(ctx, path, rng.Int64N(fileSize/bs)*bs, data, SyncNone)
				return err
			})
			over := cpuTime(b) - cpu0
			rounds[c.name] = append(rounds[c.name], round{
				prepUSPerMiB: float64(prep.Microseconds()) / float64(fileSize>>20),
				usPerWrite:   float64(over.Nanoseconds()) / 1e3 / perRound,
				rate:         r.rate(),
			})
		}
	}
	median := func(name string, f func(round) float64) float64 {
		var xs []float64
		for _, r := range rounds[name] {
			xs = append(xs, f(r))
		}
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	b.ReportMetric(0, "ns/op")
	for _, c := range chunks {
		b.ReportMetric(median(c.name, func(r round) float64 { return r.usPerWrite }), "cpu-µs/overwrite-"+c.name)
		b.ReportMetric(median(c.name, func(r round) float64 { return r.prepUSPerMiB }), "cpu-µs/MiB-prep-"+c.name)
		b.ReportMetric(median(c.name, func(r round) float64 { return r.rate }), "overwrites/s-"+c.name)
	}
}

// cpuTime is this process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
