package service

import (
	"os"
	"runtime"
)

// applyProcs sets how many threads run the daemon's Go code at once
// (runtime.GOMAXPROCS) to procs, if it is set, and returns the number in
// force and where it came from: --procs, the GOMAXPROCS variable, or the
// CPUs the runtime found (which follows a container's CPU limit). Run
// calls it before Start: the number is the process's, and the gRPC server
// sizes its workers by it. See docs/design.md, "How many threads", for
// when fewer than the CPUs pays.
func applyProcs(procs int) (int, string) {
	switch {
	case procs > 0:
		runtime.GOMAXPROCS(procs)
		return procs, "--procs"
	case os.Getenv("GOMAXPROCS") != "":
		return runtime.GOMAXPROCS(0), "GOMAXPROCS"
	}
	return runtime.GOMAXPROCS(0), "cpus"
}
