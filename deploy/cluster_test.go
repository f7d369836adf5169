// Package deploy holds the deployment files (docker-compose's configs,
// haproxy.cfg) and the tests that run them: three real daemons, each on its
// own root, behind the real HAProxy with deploy/haproxy.cfg, or behind
// grpc-go's ring_hash balancer.
package deploy

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"bytes"
	"github.com/filewrite/filewrite/internal/daemonproc"
	"github.com/filewrite/filewrite/internal/testutil"
)

// daemonBin is the filewrite daemon built once for the package by TestMain.
var daemonBin string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "filewrite-deploy-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		// Not built with -race: these tests check where requests go, the
		// daemon's own races are the service package's tests'.
		if daemonBin, err = daemonproc.Build(context.Background(), dir, false); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		// The daemon's own leaks are the in-process packages' to find;
		// here, the tests' (their clients, their watchers of the child).
		return testutil.RunAndFindLeaks(m)
	}())
}

// clusterDaemon is one filewrite process on loopback ports the kernel
// picked, serving its own root.
type clusterDaemon struct {
	*daemonproc.Process
	root string
}

// startDaemons starts n daemons, each on a fresh root, and stops them when
// the test ends.
func startDaemons(t *testing.T, n int, args ...string) []*clusterDaemon {
	t.Helper()
	ds := make([]*clusterDaemon, n)
	for i := range ds {
		ds[i] = startDaemon(t, args...)
	}
	return ds
}

// startDaemon starts a daemon on a fresh root, with args after --root.
func startDaemon(t *testing.T, args ...string) *clusterDaemon {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	root := t.TempDir()
	p, _ := testutil.StartDaemon(t, ctx, daemonBin, append([]string{"--root", root}, args...)...)
	d := &clusterDaemon{Process: p, root: root}
	t.Cleanup(d.stop)
	return d
}

// stop drains the daemon with SIGTERM, as an operator would, and kills it
// if it is still running after a while.
func (d *clusterDaemon) stop() { d.Stop(30 * time.Second) }

// owners lists the daemons whose root holds rel.
func owners(ds []*clusterDaemon, rel string) []int {
	var got []int
	for i, d := range ds {
		if _, err := os.Lstat(filepath.Join(d.root, rel)); err == nil {
			got = append(got, i)
		}
	}
	return got
}

// checkSharding holds a way of reaching the cluster to its promise. It
// runs lifecycle for every file (clusterFiles of them, on 8 workers), and
// checks that each file is whole, as written and truncated, on exactly one
// daemon, and that each daemon has some. It then stops one daemon and runs
// afterStop for every file with its daemon and the stopped one (on 64
// workers: a call to a stopped daemon may be retried for long), and checks
// that no file moved: none of the stopped daemon's is recreated elsewhere.
func checkSharding(t *testing.T, ds []*clusterDaemon, lifecycle func(i int) error, afterStop func(i, owner, down int) error) {
	t.Helper()
	errs := make([]error, clusterFiles)
	forEach(clusterFiles, 8, func(i int) { errs[i] = lifecycle(i) })
	for i, err := range errs {
		if err != nil {
			t.Fatalf("file %d: %v", i, err)
		}
	}
	owner := make([]int, clusterFiles)
	perDaemon := make([]int, len(ds))
	for i := range owner {
		got := owners(ds, clusterPath(i))
		if len(got) != 1 {
			t.Fatalf("%s is on daemons %v, want exactly one", clusterPath(i), got)
		}
		owner[i] = got[0]
		perDaemon[got[0]]++
		data, err := os.ReadFile(filepath.Join(ds[got[0]].root, clusterPath(i)))
		if err != nil {
			t.Fatal(err)
		}
		if want := content(i, 2*halfSize)[:truncSize]; !bytes.Equal(data, want) {
			t.Fatalf("%s on daemon %d: %d bytes, not the %d written and truncated", clusterPath(i), got[0], len(data), len(want))
		}
	}
	t.Logf("files per daemon: %v", perDaemon)
	for d, n := range perDaemon {
		if n == 0 {
			t.Fatalf("daemon %d owns none of %d files: %v", d, clusterFiles, perDaemon)
		}
	}

	const down = 1
	ds[down].stop()
	forEach(clusterFiles, 64, func(i int) { errs[i] = afterStop(i, owner[i], down) })
	for i, err := range errs {
		if err != nil {
			t.Errorf("file %d: %v", i, err)
		}
	}
	for i := range owner {
		if got := owners(ds, clusterPath(i)); len(got) != 1 || got[0] != owner[i] {
			t.Errorf("%s is on daemons %v after daemon %d stopped, want only %d", clusterPath(i), got, down, owner[i])
		}
	}
}

// startHAProxy runs HAProxy with deploy/haproxy.cfg in front of ds (three
// daemons, the config's three servers) and returns its REST and gRPC
// addresses. It skips the test when haproxy is not installed.
func startHAProxy(t *testing.T, ds []*clusterDaemon) (restAddr, grpcAddr string) {
	t.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		t.Skip("haproxy is not installed (Debian: apt-get install haproxy; .ci/run installs it), so the proxy's routing is not tested")
	}
	if len(ds) != 3 {
		t.Fatalf("haproxy.cfg has three servers, not %d", len(ds))
	}
	restAddr, grpcAddr = testutil.FreeAddr(t), testutil.FreeAddr(t)
	cmd := exec.Command(bin, "-f", "haproxy.cfg", "-db")
	cmd.Env = append(os.Environ(),
		"FILEWRITE_REST_BIND="+restAddr,
		"FILEWRITE_GRPC_BIND="+grpcAddr,
	)
	for i, d := range ds {
		cmd.Env = append(cmd.Env,
			fmt.Sprintf("FILEWRITE_%d_HTTP=%s", i+1, d.HTTPAddr),
			fmt.Sprintf("FILEWRITE_%d_GRPC=%s", i+1, d.GRPCAddr))
	}
	var log testutil.LockedBuffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-exited
		if t.Failed() {
			t.Logf("haproxy's log:\n%s", log.String())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, a := range []string{restAddr, grpcAddr} {
		for {
			c, err := net.Dial("tcp", a)
			if err == nil {
				c.Close()
				break
			}
			select {
			case <-exited:
				t.Fatalf("haproxy exited before it listened on %s:\n%s", a, log.String())
			case <-ctx.Done():
				t.Fatalf("haproxy did not listen on %s within 20s:\n%s", a, log.String())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return restAddr, grpcAddr
}

// forEach runs f(i) for i in [0, n) on workers goroutines.
func forEach(n, workers int, f func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(i)
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
}

// content is file i's bytes: distinct per file and per offset.
func content(i, n int) []byte {
	b := make([]byte, n)
	for k := range b {
		b[k] = byte(i*7 + k*13 + k/251)
	}
	return b
}
