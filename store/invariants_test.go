//go:build linux && invariants

package store

import (
	"strings"
	"testing"
)

// TestInvariantsAssert: in a build with the invariants tag, the store's
// runtime assertions panic when their invariant is broken.
func TestInvariantsAssert(t *testing.T) {
	for _, tt := range []struct {
		name    string
		breakIt func()
		want    string // in the panic
	}{
		{"an in-flight end without its begin", func() {
			newInflightCounter().end(0)
		}, "an end without its begin"},
		{"overlapping extent runs", func() {
			runs := []extentRun{{0, 4, ExtentWritten}, {2, 6, ExtentUnwritten}}
			extentMapOfRuns(runs, 4096)
		}, "overlap"},
		{"extent runs left apart", func() {
			runs := []extentRun{{0, 4, ExtentWritten}, {4, 6, ExtentWritten}}
			extentMapOfRuns(runs, 4096)
		}, "not coalesced"},
		{"an empty extent run", func() {
			m := newExtentMap(4096)
			m.tree.ReplaceOrInsert(extentRun{3, 3, ExtentWritten})
			m.set(10, 11, ExtentWritten)
		}, "holds the run"},
		{"an append reserved past a gap", func() {
			var q appendQueue
			q.reserveLocked(0, 10)
			q.reserveLocked(20, 10)
		}, "reservations end at 10"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				got, _ := recover().(string)
				if !strings.Contains(got, tt.want) {
					t.Errorf("panic %q, want one that says %q", got, tt.want)
				}
			}()
			tt.breakIt()
		})
	}
}
