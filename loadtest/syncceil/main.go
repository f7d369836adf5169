// Command syncceil measures what the disk allows the below-eof comparison
// without the daemon in the way: random 4 KiB pwrites, each followed by
// fdatasync, into a 256 MiB file written in 1 MiB chunks (the harness's
// preparation), under the serializations the daemon imposes. fio cannot
// share one fdatasync between jobs, so this is the ceiling measurement of
// a group commit (issue 10).
//
//	serial    one writer: pwrite, fdatasync (fio --numjobs=1 --fdatasync=1)
//	mutex     -jobs writers, one lock around pwrite+fdatasync (the exclusive policy)
//	group     -jobs writers, pwrite unlocked, then a group commit that runs
//	          one fdatasync at a time (unlocked-below-eof with --fsync group)
//	per-call  -jobs writers, each its own fdatasync (fio --numjobs=8 --fdatasync=1)
//
// Modes alternate within each round; medians over rounds are printed with
// each mode's ratio to mutex. Usage:
//
//	go -C loadtest run ./syncceil -dir DIR [-jobs 8] [-d 3s] [-r 3]
package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

const (
	fileSize  = 256 << 20
	bs        = 4096
	prepChunk = 1 << 20
)

var modes = []string{"serial", "mutex", "group", "per-call"}

func main() {
	dir := flag.String("dir", "", "directory on the file system to measure (required)")
	jobs := flag.Int("jobs", 8, "concurrent writers (the below-eof scenario's clients)")
	dur := flag.Duration("d", 3*time.Second, "length of each run")
	rounds := flag.Int("r", 3, "rounds; each runs every mode once")
	flag.Parse()
	if *dir == "" || *jobs < 1 || *rounds < 1 || *dur <= 0 {
		fmt.Fprintln(os.Stderr, "syncceil: -dir is required; -jobs, -r and -d must be positive")
		os.Exit(2)
	}
	path := filepath.Join(*dir, "syncceil.dat")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	check(err)
	defer os.Remove(path)
	chunk := make([]byte, prepChunk)
	for off := int64(0); off < fileSize; off += prepChunk {
		_, err := f.WriteAt(chunk, off)
		check(err)
	}
	check(f.Sync())
	fd := int(f.Fd())

	iops := map[string][]float64{}
	for r := range *rounds {
		for _, m := range modes {
			ops, syncs := run(fd, m, *jobs, *dur, uint64(r))
			rate := float64(ops) / dur.Seconds()
			iops[m] = append(iops[m], rate)
			fmt.Printf("round %d  %-8s %7.0f IOPS  %.2f syncs/op\n", r+1, m, rate, float64(syncs)/float64(ops))
		}
	}
	median := func(xs []float64) float64 {
		xs = slices.Sorted(slices.Values(xs))
		return xs[len(xs)/2]
	}
	base := median(iops["mutex"])
	for _, m := range modes {
		fmt.Printf("median    %-8s %7.0f IOPS  %.2fx of mutex\n", m, median(iops[m]), median(iops[m])/base)
	}
	runtime.KeepAlive(f) // fd is f's: a collected f would close it
}

// run writes for d in mode m and returns the writes and syncs made.
func run(fd int, m string, jobs int, d time.Duration, seed uint64) (ops, syncs int64) {
	var nops, nsyncs atomic.Int64
	var mu sync.Mutex
	g := &groupCommit{fd: fd, syncs: &nsyncs}
	if m == "serial" {
		jobs = 1
	}
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for j := range jobs {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(j)))
			buf := make([]byte, bs)
			for time.Now().Before(stop) {
				off := rng.Int64N(fileSize/bs) * bs
				switch m {
				case "mutex":
					mu.Lock()
					pwrite(fd, buf, off)
					check(unix.Fdatasync(fd))
					mu.Unlock()
					nsyncs.Add(1)
				case "group":
					pwrite(fd, buf, off)
					g.wait()
				default:
					pwrite(fd, buf, off)
					check(unix.Fdatasync(fd))
					nsyncs.Add(1)
				}
				nops.Add(1)
			}
		})
	}
	wg.Wait()
	return nops.Load(), nsyncs.Load()
}

// groupCommit is the store's group commit reduced to its schedule: callers
// that arrive while a sync runs share the next, which starts the moment the
// running one ends.
type groupCommit struct {
	fd    int
	syncs *atomic.Int64
	// mu guards running and pending.
	mu      sync.Mutex
	running bool
	pending chan struct{} // closed when the batch gathering callers is synced
}

func (g *groupCommit) wait() {
	g.mu.Lock()
	if g.pending == nil {
		g.pending = make(chan struct{})
	}
	b := g.pending
	if g.running {
		g.mu.Unlock()
		<-b
		return
	}
	g.running = true
	for b != nil {
		g.pending = nil
		g.mu.Unlock()
		check(unix.Fdatasync(g.fd))
		g.syncs.Add(1)
		close(b)
		g.mu.Lock()
		b = g.pending
	}
	g.running = false
	g.mu.Unlock()
}

func pwrite(fd int, b []byte, off int64) {
	_, err := unix.Pwrite(fd, b, off)
	check(err)
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "syncceil:", err)
		os.Exit(1)
	}
}
