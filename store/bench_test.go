//go:build linux

package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A benchmark here compares configurations side by side in one run: each
// b.N iteration runs one round of every configuration in turn, on files
// prepared the same way, and the reported figures are medians over rounds.
// Run them with -benchtime=Nx (N rounds), e.g.
//
//	go test -run '^$' -bench . -benchtime 5x ./store/

// benchConfig is one side of a comparison.
type benchConfig struct {
	name string
	opts Options
}

// benchRound is one configuration's round: ops performed and time taken.
type benchRound struct {
	ops     int
	elapsed time.Duration
}

func (r benchRound) rate() float64 { return float64(r.ops) / r.elapsed.Seconds() }

// runWorkers runs op from workers goroutines until total ops are done.
func runWorkers(b *testing.B, workers, total int, op func(worker int, rng *rand.Rand) error) benchRound {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for next.Add(1) <= int64(total) {
				if err := op(w, rng); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return benchRound{ops: total, elapsed: time.Since(start)}
}

// reportPair reports each side's median rate and the median of the
// per-round ratios after/before.
func reportPair(b *testing.B, before, after string, rounds map[string][]benchRound) {
	median := func(xs []float64) float64 {
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	var rb, ra, ratio []float64
	for i := range rounds[before] {
		rb = append(rb, rounds[before][i].rate())
		ra = append(ra, rounds[after][i].rate())
		ratio = append(ratio, rounds[after][i].rate()/rounds[before][i].rate())
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(median(rb), before+"-ops/s")
	b.ReportMetric(median(ra), after+"-ops/s")
	b.ReportMetric(median(ratio), "x-"+after+"/"+before)
}

func openBenchStore(b *testing.B, opts Options) *Store {
	s, _ := newTestStore(b, opts)
	return s
}

// openBenchStores opens a store of each config's options, by name.
func openBenchStores(b *testing.B, configs []benchConfig) map[string]*Store {
	stores := map[string]*Store{}
	for _, c := range configs {
		stores[c.name] = openBenchStore(b, c.opts)
	}
	return stores
}

// BenchmarkBelowEOF: 8 writers, 4 KiB at random offsets below EOF of a
// written 256 MiB file, sync=data: unlocked-below-eof vs exclusive (the
// btrfs unlocked buffered write).
func BenchmarkBelowEOF(b *testing.B) {
	const fileSize, bs, workers, perRound = 256 << 20, 4096, 8, 4000
	ctx := context.Background()
	configs := []benchConfig{
		{"exclusive", Options{Policy: PolicyExclusive}},
		{"unlocked", Options{Policy: PolicyUnlockedBelowEOF}},
	}
	stores := map[string]*Store{}
	for _, c := range configs {
		s := openBenchStore(b, c.opts)
		chunk := make([]byte, 4<<20)
		for off := int64(0); off < fileSize; off += int64(len(chunk)) {
			if _, err := s.Write(ctx, "f", off, chunk, SyncNone); err != nil {
				b.Fatal(err)
			}
		}
		if err := s.Fsync(ctx, "f", SyncFull); err != nil {
			b.Fatal(err)
		}
		stores[c.name] = s
	}
	data := make([]byte, bs)
	rounds := map[string][]benchRound{}
	b.ResetTimer()
	for range b.N {
		for _, c := range configs {
			s := stores[c.name]
			rounds[c.name] = append(rounds[c.name], runWorkers(b, workers, perRound, func(_ int, rng *rand.Rand) error {
				_, err := s.Write(ctx, "f", rng.Int64N(fileSize/bs)*bs, data, SyncData)
				return err
			}))
		}
	}
	reportPair(b, "exclusive", "unlocked", rounds)
}

// BenchmarkPreallocOverwrite: 8 writers, 4 KiB direct I/O at random offsets
// of a freshly fallocated 1 GiB file (each round gets a new one):
// shared-overwrite vs shared-written (the ext4 unwritten-extent patch).
func BenchmarkPreallocOverwrite(b *testing.B) {
	const fileSize, bs, workers, perRound = 1 << 30, 4096, 8, 4000
	ctx := context.Background()
	configs := []benchConfig{
		{"shared-written", Options{Policy: PolicySharedWritten, IO: IODirect}},
		{"shared-overwrite", Options{Policy: PolicySharedOverwrite, IO: IODirect}},
	}
	stores := openBenchStores(b, configs)
	data := make([]byte, bs)
	rounds := map[string][]benchRound{}
	b.ResetTimer()
	for i := range b.N {
		for _, c := range configs {
			s := stores[c.name]
			name := fmt.Sprintf("f%d", i)
			b.StopTimer()
			if _, err := s.Fallocate(ctx, name, FallocAllocate, 0, fileSize); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			rounds[c.name] = append(rounds[c.name], runWorkers(b, workers, perRound, func(_ int, rng *rand.Rand) error {
				_, err := s.Write(ctx, name, rng.Int64N(fileSize/bs)*bs, data, SyncNone)
				return err
			}))
			b.StopTimer()
			if err := s.Truncate(ctx, name, 0); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
	reportPair(b, "shared-written", "shared-overwrite", rounds)
}

// BenchmarkFsyncModes: 32 callers of Write(sync=data) below EOF: group
// commit vs one sync per caller vs the 3 ms gathering timer. It also
// reports group commit's syncs per call.
func BenchmarkFsyncModes(b *testing.B) {
	const fileSize, bs, workers, perRound = 16 << 20, 4096, 32, 3000
	ctx := context.Background()
	configs := []benchConfig{
		{"per-call", Options{Fsync: FsyncPerCall}},
		{"timer", Options{Fsync: FsyncTimer}},
		{"group", Options{Fsync: FsyncGroup}},
	}
	stores := map[string]*Store{}
	for _, c := range configs {
		s := openBenchStore(b, c.opts)
		if _, err := s.Write(ctx, "f", 0, make([]byte, fileSize), SyncData); err != nil {
			b.Fatal(err)
		}
		stores[c.name] = s
	}
	syncsBefore := func(s *Store) int64 {
		ino, err := s.table.get(ctx, "f", false)
		if err != nil {
			b.Fatal(err)
		}
		defer s.table.put(ino)
		return ino.commit.syncs.Load()
	}
	data := make([]byte, bs)
	rounds := map[string][]benchRound{}
	var groupSyncs, groupCalls int64
	b.ResetTimer()
	for range b.N {
		for _, c := range configs {
			s := stores[c.name]
			first := syncsBefore(s)
			rounds[c.name] = append(rounds[c.name], runWorkers(b, workers, perRound, func(_ int, rng *rand.Rand) error {
				_, err := s.Write(ctx, "f", rng.Int64N(fileSize/bs)*bs, data, SyncData)
				return err
			}))
			if c.name == "group" {
				groupSyncs += syncsBefore(s) - first
				groupCalls += perRound
			}
		}
	}
	reportPair(b, "per-call", "group", rounds)
	var timer []float64
	for i := range rounds["timer"] {
		timer = append(timer, rounds["timer"][i].rate()/rounds["group"][i].rate())
	}
	slices.Sort(timer)
	b.ReportMetric(timer[len(timer)/2], "x-timer/group")
	b.ReportMetric(float64(groupSyncs)/float64(groupCalls), "group-syncs/call")
}

// singleCounter is the contended baseline for inflightCounter: one atomic.
type singleCounter struct{ n atomic.Int64 }

func (c *singleCounter) begin() uint32 { c.n.Add(1); return 0 }
func (c *singleCounter) end(uint32)    { c.n.Add(-1) }

// BenchmarkInflightCounter: begin/end pairs from 4 goroutines per CPU on
// the striped counter vs one shared atomic (the i_dio_count wall).
func BenchmarkInflightCounter(b *testing.B) {
	const perRound = 2_000_000
	workers := 4 * runtime.GOMAXPROCS(0)
	striped, single := newInflightCounter(), &singleCounter{}
	rounds := map[string][]benchRound{}
	b.ResetTimer()
	for range b.N {
		rounds["single"] = append(rounds["single"], runWorkers(b, workers, perRound/100, func(int, *rand.Rand) error {
			for range 100 {
				single.end(single.begin())
			}
			return nil
		}))
		rounds["striped"] = append(rounds["striped"], runWorkers(b, workers, perRound/100, func(int, *rand.Rand) error {
			for range 100 {
				striped.end(striped.begin())
			}
			return nil
		}))
	}
	// Rates are in units of 100 begin/end pairs.
	reportPair(b, "single", "striped", rounds)
}

// BenchmarkManyFiles: 8 writers, 4 KiB at a random block of a random file:
// one 64 MiB file against 10,000 files of 16 KiB, all held open, with 1024
// open (the rest reopened as they are written, their extent maps from the
// extent cache), and with 1024 open and no cache (every reopen a FIEMAP
// with FIEMAP_FLAG_SYNC). Every file is written in 16 KiB pieces and
// flushed before the rounds. The ratios are to the one file.
func BenchmarkManyFiles(b *testing.B) {
	const bs, workers, perRound, many = 4096, 8, 20000, 10000
	ctx := context.Background()
	type config struct {
		name  string
		files int
		size  int64
		opts  Options
	}
	configs := []config{
		{"1-file", 1, 64 << 20, Options{}},
		{"10k-open", many, 16 << 10, Options{MaxOpenFiles: 2 * many}},
		{"10k-1024", many, 16 << 10, Options{MaxOpenFiles: 1024}},
		{"10k-1024-nocache", many, 16 << 10, Options{MaxOpenFiles: 1024, ExtentCacheBytes: -1}},
	}
	path := func(i int) string { return fmt.Sprintf("d%03d/f%06d", i/1000, i) }
	stores := map[string]*Store{}
	piece := make([]byte, 16<<10)
	for _, c := range configs {
		s, dir := newTestStore(b, c.opts)
		for i := range c.files {
			for off := int64(0); off < c.size; off += int64(len(piece)) {
				if _, err := s.Write(ctx, path(i), off, piece, SyncNone); err != nil {
					b.Fatal(err)
				}
			}
		}
		if err := syncfs(dir); err != nil {
			b.Fatal(err)
		}
		stores[c.name] = s
	}
	data := make([]byte, bs)
	rounds := map[string][]benchRound{}
	b.ResetTimer()
	for range b.N {
		for _, c := range configs {
			s, blocks := stores[c.name], c.size/bs
			rounds[c.name] = append(rounds[c.name], runWorkers(b, workers, perRound, func(_ int, rng *rand.Rand) error {
				n := rng.Int64N(int64(c.files) * blocks)
				_, err := s.Write(ctx, path(int(n/blocks)), n%blocks*bs, data, SyncNone)
				return err
			}))
		}
	}
	b.ReportMetric(0, "ns/op")
	for _, c := range configs {
		var rates, ratios []float64
		for i, r := range rounds[c.name] {
			rates = append(rates, r.rate())
			ratios = append(ratios, r.rate()/rounds["1-file"][i].rate())
		}
		slices.Sort(rates)
		slices.Sort(ratios)
		b.ReportMetric(rates[len(rates)/2], c.name+"-ops/s")
		if c.name != "1-file" {
			b.ReportMetric(ratios[len(ratios)/2], "x-"+c.name+"/1-file")
		}
	}
}

// syncfs flushes the filesystem that holds dir.
func syncfs(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// BenchmarkAppend: 32 appenders, 4 KiB each, no sync, to one file that
// each round starts empty: exclusive (every append under the inode lock)
// vs unlocked (the range reserved under the shared lock, the bytes copied
// with none held), with the store alone, no RPC. It shows what the
// reserving policy can win where nothing else costs: on ext4 the kernel
// takes the inode's own rwsem exclusively for every buffered write, so
// the copies of appends to one file run one at a time either way.
func BenchmarkAppend(b *testing.B) {
	const bs, workers, perRound = 4096, 32, 20000
	ctx := context.Background()
	configs := []benchConfig{
		{"exclusive", Options{Policy: PolicyExclusive}},
		{"unlocked", Options{Policy: PolicyUnlockedBelowEOF}},
	}
	stores := openBenchStores(b, configs)
	data := make([]byte, bs)
	rounds := map[string][]benchRound{}
	b.ResetTimer()
	for i := range b.N {
		for _, c := range configs {
			s := stores[c.name]
			name := fmt.Sprintf("log-%d", i)
			rounds[c.name] = append(rounds[c.name], runWorkers(b, workers, perRound, func(int, *rand.Rand) error {
				_, err := s.Append(ctx, name, data, SyncNone, AppendOptions{})
				return err
			}))
			if err := s.Delete(ctx, name, false); err != nil {
				b.Fatal(err)
			}
		}
	}
	reportPair(b, "exclusive", "unlocked", rounds)
}
