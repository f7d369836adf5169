package e2e

// The doors' goals, measured as ratios side by side in one run against
// the daemon binary (docs/benchmarks.md):
//
//	go test ./e2e -run '^$' -bench 'TusVsPut|RcloneWebDAV' -benchtime 1x
//
// FILEWRITE_BENCH_TUS_BYTES (default 1g) sizes the tus upload and the PUT;
// FILEWRITE_BENCH_DAV_FILES (default 1000) counts rclone's files of 64 KiB;
// FILEWRITE_RCLONE names the rclone to run (default: rclone on PATH).
// rclone's WebDAV backend waits 10 ms between its requests (its pacer),
// which caps a copy at about 33 files a second whatever the server; an
// rclone that has --webdav-pacer-min-sleep (1.63 and later) is run with
// it at 0, so that the server is what is measured.

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/filewrite/filewrite/internal/bytesize"
)

func benchEnvSize(b *testing.B, name string, def int64) int64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := bytesize.Parse(v)
	if err != nil {
		b.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}

// tusUpload uploads data to the tus door at base in PATCHes of chunk
// bytes, as a tus client does.
func tusUpload(ctx context.Context, base, target string, data []byte, chunk int) error {
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/uploads/", nil)
	req.Header.Set("Tus-Resumable", "1.0.0")
	req.Header.Set("Upload-Length", strconv.Itoa(len(data)))
	req.Header.Set("Upload-Metadata", "path "+base64.StdEncoding.EncodeToString([]byte(target)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("POST: %s", resp.Status)
	}
	url := resp.Header.Get("Location")
	for off := 0; off < len(data); off += chunk {
		end := min(off+chunk, len(data))
		req, _ := http.NewRequestWithContext(ctx, "PATCH", url, bytes.NewReader(data[off:end]))
		req.Header.Set("Tus-Resumable", "1.0.0")
		req.Header.Set("Content-Type", "application/offset+octet-stream")
		req.Header.Set("Upload-Offset", strconv.Itoa(off))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			return fmt.Errorf("PATCH at %d: %s", off, resp.Status)
		}
	}
	return nil
}

// BenchmarkTusVsPut uploads the same bytes with tus in PATCHes of 8 MiB
// (each made durable before it is answered) and with one raw PUT with
// sync=data, to fresh files of one daemon, and reports each one's MB/s
// and their ratio (goal: tus/put >= 0.8).
func BenchmarkTusVsPut(b *testing.B) {
	size := benchEnvSize(b, "FILEWRITE_BENCH_TUS_BYTES", 1<<30)
	data := tusPattern(int(size))
	_, _, proc, _ := startFresh(b, time.Hour)
	base := "http://" + proc.HTTPAddr
	var tusTime, putTime time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if err := tusUpload(b.Context(), base, fmt.Sprintf("bench/tus%d.bin", i), data, 8<<20); err != nil {
			b.Fatal(err)
		}
		tusTime += time.Since(start)
		start = time.Now()
		req, _ := http.NewRequestWithContext(b.Context(), "PUT", fmt.Sprintf("%s/v1/files/bench/put%d.bin?sync=data", base, i), bytes.NewReader(data))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			b.Fatalf("PUT: %s", resp.Status)
		}
		putTime += time.Since(start)
	}
	b.StopTimer()
	mb := float64(size) * float64(b.N) / 1e6
	b.ReportMetric(mb/tusTime.Seconds(), "tus-MB/s")
	b.ReportMetric(mb/putTime.Seconds(), "put-MB/s")
	b.ReportMetric(putTime.Seconds()/tusTime.Seconds(), "tus/put")
}

// BenchmarkRcloneWebDAV copies a tree of files of 64 KiB with rclone into
// the daemon over WebDAV, and the same tree with rclone's local backend
// into a directory on the same disk, and reports the ratio of their
// speeds (goal: dav/local >= 0.8).
func BenchmarkRcloneWebDAV(b *testing.B) {
	rclone := cmp.Or(os.Getenv("FILEWRITE_RCLONE"), "rclone")
	if _, err := exec.LookPath(rclone); err != nil {
		b.Skipf("%s is not installed", rclone)
	}
	var davFlags []string
	if help, _ := exec.Command(rclone, "help", "flags", "webdav").Output(); bytes.Contains(help, []byte("--webdav-pacer-min-sleep")) {
		davFlags = []string{"--webdav-pacer-min-sleep", "0"}
	} else {
		b.Logf("%s has no --webdav-pacer-min-sleep: its pacer caps the WebDAV copy at about 33 files a second", rclone)
	}
	files := int(benchEnvSize(b, "FILEWRITE_BENCH_DAV_FILES", 1000))
	_, root, proc, _ := startFresh(b, time.Hour)
	src := filepath.Join(filepath.Dir(root), "src")
	for i := range files {
		p := filepath.Join(src, fmt.Sprintf("d%02d", i%10), fmt.Sprintf("f%05d.bin", i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, tusPattern(64<<10), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	url := "http://" + proc.HTTPAddr + "/dav/"
	var davTime, localTime time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		benchRclone(b, rclone, url, append([]string{"copy", src, fmt.Sprintf("dav:tree%d", i), "--transfers", "8"}, davFlags...)...)
		davTime += time.Since(start)
		start = time.Now()
		benchRclone(b, rclone, url, "copy", src, filepath.Join(filepath.Dir(root), fmt.Sprintf("local%d", i)), "--transfers", "8")
		localTime += time.Since(start)
	}
	b.StopTimer()
	b.ReportMetric(localTime.Seconds()/davTime.Seconds(), "dav/local")
	b.ReportMetric(float64(files*b.N)/davTime.Seconds(), "dav-files/s")
	b.ReportMetric(float64(files*b.N)/localTime.Seconds(), "local-files/s")
}

func benchRclone(b *testing.B, rclone, url string, args ...string) {
	cmd := exec.Command(rclone, args...)
	cmd.Env = append(os.Environ(), "RCLONE_CONFIG="+os.DevNull,
		"RCLONE_CONFIG_DAV_TYPE=webdav", "RCLONE_CONFIG_DAV_URL="+url, "RCLONE_CONFIG_DAV_VENDOR=other")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("rclone %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}
