package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/filewrite/filewrite/internal/daemonproc"
)

// daemon is one filewrite process started by the harness, serving gRPC on
// a loopback port the kernel picked.
type daemon struct {
	name string
	args []string
	root string // its --root
	addr string // the gRPC address it logged
	// httpAddr is the HTTP address it logged, "" unless its flags ask for
	// one (--http-addr): its /metrics gives the daemon's allocations.
	httpAddr string
	// pprofAddr is its --pprof-addr, "" for none (-profile gives one).
	pprofAddr string
	proc      *daemonproc.Process
	logf      *os.File
	// procs is how many threads run the daemon's Go code, from its start
	// record; 0 if it does not say.
	procs int
}

// startDaemon runs bin with args on a fresh data directory, dataDir, and
// returns once the daemon has logged its addresses. Its log goes to
// logPath, in JSON.
func startDaemon(ctx context.Context, name, bin, dataDir, logPath string, args []string) (*daemon, error) {
	return startDaemonEnv(ctx, name, bin, dataDir, logPath, args, nil)
}

// startDaemonEnv is startDaemon with env ("NAME=value", such as the
// OTEL_* variables that turn tracing on) added to the daemon's
// environment.
func startDaemonEnv(ctx context.Context, name, bin, dataDir, logPath string, args, env []string) (*daemon, error) {
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return nil, err
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	full := append([]string{
		"--root", dataDir,
		"--grpc-addr", "127.0.0.1:0",
		"--http-addr", "", // the harness speaks gRPC only
		"--log-format", "json",
	}, args...)
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	p, err := daemonproc.StartEnv(wait, bin, full, env, logf)
	if err != nil {
		logf.Close()
		return nil, fmt.Errorf("daemon %s: %w; its log is %s", name, err, logPath)
	}
	return &daemon{name: name, args: args, root: dataDir, addr: p.GRPCAddr, httpAddr: p.HTTPAddr, pprofAddr: flagValue(args, "--pprof-addr"),
		proc: p, logf: logf, procs: startedProcs(logPath)}, nil
}

// flagValue is the value args give flag (as "--flag value"; the last
// wins), "" if none.
func flagValue(args []string, flag string) string {
	v := ""
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			v = args[i+1]
		}
	}
	return v
}

// startedProcs is the procs attribute of the "filewrite started" record in
// the daemon's JSON log at path (the threads that run its Go code), 0 if
// the daemon logs none (an older one).
func startedProcs(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		var rec struct {
			Msg   string `json:"msg"`
			Procs int    `json:"procs"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "filewrite started" {
			return rec.Procs
		}
	}
	return 0
}

// mallocs is the daemon's count of heap allocations so far, from its
// /metrics (go_memstats_mallocs_total); 0 without an HTTP address.
func (d *daemon) mallocs(ctx context.Context) (uint64, error) {
	if d == nil || d.httpAddr == "" {
		return 0, nil
	}
	m, err := readMetrics(ctx, d.httpAddr)
	if err != nil {
		return 0, err
	}
	if len(m["go_memstats_mallocs_total"]) == 0 {
		return 0, fmt.Errorf("daemon %s: no go_memstats_mallocs_total in /metrics", d.name)
	}
	return uint64(m.sum("go_memstats_mallocs_total", "")), nil
}

// stop asks the daemon to drain (SIGTERM), and kills it if it has not
// exited after a while. A daemon that exits non-zero after SIGTERM failed
// its final sync, which stop reports.
func (d *daemon) stop() error {
	err := d.proc.Stop(30 * time.Second)
	d.logf.Close()
	if err != nil {
		return fmt.Errorf("daemon %s: %w", d.name, err)
	}
	return nil
}

// alive reports an error if the daemon has exited: a run against a dead
// daemon measures nothing.
func (d *daemon) alive() error {
	select {
	case <-d.proc.Exited():
		return fmt.Errorf("daemon %s exited: %v", d.name, d.proc.Wait())
	default:
		return nil
	}
}

// memory is a process's resident set as /proc/PID/status reports it.
type memory struct {
	// PeakRSS is VmHWM, the high-water mark of the resident set.
	PeakRSS int64 `json:"peak_rss_bytes"`
	// RSS is VmRSS, the resident set now.
	RSS int64 `json:"rss_bytes"`
	// RSSFile is RssFile, the part of RSS that is file pages mapped into
	// the process: the page cache of the files the daemon writes through
	// a mapping, which the kernel can reclaim (written back first).
	RSSFile int64 `json:"rss_file_bytes"`
}

// procMemory reads VmHWM, VmRSS and RssFile of pid.
func procMemory(pid int) (memory, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memory{}, err
	}
	var m memory
	for _, line := range strings.Split(string(data), "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok || (key != "VmHWM" && key != "VmRSS" && key != "RssFile") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 10, 64)
		if err != nil {
			return memory{}, fmt.Errorf("/proc/%d/status %s: %q", pid, key, val)
		}
		switch key {
		case "VmHWM":
			m.PeakRSS = kb << 10
		case "VmRSS":
			m.RSS = kb << 10
		default:
			m.RSSFile = kb << 10
		}
	}
	if m.PeakRSS == 0 || m.RSS == 0 {
		return memory{}, fmt.Errorf("/proc/%d/status has no VmHWM or VmRSS", pid)
	}
	return m, nil
}
