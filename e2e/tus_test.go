package e2e

// Resumable uploads by the stock tus clients, across a SIGKILL of the
// daemon: tuspy (Debian's python3-tuspy) and tus-js-client (npm, in
// e2e/testdata/tusjs) in headless Chromium, from a page of another origin
// listed in --http-allowed-origins. Each client uploads in chunks, the
// daemon is killed mid-upload and restarted on the same address, the
// client resumes where the daemon says it stands (HEAD), and the file
// published at the end holds the bytes sent. .ci/run installs the clients;
// a test whose client is missing says so and skips.

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/filewrite/filewrite/internal/daemonproc"
	"github.com/filewrite/filewrite/internal/testutil"
)

// tusPattern is the bytes the clients upload: byte i is (7i + i>>12) mod
// 256, computed the same way by the page's JavaScript.
func tusPattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>12)
	}
	return b
}

// stagedBytes is how many bytes the daemon keeps staged for tus uploads
// under root: what it acknowledged, and perhaps part of a PATCH.
func stagedBytes(root string) int64 {
	names, _ := filepath.Glob(filepath.Join(root, ".filewrite", "staged", "tus-*"))
	var n int64
	for _, name := range names {
		if fi, err := os.Stat(name); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// killAndRestart waits until the daemon has at least atLeast bytes staged,
// kills it with SIGKILL, and starts it again on the same root and address.
func killAndRestart(t *testing.T, ctx context.Context, proc *daemonproc.Process, root string, atLeast int64, args ...string) *daemonproc.Process {
	t.Helper()
	for stagedBytes(root) < atLeast {
		select {
		case <-ctx.Done():
			t.Fatalf("the upload did not get to %d bytes: %d staged", atLeast, stagedBytes(root))
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := proc.Kill(); err != nil {
		t.Fatal(err)
	}
	proc.Wait()
	t.Logf("killed the daemon with %d bytes staged", stagedBytes(root))
	time.Sleep(time.Second) // the client meets a daemon that is not there
	restarted, logs := testutil.StartDaemon(t, ctx, daemonBin, append([]string{"--root", root, "--http-addr", proc.HTTPAddr}, args...)...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("restarted daemon's log:\n%s", logs)
		}
	})
	return restarted
}

// checkUploaded checks that the upload published want at p below root,
// and that the client resumed its upload rather than starting another:
// the daemon keeps one record, the complete upload's.
func checkUploaded(t *testing.T, root, p string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(filepath.Join(root, p))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		i := 0
		for i < min(len(got), len(want)) && got[i] == want[i] {
			i++
		}
		t.Fatalf("%s: %d bytes, want %d; first difference at %d", p, len(got), len(want), i)
	}
	recs, _ := filepath.Glob(filepath.Join(root, ".filewrite", "records", "tus-*"))
	if len(recs) != 1 {
		t.Errorf("%d uploads recorded, want 1: the client started over instead of resuming", len(recs))
	}
	if n := stagedBytes(root); n != 0 {
		t.Errorf("%d bytes still staged after the upload completed", n)
	}
}

const tuspyScript = `
import sys
from tusclient import client
url, path, target = sys.argv[1], sys.argv[2], sys.argv[3]
c = client.TusClient(url)
u = c.uploader(path, chunk_size=1 << 20, retries=60, retry_delay=1, upload_checksum=True,
               metadata={"path": target, "filetype": "application/octet-stream"})
u.upload()
print("uploaded", u.url)
`

// TestTuspyResumesAcrossKill uploads 32 MiB with tuspy in PATCHes of 1
// MiB, each with an Upload-Checksum, and kills the daemon midway.
func TestTuspyResumesAcrossKill(t *testing.T) {
	python := "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import tusclient").Run(); err != nil {
		t.Skipf("tuspy is not installed (Debian: apt-get install python3-tuspy; .ci/run installs it): %v", err)
	}
	ctx, root, proc, logs := startFresh(t, 3*time.Minute)
	want := tusPattern(32 << 20)
	src := filepath.Join(testutil.Dir(t), "src.bin")
	if err := os.WriteFile(src, want, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, python, "-c", tuspyScript, "http://"+proc.HTTPAddr+"/v1/uploads/", src, "py/big.bin")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	killAndRestart(t, ctx, proc, root, 8<<20)
	if err := <-done; err != nil {
		t.Fatalf("tuspy: %v\n%s\nfirst daemon's log:\n%s", err, out.String(), logs)
	}
	checkUploaded(t, root, "py/big.bin", want)
}

// tusPage uploads a Blob of 64 MiB with tus-js-client in chunks of 5 MiB
// to the daemon at %[1]s, retrying through the daemon's absence, and
// reports to the page's own origin.
const tusPage = `<!doctype html>
<meta charset="utf-8">
<title>tus upload</title>
<script src="/tus.min.js"></script>
<script>
const N = 64 * 1024 * 1024;
const buf = new Uint8Array(N);
for (let i = 0; i < N; i++) buf[i] = (i * 7 + (i >>> 12)) & 255;
const report = (what, v) => fetch('/report?' + what + '=' + encodeURIComponent(v), {method: 'POST'}).catch(() => {});
const upload = new tus.Upload(new Blob([buf]), {
  endpoint: '%[1]s/v1/uploads/',
  chunkSize: 5 * 1024 * 1024,
  retryDelays: Array(120).fill(500),
  storeFingerprintForResuming: false,
  metadata: {path: 'web/blob.bin', filetype: 'application/octet-stream'},
  onChunkComplete: (size, accepted, total) => report('accepted', accepted),
  onError: (e) => report('error', String(e)),
  onSuccess: () => report('done', upload.url),
});
upload.start();
</script>
`

// TestTusJSInChromium uploads from a page of another origin, listed in
// --http-allowed-origins, in headless Chromium, and kills the daemon
// midway.
func TestTusJSInChromium(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)")
	}
	bundle, err := filepath.Abs("testdata/tusjs/node_modules/tus-js-client/dist/tus.min.js")
	if err == nil {
		_, err = os.Stat(bundle)
	}
	if err != nil {
		t.Skipf("tus-js-client is not installed (npm ci --prefix e2e/testdata/tusjs; .ci/run does): %v", err)
	}

	// The page's origin: a server of its own, on another port.
	var mu sync.Mutex
	reports := make(chan string, 256)
	var daemonURL string
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		url := daemonURL
		mu.Unlock()
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, tusPage, url)
	})
	mux.HandleFunc("/tus.min.js", func(w http.ResponseWriter, r *http.Request) { http.ServeFile(w, r, bundle) })
	mux.HandleFunc("/report", func(w http.ResponseWriter, r *http.Request) {
		select {
		case reports <- r.URL.RawQuery:
		default:
		}
	})
	page := httptest.NewServer(mux)
	defer page.Close()

	ctx, root, proc, logs := startFresh(t, 4*time.Minute, "--http-allowed-origins", page.URL)
	mu.Lock()
	daemonURL = "http://" + proc.HTTPAddr
	mu.Unlock()
	if host, _, _ := net.SplitHostPort(proc.HTTPAddr); !strings.HasPrefix(page.URL, "http://"+host) {
		t.Fatalf("page %s and daemon %s: want both on loopback", page.URL, proc.HTTPAddr)
	}

	cmd := exec.Command(chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
		"--user-data-dir="+testutil.Dir(t), page.URL)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out testutil.LockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		// Chromium's own processes are in its process group.
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	}()

	killAndRestart(t, ctx, proc, root, 20<<20, "--http-allowed-origins", page.URL)
	for {
		select {
		case <-ctx.Done():
			t.Fatalf("no end to the upload: %d bytes staged\nchromium:\n%s\nfirst daemon's log:\n%s", stagedBytes(root), out.String(), logs)
		case rep := <-reports:
			switch {
			case strings.HasPrefix(rep, "error="):
				t.Fatalf("tus-js-client: %s", rep)
			case strings.HasPrefix(rep, "done="):
				checkUploaded(t, root, "web/blob.bin", tusPattern(64<<20))
				return
			}
		}
	}
}
