package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/bojand/ghz/runner"

	"github.com/filewrite/filewrite/client"
)

// The peer comparison: filewrite against nbdkit, a server that does the
// same job (positional writes into one file, pipelined over one
// connection), on the same machine and file system. nbdkit's file plugin
// serves a file on a unix socket and fio's nbd engine drives it; filewrite
// serves its file on a unix socket and the client package drives it. Two
// client shapes: peer, one Client with a File per caller, so that the
// callers' writes share one WriteStream as fio's share one NBD
// connection; peer-streams, several Clients (so several connections and
// streams) with a few callers each, as several fio jobs of a few requests
// in flight each. peer-durable also runs fio itself on a file of its own,
// pwrite plus fdatasync per write from as many jobs as there are writes in
// flight: the limit of the disk and the kernel for durable writes at that
// depth. Every file is written in full in prepareChunk chunks and synced
// before the runs, and fio is told not to drop its file's page cache, so
// that all start from the same cache state.

// peerStreams is peer-streams' number of streams (fio jobs); the callers
// are shared among them.
const peerStreams = 8

// peerMissing says which of the peer's tools is not installed, "" when
// both are.
func peerMissing() string {
	for _, tool := range []string{"nbdkit", "fio"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool
		}
	}
	return ""
}

// peer compares the two at 4 KiB random writes below EOF over one
// connection; durable asks each write to be durable: fio --fsync=1 (an
// NBD flush after every write, which nbdkit's file plugin turns into a
// sync of the file) against client.WithSync(SyncData), with fio's own
// fdatasync-per-write run beside them.
func (e *env) peer(durable bool) *comparison {
	c := e.peerComparison("peer", 1, durable)
	if durable {
		c.columns = append(c.columns, column{name: "fio-fdatasync", setup: setupRawFile(c.fileSize), run: fioFdatasync(c.fileSize), after: syncRawFile})
		c.ratios = append(c.ratios, [2]string{"filewrite-stream", "fio-fdatasync"})
	}
	return c.comparison
}

// peerMany is peer over peerStreams connections: fio's jobs each with its
// own NBD connection, filewrite's callers shared among as many Clients,
// each with its own connection and stream.
func (e *env) peerMany() *comparison {
	return e.peerComparison("peer-streams", peerStreams, false).comparison
}

// peerSetup is a peer comparison with the size of its file.
type peerSetup struct {
	*comparison
	fileSize int64
}

// peerComparison is a peer comparison over streams connections (one
// Client, or one fio job, each), durable or not.
func (e *env) peerComparison(name string, streams int, durable bool) peerSetup {
	bs := e.bs(4 << 10)
	size := e.fileSize(64<<20, bs)
	clients := e.clients(32)
	streams = max(1, min(streams, clients))
	sync, fsync, kind := client.SyncNone, 0, ""
	if durable {
		name, sync, fsync, kind = name+"-durable", client.SyncData, 1, "durable "
	}
	path := "loadtest/" + name + ".dat"
	shape := "over one connection"
	if streams > 1 {
		shape = fmt.Sprintf("over %d connections of %d in flight each", streams, clients/streams)
	}
	// In the work directory, removed with it; a unix socket's path must
	// fit in 108 bytes.
	sock := filepath.Join(e.work, name+".sock")
	filewrite := peerColumn(path, size, sync, streams)
	return peerSetup{fileSize: size, comparison: &comparison{
		name: name,
		title: fmt.Sprintf("random %s %swrites below EOF of a written %s file, queue depth %d %s, unix sockets",
			sizeName(bs), kind, sizeName(size), clients, shape),
		preparation: fmt.Sprintf("each written in full to %s in %s chunks (prepareChunk), then synced: pwrite(2)+fsync for nbdkit's and fio's, Write+Fsync for filewrite's",
			sizeName(size), sizeName(prepareChunk)),
		clients: clients, connections: streams, bs: bs,
		columns: []column{
			{name: "nbdkit-fio", setup: setupRawFile(size), run: nbdkitFio(size, fsync, streams), after: syncRawFile},
			filewrite("filewrite-stream", sock),
			// The same daemon with one thread of Go code (--procs 1): on
			// a machine of two CPUs shared with the clients, a stream's
			// goroutines then hand off without waking another thread
			// (docs/design.md, "How many threads").
			filewrite("filewrite-procs1-stream", filepath.Join(e.work, name+"-p1.sock"), "--procs", "1"),
		},
		ratios: [][2]string{{"filewrite-stream", "nbdkit-fio"}, {"filewrite-procs1-stream", "nbdkit-fio"}},
	}}
}

// peerColumn is a filewrite column of a peer comparison: its daemon
// listening on the unix socket sock with flags, its clients writing path
// of size through the client package over streams connections.
func peerColumn(path string, size int64, sync client.SyncMode, streams int) func(name, sock string, flags ...string) column {
	return func(name, sock string, flags ...string) column {
		return column{name: name, daemon: append([]string{"--grpc-addr", "unix:" + sock, "--http-addr", "127.0.0.1:0"}, flags...),
			setup: func(ctx context.Context, s *session) error {
				return writeFile(ctx, s.client, path, size)
			},
			run:       countSyncs(clientWritesOver(path, size, sync, streams)),
			after:     func(ctx context.Context, s *session) error { return fsyncFile(ctx, s.client, path) },
			transport: transportStream}
	}
}

// nbdkitFio is one run of fio's nbd engine against nbdkit's file plugin
// serving the column's raw file on a unix socket, with jobs fio jobs (so
// NBD connections) sharing s.clients requests in flight. nbdkit runs
// with as many threads per connection as a job has requests in flight
// (its default is 16), so that it serves the whole queue depth; fsync is
// fio's --fsync (1: a flush after every write). nbdkit is started and
// stopped by the run, untimed; its CPU time counts as the server's, fio's
// as the harness's.
func nbdkitFio(fileSize int64, fsync, jobs int) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		depth := max(1, s.clients/jobs)
		sockDir, err := os.MkdirTemp("", "loadtest-nbd-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(sockDir)
		sock := filepath.Join(sockDir, "nbd.sock")
		nbd := exec.Command("nbdkit", "--foreground", "--exit-with-parent", "--unix", sock,
			"--threads", strconv.Itoa(depth), "file", "file="+rawFile(s))
		logf, err := os.Create(filepath.Join(s.dir, "nbdkit.log"))
		if err != nil {
			return nil, err
		}
		defer logf.Close()
		nbd.Stdout, nbd.Stderr = logf, logf
		if err := nbd.Start(); err != nil {
			return nil, fmt.Errorf("start nbdkit: %w", err)
		}
		stopped := false
		stop := func() {
			if !stopped {
				stopped = true
				nbd.Process.Signal(syscall.SIGTERM)
				nbd.Wait()
			}
		}
		defer stop()
		for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat(sock); err == nil {
				break
			}
			if time.Since(start) > 10*time.Second {
				return nil, fmt.Errorf("nbdkit made no socket within 10s; see %s", logf.Name())
			}
		}
		r, err := runFio(ctx, s, "nbd", "--ioengine=nbd", "--uri=nbd+unix:///?socket="+sock,
			"--numjobs="+strconv.Itoa(jobs), "--iodepth="+strconv.Itoa(depth),
			"--size="+strconv.FormatInt(fileSize, 10), "--fsync="+strconv.Itoa(fsync))
		if err != nil {
			return nil, err
		}
		stop()
		r.toolServer = processCPU(nbd.ProcessState)
		return r, nil
	}
}

// fioFdatasync is fio alone on the column's raw file: s.clients jobs, each
// a pwrite(2) and an fdatasync(2) per write, the durable writes' limit at
// that many in flight without any server.
func fioFdatasync(fileSize int64) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		return runFio(ctx, s, "fdatasync", "--ioengine=psync", "--filename="+rawFile(s),
			"--numjobs="+strconv.Itoa(s.clients), "--fdatasync=1", "--invalidate=0",
			"--size="+strconv.FormatInt(fileSize, 10))
	}
}

// runFio runs fio's random writes of s.bs for s.duration with args, its
// jobs reported as one, and returns its figures; fio's CPU time counts
// as the harness's.
func runFio(ctx context.Context, s *session, name string, args ...string) (*runResult, error) {
	out := filepath.Join(s.dir, fmt.Sprintf("fio-%s-r%d.json", name, s.round))
	args = append([]string{"--name=" + name, "--rw=randwrite", "--bs=" + strconv.Itoa(s.bs), "--group_reporting",
		"--time_based", "--runtime=" + strconv.FormatInt(s.duration.Milliseconds(), 10) + "ms",
		"--output-format=json", "--output=" + out}, args...)
	fio := exec.CommandContext(ctx, "fio", args...)
	if msg, err := fio.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("fio %q: %w\n%s", args, err, msg)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		return nil, err
	}
	r, err := fromFio(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", out, err)
	}
	r.toolClient = processCPU(fio.ProcessState)
	s.done.Add(int64(r.Count))
	return r, nil
}

// processCPU is the user and system time of a process that was waited
// for; 0 if it was not.
func processCPU(ps *os.ProcessState) time.Duration {
	if ps == nil {
		return 0
	}
	return ps.UserTime() + ps.SystemTime()
}

// fromFio reads fio's JSON output: one job's writes (or its jobs', as
// --group_reporting sums them), their count, runtime and
// completion-latency percentiles (fio's defaults are the same as
// fioPercentiles).
func fromFio(data []byte) (*runResult, error) {
	var out struct {
		Jobs []struct {
			Error int `json:"error"`
			Write struct {
				TotalIOs uint64 `json:"total_ios"`
				Runtime  int64  `json:"runtime"` // ms
				ClatNS   struct {
					Percentile map[string]float64 `json:"percentile"`
				} `json:"clat_ns"`
			} `json:"write"`
		} `json:"jobs"`
	}
	// fio may print notes before its JSON.
	if i := bytes.IndexByte(data, '{'); i > 0 {
		data = data[i:]
	}
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, err
	}
	if len(out.Jobs) != 1 {
		return nil, fmt.Errorf("%d jobs, want 1", len(out.Jobs))
	}
	j := out.Jobs[0]
	errs := map[string]int{}
	if j.Error != 0 {
		errs[fmt.Sprintf("fio: error %d", j.Error)] = 1
	}
	elapsed := time.Duration(j.Write.Runtime) * time.Millisecond
	r := loopResult("", "fio randwrite", 0, elapsed, nil, errs)
	r.Count = j.Write.TotalIOs
	r.report.Count, r.report.Rps = r.Count, r.IOPS()
	r.pcts = map[float64]time.Duration{}
	for k, ns := range j.Write.ClatNS.Percentile {
		p, err := strconv.ParseFloat(k, 64)
		if err != nil {
			return nil, fmt.Errorf("percentile %q", k)
		}
		r.pcts[p] = time.Duration(ns)
	}
	r.report.StatusCodeDist = map[string]int{"OK": int(r.Count)}
	for _, p := range []int{10, 50, 90, 95, 99} {
		r.report.LatencyDistribution = append(r.report.LatencyDistribution,
			runner.LatencyDistribution{Percentage: p, Latency: r.pcts[float64(p)]})
	}
	return r, nil
}
