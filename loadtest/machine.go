package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The machine line: the figures of a run belong to the machine and the
// file system they were taken on, so summary.json and the output name
// them, and time the disk's fdatasync before anything else runs.

// storageInfo is the file system below -out, where every file of a run
// lives, and what a sync costs there.
type storageInfo struct {
	FS      string `json:"filesystem"`
	Device  string `json:"device,omitempty"`
	Options string `json:"mount_options,omitempty"`
	// Journal says whether, and how, the file system journals.
	Journal string `json:"journal"`
	// FdatasyncUS is the median and 99th percentile of pwrite(4 KiB) +
	// fdatasync in a short loop on a written file, at start.
	FdatasyncP50US float64 `json:"fdatasync_p50_usec"`
	FdatasyncP99US float64 `json:"fdatasync_p99_usec"`
	FdatasyncLoops int     `json:"fdatasync_loops"`
}

func (s storageInfo) String() string {
	return fmt.Sprintf("%s on %s (%s), journal: %s; pwrite 4k+fdatasync p50 %.0f us, p99 %.0f us (%d loops)",
		s.FS, s.Device, s.Options, s.Journal, s.FdatasyncP50US, s.FdatasyncP99US, s.FdatasyncLoops)
}

// readStorage finds dir's mount in /proc/self/mountinfo and times
// fdatasync in dir.
func readStorage(dir string) (storageInfo, error) {
	var s storageInfo
	if data, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		best := ""
		for line := range strings.Lines(string(data)) {
			// id parent major:minor root mountpoint options ... - fstype source superoptions
			pre, post, ok := strings.Cut(line, " - ")
			f, g := strings.Fields(pre), strings.Fields(post)
			if !ok || len(f) < 6 || len(g) < 3 {
				continue
			}
			mp := f[4]
			if (dir == mp || strings.HasPrefix(dir, strings.TrimSuffix(mp, "/")+"/")) && len(mp) >= len(best) {
				best, s.FS, s.Device, s.Options = mp, g[0], g[1], g[2]
			}
		}
	}
	s.Journal = journal(s.FS, s.Device, s.Options)
	lat, err := timeFdatasync(dir, 200, time.Second)
	if err != nil {
		return s, err
	}
	s.FdatasyncLoops = len(lat)
	s.FdatasyncP50US = float64(percentileOf(lat, 50)) / 1e3
	s.FdatasyncP99US = float64(percentileOf(lat, 99)) / 1e3
	return s, nil
}

// journal says whether fs journals: ext4 does when jbd2 runs for its
// device, xfs always logs its metadata, btrfs is copy-on-write with a log
// tree for fsync.
func journal(fs, device, opts string) string {
	switch fs {
	case "ext4", "ext3":
		dev := filepath.Base(device)
		if matches, _ := filepath.Glob("/proc/fs/jbd2/" + dev + "-*"); len(matches) > 0 {
			mode := "ordered"
			for _, o := range strings.Split(opts, ",") {
				if m, ok := strings.CutPrefix(o, "data="); ok {
					mode = m
				}
			}
			return "yes (jbd2, data=" + mode + ")"
		}
		return "no (no jbd2 for " + dev + ": ext4 without a journal)"
	case "xfs":
		return "yes (metadata log)"
	case "btrfs":
		return "no (copy-on-write, log tree for fsync)"
	case "tmpfs", "ramfs":
		return "no (memory)"
	case "overlay":
		return "depends on the upper file system"
	}
	return "unknown"
}

// timeFdatasync writes a 1 MiB file in dir, syncs it, then times up to
// loops rounds of a 4 KiB pwrite at a varying block followed by
// fdatasync, for at most limit; the latencies come back sorted.
func timeFdatasync(dir string, loops int, limit time.Duration) ([]time.Duration, error) {
	f, err := os.CreateTemp(dir, "fdatasync-probe-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	const size = 1 << 20
	if _, err := f.Write(patternBytes(size)); err != nil {
		return nil, err
	}
	if err := f.Sync(); err != nil {
		return nil, err
	}
	block := patternBytes(4 << 10)
	var lat []time.Duration
	end := time.Now().Add(limit)
	for i := 0; i < loops && time.Now().Before(end); i++ {
		t0 := time.Now()
		if _, err := f.WriteAt(block, randomBlock(7, int64(i), size/4096)*4096); err != nil {
			return nil, err
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return nil, err
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	return lat, nil
}
