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
		run := appendsWithOverwriters(size, syncMode, timeAppends, false)
		stream := appendsWithOverwriters(size, syncMode, timeAppends, true)
		if synced {
			run, stream = countSyncs(run), countSyncs(stream)
		}
		return column{name: name, daemon: []string{"--policy", policy, "--http-addr", "127.0.0.1:0"},
			setup: setup, before: empty, after: empty, run: run, stream: stream}
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
// half runs until the timed half is done. With overStream each client
// sends its writes on a WriteStream of its own, one at a time (append set
// for the appenders), instead of one unary call each.
func appendsWithOverwriters(fileSize int64, syncMode filewritev1.SyncMode, timeAppends, overStream bool) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		clients, closeAll, err := dialClients(s.addr, s.token, 2*s.clients, s.connections)
		if err != nil {
			return nil, err
		}
		defer closeAll()
		data := patternBytes(s.bs)
		blocks, bs, seed := fileSize/int64(s.bs), int64(s.bs), uint64(s.round)
		var n atomic.Int64
		// op makes client i's operation: an append, or an overwrite.
		op := func(ctx context.Context, c filewritev1.FileServiceClient, appends bool) (func() error, error) {
			if !overStream {
				if appends {
					return func() error {
						_, err := c.Append(ctx, &filewritev1.AppendRequest{Path: appendLogPath, Data: data, Sync: syncMode})
						return err
					}, nil
				}
				return func() error {
					off := randomBlock(seed, n.Add(1), blocks) * bs
					_, err := c.Write(ctx, &filewritev1.WriteRequest{Path: appendOverwritePath, Offset: off, Data: data})
					return err
				}, nil
			}
			path, sync := appendOverwritePath, filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED
			if appends {
				path, sync = appendLogPath, syncMode
			}
			st, err := c.WriteStream(ctx)
			if err != nil {
				return nil, err
			}
			first := true
			var id uint64
			return func() error {
				id++
				w := &filewritev1.StreamWrite{Id: id, Data: data, Sync: sync, Append: appends}
				if !appends {
					w.Offset = randomBlock(seed, n.Add(1), blocks) * bs
				}
				req := &filewritev1.WriteStreamRequest{Writes: []*filewritev1.StreamWrite{w}}
				if first {
					req.Path, first = path, false
				}
				if err := st.Send(req); err != nil {
					return err
				}
				for {
					resp, err := st.Recv()
					if err != nil {
						return err
					}
					for _, a := range resp.GetAcks() {
						if a.GetId() == id {
							if a.GetStatus() != nil {
								return fmt.Errorf("ack: %v", a.GetStatus())
							}
							return nil
						}
					}
				}
			}, nil
		}
		bg, stop := context.WithCancel(ctx)
		defer stop()
		timed := make([]func() error, s.clients)
		alongside := make([]func() error, s.clients)
		for i := range s.clients {
			if timed[i], err = op(ctx, clients[i], timeAppends); err != nil {
				return nil, err
			}
			if alongside[i], err = op(bg, clients[s.clients+i], !timeAppends); err != nil {
				return nil, err
			}
		}
		call := map[bool]string{true: "Append", false: "Write"}[timeAppends]
		if overStream {
			call += " (WriteStream)"
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		failed := map[string]int{} // the untimed half's errors, but its end's
		for i := range s.clients {
			wg.Go(func() {
				for bg.Err() == nil {
					if err := alongside[i](); err != nil && bg.Err() == nil {
						mu.Lock()
						failed["alongside: "+err.Error()]++
						mu.Unlock()
					}
				}
			})
		}
		r := loop(ctx, s, call, func(_ context.Context, client int, _ int64) error {
			return timed[client]()
		})
		stop()
		wg.Wait()
		for k, n := range failed {
			r.Errors[k] += n
		}
		return r, nil
	}
}
