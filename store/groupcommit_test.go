//go:build linux

package store

import (
	"context"
	"fmt"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

// TestBatchTakesStrongestMode: callers that queue behind a running sync
// share the next one, which syncs in the strongest mode any of them asked
// for: fsync if one asked for SyncFull, else fdatasync.
// syncFunc is a syncer made of a function.
type syncFunc func(mode SyncMode) error

func (f syncFunc) syncFile(mode SyncMode) error { return f(mode) }

func TestBatchTakesStrongestMode(t *testing.T) {
	tests := []struct {
		queued []SyncMode
		want   SyncMode
	}{
		{[]SyncMode{SyncData, SyncData}, SyncData},
		{[]SyncMode{SyncData, SyncFull}, SyncFull},
		{[]SyncMode{SyncFull, SyncData}, SyncFull},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.queued), func(t *testing.T) {
			release := make(chan struct{})
			synced := make(chan SyncMode, 2)
			g := &groupCommit{
				mode: FsyncGroup,
				sync: syncFunc(func(mode SyncMode) error {
					synced <- mode
					<-release
					return nil
				}),
				onBatch: func(int) {},
				wait:    waitTrace{tel: noopTelemetry},
			}
			ctx := context.Background()
			done := make(chan error, 1+len(tt.queued))
			go func() { done <- g.waitDurable(ctx, SyncData) }()
			<-synced // the first batch runs and holds the "running" role
			for _, mode := range tt.queued {
				go func() { done <- g.waitDurable(ctx, mode) }()
			}
			testutil.WaitFor(t, "the callers to queue", func() bool {
				g.mu.Lock()
				defer g.mu.Unlock()
				return g.pending != nil && g.pending.callers == len(tt.queued)
			})
			close(release)
			if got := <-synced; got != tt.want {
				t.Errorf("the queued batch synced with %v, want %v", got, tt.want)
			}
			for range 1 + len(tt.queued) {
				if err := <-done; err != nil {
					t.Error(err)
				}
			}
		})
	}
}
