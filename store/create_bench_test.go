//go:build linux

package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
)

// dirSyncCountFS counts SyncDir calls.
type dirSyncCountFS struct {
	FS
	n atomic.Int64
}

func (f *dirSyncCountFS) SyncDir(name string) error {
	f.n.Add(1)
	return f.FS.SyncDir(name)
}

// BenchmarkCreateSynced: 32 callers each create new files, ten to a new
// directory, by one 4 KiB Write with sync=data (the loadtest's
// files-create without the RPC): group commit vs one fsync per caller,
// for the files and for the four directories above each (its own, the
// round's, the benchmark's, the root). It also reports directory fsyncs
// per file on each side.
func BenchmarkCreateSynced(b *testing.B) {
	const bs, workers, perRound, perDir = 4096, 32, 1000, 10
	ctx := context.Background()
	configs := []benchConfig{
		{"per-call", Options{Fsync: FsyncPerCall}},
		{"group", Options{Fsync: FsyncGroup}},
	}
	stores := map[string]*Store{}
	counts := map[string]*dirSyncCountFS{}
	for _, c := range configs {
		s, _ := newWrappedStore(b, func(fsys FS) FS {
			counts[c.name] = &dirSyncCountFS{FS: fsys}
			return counts[c.name]
		}, c.opts)
		stores[c.name] = s
	}
	data := make([]byte, bs)
	rounds := map[string][]benchRound{}
	dirSyncs := map[string]int64{}
	b.ResetTimer()
	for round := range b.N {
		for _, c := range configs {
			s := stores[c.name]
			var next atomic.Int64
			before := counts[c.name].n.Load()
			rounds[c.name] = append(rounds[c.name], runWorkers(b, workers, perRound, func(int, *rand.Rand) error {
				i := next.Add(1) - 1
				name := fmt.Sprintf("create/r%d/d%05d/f%07d", round, i/perDir, i)
				_, err := s.Write(ctx, name, 0, data, SyncData)
				return err
			}))
			dirSyncs[c.name] += counts[c.name].n.Load() - before
		}
	}
	reportPair(b, "per-call", "group", rounds)
	for _, c := range configs {
		b.ReportMetric(float64(dirSyncs[c.name])/float64(b.N*perRound), c.name+"-dirsyncs/file")
	}
}
