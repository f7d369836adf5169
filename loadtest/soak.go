package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
	// that a client can ask for a write past it and expect
	// RESOURCE_EXHAUSTED and no change.
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

// soakFile is one file and its model. Each slot is read and written only
// by its owner's goroutine and the tail only by the tail owner's, so the
// model needs no lock while clients run; the final check runs after they
// have all stopped.
type soakFile struct {
	path  string
	slots [][]byte // slots[k] models bytes [k*soakSlot, (k+1)*soakSlot)
	tail  []byte   // models bytes [base, size): len(tail) is size-base
}

func (f *soakFile) base() int64 { return int64(len(f.slots)) * soakSlot }
func (f *soakFile) size() int64 { return f.base() + int64(len(f.tail)) }

// soakClient is one client's state; its counters are its own, merged at
// the end.
type soakClient struct {
	id     int
	file   *soakFile
	slot   int // -1: the tail owner
	rng    *rand.Rand
	c      filewritev1.FileServiceClient
	buf    []byte
	lat    map[string][]time.Duration
	expErr map[string]int
	unexp  map[string]int
	notes  []string
	// ownDaemon is whether the harness started the server, and so knows
	// its --max-file-size.
	ownDaemon bool
}

func (c *soakClient) unexpected(op, format string, args ...any) {
	c.unexp[op]++
	if len(c.notes) < 5 {
		c.notes = append(c.notes, fmt.Sprintf("client %d %s %s: ", c.id, op, c.file.path)+fmt.Sprintf(format, args...))
	}
}

// record files a finished call: its latency if it succeeded, an unexpected
// error otherwise.
func (c *soakClient) record(op string, t0 time.Time, err error) bool {
	if err != nil {
		c.unexpected(op, "%v", err)
		return false
	}
	c.lat[op] = append(c.lat[op], time.Since(t0))
	return true
}

// randRange picks [off, off+n) inside [0, limit): half of the time whole
// blocks, half of the time any bytes, so that both the aligned paths and
// the partial-block ones are exercised.
func (c *soakClient) randRange(limit int64) (off, n int64) {
	const block = 4096
	if c.rng.IntN(2) == 0 && limit >= block {
		off = c.rng.Int64N(limit/block) * block
		n = (1 + c.rng.Int64N(min(soakMaxWrite/block, (limit-off)/block))) * block
		return off, n
	}
	off = c.rng.Int64N(limit)
	n = 1 + c.rng.Int64N(min(soakMaxWrite, limit-off))
	return off, n
}

func (c *soakClient) randomData(n int64) []byte {
	b := c.buf[:n]
	for i := 0; i < len(b); i += 8 {
		v := c.rng.Uint64()
		for j := 0; j < 8 && i+j < len(b); j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

func zero(b []byte) {
	for i := range b {
		b[i] = 0
	}
}

var syncModes = []filewritev1.SyncMode{filewritev1.SyncMode_SYNC_MODE_DATA, filewritev1.SyncMode_SYNC_MODE_FULL}

// step performs one random operation of a slot owner.
func (c *soakClient) slotStep(ctx context.Context) {
	f, model := c.file, c.file.slots[c.slot]
	base := int64(c.slot) * soakSlot
	switch p := c.rng.IntN(100); {
	case p < 45: // Write, now and then synced
		off, n := c.randRange(soakSlot)
		data := c.randomData(n)
		sync := filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED
		op := "write"
		if p < 5 {
			sync, op = syncModes[p%2], "write-sync"
		}
		t0 := time.Now()
		resp, err := c.c.Write(ctx, &filewritev1.WriteRequest{Path: f.path, Offset: base + off, Data: data, Sync: sync})
		if c.record(op, t0, err) {
			copy(model[off:], data)
			if resp.GetBytesWritten() != n || resp.GetSize() < f.base() {
				c.unexpected(op, "wrote %d of %d bytes, size %d below the slots' end %d", resp.GetBytesWritten(), n, resp.GetSize(), f.base())
			}
		}
	case p < 70: // Read, checked against the model
		off, n := c.randRange(soakSlot)
		t0 := time.Now()
		resp, err := c.c.Read(ctx, &filewritev1.ReadRequest{Path: f.path, Offset: base + off, Length: n})
		if c.record("read", t0, err) && !bytes.Equal(resp.GetData(), model[off:off+n]) {
			c.unexpected("read", "[%d, +%d) differs from the model (%d bytes back)", base+off, n, len(resp.GetData()))
		}
	case p < 82: // Fallocate inside the slot: never changes the size
		off, n := c.randRange(soakSlot)
		modes := []filewritev1.FallocateMode{
			filewritev1.FallocateMode_FALLOCATE_MODE_ALLOCATE, filewritev1.FallocateMode_FALLOCATE_MODE_KEEP_SIZE,
			filewritev1.FallocateMode_FALLOCATE_MODE_PUNCH_HOLE, filewritev1.FallocateMode_FALLOCATE_MODE_ZERO_RANGE,
		}
		mode := modes[c.rng.IntN(len(modes))]
		t0 := time.Now()
		resp, err := c.c.Fallocate(ctx, &filewritev1.FallocateRequest{Path: f.path, Mode: mode, Offset: base + off, Length: n})
		if c.record("fallocate", t0, err) {
			if mode == filewritev1.FallocateMode_FALLOCATE_MODE_PUNCH_HOLE || mode == filewritev1.FallocateMode_FALLOCATE_MODE_ZERO_RANGE {
				zero(model[off : off+n])
			}
			if resp.GetSize() < f.base() {
				c.unexpected("fallocate", "size %d below the slots' end %d", resp.GetSize(), f.base())
			}
		}
	case p < 94:
		t0 := time.Now()
		_, err := c.c.Fsync(ctx, &filewritev1.FsyncRequest{Path: f.path, DataOnly: c.rng.IntN(2) == 0})
		c.record("fsync", t0, err)
	default:
		c.badRequest(ctx)
	}
}

// badRequest sends a request that must fail with a known code and change
// nothing; whether it changed nothing is what the model checks.
func (c *soakClient) badRequest(ctx context.Context) {
	var err error
	var want codes.Code
	t0 := time.Now()
	switch k := c.rng.IntN(4); {
	case k == 0:
		_, err = c.c.Read(ctx, &filewritev1.ReadRequest{Path: fmt.Sprintf("soak/missing-%d", c.id), Length: 10})
		want = codes.NotFound
	case k == 1:
		_, err = c.c.Write(ctx, &filewritev1.WriteRequest{Path: "soak/../../escape", Data: []byte("x")})
		want = codes.InvalidArgument
	case k == 2:
		_, err = c.c.Fallocate(ctx, &filewritev1.FallocateRequest{Path: c.file.path, Offset: 0, Length: 4096})
		want = codes.InvalidArgument // no mode
	case c.ownDaemon:
		_, err = c.c.Write(ctx, &filewritev1.WriteRequest{Path: c.file.path, Offset: soakMaxFileSize - 100, Data: c.randomData(4096)})
		want = codes.ResourceExhausted
	default:
		_, err = c.c.Truncate(ctx, &filewritev1.TruncateRequest{Path: c.file.path, Size: -1})
		want = codes.InvalidArgument
	}
	if got := status.Code(err); got != want {
		c.unexpected("bad-request", "got %v (%v), want %v", got, err, want)
		return
	}
	c.lat["bad-request"] = append(c.lat["bad-request"], time.Since(t0))
	c.expErr["bad-request"]++
}

// tailStep performs one random operation of the tail owner, the only client
// that changes its file's size.
func (c *soakClient) tailStep(ctx context.Context) {
	f := c.file
	base := f.base()
	checkSize := func(op string, got int64) {
		if got != f.size() {
			c.unexpected(op, "size %d, model %d", got, f.size())
		}
	}
	grow := func(end int64) {
		if end > int64(len(f.tail)) {
			f.tail = append(f.tail, make([]byte, end-int64(len(f.tail)))...)
		}
	}
	switch p := c.rng.IntN(100); {
	case p < 35: // Write anywhere in the tail: extending or not
		off, n := c.randRange(soakTailMax)
		data := c.randomData(n)
		t0 := time.Now()
		resp, err := c.c.Write(ctx, &filewritev1.WriteRequest{Path: f.path, Offset: base + off, Data: data})
		if c.record("write", t0, err) {
			grow(off + n)
			copy(f.tail[off:], data)
			checkSize("write", resp.GetSize())
		}
	case p < 50:
		size := c.rng.Int64N(soakTailMax + 1)
		t0 := time.Now()
		_, err := c.c.Truncate(ctx, &filewritev1.TruncateRequest{Path: f.path, Size: base + size})
		if c.record("truncate", t0, err) {
			if size < int64(len(f.tail)) {
				f.tail = f.tail[:size]
			}
			grow(size)
		}
	case p < 65: // Fallocate in the tail, past EOF too
		off, n := c.randRange(soakTailMax)
		modes := []filewritev1.FallocateMode{
			filewritev1.FallocateMode_FALLOCATE_MODE_ALLOCATE, filewritev1.FallocateMode_FALLOCATE_MODE_KEEP_SIZE,
			filewritev1.FallocateMode_FALLOCATE_MODE_PUNCH_HOLE, filewritev1.FallocateMode_FALLOCATE_MODE_ZERO_RANGE,
		}
		mode := modes[c.rng.IntN(len(modes))]
		t0 := time.Now()
		resp, err := c.c.Fallocate(ctx, &filewritev1.FallocateRequest{Path: f.path, Mode: mode, Offset: base + off, Length: n})
		if c.record("fallocate", t0, err) {
			switch mode {
			case filewritev1.FallocateMode_FALLOCATE_MODE_ALLOCATE:
				grow(off + n)
			case filewritev1.FallocateMode_FALLOCATE_MODE_PUNCH_HOLE, filewritev1.FallocateMode_FALLOCATE_MODE_ZERO_RANGE:
				if off < int64(len(f.tail)) {
					zero(f.tail[off:min(off+n, int64(len(f.tail)))])
				}
			}
			checkSize("fallocate", resp.GetSize())
		}
	case p < 85: // Read, past EOF too: short reads must be exact
		off, n := c.randRange(soakTailMax)
		t0 := time.Now()
		resp, err := c.c.Read(ctx, &filewritev1.ReadRequest{Path: f.path, Offset: base + off, Length: n})
		if c.record("read", t0, err) {
			var want []byte
			if off < int64(len(f.tail)) {
				want = f.tail[off:min(off+n, int64(len(f.tail)))]
			}
			if !bytes.Equal(resp.GetData(), want) {
				c.unexpected("read", "[%d, +%d) differs from the model (%d bytes back, %d expected)", base+off, n, len(resp.GetData()), len(want))
			}
		}
	case p < 95:
		t0 := time.Now()
		resp, err := c.c.Stat(ctx, &filewritev1.StatRequest{Path: f.path})
		if c.record("stat", t0, err) {
			checkSize("stat", resp.GetSize())
		}
	default:
		t0 := time.Now()
		_, err := c.c.Fsync(ctx, &filewritev1.FsyncRequest{Path: f.path, DataOnly: c.rng.IntN(2) == 0})
		c.record("fsync", t0, err)
	}
}

// runSoak is -scenario soak.
func (e *env) runSoak(ctx context.Context) (_ *soakResult, err error) {
	clients := e.clients(64)
	nfiles := min(soakFiles, max(1, clients/2))
	dur := e.duration(true)
	res := &soakResult{Duration: dur.String(), Clients: clients, Files: nfiles}
	fmt.Fprintf(e.log, "\n== soak: %d clients, mixed Write/Read/Truncate/Fallocate/Fsync/Stat on %d files, %s\n", clients, nfiles, dur)

	dir := filepath.Join(e.work, "soak")
	addr := e.opts.target
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
		fmt.Fprintf(e.log, "   daemon --max-file-size %d at %s (pid %d)\n", soakMaxFileSize, addr, d.cmd.Process.Pid)
	}
	conns, closeAll, err := dialClients(addr, clients, e.opts.connections)
	if err != nil {
		return nil, err
	}
	defer closeAll()

	// Lay out the files: client i works on file i%nfiles; the first client
	// of each file owns its tail, the others one slot each.
	files := make([]*soakFile, nfiles)
	for i := range files {
		files[i] = &soakFile{path: fmt.Sprintf("soak/f%d.dat", i)}
	}
	cls := make([]*soakClient, clients)
	for i := range cls {
		f := files[i%nfiles]
		c := &soakClient{id: i, file: f, slot: -1, rng: rand.New(rand.NewPCG(uint64(i), 0x50a4)), c: conns[i],
			buf: make([]byte, soakMaxWrite), lat: map[string][]time.Duration{}, expErr: map[string]int{},
			unexp: map[string]int{}, ownDaemon: d != nil}
		if i >= nfiles {
			c.slot = len(f.slots)
			f.slots = append(f.slots, make([]byte, soakSlot))
		}
		cls[i] = c
	}
	for _, f := range files {
		// Start from a file of holes up to the tail: what the model says.
		for _, size := range []int64{0, f.base()} {
			if _, err := conns[0].Truncate(ctx, &filewritev1.TruncateRequest{Path: f.path, Size: size}); err != nil {
				return nil, fmt.Errorf("prepare %s: %w", f.path, err)
			}
		}
	}

	if d != nil {
		m, err := procMemory(d.cmd.Process.Pid)
		if err != nil {
			return nil, err
		}
		res.MemoryStart = &m
	}
	var done atomic.Int64
	stopSampling := make(chan struct{})
	var sampler sync.WaitGroup
	start := time.Now()
	if d != nil {
		sampler.Add(1)
		go func() {
			defer sampler.Done()
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				select {
				case <-stopSampling:
					return
				case <-tick.C:
					if m, err := procMemory(d.cmd.Process.Pid); err == nil {
						res.RSSSamples = append(res.RSSSamples, rssSample{time.Since(start).Seconds(), m})
					}
				}
			}
		}()
	}
	end := e.progress.start(fmt.Sprintf("[soak] %d clients", clients), dur, &done)
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
	elapsed := time.Since(start)
	end()
	close(stopSampling)
	sampler.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if d != nil {
		m, err := procMemory(d.cmd.Process.Pid)
		if err != nil {
			return nil, err
		}
		res.MemoryEnd = &m
	}

	// Merge the clients' figures.
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

	// The final check, with every client stopped: sizes and whole contents.
	final := "final-check"
	for _, f := range files {
		if err := verifySoakFile(ctx, conns[0], f); err != nil {
			unexp[final]++
			res.UnexpectedSamples = append(res.UnexpectedSamples, err.Error())
			continue
		}
		res.VerifiedFiles++
		res.VerifiedBytes += f.size()
	}

	var allLat []time.Duration
	ops := make([]string, 0, len(lat))
	for op := range lat {
		ops = append(ops, op)
	}
	for op := range unexp {
		if _, ok := lat[op]; !ok {
			ops = append(ops, op)
		}
	}
	sort.Strings(ops)
	for _, op := range ops {
		l := lat[op]
		slices.Sort(l)
		s := opSummary{Op: op, Count: len(l) + unexp[op], Expected: expErr[op], Unexpected: unexp[op]}
		if op == final {
			s.Count = unexp[op]
		}
		for _, p := range fioPercentiles {
			s.Clat = append(s.Clat, percentileUS{p, float64(percentileOf(l, p)) / float64(time.Microsecond)})
		}
		res.Ops = append(res.Ops, s)
		res.ExpectedErrors += s.Expected
		res.Unexpected += s.Unexpected
		if op != final {
			res.Total += uint64(s.Count)
		}
		allLat = append(allLat, l...)
	}
	res.OpsPerSec = float64(res.Total) / elapsed.Seconds()
	if len(res.UnexpectedSamples) > 20 {
		res.UnexpectedSamples = res.UnexpectedSamples[:20]
	}

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

	errs := map[string]int{}
	for op, n := range unexp {
		errs[op+": unexpected"] = n
	}
	r := loopResult("soak", "mixed", clients, elapsed, allLat, errs)
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

// verifySoakFile compares the whole file with its model.
func verifySoakFile(ctx context.Context, c filewritev1.FileServiceClient, f *soakFile) error {
	st, err := c.Stat(ctx, &filewritev1.StatRequest{Path: f.path})
	if err != nil {
		return fmt.Errorf("final Stat %s: %w", f.path, err)
	}
	if st.GetSize() != f.size() {
		return fmt.Errorf("final size of %s is %d, the model's %d", f.path, st.GetSize(), f.size())
	}
	want := slices.Concat(append(slices.Clone(f.slots), f.tail)...)
	const chunk = 1 << 20
	for off := int64(0); off < int64(len(want)); off += chunk {
		n := min(chunk, int64(len(want))-off)
		resp, err := c.Read(ctx, &filewritev1.ReadRequest{Path: f.path, Offset: off, Length: n})
		if err != nil {
			return fmt.Errorf("final Read %s: %w", f.path, err)
		}
		if got := resp.GetData(); !bytes.Equal(got, want[off:off+n]) {
			i := 0
			for i < len(got) && i < int(n) && got[i] == want[off+int64(i)] {
				i++
			}
			return fmt.Errorf("final content of %s differs from the model at byte %d", f.path, off+int64(i))
		}
	}
	return nil
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
