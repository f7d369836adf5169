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
// serves its file on a unix socket and the client package drives it, one
// Client with a File per caller, so that the callers' writes share one
// WriteStream as fio's share one NBD connection. Both files are written in
// full in prepareChunk chunks and synced before the runs.

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

// peer compares the two at 4 KiB random writes below EOF; durable asks
// each write to be durable: fio --fsync=1 (an NBD flush after every write,
// which nbdkit's file plugin turns into a sync of the file) against
// client.WithSync(SyncData).
func (e *env) peer(durable bool) *comparison {
	bs := e.bs(4 << 10)
	size := e.fileSize(64<<20, bs)
	clients := e.clients(32)
	name, title, sync, fsync := "peer", "random %s writes below EOF of a written %s file, queue depth %d, unix sockets", client.SyncNone, 0
	if durable {
		name, title, sync, fsync = "peer-durable", "random %s durable writes below EOF of a written %s file, queue depth %d, unix sockets", client.SyncData, 1
	}
	const path = "loadtest/peer.dat"
	// In the work directory, removed with it; a unix socket's path must
	// fit in 108 bytes.
	sock := filepath.Join(e.work, name+".sock")
	return &comparison{
		name:  name,
		title: fmt.Sprintf(title, sizeName(bs), sizeName(size), clients),
		preparation: fmt.Sprintf("each written in full to %s in %s chunks (prepareChunk), then synced: pwrite(2)+fsync for nbdkit's, Write+Fsync for filewrite's",
			sizeName(size), sizeName(prepareChunk)),
		clients: clients, bs: bs,
		columns: []column{
			{name: "nbdkit-fio", setup: setupRawFile(size), run: nbdkitFio(size, fsync), after: syncRawFile},
			{name: "filewrite-stream", daemon: []string{"--grpc-addr", "unix:" + sock},
				setup: func(ctx context.Context, s *session) error {
					return writeFile(ctx, s.client, path, size)
				},
				run:       clientWrites(path, size, sync),
				after:     func(ctx context.Context, s *session) error { return fsyncFile(ctx, s.client, path) },
				transport: transportStream},
		},
		ratios: [][2]string{{"filewrite-stream", "nbdkit-fio"}},
	}
}

// nbdkitFio is one run of fio's nbd engine against nbdkit's file plugin
// serving the column's raw file on a unix socket. nbdkit runs with as many
// threads as fio has requests in flight (its default is 16), so that it
// serves the whole queue depth; fsync is fio's --fsync (1: a flush after
// every write). nbdkit is started and stopped by the run, untimed.
func nbdkitFio(fileSize int64, fsync int) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		sockDir, err := os.MkdirTemp("", "loadtest-nbd-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(sockDir)
		sock := filepath.Join(sockDir, "nbd.sock")
		nbd := exec.Command("nbdkit", "--foreground", "--exit-with-parent", "--unix", sock,
			"--threads", strconv.Itoa(s.clients), "file", "file="+rawFile(s))
		logf, err := os.Create(filepath.Join(s.dir, "nbdkit.log"))
		if err != nil {
			return nil, err
		}
		defer logf.Close()
		nbd.Stdout, nbd.Stderr = logf, logf
		if err := nbd.Start(); err != nil {
			return nil, fmt.Errorf("start nbdkit: %w", err)
		}
		defer func() {
			nbd.Process.Signal(syscall.SIGTERM)
			nbd.Wait()
		}()
		for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat(sock); err == nil {
				break
			}
			if time.Since(start) > 10*time.Second {
				return nil, fmt.Errorf("nbdkit made no socket within 10s; see %s", logf.Name())
			}
		}
		out := filepath.Join(s.dir, fmt.Sprintf("fio-r%d.json", s.round))
		args := []string{"--name=peer", "--ioengine=nbd", "--uri=nbd+unix:///?socket=" + sock,
			"--rw=randwrite", "--bs=" + strconv.Itoa(s.bs), "--iodepth=" + strconv.Itoa(s.clients),
			"--size=" + strconv.FormatInt(fileSize, 10), "--fsync=" + strconv.Itoa(fsync),
			"--time_based", "--runtime=" + strconv.FormatInt(s.duration.Milliseconds(), 10) + "ms",
			"--output-format=json", "--output=" + out}
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
		s.done.Add(int64(r.Count))
		return r, nil
	}
}

// fromFio reads fio's JSON output: one job's writes, their count, runtime
// and completion-latency percentiles (fio's defaults are the same as
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
	r := loopResult("", "fio nbd randwrite", 0, elapsed, nil, errs)
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
