package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"hash/crc32"
	"strconv"
	"sync/atomic"

	"google.golang.org/grpc"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// Append writes p at the end of the file with the File's SyncMode and
// returns the offset where it landed: p occupies [off, off+len(p)). It is
// safe from many goroutines, of this and other clients: appends never
// overlap, and each is one append (p is at most the daemon's
// --max-request-bytes; it is not split, for a range is reserved whole).
// Once it returns, every Read sees p; with SyncData or SyncFull, p and
// every append below it are durable.
//
// Appends go on the File's stream, as writes do, and coalesce the same
// way: those that callers start while a message is being sent share the
// next one. The daemon gives a stream's appends increasing offsets in the
// order they were sent, so one goroutine's appends land in call order.
// Like WriteAt, an append on the stream goes to the file the File holds
// (see File). An append larger than a piece (WithMaxMessageBytes), or on
// a Client whose paths each have a stream of their own
// (WithSharedStreams(0), WithRingHash), is a unary Append call instead:
// the client cannot tell such a stream's daemon from one that predates
// appends on streams, which would take an append for a write at offset 0
// (a daemon that takes shared streams takes appends on them too).
//
// Under WithRetry each append carries an append ID of its own, and one
// that failed because the daemon could not be reached or went away
// (UNAVAILABLE) is sent again with the same ID, with backoff, after
// waiting for the connection: the daemon answers a resend of an append it
// has made with the first offset and writes nothing, so the append lands
// once. The daemon remembers IDs for a bounded window, also across a crash
// and restart of the daemon (it journals them), but not across a power
// cut of its machine, after which a resend may land twice. Without
// WithRetry an append is sent once, with no ID.
func (f *File) Append(ctx context.Context, p []byte) (int64, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, wrapErr(err) // not sent, as Write
	}
	var id string
	if f.c.opts.retries > 0 {
		id = f.c.appendIDs.next()
	}
	if !f.c.sharing() || len(p) > f.c.opts.piece {
		return f.appendUnary(ctx, p, id)
	}
	w := getWrite()
	w.f, w.data, w.sync, w.append = f, p, f.sync, true
	w.crc = crc32.Checksum(p, castagnoli)
	if id != "" {
		w.appendID = []byte(id)
	}
	ws := [1]*write{w}
	if err := f.s.enqueue(ws[:]); err != nil {
		putWrite(w) // never queued: nothing else refers to it
		return 0, err
	}
	select {
	case <-w.done:
	case <-ctx.Done():
		// Taken out if still queued; if sent, it may land, and a failure
		// goes to Close, as for a write.
		f.s.giveUp(ws[:])
		return 0, wrapErr(ctx.Err())
	}
	off, err := w.landed, wrapErr(w.err)
	putWrite(w)
	if err != nil {
		return 0, err
	}
	return off, nil
}

// appendUnary is Append as one Append call, with id if not empty, resent
// on UNAVAILABLE under WithRetry.
func (f *File) appendUnary(ctx context.Context, p []byte, id string) (int64, error) {
	req := &filewritev1.AppendRequest{Path: f.path, Data: p, Sync: f.sync.proto(), AppendId: id}
	retries := f.c.opts.retries
	if id == "" {
		retries = 0 // a resend without an id could land twice
	}
	var off int64
	err := retry(ctx, f.c.ctx.Done(), retries, func(attempt int) error {
		resp, err := f.c.api.Append(f.c.outgoing(ctx, f.path), req, grpc.WaitForReady(attempt > 1))
		off = resp.GetOffset()
		f.learned(resp.GetGeneration())
		return err
	})
	if err != nil {
		return 0, wrapErr(err)
	}
	return off, nil
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
