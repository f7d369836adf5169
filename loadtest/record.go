package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/filewrite/filewrite/internal/daemonproc"
)

// A record is one run of the harness kept as a page of the project's
// benchmark history (-record DIR): the command, the commit it measured,
// the machine, the other load, and every table exactly as the run printed
// it. The harness writes it so that figures are never retyped, and names
// it by date, commit and scenario so that a later run never overwrites an
// earlier one.

// recordInfo is what a record says about the run besides its tables.
type recordInfo struct {
	scenario string
	args     []string // the harness's command line, without argv[0]
	commit   string   // short hash of the checkout; "unknown" outside git
	dirty    bool     // the checkout had uncommitted changes
	started  time.Time
	finished time.Time
	// loadStart and loadEnd are the 1-, 5- and 15-minute load averages
	// (/proc/loadavg) before the first run and after the last.
	loadStart, loadEnd string
	host               hostInfo
	target             string
	failed             bool
	// out is -out as the run printed it: the record writes "$OUT" for it,
	// so that no record names a path of the machine it ran on.
	out string
}

// checkoutCommit returns the short commit of the filewrite checkout the
// harness builds the daemon from, and whether its tree has uncommitted
// changes. Outside a git checkout it returns "unknown".
func checkoutCommit(ctx context.Context) (commit string, dirty bool) {
	root, err := daemonproc.ModuleRoot(ctx)
	if err != nil {
		return "unknown", false
	}
	out, err := exec.CommandContext(ctx, "git", "-C", root, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown", false
	}
	status, err := exec.CommandContext(ctx, "git", "-C", root, "status", "--porcelain", "--untracked-files=no").Output()
	return strings.TrimSpace(string(out)), err != nil || len(bytes.TrimSpace(status)) > 0
}

// loadAverage returns the three load averages of /proc/loadavg, or "" if
// it cannot be read.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// recordName is the file a record of info gets in dir:
// YYYY-MM-DD-COMMIT-SCENARIO.md, with -2, -3, ... before ".md" when a run
// of the same day, commit and scenario is already there.
func recordName(dir string, info recordInfo) (string, error) {
	base := fmt.Sprintf("%s-%s-%s", info.started.UTC().Format(time.DateOnly), info.commit, info.scenario)
	for n := 1; ; n++ {
		name := base + ".md"
		if n > 1 {
			name = fmt.Sprintf("%s-%d.md", base, n)
		}
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			return p, nil
		} else if err != nil {
			return "", err
		}
	}
}

// writeRecord writes the record of a run whose printed output is
// transcript into dir and returns its path.
func writeRecord(dir string, info recordInfo, transcript []byte) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path, err := recordName(dir, info)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# `%s`, %s, commit %s\n\n", info.scenario, info.started.UTC().Format(time.DateOnly), info.commit)
	b.WriteString("Written by the load harness (`-record`); the tables are its output, unedited.\n\n")
	// The -out directory is this machine's: the command shows it as $OUT,
	// as the tables do.
	command := redactPath([]byte(strings.Join(info.args, " ")), info.out, "$OUT")
	fmt.Fprintf(&b, "- command: `go -C loadtest run . %s`\n", command)
	tree := "clean"
	if info.dirty {
		tree = "with uncommitted changes"
	}
	fmt.Fprintf(&b, "- commit: %s (working tree %s)\n", info.commit, tree)
	fmt.Fprintf(&b, "- ran: %s to %s\n", info.started.UTC().Format(time.RFC3339), info.finished.UTC().Format(time.RFC3339))
	fmt.Fprintf(&b, "- machine: %s\n", info.host)
	if info.target != "" {
		fmt.Fprintf(&b, "- target: a running daemon at %s (its build and flags are not the harness's)\n", info.target)
	}
	fmt.Fprintf(&b, "- other load: load average %s before, %s after (1, 5, 15 minutes; the harness's own load included);"+
		" each table's \"other load (cpus)\" row is the CPUs other processes used during that column's runs\n",
		cmp.Or(info.loadStart, "unknown"), cmp.Or(info.loadEnd, "unknown"))
	result := "every request succeeded"
	if info.failed {
		result = "SOME RUNS HAD ERRORS OR WRONG CONTENT: do not trust these figures"
	}
	fmt.Fprintf(&b, "- result: %s\n\n", result)
	if info.out != "" {
		fmt.Fprintf(&b, "`$OUT` below is the run's `-out` directory.\n\n")
		transcript = redactPath(transcript, info.out, "$OUT")
	}
	b.WriteString("```\n")
	b.Write(bytes.TrimRight(transcript, "\n"))
	b.WriteString("\n```\n")
	return path, os.WriteFile(path, []byte(b.String()), 0o644)
}

// redactPath replaces dir, and its absolute form, in transcript with name.
func redactPath(transcript []byte, dir, name string) []byte {
	dirs := []string{dir}
	if abs, err := filepath.Abs(dir); err == nil && abs != dir {
		dirs = append([]string{abs}, dirs...) // the longer first
	}
	for _, d := range dirs {
		if d != "" && d != "." {
			transcript = bytes.ReplaceAll(transcript, []byte(d), []byte(name))
		}
	}
	return transcript
}
