package main

import "context"

// syncCounts are a daemon's filewrite_fsync_batch_size histogram totals:
// every sync the store issued (any --fsync mode) is one observation of the
// number of callers it covered.
type syncCounts struct {
	syncs   float64 // fdatasync/fsync calls issued
	callers float64 // callers those syncs covered
}

// readSyncCounts reads the histogram's _count and _sum from the daemon's
// /metrics, summed over label sets.
func readSyncCounts(ctx context.Context, httpAddr string) (syncCounts, error) {
	m, err := readMetrics(ctx, httpAddr)
	if err != nil {
		return syncCounts{}, err
	}
	return syncCounts{
		syncs:   m.sum("filewrite_fsync_batch_size_count", ""),
		callers: m.sum("filewrite_fsync_batch_size_sum", ""),
	}, nil
}

// countSyncs wraps run so that its result says how many syncs the daemon
// issued during it (Syncs), counted by the daemon, not inferred from the
// harness's calls. Without a daemon serving HTTP (-target) it counts
// nothing.
func countSyncs(run func(context.Context, *session) (*runResult, error)) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		if s.daemon == nil || s.daemon.httpAddr == "" {
			return run(ctx, s)
		}
		before, err := readSyncCounts(ctx, s.daemon.httpAddr)
		if err != nil {
			return nil, err
		}
		r, err := run(ctx, s)
		if err != nil {
			return r, err
		}
		after, err := readSyncCounts(ctx, s.daemon.httpAddr)
		if err != nil {
			return nil, err
		}
		r.Syncs = after.syncs - before.syncs
		r.SyncCallers = after.callers - before.callers
		return r, nil
	}
}
