package main

import (
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/bojand/ghz/runner"
)

// fioPercentiles are the completion-latency percentiles fio prints by
// default ("clat percentiles (usec)"), so that the tables read like the
// kernel patches' own fio output.
var fioPercentiles = []float64{1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99, 99.5, 99.9, 99.95, 99.99}

// runResult is one timed run of one configuration.
type runResult struct {
	Column string
	Round  int
	// Count is the operations that completed, failed ones included.
	Count uint64
	// Errors counts failed operations by error text.
	Errors  map[string]int
	Elapsed time.Duration
	// Wall is how long the run took, set up and torn down included,
	// which is the time CPU was sampled over; Elapsed may be less (what
	// fio reports of its own runs).
	Wall time.Duration
	// CPU is what the run cost the daemon, the harness and the rest of
	// the machine.
	CPU cpuUsage
	// Daemon is the daemon's memory, descriptors and metrics after the
	// run, for comparisons that read them (daemonStats).
	Daemon *daemonStats
	// Allocs is the daemon's heap allocations during the run, 0 when it
	// was not counted.
	Allocs uint64
	// latencies of the successful operations, sorted.
	latencies []time.Duration
	// report is ghz's report of the run: ghz's own for the runs ghz
	// drives, one built from the same figures for the harness's own loops.
	report *runner.Report
	// Syncs is how many fdatasync/fsync calls the daemon issued during
	// the run, SyncCallers how many callers they covered, as the daemon's
	// filewrite_fsync_batch_size counts them; 0 when not counted.
	Syncs, SyncCallers float64
	// Spans is how many spans reached the harness's OTLP sink during the
	// run (the tracing scenario); 0 when not counted.
	Spans int64
	// pcts are the run's latency percentiles when another tool (fio)
	// measured them and the latencies themselves are not at hand.
	pcts map[float64]time.Duration
	// toolServer and toolClient are the CPU time of the processes a run
	// started and waited for itself, as server (nbdkit) and as client
	// (fio): the harness counts them with the daemon and with itself, not
	// as other load.
	toolServer, toolClient time.Duration
	// RSSAboveIdle is the daemon's peak resident memory during the run
	// above its idle level, for the runs that measure it (withPeakRSS);
	// 0 otherwise.
	RSSAboveIdle int64
	// Note says how the run did its work where that varies (a PUT made
	// in pieces); "" otherwise.
	Note string
}

// syncsPerOp is the daemon's syncs per operation of the run, 0 when not
// counted.
func (r *runResult) syncsPerOp() float64 {
	if r.Count == 0 {
		return 0
	}
	return r.Syncs / float64(r.Count)
}

// spansPerOp is the spans the sink received per operation of the run.
func (r *runResult) spansPerOp() float64 {
	if r.Count == 0 {
		return 0
	}
	return float64(r.Spans) / float64(r.Count)
}

// IOPS is completed operations per second, as fio counts them.
func (r *runResult) IOPS() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Count) / r.Elapsed.Seconds()
}

// percentile is the nearest-rank percentile p of the run's latencies.
func (r *runResult) percentile(p float64) time.Duration {
	if r.pcts != nil {
		return r.pcts[p]
	}
	return percentileOf(r.latencies, p)
}

func percentileOf(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	// The epsilon keeps float error (99.9/100*1000 = 999.0000000000001)
	// from moving the rank up by one.
	rank := int(math.Ceil(p/100*float64(len(sorted)) - 1e-9))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// median of xs (the lower middle of an even count, like the store's
// benchmarks); 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	return s[(len(s)-1)/2]
}

// loopResult turns the latencies and errors of one of the harness's own
// loops (no ghz involved) into a runResult carrying a report in ghz's
// format, so that its JSON and HTML read like ghz's.
func loopResult(column, call string, clients int, elapsed time.Duration, lats []time.Duration, errs map[string]int) *runResult {
	slices.Sort(lats)
	r := &runResult{Column: column, Count: uint64(len(lats)), Errors: errs, Elapsed: elapsed, latencies: lats}
	for _, n := range errs {
		r.Count += uint64(n)
	}
	rep := &runner.Report{
		Name:           column,
		EndReason:      runner.ReasonTimeout,
		Date:           time.Now(),
		Count:          r.Count,
		Total:          elapsed,
		Rps:            r.IOPS(),
		ErrorDist:      errs,
		StatusCodeDist: map[string]int{},
		Options:        runner.Options{Call: call, Concurrency: clients, Duration: elapsed, Insecure: true},
	}
	if len(lats) > 0 {
		rep.StatusCodeDist["OK"] = len(lats)
		var sum time.Duration
		for _, l := range lats {
			sum += l
		}
		rep.Average = sum / time.Duration(len(lats))
		rep.Fastest, rep.Slowest = lats[0], lats[len(lats)-1]
		for _, p := range []int{10, 25, 50, 75, 90, 95, 99} {
			rep.LatencyDistribution = append(rep.LatencyDistribution,
				runner.LatencyDistribution{Percentage: p, Latency: percentileOf(lats, float64(p))})
		}
		rep.Histogram = histogram(lats)
	}
	for text, n := range errs {
		rep.StatusCodeDist[errorCode(text)] += n
	}
	r.report = rep
	return r
}

// histogram is ghz's latency histogram: ten equal buckets from the fastest
// to the slowest latency, each marked by its upper bound in seconds.
func histogram(sorted []time.Duration) []runner.Bucket {
	const buckets = 10
	lo, hi := sorted[0].Seconds(), sorted[len(sorted)-1].Seconds()
	width := (hi - lo) / buckets
	out := make([]runner.Bucket, buckets+1)
	for i := range out {
		out[i].Mark = lo + width*float64(i)
	}
	out[buckets].Mark = hi
	i := 0
	for _, l := range sorted {
		for i < buckets && l.Seconds() > out[i].Mark {
			i++
		}
		out[i].Count++
	}
	for i := range out {
		out[i].Frequency = float64(out[i].Count) / float64(len(sorted))
	}
	return out
}

// errorCode is the gRPC code name in an error text ("...rpc error: code =
// NotFound desc = ..."), or the text itself: the harness's loops keep
// errors as text, prefixed with the call that failed.
func errorCode(text string) string {
	const marker = "rpc error: code = "
	i := strings.Index(text, marker)
	if i < 0 {
		return text
	}
	code, _, _ := strings.Cut(text[i+len(marker):], " ")
	return code
}

// fromGHZ turns ghz's report into a runResult. ghz keeps every call's
// latency in Details (up to a million), which is what the fio percentiles
// are computed from; only successful calls count, as in ghz's own
// distribution.
func fromGHZ(column string, rep *runner.Report) *runResult {
	r := &runResult{Column: column, Count: rep.Count, Errors: rep.ErrorDist, Elapsed: rep.Total, report: rep}
	r.latencies = make([]time.Duration, 0, len(rep.Details))
	for _, d := range rep.Details {
		if d.Error == "" {
			r.latencies = append(r.latencies, d.Latency)
		}
	}
	slices.Sort(r.latencies)
	return r
}
