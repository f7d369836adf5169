package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// The files scenario asks whether the cost of a write stays flat as the
// set of files grows (issue 14): rows of one 64 MiB file, then 1,000,
// 10,000 and 100,000 files of 16 KiB, each multi-file row with the
// daemon's default flags and again with --max-open-files 1024, so that
// reopens and the extent cache are measured even where the default bound
// holds every file open. Clients write bs (4 KiB) at a random block of a
// random file, all files prepared alike: written in 16 KiB pieces through
// the service, then flushed (syncfs) before the runs, and after each run.
//
// Each row runs over the transports of -transport (both by default):
// unary Writes (ghz), and WriteStreams that each carry many files
// (filesMultiStream): a file is declared on a stream at its first write
// and closed, least recently used first, past the files the daemon can
// hold open. Both transports of a row share one daemon and its files. A daemon's memory, descriptors, reopens and
// extent-cache hits are read after each run.
//
// files-create measures the other side of many files: creating -create
// files (10,000), ten to a new directory, each with one synced write
// (SYNC_MODE_DATA), whose first sync also syncs the new directories above
// it; group commit against --fsync per-call, with the fsyncs of
// directories counted.

const (
	// filesSize is the size of each file of the multi-file rows.
	filesSize = 16 << 10
	// filesPerDir spreads the files of a row over directories.
	filesPerDir = 1000
	// createPerDir is how many of files-create's files share a directory.
	createPerDir = 10
	// oneFileRow is the name of the row the others are compared with.
	oneFileRow = "1-file"
)

// filesRow is one row of the files scenario: count files of size bytes,
// served by a daemon with flags.
type filesRow struct {
	name  string
	count int
	size  int64
	flags []string
}

// path is the path of file i of the row.
func (r filesRow) path(i int) string {
	return fmt.Sprintf("%s/d%03d/f%06d", r.name, i/filesPerDir, i)
}

// countName prints a file count the way the table names rows: 1k, 100k.
func countName(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

func (e *env) filesRows(bs int) []filesRow {
	rows := []filesRow{{name: oneFileRow, count: 1, size: e.fileSize(64<<20, max(bs, filesSize))}}
	bound := strconv.Itoa(e.opts.maxOpenFiles)
	for _, n := range e.opts.files {
		rows = append(rows,
			filesRow{name: countName(n), count: n, size: filesSize},
			filesRow{name: countName(n) + "-open" + bound, count: n, size: filesSize, flags: []string{"--max-open-files", bound}})
	}
	return rows
}

// files is the comparison of the rows; transports gives each its stream
// twin.
func (e *env) files() *comparison {
	bs := e.bs(4 << 10)
	c := &comparison{
		name:        "files",
		title:       fmt.Sprintf("random %s writes at random blocks of random files, one 64 MiB file against many of 16 KiB", sizeName(bs)),
		clients:     e.clients(32),
		bs:          bs,
		daemonStats: true,
		paired:      true,
		print:       printFilesTable,
	}
	for _, row := range e.filesRows(bs) {
		if e.opts.target != "" && row.flags != nil {
			continue // the harness cannot change a running server's flags
		}
		c.columns = append(c.columns, column{name: row.name, daemon: append([]string{}, row.flags...), daemonKey: row.name,
			setup: setupFiles(row), after: syncDataDir, run: filesUnary(row), stream: filesMultiStream(row, e.opts.streams)})
		if row.name != oneFileRow {
			c.ratios = append(c.ratios, [2]string{row.name, oneFileRow})
		}
	}
	return c
}

// setupFiles writes every file of row in full, in pieces of 16 KiB (the
// one-file row too, so that every row's page cache starts alike) from the
// session's clients, and flushes them: once per daemon, which the twins of
// a row (one per transport) share.
func setupFiles(row filesRow) func(context.Context, *session) error {
	var mu sync.Mutex
	done := map[string]bool{}
	return func(ctx context.Context, s *session) error {
		mu.Lock()
		defer mu.Unlock()
		if done[s.addr] {
			return nil
		}
		done[s.addr] = true
		clients, closeAll, err := dialClients(s.addr, s.token, s.clients, s.connections)
		if err != nil {
			return err
		}
		defer closeAll()
		data := patternBytes(filesSize)
		pieces := (row.size + filesSize - 1) / filesSize
		total := int64(row.count) * pieces
		var next int64
		var mu sync.Mutex
		errs := make(chan error, len(clients))
		for _, c := range clients {
			go func() {
				for {
					mu.Lock()
					n := next
					next++
					mu.Unlock()
					if n >= total || ctx.Err() != nil {
						errs <- ctx.Err()
						return
					}
					off := (n % pieces) * filesSize
					req := &filewritev1.WriteRequest{Path: row.path(int(n / pieces)), Offset: off, Data: data[:min(filesSize, row.size-off)]}
					if _, err := c.Write(ctx, req); err != nil {
						errs <- fmt.Errorf("prepare %s: %w", req.Path, err)
						return
					}
				}
			}()
		}
		var first error
		for range clients {
			first = errors.Join(first, <-errs)
		}
		if first != nil {
			return first
		}
		return syncDataDir(ctx, s)
	}
}

// syncDataDir flushes the filesystem of the daemon's data (syncfs), so that
// a run neither starts with another's dirty pages nor leaves its own to the
// next: untimed, before and after runs. With -target the harness cannot
// reach the server's files, and does nothing.
func syncDataDir(_ context.Context, s *session) error {
	if s.daemon == nil {
		return nil
	}
	f, err := os.Open(s.daemon.root)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", s.daemon.root, err)
	}
	return nil
}

// filesBlock picks request n's file and offset: a random block of the
// row's files, all of one size.
func filesBlock(row filesRow, bs int, seed uint64, n int64) (file int, off int64) {
	perFile := max(row.size/int64(bs), 1)
	b := randomBlock(seed, n, int64(row.count)*perFile)
	return int(b / perFile), (b % perFile) * int64(bs)
}

// filesUnary is a run of unary Writes at random blocks of random files of
// row, driven by ghz.
func filesUnary(row filesRow) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		enc, err := newPathWriteEncoder(s.bs, filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED)
		if err != nil {
			return nil, err
		}
		seed := uint64(s.round)
		return ghzRun{
			call: callWrite, addr: s.addr, token: s.token, clients: s.clients, connections: s.connections, duration: s.duration, done: s.done,
			message: func(n int64) []byte {
				file, off := filesBlock(row, s.bs, seed, n)
				return enc.encode(row.path(file), off)
			},
		}.run(ctx, "")
	}
}

// pathWriteEncoder builds WriteRequests that differ in path and offset:
// the data and sync fields are encoded once, and each call prepends the
// two fields that change (protobuf accepts fields in any order).
type pathWriteEncoder struct{ fixed []byte }

func newPathWriteEncoder(bs int, sync filewritev1.SyncMode) (*pathWriteEncoder, error) {
	fixed, err := proto.Marshal(&filewritev1.WriteRequest{Data: patternBytes(bs), Sync: sync})
	if err != nil {
		return nil, err
	}
	return &pathWriteEncoder{fixed: fixed}, nil
}

// encode returns the length-delimited WriteRequest for path and off.
func (e *pathWriteEncoder) encode(path string, off int64) []byte {
	var head [64 + binaryVarintMax]byte
	h := protowire.AppendTag(head[:0], 1, protowire.BytesType)
	h = protowire.AppendString(h, path)
	h = protowire.AppendTag(h, 2, protowire.VarintType)
	h = protowire.AppendVarint(h, uint64(off))
	n := len(h) + len(e.fixed)
	b := protowire.AppendVarint(make([]byte, 0, n+binaryVarintMax), uint64(n))
	b = append(b, h...)
	return append(b, e.fixed...)
}

// filesCreate is files-create: -create new files, ten to a new directory,
// each made by one synced Write, group commit against per-call syncs.
func (e *env) filesCreate() *comparison {
	bs := e.bs(4 << 10)
	n := e.opts.createFiles
	return &comparison{
		name: "files-create",
		title: fmt.Sprintf("%d new files, %d to a new directory, each made by one %s Write with sync=data: fsyncs of directories shared or not",
			n, createPerDir, sizeName(bs)),
		clients: e.clients(32), bs: bs, byServer: true, daemonStats: true,
		print: printCreateTable,
		columns: []column{
			{name: "group", daemon: []string{}, run: createFiles(n), after: syncDataDir},
			{name: "per-call", daemon: []string{"--fsync", "per-call"}, run: createFiles(n), after: syncDataDir},
		},
		ratios: [][2]string{{"group", "per-call"}},
	}
}

// createFiles creates n files below a directory of the round's own, so
// that each round makes new directories, each file by one Write of bs
// bytes with SYNC_MODE_DATA. The run ends when all are made.
func createFiles(n int) func(context.Context, *session) (*runResult, error) {
	return unaryRun(func(ctx context.Context, s *session, clients []filewritev1.FileServiceClient, data []byte) *runResult {
		prefix := fmt.Sprintf("create-%s/r%d", s.column, s.round)
		return loopN(ctx, s, "Write(create, sync=data)", int64(n), func(ctx context.Context, client int, i int64) error {
			path := fmt.Sprintf("%s/d%05d/f%07d", prefix, i/createPerDir, i)
			_, err := clients[client].Write(ctx, &filewritev1.WriteRequest{Path: path, Data: data, Sync: filewritev1.SyncMode_SYNC_MODE_DATA})
			return err
		})
	})
}
