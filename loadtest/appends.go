package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// The append scenario: many clients append to one file, under the
// exclusive policy (every append holds the inode lock throughout, the
// baseline) and under unlocked-below-eof (an append holds it shared only
// to reserve its range, then writes unlocked). In every run as many other
// clients overwrite random blocks below EOF of a second file, for scale:
// the goal is appends at the speed of overwrites. A run times one half of
// its clients, the appenders or the overwriters (the -overwrites
// columns), while the other half runs alongside untimed, so that each
// figure is taken under the same mixed load.

const (
	appendLogPath       = "loadtest/append.log"
	appendOverwritePath = "loadtest/append-overwrite.dat"
)

// appendScenario is the comparison for appends with no sync, or
// SYNC_MODE_DATA (synced): clients appenders of bs bytes and as many overwriters.
func (e *env) appendScenario(synced bool) *comparison {
	syncMode := filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED
	if synced {
		syncMode = filewritev1.SyncMode_SYNC_MODE_DATA
	}
	bs := e.bs(4 << 10)
	size := e.fileSize(64<<20, bs)
	clients := e.clients(32)
	setup := func(ctx context.Context, s *session) error {
		return writeFile(ctx, s.client, appendOverwritePath, size)
	}
	// The log starts empty in every run; truncated after it too, so that
	// the runs do not fill the disk.
	empty := func(ctx context.Context, s *session) error {
		_, err := s.client.Truncate(ctx, &filewritev1.TruncateRequest{Path: appendLogPath, Size: 0})
		return err
	}
	name, syncName := "append", "no sync"
	if synced {
		name, syncName = "append-sync", "sync=data"
	}
	col := func(name, policy string, timeAppends bool) column {
		run := appendsWithOverwriters(size, syncMode, timeAppends)
		if synced {
			run = countSyncs(run)
		}
		return column{name: name, daemon: []string{"--policy", policy, "--http-addr", "127.0.0.1:0"},
			setup: setup, before: empty, after: empty, run: run}
	}
	return &comparison{
		name:        name,
		preparation: writtenPreparation(size) + " (the overwriters' file); the appenders' log truncated to 0 before and after every run",
		title: fmt.Sprintf("%d clients append %s to one file (%s) while %d overwrite %s below EOF of another; "+
			"a column times the appenders, or the overwriters (-overwrites)", clients, sizeName(bs), syncName, clients, sizeName(bs)),
		clients: clients, bs: bs,
		columns: []column{
			col("exclusive", "exclusive", true),
			col("exclusive-overwrites", "exclusive", false),
			col("reserving", "unlocked-below-eof", true),
			col("reserving-overwrites", "unlocked-below-eof", false),
		},
		ratios: [][2]string{{"reserving", "exclusive"}, {"reserving", "reserving-overwrites"}},
	}
}

// appendsWithOverwriters runs s.clients appenders of s.bs bytes to
// appendLogPath and as many overwriters of random blocks below fileSize of
// appendOverwritePath, each over its own connection (or -connections),
// and times the appenders (timeAppends) or the overwriters; the other
// half runs until the timed half is done.
func appendsWithOverwriters(fileSize int64, syncMode filewritev1.SyncMode, timeAppends bool) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		clients, closeAll, err := dialClients(s.addr, s.token, 2*s.clients, s.connections)
		if err != nil {
			return nil, err
		}
		defer closeAll()
		data := patternBytes(s.bs)
		blocks, bs, seed := fileSize/int64(s.bs), int64(s.bs), uint64(s.round)
		appendOnce := func(ctx context.Context, c filewritev1.FileServiceClient) error {
			_, err := c.Append(ctx, &filewritev1.AppendRequest{Path: appendLogPath, Data: data, Sync: syncMode})
			return err
		}
		var n atomic.Int64
		overwriteOnce := func(ctx context.Context, c filewritev1.FileServiceClient) error {
			off := randomBlock(seed, n.Add(1), blocks) * bs
			_, err := c.Write(ctx, &filewritev1.WriteRequest{Path: appendOverwritePath, Offset: off, Data: data})
			return err
		}
		timed, alongside := appendOnce, overwriteOnce
		call := "Append"
		if !timeAppends {
			timed, alongside, call = overwriteOnce, appendOnce, "Write"
		}
		bg, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		var mu sync.Mutex
		failed := map[string]int{} // the untimed half's errors, but its end's
		for i := range s.clients {
			c := clients[s.clients+i]
			wg.Go(func() {
				for bg.Err() == nil {
					if err := alongside(bg, c); err != nil && bg.Err() == nil {
						mu.Lock()
						failed["alongside: "+err.Error()]++
						mu.Unlock()
					}
				}
			})
		}
		r := loop(ctx, s, call, func(ctx context.Context, client int, _ int64) error {
			return timed(ctx, clients[client])
		})
		stop()
		wg.Wait()
		for k, n := range failed {
			r.Errors[k] += n
		}
		return r, nil
	}
}
