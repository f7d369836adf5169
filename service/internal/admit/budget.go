package admit

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/bufpool"
	"github.com/filewrite/filewrite/service/internal/status"
)

// Budget bounds the bytes that requests in flight hold across the
// whole daemon (--max-inflight-bytes): gRPC messages, REST bodies, Reads'
// data, and what streams hold. A request that would pass the bound waits
// until others release enough or its context ends; it does not fail for
// the bound alone.
//
// What a request holds is an estimate, in bytes, of the memory it keeps
// alive: the copies of its data that the path it takes makes (see
// GRPCCopies and the gateway's reservations), not just its data. It is
// taken once the request's bytes have arrived, never for bytes still to
// come: a peer that sends a call's headers and nothing more holds none of
// it (docs/guarantees.md states the bound per call).
//
// Waiters are served in arrival order, so that a stream of small requests
// cannot starve a large one; but the first waiter holds back those
// behind it for at most headPatience: after that, a waiter that fits in
// what is free goes ahead (the first keeps its place). So no request
// that would fit waits indefinitely behind one that does not.
//
// Who may call what: Acquire and Release are safe for concurrent use.
// Every Acquire(ctx, n) that returns nil must be matched by Releases that
// add up to n, from the same caller; a caller may release part of what it
// holds early (a message turned out smaller than its reservation).
type Budget struct {
	capacity int64
	// patience is headPatience, shorter or longer in tests.
	patience time.Duration

	// mu guards free, queue and timer. A leaf lock.
	mu   sync.Mutex
	free int64
	// queue holds the waiters in arrival order.
	queue []*budgetWaiter
	// timer lets the waiters behind the first go ahead once its patience
	// has run out, when no Release comes to do it.
	timer *time.Timer

	// held and waiting are for metrics and tests only: held counts what
	// Acquire granted and Release has not taken back, waiting the callers
	// inside Acquire.
	held, waiting atomic.Int64
}

// headPatience is how long the first request waiting for the budget may
// hold back requests behind it that would fit.
const headPatience = time.Second

// budgetWaiter is one caller waiting in Acquire.
type budgetWaiter struct {
	n int64
	// first is when it became the first waiter.
	first time.Time
	// ready is closed once the waiter is granted. granted says so to a
	// waiter whose context ended meanwhile; it is guarded by
	// Budget.mu, under which ready is closed too.
	ready   chan struct{}
	granted bool
}

// Held is what Acquire granted and Release has not taken back, Waiting
// the callers inside Acquire, and Capacity the bound: for metrics and
// tests.
func (b *Budget) Held() int64     { return b.held.Load() }
func (b *Budget) Waiting() int64  { return b.waiting.Load() }
func (b *Budget) Capacity() int64 { return b.capacity }

// SetPatience sets how long b's first waiter holds back the others
// (headPatience), for a test that needs them served strictly in order (a
// long patience).
func (b *Budget) SetPatience(d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.patience = d
}

func NewBudget(capacity int64) *Budget {
	return &Budget{capacity: capacity, free: capacity, patience: headPatience}
}

// clamp: a request that needs more than the whole budget gets all of it,
// once nobody else holds any, rather than waiting forever.
func (b *Budget) clamp(n int64) int64 {
	return max(0, min(n, b.capacity))
}

// Acquire waits until n bytes are free or ctx ends, and takes them. On
// error (ctx's, as a *status.BudgetWaitError) it holds nothing. A nil budget is unbounded.
func (b *Budget) Acquire(ctx context.Context, n int64) error {
	if b == nil {
		return nil
	}
	n = b.clamp(n)
	if n == 0 {
		return ctx.Err()
	}
	if err := ctx.Err(); err != nil {
		return &status.BudgetWaitError{Capacity: b.capacity, Err: err}
	}
	b.mu.Lock()
	if n <= b.free && (len(b.queue) == 0 || b.headOverdueLocked(time.Now())) {
		b.free -= n
		b.mu.Unlock()
		b.held.Add(n)
		return nil
	}
	w := &budgetWaiter{n: n, ready: make(chan struct{})}
	b.queue = append(b.queue, w)
	if len(b.queue) == 1 {
		b.newHeadLocked(time.Now())
	}
	b.waiting.Add(1)
	b.mu.Unlock()
	defer b.waiting.Add(-1)

	select {
	case <-w.ready:
		b.held.Add(n)
		return nil
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if w.granted {
		// Granted as ctx ended: give it back, to whoever waits.
		b.free += n
	} else {
		i := slices.Index(b.queue, w)
		b.queue = slices.Delete(b.queue, i, i+1)
		if i == 0 && len(b.queue) > 0 {
			b.newHeadLocked(time.Now())
		}
	}
	b.grantLocked()
	// Said apart from a deadline that passed elsewhere: the request was
	// never performed, and may be retried once memory frees up.
	return &status.BudgetWaitError{Capacity: b.capacity, Err: ctx.Err()}
}

// Release gives back n bytes taken by Acquire.
func (b *Budget) Release(n int64) {
	if b == nil {
		return
	}
	n = b.clamp(n)
	if n == 0 {
		return
	}
	b.held.Add(-n)
	b.mu.Lock()
	b.free += n
	b.grantLocked()
	b.mu.Unlock()
}

// headOverdueLocked reports whether the first waiter's patience has run
// out.
//
// Preconditions: b.mu is held; b.queue is not empty.
func (b *Budget) headOverdueLocked(now time.Time) bool {
	return now.Sub(b.queue[0].first) >= b.patience
}

// newHeadLocked starts the patience of the first waiter, which has just
// become first.
//
// Preconditions: b.mu is held; b.queue is not empty.
func (b *Budget) newHeadLocked(now time.Time) {
	b.queue[0].first = now
	if b.timer == nil {
		b.timer = time.AfterFunc(b.patience, b.patienceOut)
		return
	}
	b.timer.Reset(b.patience)
}

// patienceOut lets waiters that fit go ahead of a first waiter whose
// patience has run out.
func (b *Budget) patienceOut() {
	b.mu.Lock()
	b.grantLocked()
	b.mu.Unlock()
}

// grantLocked grants, in order, every waiter that fits in what is free,
// stopping at the first that does not unless its patience has run out.
//
// With no waiter, the common case of every Release, it reads no clock.
//
// Preconditions: b.mu is held.
func (b *Budget) grantLocked() {
	if len(b.queue) == 0 {
		return
	}
	now := time.Now()
	for i := 0; i < len(b.queue); {
		w := b.queue[i]
		if w.n <= b.free {
			b.free -= w.n
			w.granted = true
			close(w.ready)
			b.queue = slices.Delete(b.queue, i, i+1)
			if i == 0 && len(b.queue) > 0 {
				b.newHeadLocked(now)
			}
			continue
		}
		if i == 0 && !b.headOverdueLocked(now) {
			return
		}
		i++
	}
}

// GRPCBudget takes the public gRPC server's calls' shares of the budget.
// grpc-go reads and decodes a unary call's message before any interceptor
// runs, and queues its reply to be written after the call has ended, so
// the shares are taken and given back around those two points:
//
//  1. Nothing is taken while the message arrives: a call that sent its
//     headers and nothing more holds nothing, however long it waits, and a
//     call whose message arrives holds what arrived (gRPC's buffers hold
//     the frames as they come, not the size the message's header claims).
//  2. Once the message is decoded (stats.InPayload), the call takes
//     GRPCCopies of it, waiting if need be; meanwhile it holds its message
//     received and decoded, about GRPCCopies times what its peer sent,
//     outside the budget (docs/guarantees.md).
//  3. A Read gives back what its request held and takes GRPCCopies of what
//     its reply will hold before the store is asked (unary).
//  4. Its reply keeps what it holds until grpc-go has written it and freed
//     its buffer (Marshal): the call ends when the reply is queued, which
//     for a slow reader can be long before it is sent.
//  5. The call gives back the rest when it ends (stats.End).
//
// gRPC health calls take nothing: a probe must answer while the budget is
// short. Streams take their share per message (BudgetStream), and a
// WriteStream for the writes it holds until their acks go out
// (StreamBudget).
type GRPCBudget struct {
	budget *Budget
	// maxRequest is --max-request-bytes.
	maxRequest int64
	// replies holds what a Read's reply owes the budget, and the pooled
	// buffer its data lies in if any, from the end of its handler until
	// Marshal hands them to the reply's encoding:
	// *filewritev1.ReadResponse → replyShare.
	replies sync.Map
}

func NewGRPCBudget(b *Budget, maxRequest int64) *GRPCBudget {
	return &GRPCBudget{budget: b, maxRequest: maxRequest}
}

// receiveCopies is how many copies of its message a unary call holds at
// the peak of its decoding: the buffers grpc-go received it into, the one
// buffer it joins them into, and the decoded message, which copies the
// data once more.
const receiveCopies = 3

// receiveHold is what a unary call holds at the peak of its decoding, for
// a message at the data limit: the least --max-inflight-bytes accepted. A
// message up to gRPC's own, larger limit (for WriteStream) is refused by
// the store after it was decoded, and may hold more meanwhile.
func receiveHold(maxRequestBytes int64) int64 {
	return receiveCopies * int64(status.MaxMessageBytes(maxRequestBytes))
}

// GRPCCopies is how many copies of a message's bytes a unary call holds
// once its message is decoded: the decoded message, and the buffers it was
// received into, garbage not yet collected; for a Read, the data the store
// read and the reply encoded from it (one copy where the reply is sent
// from its pooled buffer, readreply.go: the share stays, for the replies
// that are not).
const GRPCCopies = 2

// callBudget is what one unary call holds. Its stats events and
// interceptor all run on the call's own goroutine, one after the other, so
// it needs no lock. A stream's do not: its messages may be received on a
// goroutine of its handler's (WriteStream's reader) while the call ends,
// so a stream's callBudget is marked at Begin, before its handler runs,
// and left alone after (streams take their shares in BudgetStream).
type callBudget struct {
	stream bool
	held   int64
	// err is why the call could not take its share (its context ended
	// while it waited): unary answers it instead of running the handler.
	err   error
	reply *filewritev1.ReadResponse // whose share is in GRPCBudget.replies
	// data is the pooled buffer ReplyBuffer gave the call's handler for
	// a Read's data; nil if none.
	data *[]byte
}

type callBudgetKey struct{}

// TagCall gives a call its callBudget, unless it is a health call.
func (g *GRPCBudget) TagCall(ctx context.Context, method string) context.Context {
	if strings.HasPrefix(method, status.HealthPrefix) {
		return ctx
	}
	return context.WithValue(ctx, callBudgetKey{}, &callBudget{})
}

// Event is the budget's part of the stats handler.
func (g *GRPCBudget) Event(ctx context.Context, s stats.RPCStats) {
	cb, _ := ctx.Value(callBudgetKey{}).(*callBudget)
	if cb == nil || cb.stream {
		return
	}
	switch s := s.(type) {
	case *stats.Begin:
		if s.IsClientStream || s.IsServerStream {
			cb.stream = true
		}
	case *stats.InPayload:
		want := GRPCCopies * int64(s.Length)
		if err := g.budget.Acquire(ctx, want); err != nil {
			cb.err = err
			return
		}
		cb.held = want
	case *stats.End:
		if cb.reply != nil {
			if share, ok := g.replies.LoadAndDelete(cb.reply); ok {
				g.budget.Release(share.(replyShare).owed) // never marshaled
			}
			// The call's context lives on until its reply is written:
			// through it, the reply's data would too.
			cb.reply = nil
		}
		g.budget.Release(cb.held)
		cb.held = 0
	}
}

// Unary takes what a Read's reply will hold before the store reads it. The
// request's own share is given back first, so that no call waits while
// holding any: calls that held while waiting could leave every byte held
// by waiters.
func (g *GRPCBudget) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	cb, _ := ctx.Value(callBudgetKey{}).(*callBudget)
	if cb != nil && cb.err != nil {
		return nil, status.Of(cb.err)
	}
	r, ok := req.(*filewritev1.ReadRequest)
	if cb == nil || !ok {
		return handler(ctx, req)
	}
	// The decoder keeps unknown fields; a Read needs none, and dropped
	// they hold no memory that nothing counts while it waits. (Unless
	// they are the marker of a Read that did not decode, refused later.)
	if _, bad := status.Undecodable(r); !bad {
		r.ProtoReflect().SetUnknown(nil)
	}
	g.budget.Release(cb.held)
	cb.held = 0
	want := GRPCCopies * min(max(r.GetLength(), 0), g.maxRequest)
	if err := g.budget.Acquire(ctx, want); err != nil {
		return nil, status.Of(err)
	}
	cb.held = want
	resp, err := handler(ctx, req)
	data := cb.data
	cb.data = nil
	reply, ok := resp.(*filewritev1.ReadResponse)
	if !ok || err != nil {
		if data != nil {
			bufpool.Shared.Put(data) // the store's again: see ReadInto
		}
		return resp, err
	}
	if data != nil && !holds(data, reply.GetData()) {
		data = nil // not the reply's: marshaled as any other
	}
	owed := min(cb.held, int64(proto.Size(reply)))
	cb.held -= owed
	cb.reply = reply
	g.replies.Store(reply, replyShare{owed: owed, data: data})
	return resp, err
}

// BudgetStream makes a stream take the budget for each message it
// receives, once it has it: a stream may wait for hours for its next
// message, and could not hold the largest message's worth all that time.
// Each message is held until the next RecvMsg or the stream's end; while
// the budget is short, RecvMsg waits before it returns the message, so the
// stream reads no further and flow control holds its client back. A
// handler that keeps a message's bytes longer takes them itself, with
// Acquire and Release.
//
// WriteStream is such a handler, and the hand-over is by type: its
// messages decode into a streamRequest, not a proto.Message, so this
// takes nothing for them, and the stream takes each message's cost once
// it has read it and gives it back as the acks go out (StreamBudget).
// What remains here are the small messages of other streams (health's
// Watch, reflection).
//
// What this does not bound: the one message each stream may be receiving
// beyond the budget (at most the largest message, per stream).
func BudgetStream(b *Budget) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if strings.HasPrefix(info.FullMethod, status.HealthPrefix) {
			return handler(srv, ss) // a probe's Watch never waits for the budget
		}
		bs := &budgetedStream{ServerStream: ss, budget: b}
		defer bs.end()
		return handler(srv, bs)
	}
}

type budgetedStream struct {
	grpc.ServerStream
	budget *Budget

	// mu guards held and ended: RecvMsg may run on a goroutine of the
	// handler's own (WriteStream reads on one) while the handler returns.
	mu    sync.Mutex
	held  int64
	ended bool // the handler returned: hold nothing more
}

func (s *budgetedStream) setHeld(n int64) {
	s.mu.Lock()
	if s.ended {
		n = 0
	}
	old := s.held
	s.held = n
	s.mu.Unlock()
	s.budget.Release(old)
}

func (s *budgetedStream) end() {
	s.mu.Lock()
	s.ended = true
	s.mu.Unlock()
	s.setHeld(0)
}

func (s *budgetedStream) RecvMsg(m any) error {
	s.setHeld(0)
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	msg, ok := m.(proto.Message)
	if !ok {
		return nil
	}
	n := int64(proto.Size(msg))
	if err := s.budget.Acquire(s.Context(), n); err != nil {
		return status.Of(err)
	}
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		s.budget.Release(n)
		return nil
	}
	s.held = n
	s.mu.Unlock()
	return nil
}

// MinInflightBytes is the least --max-inflight-bytes accepted: what one
// unary gRPC call holds while its message, which may be at the data limit,
// is received. A smaller budget could never admit one.
func MinInflightBytes(maxRequestBytes int64) int64 {
	return receiveHold(maxRequestBytes)
}
