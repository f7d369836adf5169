package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// A write that crosses goroutines may cost the daemon a thread's sleep and
// wake-up each time, and on a loaded machine those are what a stream's
// rate is made of: the daemon's context switches per operation say so
// more steadily than its rate does.

// procSwitches is the context switches of a process so far, voluntary
// and not, summed over its threads (/proc/PID/task/*/status: the
// process's own status counts only its first thread). Those of threads
// that have exited are lost; a Go program's threads seldom exit.
func procSwitches(pid int) (int64, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(tasks) == 0 {
		return 0, fmt.Errorf("/proc/%d/task: no threads", pid)
	}
	var n int64
	for _, t := range tasks {
		data, err := os.ReadFile(t)
		if err != nil {
			continue // the thread exited meanwhile
		}
		for line := range strings.Lines(string(data)) {
			k, v, ok := strings.Cut(line, ":")
			if !ok || (k != "voluntary_ctxt_switches" && k != "nonvoluntary_ctxt_switches") {
				continue
			}
			c, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %s %q", t, k, v)
			}
			n += c
		}
	}
	return n, nil
}
