package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/daemonproc"
	"github.com/filewrite/filewrite/internal/testutil"
)

// growingFiles is how many files TestGrowingFilesKeepDaemonServing writes,
// and maxOpenFiles the daemon's bound, above it so that no file is closed
// for room (and its mappings with it).
const (
	growingFiles = 9000
	maxOpenFiles = 10000
)

// TestGrowingFilesKeepDaemonServing runs the reproduction of issue 36's
// first item against the daemon binary: a tokenless client writes, for
// each of 9,000 files, one byte at 0, eight over it, then for L = 1, 2, 4
// ... 64 MiB one byte at L and one over it (23 one-byte Writes a file; the
// files are sparse). A daemon that mapped each such file, and kept a
// mapping per doubling, held some 8 mappings a file and died at
// vm.max_map_count (65,530) near 8,400 files, every client then getting
// UNAVAILABLE. It runs with --max-open-files 10000, and RLIMIT_NOFILE
// raised to allow it, so that no file is closed for room whatever this
// machine's defaults: the daemon must serve to the end, and its mappings
// stay below half of vm.max_map_count. The load runs in a process of its
// own, built without the race detector (e2e/internal/growfiles).
func TestGrowingFilesKeepDaemonServing(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon")
	}
	raiseNoFile(t, maxOpenFiles+1024)
	dir := testutil.Dir(t)
	// Without -race whatever the test runs with: what is tested is the
	// daemon's own use of the address space, and the race detector
	// multiplies its CPU.
	bin := testutil.BuildDaemon(t, dir, false)
	load := buildGrowFiles(t, dir)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	proc, logs := testutil.StartDaemon(t, ctx, bin, "--root", filepath.Join(dir, "root"),
		"--max-open-files", fmt.Sprint(maxOpenFiles))

	start := time.Now()
	out, err := exec.CommandContext(ctx, load, "-addr", proc.GRPCAddr, "-files", fmt.Sprint(growingFiles)).CombinedOutput()
	if err != nil {
		t.Fatalf("the load, after %v: %v\n%s\nthe daemon's log:\n%s", time.Since(start).Round(time.Second), err, out, crashOrTail(logs.String()))
	}
	maps, maxMaps := processMappings(t, proc.Pid()), maxMapCount(t)
	t.Logf("%s in %v; the daemon holds %d mappings (vm.max_map_count %d)",
		strings.TrimSpace(string(out)), time.Since(start).Round(time.Second), maps, maxMaps)
	conn, err := grpc.NewClient(proc.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := filewritev1.NewFileServiceClient(conn)
	// Still serving: a write and a read back.
	if _, err := client.Write(ctx, &filewritev1.WriteRequest{Path: "after", Data: []byte("served")}); err != nil {
		t.Fatalf("Write after the files: %v", err)
	}
	r, err := client.Read(ctx, &filewritev1.ReadRequest{Path: "after", Length: 6})
	if err != nil || !bytes.Equal(r.GetData(), []byte("served")) {
		t.Fatalf("Read after the files: %q, %v", r.GetData(), err)
	}
	if maps > maxMaps/2+1024 {
		t.Errorf("the daemon holds %d mappings, want at most half of vm.max_map_count (%d) and the runtime's", maps, maxMaps)
	}
}

// buildGrowFiles compiles e2e/internal/growfiles, without the race
// detector, into dir.
func buildGrowFiles(t *testing.T, dir string) string {
	t.Helper()
	root, err := daemonproc.ModuleRoot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "growfiles")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "./e2e/internal/growfiles")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build of the load: %v\n%s", err, out)
	}
	return bin
}

// raiseNoFile raises this process's RLIMIT_NOFILE, which the daemon
// inherits, to at least need, or skips the test if it cannot: the
// daemon refuses a --max-open-files its limit cannot hold. Setting it
// also keeps os/exec from putting back, in the child, the soft limit the
// Go runtime raised at start.
func raiseNoFile(t *testing.T, need uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	old := lim
	lim.Max = max(lim.Max, need)
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skipf("RLIMIT_NOFILE is %d (hard %d) and cannot be raised to %d: %v", old.Cur, old.Max, need, err)
	}
}

// processMappings counts the mappings (VMAs) of process pid.
func processMappings(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(b, []byte{'\n'})
}

// maxMapCount is vm.max_map_count.
func maxMapCount(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/vm/max_map_count")
	if err != nil {
		t.Skipf("no vm.max_map_count: %v", err)
	}
	var n int
	if _, err := fmt.Sscan(string(b), &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// crashOrTail is the start of a Go runtime crash report in log, its
// fatal error and the stack of the goroutine that met it, or else the
// log's last lines.
func crashOrTail(log string) string {
	if i := strings.Index(log, "fatal error:"); i >= 0 {
		return log[i:min(len(log), i+1500)]
	}
	return log[max(0, len(log)-1500):]
}
