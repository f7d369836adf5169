package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The harness and the daemons share the machine's CPUs (two, where these
// figures were taken, with other work besides), so a run's rate is bounded
// by the CPU time each operation costs on both sides. A run records that
// cost, and how busy the rest of the machine was, so that a ratio can be
// explained from measurements rather than guessed at.

// clockTick is the unit of /proc's CPU times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// cpuSample is a reading of the CPU time used so far.
type cpuSample struct {
	server  time.Duration // the daemon's user+system time; 0 without one
	client  time.Duration // the harness's own user+system time
	machine time.Duration // every CPU's non-idle time
	// switches is the daemon's context switches (procSwitches); 0
	// without one.
	switches int64
}

// cpuUsage is what a run cost, as deltas of two samples.
type cpuUsage struct {
	Server  time.Duration
	Client  time.Duration
	Machine time.Duration
	// ServerSwitches is the daemon's context switches.
	ServerSwitches int64
}

func sampleCPU(serverPID int) cpuSample {
	var s cpuSample
	if serverPID > 0 {
		s.server, _ = procCPU(serverPID)
		s.switches, _ = procSwitches(serverPID)
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.client = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	s.machine, _ = machineBusy()
	return s
}

func (s cpuSample) since(start cpuSample) cpuUsage {
	return cpuUsage{Server: s.server - start.server, Client: s.client - start.client, Machine: s.machine - start.machine,
		ServerSwitches: s.switches - start.switches}
}

// Others is the CPU time that neither the daemon nor the harness used:
// other processes, and the kernel's own work on nobody's behalf.
func (u cpuUsage) Others() time.Duration { return max(u.Machine-u.Server-u.Client, 0) }

// procCPU is a process's utime+stime, all threads, from /proc/PID/stat.
func procCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces;
	// utime and stime are fields 14 and 15.
	rest := string(data)
	if i := strings.LastIndexByte(rest, ')'); i >= 0 {
		rest = rest[i+1:]
	}
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime/stime %q %q", pid, f[11], f[12])
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// machineBusy is the non-idle time of all CPUs, from /proc/stat.
func machineBusy() (time.Duration, error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var busy int64
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, err
		}
		// idle and iowait are fields 4 and 5; guest time is already
		// counted in user.
		if i == 3 || i == 4 || i >= 8 {
			continue
		}
		busy += n
	}
	return time.Duration(busy) * clockTick, nil
}
