package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync/atomic"

	"google.golang.org/grpc"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// Append writes p at the end of the file with the File's SyncMode and
// returns the offset where it landed: p occupies [off, off+len(p)). It is
// safe from many goroutines, of this and other clients: appends never
// overlap, and each is one call (p is at most the daemon's
// --max-request-bytes; it is not split, for a range is reserved whole).
// Once it returns, every Read sees p; with SyncData or SyncFull, p and
// every append below it are durable.
//
// Under WithRetry each append carries an append ID of its own, and one
// that failed because the daemon could not be reached or went away
// (UNAVAILABLE) is sent again with the same ID, with backoff, after
// waiting for the connection: the daemon answers a resend of an append it
// has made with the first offset and writes nothing, so the append lands
// once. The daemon remembers IDs for a bounded window and in memory only:
// a resend across a restart of the daemon may land twice. Without
// WithRetry an append is sent once, with no ID.
func (f *File) Append(ctx context.Context, p []byte) (int64, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	req := &filewritev1.AppendRequest{Path: f.path, Data: p, Sync: f.sync.proto()}
	if f.c.opts.retries > 0 {
		req.AppendId = f.c.appendIDs.next()
	}
	for attempt := 1; ; attempt++ {
		resp, err := f.c.api.Append(f.c.outgoing(ctx, f.path), req, grpc.WaitForReady(attempt > 1))
		if err == nil {
			return resp.GetOffset(), nil
		}
		if req.AppendId == "" || attempt > f.c.opts.retries || !retryable(err) ||
			!sleep(ctx, f.c.ctx.Done(), backoff(attempt)) {
			return 0, wrapErr(err)
		}
	}
}

// appendIDs makes the IDs of a Client's appends: a random prefix of the
// Client's, then a counter, so that IDs are unique per file for as long as
// the Client lives, and across Clients.
type appendIDs struct {
	prefix string
	seq    atomic.Uint64
}

func newAppendIDs() *appendIDs {
	var b [12]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return &appendIDs{prefix: hex.EncodeToString(b[:]) + "-"}
}

func (a *appendIDs) next() string {
	return a.prefix + strconv.FormatUint(a.seq.Add(1), 36)
}
