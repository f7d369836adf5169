package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/filewrite/filewrite/internal/testutil"
)

// rclone runs rclone with a remote "dav:" on the daemon's WebDAV door at
// url, authenticating with token as a Basic password (rclone's webdav
// backend, vendor "other"), and no configuration file of the machine's.
func rclone(t *testing.T, url, token string, args ...string) string {
	t.Helper()
	pass, err := exec.Command("rclone", "obscure", token).Output()
	if err != nil {
		t.Fatalf("rclone obscure: %v", err)
	}
	cmd := exec.Command("rclone", args...)
	cmd.Env = append(os.Environ(),
		"RCLONE_CONFIG="+filepath.Join(testutil.Dir(t), "rclone.conf"),
		"RCLONE_CONFIG_DAV_TYPE=webdav",
		"RCLONE_CONFIG_DAV_URL="+url,
		"RCLONE_CONFIG_DAV_VENDOR=other",
		"RCLONE_CONFIG_DAV_USER=e2e",
		"RCLONE_CONFIG_DAV_PASS="+strings.TrimSpace(string(pass)))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("rclone %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestRcloneWebDAV copies a tree of 1,000 files into the daemon over
// WebDAV and back out with rclone, and checks both copies with rclone
// check: the sizes against the daemon, and the bytes (MD5) of the copy
// that came back against the original.
func TestRcloneWebDAV(t *testing.T) {
	if _, err := exec.LookPath("rclone"); err != nil {
		t.Skip("rclone is not installed (Debian: apt-get install rclone; .ci/run installs it)")
	}
	tokens := testutil.WriteTokenFile(t, testutil.Dir(t), "tokens", tokenAlpha)
	_, root, proc, logs := startFresh(t, 5*time.Minute, "--auth-token-file", tokens)
	src := filepath.Join(testutil.Dir(t), "src")
	for i := range 1000 {
		p := filepath.Join(src, fmt.Sprintf("d%02d", i%10), fmt.Sprintf("sub%d", i%3), fmt.Sprintf("f%04d.bin", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		data := bytes.Repeat([]byte{byte(i), byte(i >> 8), 0x5a}, 100+i%700)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	url := "http://" + proc.HTTPAddr + "/dav/"
	start := time.Now()
	rclone(t, url, tokenAlpha, "copy", src, "dav:tree", "--transfers", "16")
	t.Logf("rclone copy in: %v", time.Since(start))
	rclone(t, url, tokenAlpha, "check", src, "dav:tree")
	dst := filepath.Join(testutil.Dir(t), "dst")
	start = time.Now()
	rclone(t, url, tokenAlpha, "copy", "dav:tree", dst, "--transfers", "16")
	t.Logf("rclone copy out: %v", time.Since(start))
	rclone(t, url, tokenAlpha, "check", src, dst)
	// And on the daemon's disk, the tree as it was sent.
	rclone(t, url, tokenAlpha, "check", src, filepath.Join(root, "tree"))
	if t.Failed() {
		t.Logf("daemon's log:\n%s", logs)
	}
}
