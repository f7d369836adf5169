package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// The NBD comparisons: one client, fio's nbd engine through libnbd, runs
// the same job against nbdkit's file plugin and against the daemon's NBD
// export (--nbd-addr), both on unix sockets, so that the servers alone
// differ (docs/nbd.md). nbdkit serves the column's raw file as the peer
// scenario's does, with as many threads as a connection has requests in
// flight; the daemon serves a file written through gRPC in the same
// chunks. Then the seed experiments through NBD: the same daemon flags as
// below-eof and prealloc-overwrite, the same file preparation, fio's jobs
// in place of the gRPC clients.

// nbdShape is a way fio drives one NBD server.
type nbdShape struct {
	name  string
	jobs  int // fio jobs, each its own NBD connection
	depth int // requests in flight per job
	fsync int // fio's --fsync: an NBD_CMD_FLUSH after every fsync writes (0: none)
}

// nbdShapes are the three comparisons against nbdkit: one connection 32
// deep; the same with a FLUSH after every write; four connections (the
// server advertises NBD_FLAG_CAN_MULTI_CONN) 8 deep each.
var nbdShapes = []nbdShape{
	{name: "nbd", jobs: 1, depth: 32},
	{name: "nbd-durable", jobs: 1, depth: 32, fsync: 1},
	{name: "nbd-multiconn", jobs: 4, depth: 8},
}

// nbdPeer compares the daemon's NBD export with nbdkit's at 4 KiB random
// writes below EOF of a written file, in shape.
func (e *env) nbdPeer(shape nbdShape) *comparison {
	bs := e.bs(4 << 10)
	size := e.fileSize(64<<20, bs)
	path := "loadtest/" + shape.name + ".dat"
	kind, connections := "", "over one connection"
	if shape.fsync > 0 {
		kind = fmt.Sprintf(", a FLUSH after every %d", shape.fsync)
	}
	if shape.jobs > 1 {
		connections = fmt.Sprintf("over %d connections of %d in flight each", shape.jobs, shape.depth)
	}
	sock := filepath.Join(e.work, shape.name+".sock")
	return &comparison{
		name: shape.name,
		title: fmt.Sprintf("fio's nbd engine: random %s writes below EOF of a written %s file%s, queue depth %d %s, unix sockets",
			sizeName(bs), sizeName(size), kind, shape.jobs*shape.depth, connections),
		preparation: fmt.Sprintf("each written in full to %s in %s chunks (prepareChunk), then synced: pwrite(2)+fsync for nbdkit's, Write+Fsync for filewrite's",
			sizeName(size), sizeName(prepareChunk)),
		clients: shape.jobs * shape.depth, connections: shape.jobs, bs: bs,
		columns: []column{
			{name: "nbdkit-fio", setup: setupRawFile(size), run: nbdkitFio(size, shape.fsync, shape.jobs), after: syncRawFile},
			{name: "filewrite-nbd-fio", daemon: nbdDaemon(sock),
				setup:     func(ctx context.Context, s *session) error { return writeFile(ctx, s.client, path, size) },
				run:       countSyncs(nbdFio(sock, path, size, shape)),
				after:     func(ctx context.Context, s *session) error { return fsyncFile(ctx, s.client, path) },
				transport: transportNBD},
		},
		ratios: [][2]string{{"filewrite-nbd-fio", "nbdkit-fio"}},
	}
}

// nbdDaemon are the flags of a daemon serving NBD on the unix socket
// sock, gRPC on a socket beside it (for the preparation) and HTTP on
// loopback (for /metrics, which counts its syncs), with extra flags.
func nbdDaemon(sock string, extra ...string) []string {
	return append([]string{"--nbd-addr", "unix:" + sock, "--grpc-addr", "unix:" + sock + ".grpc", "--http-addr", "127.0.0.1:0"}, extra...)
}

// nbdFio is one run of fio's nbd engine against the daemon's export path
// on sock, in shape; fio's CPU time counts as the harness's.
func nbdFio(sock, path string, size int64, shape nbdShape) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		return runFio(ctx, s, "nbd", "--ioengine=nbd", "--uri=nbd+unix:///"+path+"?socket="+sock,
			"--numjobs="+strconv.Itoa(shape.jobs), "--iodepth="+strconv.Itoa(shape.depth),
			"--size="+strconv.FormatInt(size, 10), "--fsync="+strconv.Itoa(shape.fsync))
	}
}

// nbdBelowEOF is below-eof through NBD: the btrfs unlocked buffered
// write, exclusive vs unlocked-below-eof. Eight fio jobs (the seed's 8,
// below-eof's 8 clients), one connection each, each writing 4 KiB at a
// random block below EOF of a written file and flushing, as below-eof's
// clients write with sync=data.
func (e *env) nbdBelowEOF() *comparison {
	const path = "loadtest/nbd-below-eof.dat"
	bs := e.bs(4 << 10)
	size := e.fileSize(256<<20, bs)
	jobs := e.clients(8)
	shape := nbdShape{name: "nbd-below-eof", jobs: jobs, depth: 1, fsync: 1}
	setup := func(ctx context.Context, s *session) error { return writeFile(ctx, s.client, path, size) }
	col := func(policy string) column {
		sock := filepath.Join(e.work, "nbd-below-eof-"+policy+".sock")
		return column{name: policy, daemon: nbdDaemon(sock, "--policy", policy), setup: setup,
			run: countSyncs(nbdFio(sock, path, size, shape)), transport: transportNBD}
	}
	return &comparison{
		name:        shape.name,
		preparation: writtenPreparation(size),
		title: fmt.Sprintf("fio's nbd engine, %d jobs of one connection each: random %s writes below EOF of a written %s file, a FLUSH after each, buffered",
			jobs, sizeName(bs), sizeName(size)),
		clients: jobs, connections: jobs, bs: bs, byServer: true,
		columns: []column{col("exclusive"), col("unlocked-below-eof")},
		ratios:  [][2]string{{"unlocked-below-eof", "exclusive"}},
	}
}

// nbdPreallocOverwrite is prealloc-overwrite through NBD: the ext4 shared
// lock for unwritten extents, shared-written vs shared-overwrite, O_DIRECT.
// Ten fio jobs of one connection each write bs at random blocks of a file
// fallocated afresh before every run, as prealloc-overwrite prepares it.
func (e *env) nbdPreallocOverwrite(bs int) *comparison {
	path := "loadtest/nbd-prealloc-" + sizeName(bs) + ".dat"
	size := e.fileSize(max(1<<30, int64(bs)<<16), bs)
	jobs := e.clients(10)
	shape := nbdShape{name: "nbd-prealloc-overwrite-" + sizeName(bs), jobs: jobs, depth: 1}
	fresh := func(ctx context.Context, s *session) error { return fallocateFile(ctx, s.client, path, size) }
	free := func(ctx context.Context, s *session) error {
		_, err := s.client.Truncate(ctx, &filewritev1.TruncateRequest{Path: path, Size: 0})
		return err
	}
	col := func(policy string) column {
		sock := filepath.Join(e.work, "nbd-prealloc-"+sizeName(bs)+"-"+policy+".sock")
		return column{name: policy, daemon: nbdDaemon(sock, "--policy", policy, "--io", "direct"),
			before: fresh, after: free, run: nbdFio(sock, path, size, shape), transport: transportNBD}
	}
	return &comparison{
		name:        shape.name,
		preparation: fmt.Sprintf("truncated to 0 and fallocated to %s (all blocks unwritten) before every run", sizeName(size)),
		title: fmt.Sprintf("fio's nbd engine, %d jobs of one connection each: random %s O_DIRECT writes into a freshly fallocated %s file",
			jobs, sizeName(bs), sizeName(size)),
		clients: jobs, connections: jobs, bs: bs, byServer: true,
		columns: []column{col("shared-written"), col("shared-overwrite")},
		ratios:  [][2]string{{"shared-overwrite", "shared-written"}},
	}
}
