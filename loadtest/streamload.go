package main

import (
	"context"
	"errors"

	"github.com/filewrite/filewrite/client"
)

// clientWrites is a run of bs-byte writes at random blocks below fileSize
// through the client package: one Client, and a File of its own for each
// of the s.clients callers, all on path, so that the callers' writes share
// one WriteStream and its messages. The daemon may listen on TCP or on a
// unix socket (dialTarget).
func clientWrites(path string, fileSize int64, sync client.SyncMode) func(context.Context, *session) (*runResult, error) {
	return clientWritesOver(path, fileSize, sync, 1)
}

// clientWritesOver is clientWrites with the callers shared among streams
// Clients (each its own connection, so its own WriteStream): caller i
// writes through Client i mod streams.
func clientWritesOver(path string, fileSize int64, sync client.SyncMode, streams int) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		var opts []client.Option
		if s.token != "" {
			opts = append(opts, client.WithToken(s.token))
		}
		clients := make([]*client.Client, max(1, min(streams, s.clients)))
		for i := range clients {
			c, err := client.Dial(dialTarget(s.addr), opts...)
			if err != nil {
				return nil, err
			}
			defer c.Close()
			clients[i] = c
		}
		files := make([]*client.File, s.clients)
		for i := range files {
			var err error
			if files[i], err = clients[i%len(clients)].Open(ctx, path); err != nil {
				return nil, err
			}
		}
		data := patternBytes(s.bs)
		blocks, bs, seed := fileSize/int64(s.bs), int64(s.bs), uint64(s.round)
		r := loop(ctx, s, "client.File.Write", func(ctx context.Context, caller int, n int64) error {
			_, _, err := files[caller].Write(ctx, data, randomBlock(seed, n, blocks)*bs, sync)
			return err
		})
		var errs []error
		for _, f := range files {
			errs = append(errs, f.Close())
		}
		return r, errors.Join(errs...)
	}
}
