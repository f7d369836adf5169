package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/bojand/ghz/printer"
	"github.com/bojand/ghz/runner"
	"google.golang.org/grpc"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// A comparison is one scenario's before/after experiment: its columns
// (configurations) run the same workload in alternation, round after round,
// on files prepared the same way, and the table and chart set them side by
// side.
type comparison struct {
	name  string // "below-eof", "prealloc-overwrite-4k"
	title string // what is measured, one line
	// clients is the number of concurrent callers; bs the bytes each
	// operation moves (0 for none, as for a no-op call).
	clients int
	// connections is how many connections the callers share, where the
	// comparison decides it (0: -connections).
	connections int
	bs          int
	columns     []column
	// ratios are the figures the scenario is judged by, numerator first.
	ratios [][2]string
	// paired runs each ratio's denominator again just before its
	// numerator, in every round, and takes the ratio to that run: on a
	// shared machine the CPUs' speed drifts, over the minutes a round of
	// many columns takes, by more than the differences measured (the files
	// scenario saw the one-file row's daemon CPU per write vary by 1.5x
	// between rounds). The denominator's own column keeps its place in
	// the order; the runs made for pairing count only in the ratios.
	paired bool
	// preparation says how the columns' files are prepared, the same for
	// every column: a ratio means nothing otherwise.
	preparation string
	// byServer says the columns differ only in the daemon's flags. With
	// -target there is one server whose flags the harness cannot change,
	// so such a comparison runs one column, named "target".
	byServer bool
	// cleanup stops what the columns' setups started themselves (the
	// cluster scenario's daemons and proxy); nil: nothing.
	cleanup func() error
	// daemonStats reads, after each run, the daemon's memory, descriptors
	// and metrics (its HTTP address is opened for /metrics).
	daemonStats bool
	// print prints the comparison's table; nil prints printTable's.
	print func(w io.Writer, res *comparisonResult)
}

// column is one configuration of a comparison.
type column struct {
	name string
	// daemon is the flags of the daemon this column runs against; columns
	// with the same flags share one daemon, unless daemonKey says
	// otherwise. nil: the column runs in the harness alone (raw pwrite).
	daemon []string
	// daemonKey, if set, names the daemon instead of its flags: columns
	// with one key share a daemon, and columns with different keys do
	// not, whatever their flags.
	daemonKey string
	// env is added to the daemon's environment ("NAME=value"): columns
	// share a daemon only if their env is the same too.
	env []string
	// setup prepares the column's server or directory once; before and
	// after run around each timed run, untimed. Any may be nil.
	setup  func(ctx context.Context, s *session) error
	before func(ctx context.Context, s *session) error
	after  func(ctx context.Context, s *session) error
	run    func(ctx context.Context, s *session) (*runResult, error)
	// stream is run's workload through WriteStream (the client package),
	// nil where there is none; -transport decides which run (see
	// transports).
	stream func(ctx context.Context, s *session) (*runResult, error)
	// transport is "unary" or "stream" once transports has chosen; ""
	// for a column that does not reach the daemon (raw pwrite).
	transport string
}

// session is what a column's functions work with.
type session struct {
	addr  string // the gRPC address; "" for a column without a server
	token string // the bearer token every call sends (-token-file); "" for none
	pid   int    // the daemon's process, 0 if the harness did not start it
	// daemon is the daemon the harness started for the column, nil for
	// none; its /metrics, if it serves HTTP, counts its allocations.
	daemon  *daemon
	client  filewritev1.FileServiceClient
	dir     string // a directory of the column's own on the project filesystem
	clients int
	// connections is -connections: how many connections the clients
	// share, 0 for one each.
	connections int
	bs          int
	duration    time.Duration
	round       int
	done        *atomic.Int64 // completed operations, for the progress line
	column      string        // the column's name
}

// comparisonResult is a comparison's outcome, as summary.json holds it.
type comparisonResult struct {
	Name  string `json:"name"`
	Title string `json:"title"`
	// Preparation is how each column's file was prepared before its runs.
	Preparation string `json:"preparation,omitempty"`
	Clients     int    `json:"clients"`
	// Connections is how many gRPC connections the clients shared; 0: one
	// each.
	Connections int             `json:"connections"`
	BS          int             `json:"bs"`
	Duration    string          `json:"duration_per_run"`
	Rounds      int             `json:"rounds"`
	Columns     []columnSummary `json:"columns"`
	Ratios      []ratioSummary  `json:"ratios"`
	Chart       string          `json:"chart_svg"`
	// Failed is set when a run had errors: its figures are not to be
	// trusted.
	Failed bool `json:"failed"`

	runs map[string][]*runResult // by column, in round order
	// pairRuns are, by ratio, the runs of its denominator made just before
	// its numerator's (comparison.paired), in round order.
	pairRuns map[[2]string][]*runResult
}

type columnSummary struct {
	Name string `json:"name"`
	// Transport is "unary" (one RPC per operation), "stream" (through
	// WriteStream and the client package) or "nbd" (fio through the
	// daemon's NBD export); empty for a column that does not call the
	// daemon.
	Transport   string         `json:"transport,omitempty"`
	DaemonFlags []string       `json:"daemon_flags,omitempty"`
	Rounds      []roundSummary `json:"rounds"`
	IOPS        float64        `json:"median_iops"`
	Bandwidth   float64        `json:"median_bandwidth_bytes_per_sec"`
	Clat        []percentileUS `json:"median_clat_usec"`
	CPU         cpuPerOp       `json:"median_cpu"`
	Errors      int            `json:"errors"`
	// SyncsPerOp is the median over rounds of the syncs the daemon
	// issued per operation, for the scenarios that count them.
	SyncsPerOp float64 `json:"median_syncs_per_op,omitempty"`
	// SpansPerOp is the median over rounds of the spans that reached the
	// harness's OTLP sink per operation (the tracing scenario).
	SpansPerOp float64 `json:"median_spans_per_op,omitempty"`
	// RSSAboveIdle is the most the daemon's resident memory rose above
	// its idle level in any round, where measured.
	RSSAboveIdle int64 `json:"max_rss_above_idle_bytes,omitempty"`
	// Note is the last round's note on how it did its work, if any.
	Note        string         `json:"note,omitempty"`
	errorsByMsg map[string]int // summed over rounds
	clatByPct   map[float64]float64
}

type roundSummary struct {
	Round      int            `json:"round"`
	Count      uint64         `json:"count"`
	Errors     map[string]int `json:"errors,omitempty"`
	ElapsedSec float64        `json:"elapsed_sec"`
	IOPS       float64        `json:"iops"`
	Clat       []percentileUS `json:"clat_usec"`
	CPU        cpuPerOp       `json:"cpu"`
	ReportJSON string         `json:"ghz_json"`
	ReportHTML string         `json:"ghz_html"`
	// Syncs is the fdatasync/fsync calls the daemon issued during the
	// round (its filewrite_fsync_batch_size count), SyncsPerOp per
	// operation; absent where not counted.
	Syncs      float64 `json:"syncs,omitempty"`
	SyncsPerOp float64 `json:"syncs_per_op,omitempty"`
	// Spans is the spans that reached the OTLP sink during the round.
	Spans int64 `json:"spans,omitempty"`
	// Daemon is what the run cost the daemon beyond CPU (daemonStats).
	Daemon *daemonStats `json:"daemon,omitempty"`
}

// cpuPerOp is the CPU time one operation cost the daemon (ServerUS, 0
// when the harness did not start it) and the harness (ClientUS), how many
// CPUs' worth other processes used meanwhile (OtherCores), and how many
// were busy in all (BusyCores): when that is the machine's CPU count, the
// run was bound by CPU, whatever else it was meant to measure.
// ServerAllocs is the heap allocations one operation cost the daemon, for
// the scenarios whose daemon serves /metrics (0 otherwise);
// ServerSwitches its context switches (0 without a daemon).
type cpuPerOp struct {
	ServerAllocs   float64 `json:"server_allocs_per_op,omitempty"`
	ServerSwitches float64 `json:"server_switches_per_op,omitempty"`
	ServerUS       float64 `json:"server_usec_per_op"`
	ClientUS       float64 `json:"client_usec_per_op"`
	OtherCores     float64 `json:"other_load_cores"`
	BusyCores      float64 `json:"busy_cores"`
}

func perOp(r *runResult) cpuPerOp {
	if r.Count == 0 || r.Elapsed <= 0 {
		return cpuPerOp{}
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(r.Count) }
	// The CPU was sampled around the whole run, which for a run of
	// another tool (fio) is longer than the time it reports.
	wall := cmp.Or(r.Wall, r.Elapsed)
	return cpuPerOp{ServerAllocs: float64(r.Allocs) / float64(r.Count), ServerSwitches: float64(r.CPU.ServerSwitches) / float64(r.Count),
		ServerUS: us(r.CPU.Server), ClientUS: us(r.CPU.Client),
		OtherCores: r.CPU.Others().Seconds() / wall.Seconds(), BusyCores: r.CPU.Machine.Seconds() / wall.Seconds()}
}

type percentileUS struct {
	Percentile float64 `json:"pct"`
	Usec       float64 `json:"usec"`
}

type ratioSummary struct {
	Name string `json:"name"` // "after/before"
	// IOPSPerRound is each round's IOPS ratio; IOPS their median.
	IOPSPerRound []float64 `json:"iops_per_round"`
	// BaseIOPSPerRound, for a paired comparison, is the IOPS of each
	// round's run of the denominator made just before the numerator's,
	// which IOPSPerRound divides by.
	BaseIOPSPerRound []float64 `json:"base_iops_per_round,omitempty"`
	IOPS             float64   `json:"iops"`
	// Clat is the ratio of the median percentiles (below 1: the numerator
	// is faster).
	Clat []percentileUS `json:"clat"`
}

// runComparison runs c: it starts one daemon per distinct set of flags (or
// uses -target), sets every column up, then runs rounds, each running every
// column once, in alternating order so that drift (page cache, writeback,
// other load on the machine) does not always favour the same side; a
// paired comparison runs each ratio's denominator again just before its
// numerator.
func (e *env) runComparison(ctx context.Context, c *comparison) (_ *comparisonResult, err error) {
	r := &comparisonRun{e: e, c: c, cols: e.columnsOf(c), daemons: map[string]*daemon{}}
	r.res = &comparisonResult{
		Name: c.name, Title: c.title, Preparation: c.preparation, Clients: c.clients, Connections: cmp.Or(c.connections, e.opts.connections), BS: c.bs,
		Duration: e.duration(false).String(), Rounds: e.opts.rounds,
		runs: map[string][]*runResult{}, pairRuns: map[[2]string][]*runResult{},
	}
	fmt.Fprintf(e.log, "\n== %s: %s\n", c.name, c.title)
	if c.preparation != "" {
		fmt.Fprintf(e.log, "   files: %s\n", c.preparation)
	}
	defer func() {
		if cerr := r.close(); err == nil {
			err = cerr
		}
	}()
	if err := r.setUp(ctx); err != nil {
		return nil, err
	}
	pairs := pairsOf(c, r.cols)
	for round := 1; round <= e.opts.rounds; round++ {
		if err := r.runRound(ctx, round, pairs); err != nil {
			return nil, err
		}
	}
	if err := r.report(); err != nil {
		return nil, err
	}
	return r.res, nil
}

// comparisonRun is the state of one runComparison: the columns it runs,
// a session per column, the daemons and connections the sessions share,
// and the result the rounds fill in.
type comparisonRun struct {
	e        *env
	c        *comparison
	cols     []column
	sessions []*session // by column index
	daemons  map[string]*daemon
	conns    []*grpc.ClientConn
	res      *comparisonResult
}

// columnsOf returns the columns to run: c's own, or with -target and a
// comparison of server flags, one column named "target".
func (e *env) columnsOf(c *comparison) []column {
	if e.opts.target != "" && c.byServer {
		only := c.columns[0]
		only.name = "target"
		return []column{only}
	}
	return c.columns
}

// setUp gives every column its session: its directory, its daemon
// (started once per distinct set of flags, or -target), a connection,
// and the column's own setup.
func (r *comparisonRun) setUp(ctx context.Context) error {
	e, c := r.e, r.c
	r.sessions = make([]*session, len(r.cols))
	for i, col := range r.cols {
		s := &session{clients: c.clients, connections: e.opts.connections, bs: c.bs, duration: e.duration(false),
			dir: filepath.Join(e.work, c.name, col.name), done: new(atomic.Int64), column: col.name}
		if err := os.MkdirAll(s.dir, 0o755); err != nil {
			return err
		}
		switch {
		case col.daemon == nil:
		case e.opts.target != "":
			s.addr, s.token = e.opts.target, e.opts.token
		default:
			d, err := r.daemonFor(ctx, col)
			if err != nil {
				return err
			}
			s.addr, s.pid, s.daemon = d.addr, d.proc.Pid(), d
		}
		if s.addr != "" {
			cc, err := dial(s.addr, s.token)
			if err != nil {
				return err
			}
			r.conns = append(r.conns, cc)
			s.client = filewritev1.NewFileServiceClient(cc)
		}
		r.sessions[i] = s
		if col.setup != nil {
			if err := col.setup(ctx, s); err != nil {
				return fmt.Errorf("%s/%s: setup: %w", c.name, col.name, err)
			}
		}
	}
	return nil
}

// daemonFor returns the daemon col runs against, starting it if no
// earlier column has the same flags (or daemonKey).
func (r *comparisonRun) daemonFor(ctx context.Context, col column) (*daemon, error) {
	e, c := r.e, r.c
	key := strings.Join(append(slices.Clone(col.daemon), col.env...), " ")
	if col.daemonKey != "" {
		key = "key " + col.daemonKey
	}
	if d := r.daemons[key]; d != nil {
		return d, nil
	}
	args := col.daemon
	if c.daemonStats {
		args = append([]string{"--http-addr", "127.0.0.1:0"}, args...)
	}
	if e.opts.profile {
		addr, err := freeLoopbackAddr()
		if err != nil {
			return nil, err
		}
		args = append(slices.Clone(args), "--pprof-addr", addr)
	}
	name := col.name
	if col.daemonKey != "" {
		name = col.daemonKey
	}
	d, err := startDaemonEnv(ctx, c.name+"/"+col.name, e.bin, filepath.Join(e.work, c.name, name, "data"),
		filepath.Join(e.work, c.name, name, "daemon.log"), args, col.env)
	if err != nil {
		return nil, err
	}
	r.daemons[key] = d
	flags := strings.Join(append(slices.Clone(col.env), col.daemon...), " ")
	if flags == "" {
		flags = "(default flags)"
	}
	if d.procs > 0 {
		flags += fmt.Sprintf(" (procs %d)", d.procs)
	}
	fmt.Fprintf(e.log, "   daemon %-20s %s at %s\n", col.name, flags, d.addr)
	return d, nil
}

// close closes the connections, stops the daemons, runs the comparison's
// cleanup and removes its data unless -keep-data; it returns the first
// error.
func (r *comparisonRun) close() error {
	var errs []error
	for _, cc := range r.conns {
		cc.Close()
	}
	for _, d := range r.daemons {
		errs = append(errs, d.stop())
	}
	if r.c.cleanup != nil {
		errs = append(errs, r.c.cleanup())
	}
	if !r.e.opts.keepData {
		os.RemoveAll(filepath.Join(r.e.work, r.c.name))
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// pair is one ratio of a paired comparison and the index of its
// denominator's column.
type pair struct {
	ratio [2]string
	den   int
}

// pairsOf gives, where c is paired, each numerator column its ratios and
// the indexes of their denominators' columns: a numerator may have
// several. It is empty for a comparison that is not paired.
func pairsOf(c *comparison, cols []column) map[string][]pair {
	pairs := map[string][]pair{}
	if !c.paired {
		return pairs
	}
	index := map[string]int{}
	for i, col := range cols {
		index[col.name] = i
	}
	for _, rt := range c.ratios {
		if j, ok := index[rt[1]]; ok {
			pairs[rt[0]] = append(pairs[rt[0]], pair{rt, j})
		}
	}
	return pairs
}

// runRound runs every column once, in column order in odd rounds and
// reversed in even ones, each preceded by its pairs' denominators, and
// checks after each run that every daemon is still up.
func (r *comparisonRun) runRound(ctx context.Context, round int, pairs map[string][]pair) error {
	e, c := r.e, r.c
	order := make([]int, len(r.cols))
	for i := range order {
		order[i] = i
	}
	if round%2 == 0 {
		slices.Reverse(order)
	}
	for _, i := range order {
		col, s := r.cols[i], r.sessions[i]
		for _, p := range pairs[col.name] {
			j := p.den
			r.sessions[j].round = round
			// Named apart, so that its reports and profiles do not
			// overwrite those of the denominator's own run.
			den := r.cols[j]
			den.name += "-before-" + col.name
			run, err := e.runColumn(ctx, c, den, r.sessions[j])
			if err != nil {
				return fmt.Errorf("%s/%s round %d, before %s: %w", c.name, r.cols[j].name, round, col.name, err)
			}
			r.res.pairRuns[p.ratio] = append(r.res.pairRuns[p.ratio], run)
		}
		s.round = round
		run, err := e.runColumn(ctx, c, col, s)
		if err != nil {
			return fmt.Errorf("%s/%s round %d: %w", c.name, col.name, round, err)
		}
		for _, d := range r.daemons {
			if err := d.alive(); err != nil {
				return err
			}
		}
		r.res.runs[col.name] = append(r.res.runs[col.name], run)
	}
	return nil
}

// report summarizes the rounds into the result, writes its chart and
// prints its table.
func (r *comparisonRun) report() error {
	e, c, res := r.e, r.c, r.res
	e.summarize(res, c, r.cols)
	var err error
	if res.Chart, err = e.writeChart(res); err != nil {
		return err
	}
	if c.print != nil {
		c.print(e.log, res)
		return nil
	}
	var colNames []string
	for _, col := range r.cols {
		colNames = append(colNames, col.name)
	}
	printTable(e.log, res, colNames)
	return nil
}

// runColumn is one timed run: before, run (with the progress line), after,
// and the run's ghz reports written to -out.
func (e *env) runColumn(ctx context.Context, c *comparison, col column, s *session) (*runResult, error) {
	if col.before != nil {
		if err := col.before(ctx, s); err != nil {
			return nil, fmt.Errorf("before: %w", err)
		}
	}
	s.done.Store(0)
	label := fmt.Sprintf("[%s] %s round %d/%d", c.name, col.name, s.round, e.opts.rounds)
	end := e.progress.start(label, s.duration, s.done)
	var before daemonCounters
	if c.daemonStats && s.daemon != nil && s.daemon.httpAddr != "" {
		var err error
		if before, err = scrapeCounters(ctx, s.daemon.httpAddr); err != nil {
			end()
			return nil, err
		}
	}
	allocs0, aerr := s.daemon.mallocs(ctx)
	profiled := e.profile(ctx, c, col, s)
	cpu0, start := sampleCPU(s.pid), time.Now()
	r, err := col.run(ctx, s)
	cpu, wall := sampleCPU(s.pid).since(cpu0), time.Since(start)
	allocs1, aerr1 := s.daemon.mallocs(ctx)
	end()
	perr := profiled()
	if err == nil {
		err = cmp.Or(aerr, aerr1, perr)
	}
	if err == nil {
		// An interrupted run stops early and counts its cancelled calls as
		// errors: it measured nothing.
		err = ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	cpu.Server += r.toolServer
	cpu.Client += r.toolClient
	r.Column, r.Round, r.CPU, r.Allocs, r.Wall = col.name, s.round, cpu, allocs1-allocs0, wall
	if c.daemonStats && s.daemon != nil && s.daemon.httpAddr != "" {
		// Before after: what the run left, not what a flush made of it.
		if r.Daemon, err = statsSince(ctx, s.pid, s.daemon.httpAddr, before); err != nil {
			return nil, err
		}
	}
	if col.after != nil {
		if err := col.after(ctx, s); err != nil {
			return nil, fmt.Errorf("after: %w", err)
		}
	}
	if err := e.saveReport(c.name, r); err != nil {
		return nil, err
	}
	return r, nil
}

// reportPaths are where a run's ghz reports go, relative to -out.
func reportPaths(cmp string, r *runResult) (jsonPath, htmlPath string) {
	base := filepath.Join(cmp, fmt.Sprintf("r%d-%s", r.Round, r.Column))
	return base + ".json", base + ".html"
}

// saveReport writes the run's report as ghz's printer formats it, JSON and
// HTML. ghz keeps one record per call (Details); they are left out of the
// files, which would otherwise run to tens of megabytes a run, and the
// percentiles computed from them are in summary.json.
func (e *env) saveReport(cmp string, r *runResult) error {
	jp, hp := reportPaths(cmp, r)
	if err := os.MkdirAll(filepath.Join(e.opts.out, cmp), 0o755); err != nil {
		return err
	}
	rep := *r.report
	rep.Details = []runner.ResultDetail{} // "[]" in JSON: ghz's page script expects an array
	for path, format := range map[string]string{jp: "json", hp: "html"} {
		f, err := os.Create(filepath.Join(e.opts.out, path))
		if err != nil {
			return err
		}
		perr := (&printer.ReportPrinter{Out: f, Report: &rep}).Print(format)
		if err := f.Close(); perr == nil {
			perr = err
		}
		if perr != nil {
			return fmt.Errorf("write %s: %w", path, perr)
		}
	}
	return nil
}

// summarize fills res's columns and ratios from its runs.
func (e *env) summarize(res *comparisonResult, c *comparison, cols []column) {
	for _, col := range cols {
		cs := columnSummary{Name: col.name, Transport: col.transport, DaemonFlags: col.daemon, errorsByMsg: map[string]int{}, clatByPct: map[float64]float64{}}
		if e.opts.target != "" && col.daemon != nil {
			cs.DaemonFlags = nil
		}
		var iops, allocs, switches, server, client, others, busy []float64
		var syncs, spans []float64
		pcts := map[float64][]float64{}
		for _, r := range res.runs[col.name] {
			jp, hp := reportPaths(c.name, r)
			rs := roundSummary{Round: r.Round, Count: r.Count, Errors: r.Errors, ElapsedSec: r.Elapsed.Seconds(),
				IOPS: r.IOPS(), CPU: perOp(r), Daemon: r.Daemon, ReportJSON: jp, ReportHTML: hp}
			rs.Syncs, rs.SyncsPerOp = r.Syncs, r.syncsPerOp()
			syncs = append(syncs, rs.SyncsPerOp)
			rs.Spans = r.Spans
			spans = append(spans, r.spansPerOp())
			allocs = append(allocs, rs.CPU.ServerAllocs)
			switches = append(switches, rs.CPU.ServerSwitches)
			server = append(server, rs.CPU.ServerUS)
			client = append(client, rs.CPU.ClientUS)
			others = append(others, rs.CPU.OtherCores)
			busy = append(busy, rs.CPU.BusyCores)
			for _, p := range fioPercentiles {
				us := float64(r.percentile(p)) / float64(time.Microsecond)
				rs.Clat = append(rs.Clat, percentileUS{p, us})
				pcts[p] = append(pcts[p], us)
			}
			for msg, n := range r.Errors {
				cs.errorsByMsg[msg] += n
				cs.Errors += n
			}
			iops = append(iops, r.IOPS())
			cs.RSSAboveIdle = max(cs.RSSAboveIdle, r.RSSAboveIdle)
			if r.Note != "" {
				cs.Note = r.Note
			}
			cs.Rounds = append(cs.Rounds, rs)
		}
		cs.IOPS = median(iops)
		cs.SyncsPerOp = median(syncs)
		cs.SpansPerOp = median(spans)
		cs.CPU = cpuPerOp{ServerAllocs: median(allocs), ServerSwitches: median(switches), ServerUS: median(server), ClientUS: median(client), OtherCores: median(others), BusyCores: median(busy)}
		cs.Bandwidth = cs.IOPS * float64(c.bs)
		for _, p := range fioPercentiles {
			m := median(pcts[p])
			cs.clatByPct[p] = m
			cs.Clat = append(cs.Clat, percentileUS{p, m})
		}
		if cs.Errors > 0 {
			res.Failed = true
		}
		res.Columns = append(res.Columns, cs)
	}
	byName := map[string]*columnSummary{}
	for i := range res.Columns {
		byName[res.Columns[i].Name] = &res.Columns[i]
	}
	for _, rt := range c.ratios {
		num, den := byName[rt[0]], byName[rt[1]]
		if num == nil || den == nil {
			continue // a column left out by -target
		}
		rs := ratioSummary{Name: rt[0] + "/" + rt[1]}
		pairs := res.pairRuns[rt]
		for i := range num.Rounds {
			d := den.Rounds[i].IOPS
			if i < len(pairs) {
				d = pairs[i].IOPS()
				rs.BaseIOPSPerRound = append(rs.BaseIOPSPerRound, d)
			}
			if d > 0 {
				rs.IOPSPerRound = append(rs.IOPSPerRound, num.Rounds[i].IOPS/d)
			}
		}
		rs.IOPS = median(rs.IOPSPerRound)
		for _, p := range fioPercentiles {
			if d := den.clatByPct[p]; d > 0 {
				rs.Clat = append(rs.Clat, percentileUS{p, num.clatByPct[p] / d})
			}
		}
		res.Ratios = append(res.Ratios, rs)
	}
}

// writeSummary rewrites summary.json with everything run so far, so that an
// interrupted invocation still leaves its finished scenarios behind.
func (e *env) writeSummary() error {
	e.summary.Finished = time.Now().UTC().Format(time.RFC3339)
	data, err := json.MarshalIndent(e.summary, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(e.opts.out, "summary.json"), append(data, '\n'), 0o644)
}
