// Command loadtest is filewrite's load harness: it replays, through the
// service, the fio experiments of the kernel patches the store carries
// (docs/design.md), each as a before/after pair run in alternation, and reports
// them in fio's terms. It drives the gRPC API with ghz's runner.
//
//	go -C loadtest run . -scenario all
//	go -C loadtest run . -scenario below-eof -duration 15s -rounds 3
//	go -C loadtest run . -scenario soak
//	go -C loadtest run . -scenario files -duration 10s
//	go -C loadtest run . -scenario throughput -target 127.0.0.1:50051
//	go -C loadtest run . -scenario stream
//	go -C loadtest run . -scenario cluster
//	go -C loadtest run . -scenario cluster -targets 10.0.0.1:50051,10.0.0.2:50051
//	go -C loadtest run . -scenario tracing -duration 5s -rounds 2 -profile
//	go -C loadtest run . -scenario bulk -record ../docs/benchmarks
//
// By default it builds the daemon from this checkout and starts one daemon
// per configuration on a loopback port the kernel picks, with its data
// below -out (so on the filesystem the harness runs on, never /tmp).
// -target instead runs against a server that is already up: the harness
// cannot change that server's flags, so each comparison runs its workload
// once per round, as one column named "target". -token-file gives the
// bearer token such a server may ask for. -targets does the same for the
// cluster scenario with several running daemons, routed by ring hash.
//
// -transport chooses how the clients reach the daemon: unary (one RPC per
// operation, ghz's runner where ghz can drive it) or stream (WriteStream
// through the client package, one *client.File, and so one stream, per
// client); both runs the two side by side, alternated, and is what "all"
// does. Before anything runs the harness names the machine and times
// pwrite+fdatasync on the file system below -out.
//
// In -out it writes ghz's JSON and HTML report of every run, one SVG chart
// per comparison and summary.json with every figure; with -profile, also
// the daemon's CPU and allocation profiles of every run.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/filewrite/filewrite/internal/bytesize"
	"github.com/filewrite/filewrite/internal/daemonproc"
)

// options are the command line.
type options struct {
	scenario    string
	duration    time.Duration // per run; 0: the scenario's default
	rounds      int
	concurrency int   // 0: the scenario's default
	connections int   // gRPC connections the clients share; 0: one each
	bs          int   // 0: the scenario's default
	fileSize    int64 // 0: the scenario's default
	out         string
	target      string
	targets     []string // -targets: running daemons the cluster scenario routes over
	token       string   // from -token-file; "" sends none
	daemon      string   // a prebuilt daemon binary; "" builds one
	keepData    bool
	// record is the directory -record writes the run's dated record
	// into; "" writes none.
	record string
	// args is the command line parseOptions read, for the record.
	args []string
	// transport is unary, stream or both; "": both for "all" and
	// "files", unary otherwise.
	transport string
	// The files scenario's: the file counts of its rows, the
	// --max-open-files of each row's second run, how many idle
	// WriteStreams its stream transport keeps open, and how many files
	// files-create makes.
	files        []int
	maxOpenFiles int
	streams      int
	createFiles  int
	// profile captures the daemon's Go profiles over every run.
	profile bool
}

// scenarioNames in the order "all" runs them; soak is separate.
var scenarioNames = []string{"below-eof", "prealloc-overwrite", "fsync", "throughput", "stream", "peer", "nbd", "append"}

func main() {
	opts, err := parseOptions(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	sum, err := run(ctx, opts, os.Stdout, os.Stderr)
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "loadtest: interrupted; the daemons it started are stopped, finished scenarios are in summary.json")
		os.Exit(130)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(1)
	}
	if sum.failed() {
		fmt.Fprintln(os.Stderr, "loadtest: some runs had errors or wrong content; see above and summary.json")
		os.Exit(1)
	}
}

func parseOptions(args []string, out io.Writer) (options, error) {
	o := options{rounds: 3, out: "loadtest-out", maxOpenFiles: 1024, streams: 8192, createFiles: 10000}
	raw := rawFlags{files: "1000,10000,100000"}
	fs := o.flagSet(&raw, out)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.args = args
	for _, step := range []func(rawFlags) error{o.checkChoices, o.checkCounts, o.parseFiles, o.parseTargets, o.readTokenFile, o.parseSizes} {
		if err := step(raw); err != nil {
			return o, err
		}
	}
	return o, nil
}

// rawFlags are the flags parseOptions reads as text and checks after
// parsing.
type rawFlags struct {
	bs, fileSize, targets, tokenFile, files string
}

// flagSet defines every flag, writing into o and raw.
func (o *options) flagSet(raw *rawFlags, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.scenario, "scenario", "", "what to run: "+strings.Join(scenarioNames, ", ")+", all (those, with both transports), soak, cluster, files, tracing, or bulk (or one of its rows: "+strings.Join(bulkNames, ", ")+")")
	fs.DurationVar(&o.duration, "duration", 0, "length of each timed run (default 15s; 2m for soak)")
	fs.IntVar(&o.rounds, "rounds", o.rounds, "rounds per comparison; every configuration runs once per round, in alternation")
	fs.IntVar(&o.concurrency, "concurrency", 0, "concurrent clients (default: the scenario's: 8 below-eof, 10 prealloc-overwrite, 32 fsync, throughput and stream, 64 soak)")
	fs.IntVar(&o.connections, "connections", 0, "gRPC connections the clients share (default: one per client, as independent clients have)")
	fs.StringVar(&raw.bs, "bs", "", "bytes per write, like fio's bs (4k, 16k, 64k; default 4k; prealloc-overwrite runs 4k, 16k and 64k unless set)")
	fs.StringVar(&raw.fileSize, "file-size", "", "size of each scenario's file (default: the scenario's, 16m to 4g)")
	fs.StringVar(&o.out, "out", o.out, "directory for reports, charts, summary.json and the daemons' data while they run")
	fs.StringVar(&o.target, "target", "", "gRPC address of a running filewrite daemon to load instead of starting daemons")
	fs.StringVar(&raw.targets, "targets", "", "with -scenario cluster: comma-separated gRPC addresses of running daemons, routed by ring hash of the path")
	fs.StringVar(&raw.tokenFile, "token-file", "", "with -target: a `file` whose first token (one per line, # comments) is sent as the bearer token")
	fs.StringVar(&o.daemon, "daemon", "", "a filewrite binary to start instead of building one from this checkout")
	fs.StringVar(&o.transport, "transport", "", "how the clients reach the daemon: unary (one RPC per write), stream (WriteStream through the client package, a File per client; files: multi-file WriteStreams) or both, alternated (default: both for all, files and tracing, unary otherwise)")
	fs.BoolVar(&o.keepData, "keep-data", false, "keep the daemons' data directories and logs after each scenario")
	fs.StringVar(&o.record, "record", "", "also write the run as a dated record, DATE-COMMIT-SCENARIO.md, into this `dir` (docs/benchmarks keeps them)")
	fs.StringVar(&raw.files, "files", raw.files, "files: the file counts of the many-file rows, comma-separated")
	fs.IntVar(&o.maxOpenFiles, "max-open-files", o.maxOpenFiles, "files: the daemon's --max-open-files in the second run of each many-file row")
	fs.IntVar(&o.streams, "streams", o.streams, "files: most files the stream transport keeps declared (open on the daemon) on its multi-file WriteStreams, 4096 to a stream; rows with -max-open-files keep fewer")
	fs.IntVar(&o.createFiles, "create", o.createFiles, "files: how many files files-create makes, ten to a new directory")
	fs.BoolVar(&o.profile, "profile", false, "write the CPU and allocation profiles (Go pprof) of the daemon over every run to -out, as COMPARISON/rROUND-COLUMN.{cpu,allocs}.pprof; not with -target")
	return fs
}

// checkChoices checks -scenario and -transport against their choices.
func (o *options) checkChoices(rawFlags) error {
	switch o.scenario {
	case "":
		return errors.New("-scenario is required (" + strings.Join(scenarioNames, ", ") + ", all or soak)")
	case "all", "soak", "cluster", "files", "tracing", "bulk":
	default:
		if slices.Contains(bulkNames, o.scenario) {
			break
		}
		if !slices.Contains(scenarioNames, o.scenario) {
			return fmt.Errorf("unknown -scenario %q (want %s, all or soak)", o.scenario, strings.Join(scenarioNames, ", "))
		}
	}
	if (o.scenario == "bulk" || slices.Contains(bulkNames, o.scenario)) && o.target != "" {
		return errors.New("-scenario bulk compares the daemon with tools on its own disk: it starts its daemons itself, without -target")
	}
	switch o.transport {
	case "", transportUnary, transportStream, transportBoth:
	default:
		return fmt.Errorf("unknown -transport %q (want unary, stream or both)", o.transport)
	}
	return nil
}

// checkCounts checks the numeric flags' ranges.
func (o *options) checkCounts(rawFlags) error {
	if o.rounds < 1 || o.duration < 0 || o.concurrency < 0 || o.connections < 0 {
		return errors.New("-rounds must be at least 1; -duration, -concurrency and -connections not negative")
	}
	if o.maxOpenFiles < 1 || o.streams < 1 || o.createFiles < 1 {
		return errors.New("-max-open-files, -streams and -create must be at least 1")
	}
	if o.profile && (o.target != "" || o.scenario == "soak") {
		return errors.New("-profile needs daemons the harness starts for a comparison: not -target, not soak")
	}
	return nil
}

// parseFiles reads -files, the files scenario's file counts.
func (o *options) parseFiles(raw rawFlags) error {
	for _, f := range strings.Split(raw.files, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-files %q: want positive counts, like 1000,10000", raw.files)
		}
		o.files = append(o.files, n)
	}
	return nil
}

// parseTargets reads -targets, which only the cluster scenario takes.
func (o *options) parseTargets(raw rawFlags) error {
	for _, t := range strings.Split(raw.targets, ",") {
		if t = strings.TrimSpace(t); t != "" {
			o.targets = append(o.targets, t)
		}
	}
	if len(o.targets) > 0 && (o.scenario != "cluster" || o.target != "") {
		return errors.New("-targets is for -scenario cluster, without -target")
	}
	return nil
}

// readTokenFile reads the token of -token-file, which only running
// daemons (-target, -targets) ask for.
func (o *options) readTokenFile(raw rawFlags) error {
	if raw.tokenFile == "" {
		return nil
	}
	if o.target == "" && len(o.targets) == 0 {
		return errors.New("-token-file is for -target: the daemons the harness starts ask for no token")
	}
	tok, err := readToken(raw.tokenFile)
	if err != nil {
		return err
	}
	o.token = tok
	return nil
}

// parseSizes reads -bs and -file-size in the daemon's size grammar.
func (o *options) parseSizes(raw rawFlags) error {
	if raw.bs != "" {
		n, err := bytesize.Parse(raw.bs)
		if err != nil || n <= 0 || n > 64<<20 {
			return fmt.Errorf("-bs %q: want a size from 1 to 64m, like 4k", raw.bs)
		}
		o.bs = int(n)
	}
	if raw.fileSize != "" {
		n, err := bytesize.Parse(raw.fileSize)
		if err != nil || n <= 0 {
			return fmt.Errorf("-file-size %q: want a positive size, like 256m", raw.fileSize)
		}
		o.fileSize = n
	}
	return nil
}

// readToken returns the first token of a file in the daemon's
// --auth-token-file format: one credential per line, blank lines, lines
// starting with '#' and cert= lines skipped; only the token is sent, not
// the scope words after it.
func readToken(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("-token-file: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		words := strings.Fields(line)
		if len(words) == 0 || strings.HasPrefix(words[0], "#") || strings.HasPrefix(words[0], "cert=") {
			continue
		}
		// The first word is the token; scope words (name=, prefix=,
		// mode=) after it are the daemon's, never sent.
		return words[0], nil
	}
	return "", fmt.Errorf("-token-file %s holds no token", file)
}

// env is one invocation's shared state.
type env struct {
	opts     options
	bin      string // the daemon binary; "" with -target
	work     string // daemons' data and logs, below -out
	log      io.Writer
	progress *progress
	summary  *summary
}

// summary is summary.json.
type summary struct {
	Command     []string            `json:"command"`
	Started     string              `json:"started"`
	Finished    string              `json:"finished"`
	Host        hostInfo            `json:"host"`
	Target      string              `json:"target,omitempty"`
	Comparisons []*comparisonResult `json:"comparisons"`
	Soak        *soakResult         `json:"soak,omitempty"`
}

func (s *summary) failed() bool {
	for _, c := range s.Comparisons {
		if c.Failed {
			return true
		}
	}
	return s.Soak != nil && !s.Soak.Passed
}

type hostInfo struct {
	CPUs      int    `json:"cpus"`
	CPUModel  string `json:"cpu_model,omitempty"`
	Kernel    string `json:"kernel,omitempty"`
	GoVersion string `json:"go_version"`
	// Storage is the file system below -out, where every run's files
	// live; nil with -target (the daemon's files are elsewhere).
	Storage *storageInfo `json:"storage,omitempty"`
}

// String is the machine line the output and the benchmark records carry.
func (h hostInfo) String() string {
	s := fmt.Sprintf("%d CPUs (%s), Linux %s, %s", h.CPUs, h.CPUModel, h.Kernel, h.GoVersion)
	if h.Storage != nil {
		s += "; " + h.Storage.String()
	}
	return s
}

func readHost() hostInfo {
	h := hostInfo{CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		h.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				h.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	return h
}

func (e *env) duration(soak bool) time.Duration {
	switch {
	case e.opts.duration > 0:
		return e.opts.duration
	case soak:
		return 2 * time.Minute
	}
	return 15 * time.Second
}

func (e *env) clients(def int) int {
	if e.opts.concurrency > 0 {
		return e.opts.concurrency
	}
	return def
}

func (e *env) bs(def int) int {
	if e.opts.bs > 0 {
		return e.opts.bs
	}
	return def
}

// fileSize is -file-size or def, rounded down to a whole number of bs
// blocks and at least one: every write of a run must land below EOF.
func (e *env) fileSize(def int64, bs int) int64 {
	size := def
	if e.opts.fileSize > 0 {
		size = e.opts.fileSize
	}
	return max(size/int64(bs), 1) * int64(bs)
}

// run runs opts.scenario and returns what summary.json holds. Tables go to
// stdout, the progress line to progressOut.
func run(ctx context.Context, opts options, stdout, progressOut io.Writer) (*summary, error) {
	out, err := filepath.Abs(opts.out)
	if err != nil {
		return nil, err
	}
	opts.out = out
	// Everything the run prints but the progress line is also kept for
	// its record (-record).
	var transcript bytes.Buffer
	info := recordInfo{scenario: opts.scenario, args: opts.args, started: time.Now(), loadStart: loadAverage()}
	e := &env{
		opts:     opts,
		work:     filepath.Join(out, "work"),
		log:      io.MultiWriter(stdout, &transcript),
		progress: newProgress(progressOut),
		// argv[0] of "go run" is a temporary path; the command is what matters.
		summary: &summary{Command: append([]string{"loadtest"}, os.Args[1:]...), Started: time.Now().UTC().Format(time.RFC3339),
			Host: readHost(), Target: opts.target},
	}
	if err := os.MkdirAll(e.work, 0o755); err != nil {
		return nil, err
	}
	defer func() {
		if !opts.keepData {
			os.RemoveAll(e.work)
		}
	}()
	if opts.target == "" && len(opts.targets) == 0 && opts.scenario != "soak" {
		st, err := readStorage(out)
		if err != nil {
			return nil, fmt.Errorf("timing fdatasync in %s: %w", out, err)
		}
		e.summary.Host.Storage = &st
	}
	fmt.Fprintf(e.log, "machine: %s\n", e.summary.Host)
	if opts.target == "" && len(opts.targets) == 0 {
		e.bin = opts.daemon
		if e.bin == "" {
			fmt.Fprintln(e.log, "building the daemon ...")
			if e.bin, err = daemonproc.Build(ctx, e.work, false); err != nil {
				return nil, err
			}
		}
	}

	var comparisons []func() *comparison
	add := func(name string) {
		switch name {
		case "below-eof":
			comparisons = append(comparisons, e.belowEOF)
		case "prealloc-overwrite":
			sizes := []int{4 << 10, 16 << 10, 64 << 10}
			if opts.bs > 0 {
				sizes = []int{opts.bs}
			}
			for _, bs := range sizes {
				comparisons = append(comparisons, func() *comparison { return e.preallocOverwrite(bs) })
			}
		case "fsync":
			comparisons = append(comparisons, e.fsyncLone, e.fsyncModes)
		case "throughput":
			comparisons = append(comparisons, e.throughput)
		case "stream":
			comparisons = append(comparisons, e.stream)
		case "append":
			comparisons = append(comparisons,
				func() *comparison { return e.appendScenario(false) },
				func() *comparison { return e.appendScenario(true) })
		case "cluster":
			comparisons = append(comparisons, e.cluster)
		case "files":
			comparisons = append(comparisons, e.files, e.filesCreate)
		case "bulk", "bulk-put", "bulk-writer", "bulk-checkpoint", "bulk-get", "bulk-durable":
			if tool := bulkMissing(); tool != "" {
				fmt.Fprintf(e.log, "\n== %s: skipped: %s is not installed (apt-get install fio curl)\n", name, tool)
				break
			}
			comparisons = append(comparisons, e.bulk(name)...)
		case "peer":
			if tool := peerMissing(); tool != "" {
				fmt.Fprintf(e.log, "\n== peer: skipped: %s is not installed (apt-get install nbdkit fio)\n", tool)
				break
			}
			comparisons = append(comparisons, func() *comparison { return e.peer(false) }, e.peerMany, func() *comparison { return e.peer(true) })
		case "nbd":
			if tool := peerMissing(); tool != "" {
				fmt.Fprintf(e.log, "\n== nbd: skipped: %s is not installed (apt-get install nbdkit fio)\n", tool)
				break
			}
			for _, shape := range nbdShapes {
				comparisons = append(comparisons, func() *comparison { return e.nbdPeer(shape) })
			}
			comparisons = append(comparisons, e.nbdBelowEOF)
			sizes := []int{4 << 10, 16 << 10, 64 << 10}
			if opts.bs > 0 {
				sizes = []int{opts.bs}
			}
			for _, bs := range sizes {
				comparisons = append(comparisons, func() *comparison { return e.nbdPreallocOverwrite(bs) })
			}
		}
	}
	switch opts.scenario {
	case "all":
		for _, n := range scenarioNames {
			add(n)
		}
	case "soak":
	case "tracing":
		// The traced daemons' spans go to a sink of the harness's own,
		// up for the whole comparison.
		sink, err := startOTLPSink()
		if err != nil {
			return nil, err
		}
		defer sink.close()
		comparisons = append(comparisons, func() *comparison { return e.tracing(sink) })
	default:
		add(opts.scenario)
	}
	for _, mk := range comparisons {
		res, err := e.runComparison(ctx, e.transports(mk()))
		if err != nil {
			return e.summary, err
		}
		e.summary.Comparisons = append(e.summary.Comparisons, res)
		if err := e.writeSummary(); err != nil {
			return e.summary, err
		}
	}
	if opts.scenario == "soak" {
		res, err := e.runSoak(ctx)
		if err != nil {
			return e.summary, err
		}
		e.summary.Soak = res
		if err := e.writeSummary(); err != nil {
			return e.summary, err
		}
	}
	if opts.record != "" {
		info.commit, info.dirty = checkoutCommit(ctx)
		info.finished, info.loadEnd = time.Now(), loadAverage()
		info.host, info.target, info.failed = e.summary.Host, opts.target, e.summary.failed()
		info.out = out
		path, err := writeRecord(opts.record, info, transcript.Bytes())
		if err != nil {
			return e.summary, fmt.Errorf("-record: %w", err)
		}
		fmt.Fprintf(stdout, "\nthe record of this run is %s\n", path)
	}
	fmt.Fprintf(stdout, "\nreports, charts and summary.json are in %s\n", out)
	return e.summary, nil
}
