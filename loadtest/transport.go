package main

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"

	"github.com/filewrite/filewrite/client"
)

// Transports: how a column's clients reach the daemon. "unary" is one RPC
// per operation (ghz's runner where ghz can drive the workload, the
// harness's own loop otherwise); "stream" goes through the client package,
// each client goroutine with a *client.File of its own, so that every
// client has a WriteStream of its own and the daemon's policies see the
// same number of independent writers as under unary. "both" runs the two
// side by side in one comparison, alternated. A column that reaches the
// daemon by its NBD export is "nbd", whatever -transport says.
const (
	transportUnary  = "unary"
	transportStream = "stream"
	transportBoth   = "both"
	transportNBD    = "nbd"
)

// streamSuffix names a column's stream twin: "exclusive" runs unary,
// "exclusive-stream" the same daemon through WriteStream.
const streamSuffix = "-stream"

// transports rewrites c's columns for the -transport asked for. Columns
// without a stream run (the no-op RPC, raw pwrite) stay as they are.
func (e *env) transports(c *comparison) *comparison {
	t := e.opts.transport
	if t == "" {
		t = transportUnary
		if e.opts.scenario == "all" || e.opts.scenario == "files" || e.opts.scenario == "tracing" {
			t = transportBoth
		}
	}
	var cols []column
	var ratios [][2]string
	streamed := map[string]bool{}
	for _, col := range c.columns {
		if t != transportStream || col.stream == nil {
			u := col
			u.stream = nil
			if u.transport == "" && (col.stream != nil || col.daemon != nil) {
				u.transport = transportUnary
			}
			cols = append(cols, u)
		}
		if t != transportUnary && col.stream != nil {
			s := col
			s.name += streamSuffix
			s.run, s.stream, s.transport = col.stream, nil, transportStream
			cols = append(cols, s)
			streamed[col.name] = true
		}
	}
	for _, r := range c.ratios {
		mapped := [2]string{streamName(r[0], streamed), streamName(r[1], streamed)}
		switch {
		case t == transportUnary:
			ratios = append(ratios, r)
		case t == transportStream:
			ratios = append(ratios, mapped)
		default:
			ratios = append(ratios, r)
			if mapped != r {
				ratios = append(ratios, mapped)
			}
		}
	}
	out := *c
	out.columns, out.ratios = cols, ratios
	return &out
}

func streamName(col string, streamed map[string]bool) string {
	if streamed[col] {
		return col + streamSuffix
	}
	return col
}

// streamFiles opens s.clients Files on path, each on a Client of its own
// (so each has its own WriteStream), the Clients spread over
// s.connections connections as ghz spreads its clients (0: one each).
// sync is every write's durability. close closes them all and returns the
// first error a File kept.
func streamFiles(ctx context.Context, s *session, path string, sync client.SyncMode) (files []*client.File, closeAll func() error, err error) {
	conns := s.connections
	if conns <= 0 || conns > s.clients {
		conns = s.clients
	}
	var ccs []*grpc.ClientConn
	var clients []*client.Client
	closeAll = func() error {
		var errs []error
		for _, f := range files {
			errs = append(errs, f.Close())
		}
		for _, c := range clients {
			errs = append(errs, c.Close())
		}
		for _, cc := range ccs {
			cc.Close()
		}
		return errors.Join(errs...)
	}
	var opts []client.Option
	if s.token != "" {
		opts = append(opts, client.WithToken(s.token))
	}
	for i := range s.clients {
		if i < conns {
			cc, err := dial(s.addr, "") // the token goes with client.WithToken
			if err != nil {
				closeAll()
				return nil, nil, err
			}
			ccs = append(ccs, cc)
		}
		c := client.New(ccs[i%conns], opts...)
		clients = append(clients, c)
		f, err := c.Open(ctx, path, client.WithSync(sync))
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("open %s: %w", path, err)
		}
		files = append(files, f)
	}
	return files, closeAll, nil
}

// streamWrites is ghzWrites through WriteStream: bs-byte writes at random
// blocks below fileSize (the same blocks, in the same order, as the unary
// run of the round), each client on its own File.
func streamWrites(path string, fileSize int64, sync client.SyncMode) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		files, closeAll, err := streamFiles(ctx, s, path, sync)
		if err != nil {
			return nil, err
		}
		data := patternBytes(s.bs)
		blocks, bs, seed := fileSize/int64(s.bs), int64(s.bs), uint64(s.round)
		r := loop(ctx, s, "WriteStream", func(ctx context.Context, c int, n int64) error {
			_, _, err := files[c].Write(ctx, data, randomBlock(seed, n, blocks)*bs, sync)
			return err
		})
		return r, closeAll()
	}
}

// streamWriteThenFsync is writeThenFsync with the write through the
// client's stream and the Fsync through its File.Sync.
func streamWriteThenFsync(path string, fileSize int64) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		files, closeAll, err := streamFiles(ctx, s, path, client.SyncNone)
		if err != nil {
			return nil, err
		}
		data := patternBytes(s.bs)
		blocks, bs, seed := fileSize/int64(s.bs), int64(s.bs), uint64(s.round)
		r := loop(ctx, s, "WriteStream+Fsync", func(ctx context.Context, c int, n int64) error {
			if _, _, err := files[c].Write(ctx, data, randomBlock(seed, n, blocks)*bs, client.SyncNone); err != nil {
				return fmt.Errorf("Write: %w", err)
			}
			if err := files[c].SyncData(ctx); err != nil {
				return fmt.Errorf("Fsync: %w", err)
			}
			return nil
		})
		return r, closeAll()
	}
}
