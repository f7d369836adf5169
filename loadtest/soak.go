package main

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// The soak runs many clients doing a mix of every mutating RPC, Read and
// Stat on a few files for minutes, and then checks that the files hold
// exactly what a model kept by the harness says they must.
//
// The model is exact despite the concurrency because no two clients ever
// touch the same byte: each file is cut into slots of soakSlot bytes, each
// owned by one client that writes, punches, zeroes, allocates and reads
// only inside it, and a tail past the slots, owned by one more client that
// alone changes the file's size (Truncate, extending Writes, Fallocate
// ALLOCATE) and never below the slots. Slots and the tail are block
// aligned, so no two owners share a filesystem block either. Every owner
// checks its reads against its part of the model as it goes; once all
// clients stop, every file is read back whole and compared.
const (
	soakSlot     = 128 << 10
	soakTailMax  = 1 << 20
	soakMaxWrite = 64 << 10
	soakFiles    = 4
	// soakMaxFileSize is the daemon's --max-file-size during the soak, so
	// that a client can ask for a write past it and expect OUT_OF_RANGE
	// (FILE_TOO_LARGE) and no change.
	soakMaxFileSize = 1 << 30
)

// soakResult is the soak's part of summary.json.
type soakResult struct {
	Duration  string      `json:"duration"`
	Clients   int         `json:"clients"`
	Files     int         `json:"files"`
	Ops       []opSummary `json:"ops"`
	Total     uint64      `json:"total_ops"`
	OpsPerSec float64     `json:"ops_per_sec"`
	// ExpectedErrors are requests made to fail (a missing file, a bad
	// path, a write past --max-file-size) that failed with the right code.
	ExpectedErrors int `json:"expected_errors"`
	// Unexpected counts every other error, every wrong code, and every
	// read, size or final content that disagreed with the model.
	Unexpected        int      `json:"unexpected"`
	UnexpectedSamples []string `json:"unexpected_samples,omitempty"`
	// Memory is the daemon's VmHWM/VmRSS after the files were prepared
	// (start) and when the load stopped (end); absent with -target.
	MemoryStart *memory     `json:"memory_start,omitempty"`
	MemoryEnd   *memory     `json:"memory_end,omitempty"`
	RSSSamples  []rssSample `json:"rss_samples,omitempty"`
	// VerifiedBytes were read back at the end and matched the model.
	VerifiedFiles int    `json:"verified_files"`
	VerifiedBytes int64  `json:"verified_bytes"`
	DaemonExit    string `json:"daemon_exit,omitempty"`
	Passed        bool   `json:"passed"`
	Chart         string `json:"chart_svg"`
	ReportJSON    string `json:"ghz_json"`
	ReportHTML    string `json:"ghz_html"`
}

type opSummary struct {
	Op         string         `json:"op"`
	Count      int            `json:"count"`
	Expected   int            `json:"expected_errors"`
	Unexpected int            `json:"unexpected"`
	Clat       []percentileUS `json:"clat_usec"`
}

type rssSample struct {
	Sec float64 `json:"sec"`
	memory
}

// runSoak is -scenario soak.
func (e *env) runSoak(ctx context.Context) (_ *soakResult, err error) {
	clients := e.clients(64)
	nfiles := min(soakFiles, max(1, clients/2))
	dur := e.duration(true)
	res := &soakResult{Duration: dur.String(), Clients: clients, Files: nfiles}
	fmt.Fprintf(e.log, "\n== soak: %d clients, mixed Write/Read/Truncate/Fallocate/Fsync/Stat on %d files, %s\n", clients, nfiles, dur)

	dir := filepath.Join(e.work, "soak")
	addr, token := e.opts.target, e.opts.token
	var d *daemon
	if addr == "" {
		d, err = startDaemon(ctx, "soak", e.bin, filepath.Join(dir, "data"), filepath.Join(dir, "daemon.log"),
			[]string{"--max-file-size", fmt.Sprint(soakMaxFileSize)})
		if err != nil {
			return nil, err
		}
		defer func() {
			if d != nil {
				d.stop()
			}
			if !e.opts.keepData {
				os.RemoveAll(dir)
			}
		}()
		addr = d.addr
		fmt.Fprintf(e.log, "   daemon --max-file-size %d at %s (pid %d)\n", soakMaxFileSize, addr, d.proc.Pid())
	}
	conns, closeAll, err := dialClients(addr, token, clients, e.opts.connections)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	files, cls := layoutSoak(nfiles, conns, d != nil)
	for _, f := range files {
		// Start from a file of holes up to the tail: what the model says.
		for _, size := range []int64{0, f.base()} {
			if _, err := conns[0].Truncate(ctx, &filewritev1.TruncateRequest{Path: f.path, Size: size}); err != nil {
				return nil, fmt.Errorf("prepare %s: %w", f.path, err)
			}
		}
	}

	var rss *rssSampler
	if d != nil {
		if rss, err = startRSSSampler(d.proc.Pid()); err != nil {
			return nil, err
		}
		res.MemoryStart = &rss.first
	}
	elapsed := e.runSoakClients(ctx, cls, dur)
	if rss != nil {
		last, samples, err := rss.stop()
		if err != nil {
			return nil, err
		}
		res.MemoryEnd, res.RSSSamples = &last, samples
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	// The final check, with every client stopped: sizes and whole contents.
	var finalErrs []string
	for _, f := range files {
		if err := verifySoakFile(ctx, conns[0], f); err != nil {
			finalErrs = append(finalErrs, err.Error())
			continue
		}
		res.VerifiedFiles++
		res.VerifiedBytes += f.size()
	}
	allLat, unexp := res.merge(cls, finalErrs, elapsed)

	// The daemon must drain, sync every file and exit 0.
	if d != nil {
		if err := d.stop(); err != nil {
			res.DaemonExit = err.Error()
			res.Unexpected++
		} else {
			res.DaemonExit = "exit 0"
		}
		d = nil
	}
	res.Passed = res.Unexpected == 0 && res.VerifiedFiles == nfiles

	r := loopResult("soak", "mixed", clients, elapsed, allLat, unexp)
	r.Round = 1
	if err := e.saveReport("soak", r); err != nil {
		return nil, err
	}
	res.ReportJSON, res.ReportHTML = reportPaths("soak", r)
	res.Chart = "soak.svg"
	if err := os.WriteFile(filepath.Join(e.opts.out, res.Chart), soakChart(res), 0o644); err != nil {
		return nil, err
	}
	printSoak(e, res)
	return res, nil
}

// layoutSoak lays out the files and their owners: client i works on file
// i%nfiles; the first client of each file owns its tail, the others one
// slot each.
func layoutSoak(nfiles int, conns []filewritev1.FileServiceClient, ownDaemon bool) ([]*soakFile, []*soakClient) {
	files := make([]*soakFile, nfiles)
	for i := range files {
		files[i] = &soakFile{path: fmt.Sprintf("soak/f%d.dat", i)}
	}
	cls := make([]*soakClient, len(conns))
	for i := range cls {
		f := files[i%nfiles]
		c := &soakClient{id: i, file: f, slot: -1, rng: rand.New(rand.NewPCG(uint64(i), 0x50a4)), c: conns[i],
			buf: make([]byte, soakMaxWrite), lat: map[string][]time.Duration{}, expErr: map[string]int{},
			unexp: map[string]int{}, ownDaemon: ownDaemon}
		if i >= nfiles {
			c.slot = len(f.slots)
			f.slots = append(f.slots, make([]byte, soakSlot))
		}
		cls[i] = c
	}
	return files, cls
}

// runSoakClients runs every client until dur has passed and returns how
// long they ran.
func (e *env) runSoakClients(ctx context.Context, cls []*soakClient, dur time.Duration) time.Duration {
	var done atomic.Int64
	end := e.progress.start(fmt.Sprintf("[soak] %d clients", len(cls)), dur, &done)
	defer end()
	start := time.Now()
	deadline := start.Add(dur)
	var wg sync.WaitGroup
	for _, c := range cls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && time.Now().Before(deadline) {
				if c.slot < 0 {
					c.tailStep(ctx)
				} else {
					c.slotStep(ctx)
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}

// merge fills the per-operation figures from the clients' own and the
// final check's failures, and returns every latency and the unexpected
// errors by operation, for ghz's report.
func (res *soakResult) merge(cls []*soakClient, finalErrs []string, elapsed time.Duration) ([]time.Duration, map[string]int) {
	const final = "final-check"
	lat := map[string][]time.Duration{}
	expErr, unexp := map[string]int{}, map[string]int{}
	for _, c := range cls {
		for op, l := range c.lat {
			lat[op] = append(lat[op], l...)
		}
		for op, n := range c.expErr {
			expErr[op] += n
		}
		for op, n := range c.unexp {
			unexp[op] += n
		}
		res.UnexpectedSamples = append(res.UnexpectedSamples, c.notes...)
	}
	if len(finalErrs) > 0 {
		unexp[final] = len(finalErrs)
		res.UnexpectedSamples = append(res.UnexpectedSamples, finalErrs...)
	}
	ops := slices.Sorted(maps.Keys(lat))
	for op := range unexp {
		if _, ok := lat[op]; !ok {
			ops = append(ops, op)
		}
	}
	var all []time.Duration
	for _, op := range ops {
		l := lat[op]
		slices.Sort(l)
		s := opSummary{Op: op, Count: len(l) + unexp[op], Expected: expErr[op], Unexpected: unexp[op]}
		for _, p := range fioPercentiles {
			s.Clat = append(s.Clat, percentileUS{p, float64(percentileOf(l, p)) / float64(time.Microsecond)})
		}
		res.Ops = append(res.Ops, s)
		res.ExpectedErrors += s.Expected
		res.Unexpected += s.Unexpected
		if op != final {
			res.Total += uint64(s.Count)
		}
		all = append(all, l...)
	}
	res.OpsPerSec = float64(res.Total) / elapsed.Seconds()
	res.UnexpectedSamples = res.UnexpectedSamples[:min(len(res.UnexpectedSamples), 20)]
	errs := map[string]int{}
	for op, n := range unexp {
		errs[op+": unexpected"] = n
	}
	return all, errs
}

// rssSampler reads a process's memory once a second until stopped.
type rssSampler struct {
	pid     int
	first   memory
	start   time.Time
	quit    chan struct{}
	done    chan struct{}
	samples []rssSample // written by the sampling goroutine until done
}

func startRSSSampler(pid int) (*rssSampler, error) {
	m, err := procMemory(pid)
	if err != nil {
		return nil, err
	}
	s := &rssSampler{pid: pid, first: m, start: time.Now(), quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-s.quit:
				return
			case <-tick.C:
				if m, err := procMemory(pid); err == nil {
					s.samples = append(s.samples, rssSample{time.Since(s.start).Seconds(), m})
				}
			}
		}
	}()
	return s, nil
}

// stop ends the sampling and reads the memory one last time.
func (s *rssSampler) stop() (memory, []rssSample, error) {
	close(s.quit)
	<-s.done
	m, err := procMemory(s.pid)
	return m, s.samples, err
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func printSoak(e *env, r *soakResult) {
	w := e.log
	fmt.Fprintf(w, "   %-12s %9s %9s %9s %10s %10s %10s %10s\n", "op", "count", "expected", "unexpect", "p50 usec", "p99", "p99.9", "p99.99")
	for _, op := range r.Ops {
		us := map[float64]float64{}
		for _, p := range op.Clat {
			us[p.Percentile] = p.Usec
		}
		fmt.Fprintf(w, "   %-12s %9d %9d %9d %10.0f %10.0f %10.0f %10.0f\n", op.Op, op.Count, op.Expected, op.Unexpected,
			us[50], us[99], us[99.9], us[99.99])
	}
	fmt.Fprintf(w, "   %d ops in %s: %.0f ops/s; %d expected errors, %d unexpected\n", r.Total, r.Duration, r.OpsPerSec, r.ExpectedErrors, r.Unexpected)
	if r.MemoryStart != nil && r.MemoryEnd != nil {
		fmt.Fprintf(w, "   daemon memory: start VmHWM %s VmRSS %s; end VmHWM %s VmRSS %s\n",
			mib(r.MemoryStart.PeakRSS), mib(r.MemoryStart.RSS), mib(r.MemoryEnd.PeakRSS), mib(r.MemoryEnd.RSS))
	}
	if n := len(r.RSSSamples); n >= 4 {
		var parts []string
		for _, q := range []int{n / 4, n / 2, 3 * n / 4, n - 1} {
			s := r.RSSSamples[q]
			parts = append(parts, fmt.Sprintf("%.0fs %s", s.Sec, mib(s.RSS)))
		}
		fmt.Fprintf(w, "   daemon VmRSS during the run: %s\n", strings.Join(parts, ", "))
	}
	fmt.Fprintf(w, "   content: %d of %d files (%s) read back whole and equal to the model; daemon: %s\n",
		r.VerifiedFiles, r.Files, mib(r.VerifiedBytes), r.DaemonExit)
	for _, s := range r.UnexpectedSamples {
		fmt.Fprintln(w, "   UNEXPECTED", s)
	}
	verdict := "PASS"
	if !r.Passed {
		verdict = "FAIL"
	}
	fmt.Fprintln(w, "   soak:", verdict)
}
