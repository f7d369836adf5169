package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/filewrite/filewrite/internal/bytesize"
	"github.com/filewrite/filewrite/internal/testutil"
)

// TestDaemonCurlPut: curl -T of a file larger than --max-request-bytes,
// with sync=data, answers 201 Created with a Location, and the daemon's
// file holds the same bytes; curl downloads them back the same. The size
// is FILEWRITE_CURL_PUT_SIZE (a size such as 2g; default 80m): the issue's
// check is
//
//	FILEWRITE_CURL_PUT_SIZE=2g go test ./e2e -run TestDaemonCurlPut -v
func TestDaemonCurlPut(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed (apt-get install curl)")
	}
	size := int64(80 << 20)
	if s := os.Getenv("FILEWRITE_CURL_PUT_SIZE"); s != "" {
		n, err := bytesize.Parse(s)
		if err != nil || n <= 0 {
			t.Fatalf("FILEWRITE_CURL_PUT_SIZE=%q: want a size, like 2g", s)
		}
		size = n
	}
	ctx, root, proc, logs := startFresh(t, 10*time.Minute, "--max-request-bytes", "16m")
	src := filepath.Join(testutil.Dir(t), "src.bin")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	chunk := allBytes(1 << 20)
	for off := int64(0); off < size; off += int64(len(chunk)) {
		chunk[0] = byte(off >> 20) // each MiB its own
		if _, err := f.Write(chunk[:min(int64(len(chunk)), size-off)]); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	url := "http://" + proc.HTTPAddr + "/v1/files/big/ckpt.bin"
	out, err := exec.CommandContext(ctx, "curl", "-sS", "-T", src, "-D", "-", "-o", "/dev/null", url+"?sync=data").Output()
	if err != nil {
		t.Fatalf("curl -T: %v\n%s\n%s", err, out, logs)
	}
	head := string(out)
	if !strings.Contains(head, " 201 ") || !strings.Contains(head, "Location: /v1/files/big/ckpt.bin") {
		t.Fatalf("curl -T of %d bytes answered\n%s\nwant 201 Created with a Location", size, head)
	}
	want, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(root, "big", "ckpt.bin")); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the daemon's file (%d bytes, %v) differs from the %d sent", len(got), err, size)
	}
	back := filepath.Join(testutil.Dir(t), "back.bin")
	if out, err := exec.CommandContext(ctx, "curl", "-sS", "-f", "-o", back, "-w", "%{size_download}", url+"?alt=media").Output(); err != nil || string(out) != strconv.FormatInt(size, 10) {
		t.Fatalf("curl download: %s, %v; want %d bytes", out, err, size)
	}
	if got, err := os.ReadFile(back); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the download (%d bytes, %v) differs from what was sent", len(got), err)
	}
}
