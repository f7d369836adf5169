package service

import (
	"runtime"
	"testing"
)

// TestApplyProcs: --procs wins; without it the runtime's number stays,
// from the GOMAXPROCS variable or the CPUs.
func TestApplyProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	start := runtime.GOMAXPROCS(0)
	if n, from := applyProcs(3); n != 3 || from != "--procs" || runtime.GOMAXPROCS(0) != 3 {
		t.Errorf("applyProcs(3) = %d, %q with GOMAXPROCS %d, want 3, --procs", n, from, runtime.GOMAXPROCS(0))
	}
	runtime.GOMAXPROCS(start)
	t.Setenv("GOMAXPROCS", "2")
	if n, from := applyProcs(0); n != start || from != "GOMAXPROCS" {
		t.Errorf("with GOMAXPROCS set: applyProcs(0) = %d, %q, want %d, GOMAXPROCS", n, from, start)
	}
	t.Setenv("GOMAXPROCS", "")
	if n, from := applyProcs(0); n != start || from != "cpus" || runtime.GOMAXPROCS(0) != start {
		t.Errorf("applyProcs(0) = %d, %q, want %d, cpus", n, from, start)
	}
}
