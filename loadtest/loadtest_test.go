package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bojand/ghz/runner"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/daemonproc"
	"github.com/filewrite/filewrite/internal/testutil"
)

// daemonBin is the daemon every test starts, built once by TestMain into
// a directory on the project filesystem.
var daemonBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp(".", "testdata-tmp-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	daemonBin, err = daemonproc.Build(context.Background(), dir, false)
	code := 1
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		// The daemon's own leaks are the in-process packages' to find;
		// here, the harness's (its clients, its sink, its watchers).
		code = testutil.RunAndFindLeaks(m)
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// shortRun is a run of a scenario small enough for go test: a fraction of
// a second per run, two rounds (so that the alternation runs), tiny files.
func shortRun(t *testing.T, scenario string, mod func(*options)) (*summary, string, string) {
	t.Helper()
	// On the project filesystem, like the harness's own default.
	out := testutil.Dir(t)
	opts := options{scenario: scenario, duration: 300 * time.Millisecond, rounds: 2, fileSize: 1 << 20,
		out: out, daemon: daemonBin}
	if mod != nil {
		mod(&opts)
	}
	var stdout bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sum, err := run(ctx, opts, &stdout, io.Discard)
	if err != nil {
		t.Fatalf("run %s: %v\n%s", scenario, err, stdout.String())
	}
	return sum, out, stdout.String()
}

// checkSVG parses an SVG with encoding/xml and returns how many of each
// element it holds.
func checkSVG(t *testing.T, path string) map[string]int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	elems := map[string]int{}
	dec := xml.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s does not parse as XML: %v", path, err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if len(elems) == 0 && se.Name.Local != "svg" {
				t.Fatalf("%s: root element %q, want svg", path, se.Name.Local)
			}
			elems[se.Name.Local]++
		}
	}
	return elems
}

// checkReports checks that a run's ghz JSON report parses and shows no
// errors, and that its HTML report was written.
func checkReports(t *testing.T, out, jsonPath, htmlPath string, wantCount uint64) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(out, jsonPath))
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Count     uint64         `json:"count"`
		ErrorDist map[string]int `json:"errorDistribution"`
		Latencies []any          `json:"latencyDistribution"`
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatalf("%s: %v", jsonPath, err)
	}
	if rep.Count != wantCount || len(rep.ErrorDist) != 0 || len(rep.Latencies) == 0 {
		t.Errorf("%s: count %d, errors %v, %d latency percentiles; want count %d, no errors, some percentiles",
			jsonPath, rep.Count, rep.ErrorDist, len(rep.Latencies), wantCount)
	}
	html, err := os.ReadFile(filepath.Join(out, htmlPath))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(html, []byte("<html")) {
		t.Errorf("%s is not an HTML page", htmlPath)
	}
}

// TestScenarios runs every comparison briefly against real daemons: every
// request must succeed, and the tables, reports, charts and summary must
// be there and parse. It checks nothing about speed.
func TestScenarios(t *testing.T) {
	for _, tt := range []struct {
		scenario  string
		transport string
		names     []string // comparisons
		columns   []string
		ratios    []string
		// ratiosOf overrides ratios for the comparisons it names.
		ratiosOf map[string][]string
		// columnsOf overrides columns for the comparisons it names.
		columnsOf map[string][]string
	}{
		{"below-eof", "", []string{"below-eof"}, []string{"exclusive", "unlocked-below-eof"}, []string{"unlocked-below-eof/exclusive"}, nil, nil},
		{"below-eof", "stream", []string{"below-eof"}, []string{"exclusive-stream", "unlocked-below-eof-stream"},
			[]string{"unlocked-below-eof-stream/exclusive-stream"}, nil, nil},
		{"fsync", "both", []string{"fsync-1", "fsync"},
			[]string{"timer", "timer-stream", "per-call", "per-call-stream", "group", "group-stream"},
			[]string{"group/per-call", "group-stream/per-call-stream", "timer/group", "timer-stream/group-stream"},
			map[string][]string{"fsync-1": {"group/timer", "group-stream/timer-stream", "group/per-call", "group-stream/per-call-stream"}}, nil},
		{"peer", "", []string{"peer", "peer-streams", "peer-durable"}, []string{"nbdkit-fio", "filewrite-stream", "filewrite-procs1-stream"},
			[]string{"filewrite-stream/nbdkit-fio", "filewrite-procs1-stream/nbdkit-fio"},
			map[string][]string{"peer-durable": {"filewrite-stream/nbdkit-fio", "filewrite-procs1-stream/nbdkit-fio", "filewrite-stream/fio-fdatasync"}},
			map[string][]string{"peer-durable": {"nbdkit-fio", "filewrite-stream", "filewrite-procs1-stream", "fio-fdatasync"}}},
		{"nbd", "", []string{"nbd", "nbd-durable", "nbd-multiconn", "nbd-below-eof",
			"nbd-prealloc-overwrite-4k", "nbd-prealloc-overwrite-16k", "nbd-prealloc-overwrite-64k"},
			[]string{"nbdkit-fio", "filewrite-nbd-fio"}, []string{"filewrite-nbd-fio/nbdkit-fio"},
			map[string][]string{
				"nbd-below-eof":              {"unlocked-below-eof/exclusive"},
				"nbd-prealloc-overwrite-4k":  {"shared-overwrite/shared-written"},
				"nbd-prealloc-overwrite-16k": {"shared-overwrite/shared-written"},
				"nbd-prealloc-overwrite-64k": {"shared-overwrite/shared-written"},
			},
			map[string][]string{
				"nbd-below-eof":              {"exclusive", "unlocked-below-eof"},
				"nbd-prealloc-overwrite-4k":  {"shared-written", "shared-overwrite"},
				"nbd-prealloc-overwrite-16k": {"shared-written", "shared-overwrite"},
				"nbd-prealloc-overwrite-64k": {"shared-written", "shared-overwrite"},
			}},
		{"throughput", "both", []string{"throughput"}, []string{"noop", "write", "write-stream", "raw-pwrite"},
			[]string{"write/noop", "write-stream/noop", "write/raw-pwrite", "write-stream/raw-pwrite"}, nil, nil},
		{"prealloc-overwrite", "", []string{"prealloc-overwrite-4k", "prealloc-overwrite-16k", "prealloc-overwrite-64k"},
			[]string{"shared-written", "shared-overwrite"}, []string{"shared-overwrite/shared-written"}, nil, nil},
		{"fsync", "", []string{"fsync-1", "fsync"}, []string{"timer", "per-call", "group"}, []string{"group/per-call", "timer/group"},
			map[string][]string{"fsync-1": {"group/timer", "group/per-call"}}, nil},
		{"throughput", "", []string{"throughput"}, []string{"noop", "write", "raw-pwrite"}, []string{"write/noop", "write/raw-pwrite"}, nil, nil},
		{"append", "", []string{"append", "append-sync"}, []string{"exclusive", "exclusive-overwrites", "reserving", "reserving-overwrites"},
			[]string{"reserving/exclusive", "reserving/reserving-overwrites"}, nil, nil},
		{"append", "stream", []string{"append", "append-sync"},
			[]string{"exclusive-stream", "exclusive-overwrites-stream", "reserving-stream", "reserving-overwrites-stream"},
			[]string{"reserving-stream/exclusive-stream", "reserving-stream/reserving-overwrites-stream"}, nil, nil},
	} {
		t.Run(tt.scenario+"/"+cmp.Or(tt.transport, "default"), func(t *testing.T) {
			if tool := peerMissing(); (tt.scenario == "peer" || tt.scenario == "nbd") && tool != "" {
				t.Skipf("%s is not installed", tool)
			}
			sum, out, table := shortRun(t, tt.scenario, func(o *options) { o.transport = tt.transport })
			var names []string
			for _, c := range sum.Comparisons {
				names = append(names, c.Name)
			}
			if !slices.Equal(names, tt.names) {
				t.Fatalf("comparisons %q, want %q", names, tt.names)
			}
			for _, c := range sum.Comparisons {
				ratios := tt.ratios
				if r, ok := tt.ratiosOf[c.Name]; ok {
					ratios = r
				}
				columns := tt.columns
				if c, ok := tt.columnsOf[c.Name]; ok {
					columns = c
				}
				checkComparison(t, out, table, c, columns, ratios, 2)
				for _, col := range c.Columns {
					want := transportUnary
					switch {
					case col.Name == "raw-pwrite", col.Name == "nbdkit-fio", col.Name == "fio-fdatasync":
						want = ""
					case strings.HasSuffix(col.Name, streamSuffix):
						want = transportStream
					case strings.HasPrefix(c.Name, "nbd"):
						want = transportNBD
					}
					if col.Transport != want {
						t.Errorf("%s/%s: transport %q, want %q", c.Name, col.Name, col.Transport, want)
					}
					if strings.HasPrefix(c.Name, "fsync") && col.SyncsPerOp <= 0 {
						t.Errorf("%s/%s: the daemon's syncs per op were not counted", c.Name, col.Name)
					}
					// The CPU of the processes a column starts itself
					// (nbdkit, fio) is the server's or the harness's, not
					// other load; a daemon's context switches are counted.
					if col.Name == "nbdkit-fio" && (col.CPU.ServerUS <= 0 || col.CPU.ClientUS <= 0) {
						t.Errorf("%s/%s: nbdkit's or fio's CPU was not counted: %+v", c.Name, col.Name, col.CPU)
					}
					if strings.HasPrefix(col.Name, "filewrite-") && col.CPU.ServerSwitches <= 0 {
						t.Errorf("%s/%s: the daemon's context switches were not counted: %+v", c.Name, col.Name, col.CPU)
					}
				}
			}
			if st := sum.Host.Storage; st == nil || st.FS == "" || st.FdatasyncLoops == 0 || st.FdatasyncP50US <= 0 {
				t.Errorf("summary names no storage, or no fdatasync timing: %+v", st)
			}
			var fromFile summary
			data, err := os.ReadFile(filepath.Join(out, "summary.json"))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(data, &fromFile); err != nil {
				t.Fatalf("summary.json: %v", err)
			}
			if len(fromFile.Comparisons) != len(tt.names) {
				t.Errorf("summary.json holds %d comparisons, want %d", len(fromFile.Comparisons), len(tt.names))
			}
			if _, err := os.Stat(filepath.Join(out, "work")); !os.IsNotExist(err) {
				t.Errorf("the work directory (daemon data) was left behind: %v", err)
			}
		})
	}
}

func checkComparison(t *testing.T, out, table string, c *comparisonResult, columns, ratios []string, rounds int) {
	t.Helper()
	if c.Failed {
		t.Errorf("%s: runs had errors", c.Name)
	}
	var got []string
	for _, col := range c.Columns {
		got = append(got, col.Name)
		if len(col.Rounds) != rounds {
			t.Errorf("%s/%s: %d rounds, want %d", c.Name, col.Name, len(col.Rounds), rounds)
		}
		for _, r := range col.Rounds {
			if r.Count == 0 || len(r.Errors) != 0 {
				t.Errorf("%s/%s round %d: %d requests, errors %v; want some, none failed", c.Name, col.Name, r.Round, r.Count, r.Errors)
			}
			if len(r.Clat) != len(fioPercentiles) {
				t.Errorf("%s/%s round %d: %d percentiles, want %d", c.Name, col.Name, r.Round, len(r.Clat), len(fioPercentiles))
			}
			checkReports(t, out, r.ReportJSON, r.ReportHTML, r.Count)
		}
	}
	if !slices.Equal(got, columns) {
		t.Errorf("%s: columns %q, want %q", c.Name, got, columns)
	}
	got = nil
	for _, r := range c.Ratios {
		got = append(got, r.Name)
		if len(r.IOPSPerRound) != rounds || r.IOPS <= 0 {
			t.Errorf("%s: ratio %s per round %v, median %v", c.Name, r.Name, r.IOPSPerRound, r.IOPS)
		}
	}
	if !slices.Equal(got, ratios) {
		t.Errorf("%s: ratios %q, want %q", c.Name, got, ratios)
	}
	elems := checkSVG(t, filepath.Join(out, c.Chart))
	if elems["polyline"] != len(columns) || elems["rect"] < len(columns)+1 {
		t.Errorf("%s: %d curves and %d rectangles, want a curve and a bar per column", c.Chart, elems["polyline"], elems["rect"])
	}

	// The table: a header with every column and ratio, then fio's rows.
	section := table[strings.Index(table, "== "+c.Name+":"):]
	if next := strings.Index(section[3:], "\n== "); next >= 0 {
		section = section[:next+3]
	}
	lines := strings.Split(section, "\n")
	var header string
	for _, l := range lines {
		if strings.Contains(l, columns[0]) && strings.Contains(l, columns[len(columns)-1]) {
			header = l
			break
		}
	}
	for _, want := range append(slices.Clone(columns), ratios...) {
		if !strings.Contains(header, want) {
			t.Errorf("%s: table header %q lacks %q:\n%s", c.Name, header, want, section)
		}
	}
	for _, p := range fioPercentiles {
		label := fmt.Sprintf("| %5.2fth=", p)
		found := false
		for _, l := range lines {
			if strings.Contains(l, label) {
				found = true
				if n := strings.Count(l, "["); n != len(columns) {
					t.Errorf("%s: row %q has %d values, want one per column", c.Name, l, n)
				}
			}
		}
		if !found {
			t.Errorf("%s: no %s row in the table:\n%s", c.Name, label, section)
		}
	}
	for _, row := range []string{"iops", "bw (KiB/s)", "clat percentiles (usec):"} {
		if !strings.Contains(section, "   "+row) {
			t.Errorf("%s: no %q row in the table:\n%s", c.Name, row, section)
		}
	}
}

// TestFilesScenario runs the files scenario at toy sizes: every row over
// both transports and files-create, no errors, the daemon's memory,
// descriptors and metrics read after every run, reopens where the bound
// is below the files, and the tables printed. It checks nothing about
// speed.
func TestFilesScenario(t *testing.T) {
	sum, _, text := shortRun(t, "files", func(o *options) {
		o.fileSize = 256 << 10
		o.concurrency = 4
		o.files = []int{8, 24}
		o.maxOpenFiles = 8
		o.transport = transportBoth
		o.streams = 2 // plus one per client: below --max-open-files 8
		o.createFiles = 60
	})
	var names []string
	for _, c := range sum.Comparisons {
		names = append(names, c.Name)
	}
	if want := []string{"files", "files-create"}; !slices.Equal(names, want) {
		t.Fatalf("comparisons %q, want %q", names, want)
	}
	files, create := sum.Comparisons[0], sum.Comparisons[1]
	var cols []string
	for _, row := range []string{"1-file", "8", "8-open8", "24", "24-open8"} {
		cols = append(cols, row, row+streamSuffix)
	}
	var got []string
	for _, c := range files.Columns {
		got = append(got, c.Name)
		for _, r := range c.Rounds {
			if r.Count == 0 || len(r.Errors) != 0 {
				t.Errorf("%s round %d: %d requests, errors %v", c.Name, r.Round, r.Count, r.Errors)
			}
			d := r.Daemon
			if d == nil || d.RSS == 0 || d.FDs == 0 {
				t.Errorf("%s round %d: daemon stats %+v, want memory and descriptors", c.Name, r.Round, d)
				continue
			}
			if c.Name == "24-open8" && d.Opens == 0 {
				t.Errorf("%s round %d: no file reopened with 24 files and 8 open", c.Name, r.Round)
			}
			if d.OpenFiles > 8 && strings.Contains(c.Name, "open8") {
				t.Errorf("%s round %d: %d files open past --max-open-files 8", c.Name, r.Round, d.OpenFiles)
			}
		}
	}
	if !slices.Equal(got, cols) {
		t.Errorf("files columns %q, want %q", got, cols)
	}
	if len(files.Ratios) != len(cols)-2 {
		t.Errorf("%d ratios, want one per many-file column: %v", len(files.Ratios), files.Ratios)
	}
	// Paired: each ratio is to a run of its one-file row made just before
	// its own, one a round.
	for _, r := range files.Ratios {
		if len(r.BaseIOPSPerRound) != files.Rounds || len(r.IOPSPerRound) != files.Rounds || slices.Contains(r.BaseIOPSPerRound, 0) {
			t.Errorf("ratio %s: per round %v to the one-file runs %v, want %d of each", r.Name, r.IOPSPerRound, r.BaseIOPSPerRound, files.Rounds)
		}
	}
	for _, c := range create.Columns {
		for _, r := range c.Rounds {
			d := r.Daemon
			if r.Count != 60 || len(r.Errors) != 0 || d == nil {
				t.Errorf("files-create %s round %d: %d files, errors %v, stats %v; want 60, none, some", c.Name, r.Round, r.Count, r.Errors, d)
				continue
			}
			// Each new file's first sync asks for the four directories
			// above it (d, r, create-COLUMN and the root): per-call, one
			// fsync each; shared, at most that, with the callers that an
			// fsync done already covered not counted.
			want := int64(4 * 60)
			if c.Name == "per-call" && (d.DirSyncs != want || d.DirSyncCallers != want) {
				t.Errorf("files-create per-call round %d: %d directory fsyncs for %d callers, want %d for %d", r.Round, d.DirSyncs, d.DirSyncCallers, want, want)
			}
			if d.DirSyncs < 1 || d.DirSyncs > d.DirSyncCallers || d.DirSyncCallers > want {
				t.Errorf("files-create %s round %d: %d directory fsyncs for %d callers, want 1 to %d for at most %d", c.Name, r.Round, d.DirSyncs, d.DirSyncCallers, d.DirSyncCallers, want)
			}
		}
	}
	for _, want := range []string{"== files:", "rss/file (B)", "24-open8-stream", "== files-create:", "dir fsyncs/file"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
}

// TestSoak runs the soak briefly: no unexpected error, every file equal to
// the model, the daemon's memory read at start and end, and a clean exit.
func TestSoak(t *testing.T) {
	sum, out, text := shortRun(t, "soak", func(o *options) {
		o.duration = time.Second
		o.concurrency = 16
	})
	s := sum.Soak
	if s == nil {
		t.Fatal("no soak result")
	}
	if !s.Passed || s.Unexpected != 0 {
		t.Fatalf("soak failed: %d unexpected: %q\n%s", s.Unexpected, s.UnexpectedSamples, text)
	}
	if s.VerifiedFiles != s.Files || s.Files != soakFiles || s.VerifiedBytes == 0 {
		t.Errorf("verified %d of %d files (%d bytes), want all %d", s.VerifiedFiles, s.Files, s.VerifiedBytes, soakFiles)
	}
	if s.MemoryStart == nil || s.MemoryEnd == nil || s.MemoryEnd.PeakRSS < s.MemoryStart.PeakRSS {
		t.Errorf("memory start %+v, end %+v: want both, the peak not falling", s.MemoryStart, s.MemoryEnd)
	}
	if s.DaemonExit != "exit 0" {
		t.Errorf("daemon exit: %s", s.DaemonExit)
	}
	ops := map[string]int{}
	for _, op := range s.Ops {
		ops[op.Op] = op.Count
	}
	for _, op := range []string{"write", "read", "truncate", "fallocate", "fsync", "stat"} {
		if ops[op] == 0 {
			t.Errorf("no %s ran: %v", op, ops)
		}
	}
	checkSVG(t, filepath.Join(out, s.Chart))
	checkReports(t, out, s.ReportJSON, s.ReportHTML, s.Total)
	if !strings.Contains(text, "soak: PASS") {
		t.Errorf("no verdict in the output:\n%s", text)
	}
}

// TestTarget runs against a daemon the harness did not start: a
// comparison of server configurations becomes one "target" column, one of
// workloads keeps them all. The clients share two connections here.
func TestTarget(t *testing.T) {
	dir := testutil.Dir(t)
	d, err := startDaemon(context.Background(), "target", daemonBin, filepath.Join(dir, "data"), filepath.Join(dir, "log"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.stop()
	for _, tt := range []struct {
		scenario string
		columns  []string
		ratios   []string
	}{
		{"below-eof", []string{"target"}, nil},
		{"throughput", []string{"noop", "write", "raw-pwrite"}, []string{"write/noop", "write/raw-pwrite"}},
	} {
		sum, out, table := shortRun(t, tt.scenario, func(o *options) { o.target, o.daemon, o.rounds, o.connections = d.addr, "", 1, 2 })
		if got := sum.Comparisons[0].Connections; got != 2 {
			t.Errorf("%s: %d connections recorded, want 2", tt.scenario, got)
		}
		checkComparison(t, out, table, sum.Comparisons[0], tt.columns, tt.ratios, 1)
	}
}

// TestRecord checks -record: each run becomes a file of its own, named by
// date, commit and scenario, holding the command, the machine, the load
// and the tables the run printed, and no path of the machine it ran on.
func TestRecord(t *testing.T) {
	dir := testutil.Dir(t)
	d, err := startDaemon(context.Background(), "target", daemonBin, filepath.Join(dir, "data"), filepath.Join(dir, "log"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.stop()
	records := filepath.Join(dir, "records")
	args := []string{"-scenario", "below-eof", "-rounds", "1", "-target", d.addr, "-record", records}
	var outs []string
	for range 2 {
		_, out, table := shortRun(t, "below-eof", func(o *options) {
			// -out as given, a directory of this machine's, which the
			// record must not name.
			o.target, o.daemon, o.rounds, o.record, o.args = d.addr, "", 1, records, append(slices.Clone(args), "-out", o.out)
		})
		outs = append(outs, out)
		if !strings.Contains(table, "the record of this run is "+records) {
			t.Errorf("the output does not name the record:\n%s", table)
		}
	}
	names, err := filepath.Glob(filepath.Join(records, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	commit, _ := checkoutCommit(context.Background())
	base := time.Now().UTC().Format(time.DateOnly) + "-" + commit + "-below-eof"
	want := []string{filepath.Join(records, base+"-2.md"), filepath.Join(records, base+".md")}
	if !slices.Equal(names, want) {
		t.Fatalf("records %q, want %q", names, want)
	}
	b, err := os.ReadFile(want[1])
	if err != nil {
		t.Fatal(err)
	}
	rec := string(b)
	for _, s := range []string{
		"- command: `go -C loadtest run . " + strings.Join(args, " ") + " -out $OUT`",
		"- commit: " + commit,
		"- machine: ",
		"- other load: load average ",
		"- result: every request succeeded",
		"== below-eof: ",
		"iops by round",
	} {
		if !strings.Contains(rec, s) {
			t.Errorf("the record lacks %q:\n%s", s, rec)
		}
	}
	for _, out := range outs {
		if strings.Contains(rec, out) {
			t.Errorf("the record names the run's output directory %s:\n%s", out, rec)
		}
	}
}

// TestTargetToken runs against a daemon that asks for a bearer token: with
// -token-file every call of every kind (ghz's, the harness's own clients',
// setup's) carries it; without it the runs fail as UNAUTHENTICATED.
func TestTargetToken(t *testing.T) {
	dir := testutil.Dir(t)
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("# the load harness's\n\nsecret-token\nanother\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := startDaemon(context.Background(), "target", daemonBin, filepath.Join(dir, "data"), filepath.Join(dir, "log"),
		[]string{"--auth-token-file", tokens})
	if err != nil {
		t.Fatal(err)
	}
	defer d.stop()
	o, err := parseOptions([]string{"-scenario", "throughput", "-target", d.addr, "-token-file", tokens}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.token != "secret-token" {
		t.Fatalf("-token-file read as %q, want the first token", o.token)
	}
	for _, tt := range []struct {
		scenario string
		columns  []string
		ratios   []string
	}{
		{"throughput", []string{"noop", "write", "raw-pwrite"}, []string{"write/noop", "write/raw-pwrite"}}, // ghz
		{"fsync", []string{"target"}, nil}, // the harness's own clients
	} {
		sum, out, table := shortRun(t, tt.scenario, func(opts *options) { opts.target, opts.token, opts.daemon, opts.rounds = d.addr, o.token, "", 1 })
		checkComparison(t, out, table, sum.Comparisons[0], tt.columns, tt.ratios, 1)
	}

	// Without the token, setup's first Write is refused.
	opts := options{scenario: "throughput", duration: 300 * time.Millisecond, rounds: 1, fileSize: 1 << 20,
		out: filepath.Join(dir, "out"), target: d.addr}
	_, err = run(t.Context(), opts, io.Discard, io.Discard)
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("run without -token-file: %v, want UNAUTHENTICATED", err)
	}
}

// ghzOrder ranks the ghz configs that need others run first: fallocate.json
// prepares the file most use; create.json the files rename.json renames,
// which list.json lists and delete.json deletes.
var ghzOrder = map[string]int{"fallocate.json": -3, "create.json": -2, "rename.json": -1, "delete.json": 1}

// TestGHZConfigs loads every ghz config file in ghz/ the way the ghz CLI
// does and runs it briefly against a daemon, with its host replaced, in
// the order ghzOrder says (else by name). Each request of a config with a
// total acts on files of its own, by request number, so that a short run
// of the same configs in the same order makes no error either.
func TestGHZConfigs(t *testing.T) {
	paths, err := filepath.Glob("ghz/*.json")
	if err != nil || len(paths) < 5 {
		t.Fatalf("ghz configs: %q, %v", paths, err)
	}
	slices.SortFunc(paths, func(a, b string) int {
		ra, rb := ghzOrder[filepath.Base(a)], ghzOrder[filepath.Base(b)]
		if ra != rb {
			return ra - rb
		}
		return strings.Compare(a, b)
	})
	dir := testutil.Dir(t)
	d, err := startDaemon(context.Background(), "ghz", daemonBin, filepath.Join(dir, "data"), filepath.Join(dir, "log"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.stop()
	for _, path := range paths {
		var cfg runner.Config
		if err := runner.LoadConfig(path, &cfg); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if cfg.Host != "127.0.0.1:50051" || !cfg.Insecure || cfg.Call == "" {
			t.Errorf("%s: host %q, insecure %v, call %q: want the daemon's default address, plaintext", path, cfg.Host, cfg.Insecure, cfg.Call)
		}
		const calls = 20
		cfg.Host = d.addr
		// The configs keep ghz's 20 s per call; a race-built suite on a
		// loaded two-core machine once took longer over a call (the
		// configs are checked here, not the daemon's speed).
		cfg.Timeout = runner.Duration(2 * time.Minute)
		if cfg.N != 1 { // keep one-shot configs as they are
			cfg.Z, cfg.N = 0, calls
		}
		rep, err := runner.Run(cfg.Call, cfg.Host, runner.WithConfig(&cfg))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if rep.Count != uint64(cfg.N) || len(rep.ErrorDist) != 0 {
			t.Errorf("%s: %d calls, errors %v; want %d, none", path, rep.Count, rep.ErrorDist, cfg.N)
		}
	}
}

func TestWriteEncoder(t *testing.T) {
	enc, err := newWriteEncoder("a/b.dat", 4096, filewritev1.SyncMode_SYNC_MODE_DATA)
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 4096, 1 << 40} {
		b := enc.encode(off)
		n, l := protowire.ConsumeVarint(b)
		if l < 0 || int(n) != len(b)-l {
			t.Fatalf("offset %d: length prefix %d over %d bytes", off, n, len(b)-l)
		}
		var got filewritev1.WriteRequest
		if err := proto.Unmarshal(b[l:], &got); err != nil {
			t.Fatal(err)
		}
		if got.GetPath() != "a/b.dat" || got.GetOffset() != off || len(got.GetData()) != 4096 || got.GetSync() != filewritev1.SyncMode_SYNC_MODE_DATA {
			t.Errorf("encode(%d) decodes to path %q offset %d, %d bytes, sync %v", off, got.GetPath(), got.GetOffset(), len(got.GetData()), got.GetSync())
		}
	}
	if got := delimited(nil); !bytes.Equal(got, []byte{0}) {
		t.Errorf("delimited(nil) = %v, want [0]", got)
	}
}

func TestRandomBlock(t *testing.T) {
	seen := map[int64]bool{}
	for n := range int64(1000) {
		b := randomBlock(7, n, 64)
		if b < 0 || b >= 64 {
			t.Fatalf("randomBlock(7, %d, 64) = %d", n, b)
		}
		if again := randomBlock(7, n, 64); again != b {
			t.Fatalf("randomBlock is not a function of its arguments: %d then %d", b, again)
		}
		seen[b] = true
	}
	if len(seen) < 60 {
		t.Errorf("1000 draws hit %d of 64 blocks", len(seen))
	}
}

func TestPercentiles(t *testing.T) {
	var lats []time.Duration
	for i := 1; i <= 1000; i++ {
		lats = append(lats, time.Duration(i)*time.Microsecond)
	}
	for _, tt := range []struct {
		p    float64
		want time.Duration
	}{{1, 10 * time.Microsecond}, {50, 500 * time.Microsecond}, {99.9, 999 * time.Microsecond}, {99.99, 1000 * time.Microsecond}, {100, 1000 * time.Microsecond}} {
		if got := percentileOf(lats, tt.p); got != tt.want {
			t.Errorf("percentile %v = %v, want %v", tt.p, got, tt.want)
		}
	}
	if got := median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("median = %v, want 2", got)
	}
}

func TestParseOptions(t *testing.T) {
	o, err := parseOptions([]string{"-scenario", "prealloc-overwrite", "-bs", "16k", "-duration", "3s", "-target", "127.0.0.1:1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.bs != 16<<10 || o.duration != 3*time.Second || o.rounds != 3 || o.target != "127.0.0.1:1" {
		t.Errorf("parsed %+v", o)
	}
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("\n# comment\ncert=spiffe://x/y name=y\n  tok name=job-7 prefix=ckpt/job-7/ mode=rw \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte("# none\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if o, err := parseOptions([]string{"-scenario", "all", "-target", "127.0.0.1:1", "-token-file", tokens}, io.Discard); err != nil || o.token != "tok" {
		t.Errorf("-token-file: token %q, %v; want \"tok\"", o.token, err)
	}
	for _, args := range [][]string{
		{"-scenario", "all", "-token-file", tokens}, // no -target
		{"-scenario", "all", "-target", "127.0.0.1:1", "-token-file", empty},
		{"-scenario", "all", "-target", "127.0.0.1:1", "-token-file", filepath.Join(t.TempDir(), "missing")},
	} {
		if _, err := parseOptions(args, io.Discard); err == nil {
			t.Errorf("parseOptions(%q) succeeded", args)
		}
	}
	// Sizes read as the daemon's flags do (internal/bytesize): 4k = 4KiB.
	for _, bs := range []string{"4k", "4K", "4KiB", "4096"} {
		if o, err := parseOptions([]string{"-scenario", "all", "-bs", bs}, io.Discard); err != nil || o.bs != 4096 {
			t.Errorf("-bs %s: %d, %v; want 4096", bs, o.bs, err)
		}
	}
	if o, err := parseOptions([]string{"-scenario", "all", "-file-size", "1GiB"}, io.Discard); err != nil || o.fileSize != 1<<30 {
		t.Errorf("-file-size 1GiB: %d, %v; want %d", o.fileSize, err, 1<<30)
	}
	if o, err := parseOptions([]string{"-scenario", "all", "-transport", "stream"}, io.Discard); err != nil || o.transport != transportStream {
		t.Errorf("-transport stream: %q, %v", o.transport, err)
	}
	for _, args := range [][]string{{}, {"-scenario", "nope"}, {"-scenario", "all", "-transport", "rest"}, {"-scenario", "all", "-rounds", "0"}, {"-scenario", "all", "-bs", "0"},
		{"-scenario", "all", "-bs", "16kb"}, {"-scenario", "all", "-bs", "65m"}, {"-scenario", "all", "x"}} {
		if _, err := parseOptions(args, io.Discard); err == nil {
			t.Errorf("parseOptions(%q) succeeded", args)
		}
	}
}

func TestErrorCode(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"rpc error: code = NotFound desc = soak/x: file not found", "NotFound"},
		{"Fsync: rpc error: code = DataLoss desc = sync failed", "DataLoss"},
		{"rpc error: code = Unavailable", "Unavailable"},
		{"short write", "short write"},
	} {
		if got := errorCode(tt.in); got != tt.want {
			t.Errorf("errorCode(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
