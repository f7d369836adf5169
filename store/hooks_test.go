//go:build linux

package store

import (
	"testing"

	"github.com/filewrite/filewrite/internal/invariants"
)

// TestBreaksNeedTheTag: a deliberate break is on only in a build with the
// invariants tag, and there only when asked for. Without the tag not even
// Hooks with every bit set break anything: broken is the constant false,
// and .ci/run checks that the daemon's binary holds no breakOn.
func TestBreaksNeedTheTag(t *testing.T) {
	if breakCount > 32 {
		t.Fatalf("%d breaks do not fit in Hooks.breaks", breakCount)
	}
	var none *Hooks
	all := &Hooks{breaks: ^uint32(0)}
	for id := range breakCount {
		if none.broken(id) || (&Hooks{}).broken(id) {
			t.Errorf("break %d is on without being asked for", id)
		}
		if got, want := all.broken(id), invariants.Enabled; got != want {
			t.Errorf("break %d with every bit set: on = %v, want %v (invariants.Enabled)", id, got, want)
		}
	}
}
