package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// mountSmallExt4 makes an ext4 filesystem of size bytes in a file under
// dir, mounts it through a loop device, and returns where; it is unmounted
// when the test ends. A small filesystem fills in seconds, as a production
// disk does in hours, and is ext4 as production's is, where tmpfs is not
// (no extents, no delayed allocation). It needs root, mkfs.ext4 and a loop
// device: where it cannot mount, it returns "" and why.
func mountSmallExt4(t *testing.T, dir string, size int64) (string, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		return "", "not root: mounting a loop device needs root (CI runs as root)"
	}
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		return "", "no mkfs.ext4 (apt-get install e2fsprogs)"
	}
	img := filepath.Join(dir, "disk.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		return "", err.Error()
	}
	if err := os.Truncate(img, size); err != nil {
		return "", err.Error()
	}
	// No reserved blocks: the daemon runs as root here, and would
	// write into them where another user could not.
	if out, err := exec.Command(mkfs, "-q", "-F", "-m", "0", img).CombinedOutput(); err != nil {
		return "", fmt.Sprintf("mkfs.ext4: %v: %s", err, out)
	}
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return "", err.Error()
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		return "", fmt.Sprintf("mount -o loop: %v: %s", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() {
		// The daemon is gone by now (its cleanup ran first), but a
		// process it left may hold the mount a moment longer.
		for range 50 {
			err := exec.Command("umount", mnt).Run()
			if err == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		if out, err := exec.Command("umount", "-l", mnt).CombinedOutput(); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	return mnt, ""
}
