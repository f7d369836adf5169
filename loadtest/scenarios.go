package main

import (
	"context"
	"fmt"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/client"
)

// The comparisons, each the service's replay of one kernel patch's fio
// experiment (docs/design.md), plus the service's overhead.

// belowEOF: the btrfs unlocked buffered write. Random 4 KiB writes below
// EOF of a fully written file, sync=data, 8 clients (the seed's 8 jobs):
// exclusive vs unlocked-below-eof.
func (e *env) belowEOF() *comparison {
	const path = "loadtest/below-eof.dat"
	bs := e.bs(4 << 10)
	size := e.fileSize(256<<20, bs)
	setup := func(ctx context.Context, s *session) error { return writeFile(ctx, s.client, path, size) }
	run := ghzWrites(path, size, filewritev1.SyncMode_SYNC_MODE_DATA)
	stream := streamWrites(path, size, client.SyncData)
	return &comparison{
		name:        "below-eof",
		preparation: writtenPreparation(size),
		title:       fmt.Sprintf("random %s writes below EOF of a written %s file, sync=data, buffered", sizeName(bs), sizeName(size)),
		clients:     e.clients(8), bs: bs, byServer: true,
		columns: []column{
			{name: "exclusive", daemon: []string{"--policy", "exclusive"}, setup: setup, run: run, stream: stream},
			{name: "unlocked-below-eof", daemon: []string{"--policy", "unlocked-below-eof"}, setup: setup, run: run, stream: stream},
		},
		ratios: [][2]string{{"unlocked-below-eof", "exclusive"}},
	}
}

// preallocOverwrite: the ext4 shared lock for unwritten extents. Direct
// random writes into a freshly fallocated file, 10 clients, at bs (the
// seed used 4k, 16k and 64k): shared-written vs shared-overwrite. The file
// is fallocated afresh before every run, because a run turns the blocks it
// writes from unwritten into written, and is made large (2^16 blocks of bs,
// at least 1 GiB) so that few of a run's writes land on blocks an earlier
// write of the same run already converted.
func (e *env) preallocOverwrite(bs int) *comparison {
	path := "loadtest/prealloc-" + sizeName(bs) + ".dat"
	size := e.fileSize(max(1<<30, int64(bs)<<16), bs)
	fresh := func(ctx context.Context, s *session) error { return fallocateFile(ctx, s.client, path, size) }
	// Free the blocks between runs: an idle daemon need not hold gigabytes.
	free := func(ctx context.Context, s *session) error {
		_, err := s.client.Truncate(ctx, &filewritev1.TruncateRequest{Path: path, Size: 0})
		return err
	}
	run := ghzWrites(path, size, filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED)
	stream := streamWrites(path, size, client.SyncNone)
	return &comparison{
		name:        "prealloc-overwrite-" + sizeName(bs),
		preparation: fmt.Sprintf("truncated to 0 and fallocated to %s (all blocks unwritten) before every run", sizeName(size)),
		title:       fmt.Sprintf("random %s O_DIRECT writes into a freshly fallocated %s file", sizeName(bs), sizeName(size)),
		clients:     e.clients(10), bs: bs, byServer: true,
		columns: []column{
			{name: "shared-written", daemon: []string{"--policy", "shared-written", "--io", "direct"}, before: fresh, after: free, run: run, stream: stream},
			{name: "shared-overwrite", daemon: []string{"--policy", "shared-overwrite", "--io", "direct"}, before: fresh, after: free, run: run, stream: stream},
		},
		ratios: [][2]string{{"shared-overwrite", "shared-written"}},
	}
}

// fsyncModes: the btrfs fsync unplug. 32 clients, each writing 4 KiB at a
// random block below EOF and then calling Fsync (data only): the 3 ms
// gathering timer vs one sync per call vs group commit. Each column counts
// the syncs its daemon issued (its filewrite_fsync_batch_size histogram),
// so the table says how many syncs a call cost.
func (e *env) fsyncModes() *comparison {
	const path = "loadtest/fsync.dat"
	bs := e.bs(4 << 10)
	size := e.fileSize(16<<20, bs)
	setup := func(ctx context.Context, s *session) error { return writeFile(ctx, s.client, path, size) }
	run := countSyncs(writeThenFsync(path, size))
	stream := countSyncs(streamWriteThenFsync(path, size))
	return &comparison{
		name:        "fsync",
		preparation: writtenPreparation(size),
		title:       fmt.Sprintf("each client: Write %s below EOF of a %s file, then Fsync(data_only); one op is the pair", sizeName(bs), sizeName(size)),
		clients:     e.clients(32), bs: bs, byServer: true,
		columns: []column{
			{name: "timer", daemon: fsyncFlags("timer"), setup: setup, run: run, stream: stream},
			{name: "per-call", daemon: fsyncFlags("per-call"), setup: setup, run: run, stream: stream},
			{name: "group", daemon: fsyncFlags("group"), setup: setup, run: run, stream: stream},
		},
		ratios: [][2]string{{"group", "per-call"}, {"timer", "group"}},
	}
}

// fsyncLone: the btrfs fsync unplug as its patch measured it, a lone
// synced writer: one client writing 4 KiB with SYNC_MODE_DATA in a loop,
// which under the timer waits out the 3 ms gathering delay on every write
// with nobody to gather.
func (e *env) fsyncLone() *comparison {
	const path = "loadtest/fsync-1.dat"
	bs := e.bs(4 << 10)
	size := e.fileSize(16<<20, bs)
	setup := func(ctx context.Context, s *session) error { return writeFile(ctx, s.client, path, size) }
	run := countSyncs(ghzWrites(path, size, filewritev1.SyncMode_SYNC_MODE_DATA))
	stream := countSyncs(streamWrites(path, size, client.SyncData))
	return &comparison{
		name:        "fsync-1",
		preparation: writtenPreparation(size),
		title:       fmt.Sprintf("one client: Write %s with sync=data at a random block below EOF of a %s file, in a loop", sizeName(bs), sizeName(size)),
		clients:     1, bs: bs, byServer: true,
		columns: []column{
			{name: "timer", daemon: fsyncFlags("timer"), setup: setup, run: run, stream: stream},
			{name: "per-call", daemon: fsyncFlags("per-call"), setup: setup, run: run, stream: stream},
			{name: "group", daemon: fsyncFlags("group"), setup: setup, run: run, stream: stream},
		},
		ratios: [][2]string{{"group", "timer"}, {"group", "per-call"}},
	}
}

// fsyncFlags are the fsync scenarios' daemon flags: the mode, and an HTTP
// address on loopback for the /metrics that count its syncs.
func fsyncFlags(mode string) []string {
	return []string{"--fsync", mode, "--http-addr", "127.0.0.1:0"}
}

// writtenPreparation says how writeFile prepares a file of size bytes.
func writtenPreparation(size int64) string {
	return fmt.Sprintf("written in full to %s in %s chunks (prepareChunk) through Write, then Fsync", sizeName(size), sizeName(prepareChunk))
}

// throughput: the service's overhead. Buffered 4 KiB writes below EOF at
// 32 clients, against the ceiling of the same harness and server (a health
// Check, which does no work) and against raw pwrite(2) from 32 goroutines
// in the harness. All three share one daemon in its default configuration.
func (e *env) throughput() *comparison {
	const path = "loadtest/throughput.dat"
	bs := e.bs(4 << 10)
	size := e.fileSize(256<<20, bs)
	defaults := []string{} // the daemon's defaults: unlocked-below-eof, buffered, group
	return &comparison{
		name:        "throughput",
		preparation: writtenPreparation(size) + "; raw-pwrite's the same with pwrite(2) and fsync",
		title:       fmt.Sprintf("buffered %s writes below EOF of a written %s file vs a no-op RPC vs raw pwrite", sizeName(bs), sizeName(size)),
		clients:     e.clients(32), bs: bs,
		columns: []column{
			{name: "noop", daemon: defaults, run: ghzHealthChecks},
			{name: "write", daemon: defaults,
				setup:  func(ctx context.Context, s *session) error { return writeFile(ctx, s.client, path, size) },
				run:    ghzWrites(path, size, filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED),
				stream: streamWrites(path, size, client.SyncNone),
				after:  func(ctx context.Context, s *session) error { return fsyncFile(ctx, s.client, path) }},
			{name: "raw-pwrite", setup: setupRawFile(size), run: rawPwrites(size), after: syncRawFile},
		},
		ratios: [][2]string{{"write", "noop"}, {"write", "raw-pwrite"}},
	}
}

// sizeName prints a size the way fio's bs= does: 4k, 64k, 1m, 1g.
func sizeName[T int64Like](n T) string {
	v := int64(n)
	for _, u := range []struct {
		suffix string
		shift  uint
	}{{"g", 30}, {"m", 20}, {"k", 10}} {
		if v != 0 && v%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d%s", v>>u.shift, u.suffix)
		}
	}
	return fmt.Sprint(v)
}

type int64Like interface{ ~int | ~int64 }

// stream: the WriteStream through the client package against the unary
// Write and the no-op RPC (issue 9). 32 callers write bs at random blocks
// below EOF of one file, rewritten in prepareChunk writes and synced
// before every run so that each run starts from the same page cache
// state; the stream's callers each have a client.File of their own, all
// of one Client (one connection), so their writes share messages (unlike
// -transport stream, which gives each caller a Client, so a stream, of its
// own). The daemon serves /metrics on loopback, for its allocations per
// write.
func (e *env) stream() *comparison {
	const path = "loadtest/stream.dat"
	bs := e.bs(4 << 10)
	size := e.fileSize(64<<20, bs)
	flags := []string{"--http-addr", "127.0.0.1:0"}
	prepare := func(ctx context.Context, s *session) error { return writeFile(ctx, s.client, path, size) }
	return &comparison{
		name:        "stream",
		preparation: writtenPreparation(size) + ", before every run",
		title: fmt.Sprintf("%s writes at random blocks below EOF of a %s file: "+
			"unary Write vs WriteStream through client (a File per caller, one Client) vs a no-op RPC",
			sizeName(bs), sizeName(size)),
		clients: e.clients(32), bs: bs,
		columns: []column{
			{name: "noop", daemon: flags, run: ghzHealthChecks},
			{name: "unary", daemon: flags, before: prepare, run: ghzWrites(path, size, filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED)},
			{name: "stream", daemon: flags, before: prepare, run: clientWrites(path, size, client.SyncNone), transport: transportStream},
		},
		ratios: [][2]string{{"stream", "unary"}, {"unary", "noop"}, {"stream", "noop"}},
	}
}
