package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// buildDaemon compiles the filewrite daemon (the module's root package) into
// dir, so that every configuration runs the same binary, built from the
// tree the harness belongs to.
func buildDaemon(ctx context.Context, dir string) (string, error) {
	gomod, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	if root == "." || root == "" || strings.TrimSpace(string(gomod)) == os.DevNull {
		return "", errors.New("not inside the filewrite module: run the harness from a checkout (go run ./loadtest)")
	}
	bin, err := filepath.Abs(filepath.Join(dir, "filewrite"))
	if err != nil {
		return "", err
	}
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build of the daemon: %w\n%s", err, out)
	}
	return bin, nil
}

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
	cmd      *exec.Cmd
	// exited is closed once the process has been waited for; err is then
	// what Wait returned.
	exited chan struct{}
	err    error
	logf   *os.File
}

// startDaemon runs bin with args on a fresh data directory, dataDir, and
// returns once the daemon has logged its gRPC address. Its log goes to
// logPath.
func startDaemon(ctx context.Context, name, bin, dataDir, logPath string, args []string) (*daemon, error) {
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
	d := &daemon{name: name, args: args, root: dataDir, cmd: exec.Command(bin, full...), exited: make(chan struct{}), logf: logf}
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if err := d.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start daemon %s: %w", name, err)
	}
	addrc := make(chan string, 1)
	httpc := make(chan string, 1)
	go func() {
		// The log is copied whole to logPath; the "listening" records
		// give the addresses, since port 0 was asked for.
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			logf.Write(append(sc.Bytes(), '\n'))
			var rec struct{ Msg, Protocol, Addr string }
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "listening" {
				switch rec.Protocol {
				case "grpc":
					addrc <- rec.Addr
				case "http":
					httpc <- rec.Addr
				}
			}
		}
		io.Copy(io.Discard, stderr)
		d.err = d.cmd.Wait()
		close(d.exited)
	}()
	select {
	case d.addr = <-addrc:
		if wantsHTTP(full) {
			// Logged right after the gRPC address.
			select {
			case d.httpAddr = <-httpc:
			case <-d.exited:
				return nil, fmt.Errorf("daemon %s exited (%v); its log is %s", name, d.err, logPath)
			}
		}
		return d, nil
	case <-d.exited:
		logf.Close()
		return nil, fmt.Errorf("daemon %s exited before it listened (%v); its log is %s", name, d.err, logPath)
	case <-time.After(30 * time.Second):
		d.stop()
		return nil, fmt.Errorf("daemon %s logged no gRPC address within 30s; its log is %s", name, logPath)
	case <-ctx.Done():
		d.stop()
		return nil, ctx.Err()
	}
}

// wantsHTTP reports whether args, a daemon's flags, give it an HTTP
// address: the last --http-addr wins.
func wantsHTTP(args []string) bool {
	want := true // the daemon's default
	for i, a := range args {
		switch {
		case a == "--http-addr" && i+1 < len(args):
			want = args[i+1] != ""
		case strings.HasPrefix(a, "--http-addr="):
			want = a != "--http-addr="
		}
	}
	return want
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
	select {
	case <-d.exited:
	default:
		d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(30 * time.Second):
			d.cmd.Process.Kill()
			<-d.exited
		}
	}
	d.logf.Close()
	if d.err != nil {
		return fmt.Errorf("daemon %s: %w", d.name, d.err)
	}
	return nil
}

// alive reports an error if the daemon has exited: a run against a dead
// daemon measures nothing.
func (d *daemon) alive() error {
	select {
	case <-d.exited:
		return fmt.Errorf("daemon %s exited: %v", d.name, d.err)
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
}

// procMemory reads VmHWM and VmRSS of pid.
func procMemory(pid int) (memory, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memory{}, err
	}
	var m memory
	for _, line := range strings.Split(string(data), "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok || (key != "VmHWM" && key != "VmRSS") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 10, 64)
		if err != nil {
			return memory{}, fmt.Errorf("/proc/%d/status %s: %q", pid, key, val)
		}
		if key == "VmHWM" {
			m.PeakRSS = kb << 10
		} else {
			m.RSS = kb << 10
		}
	}
	if m.PeakRSS == 0 || m.RSS == 0 {
		return memory{}, fmt.Errorf("/proc/%d/status has no VmHWM or VmRSS", pid)
	}
	return m, nil
}
