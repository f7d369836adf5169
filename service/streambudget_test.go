package service

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/admit"
)

// The daemon-wide budget (--max-inflight-bytes) and WriteStreams: what a
// stream holds unacknowledged counts against it with every other request.
// The tests run daemons with small budgets, near the least one accepted
// (what one message at --max-request-bytes holds while it is received,
// which any unary call takes while its message arrives), and writes of
// one byte, each costing admit.WriteCost(1) of it, so that a single message can
// pass what is free without passing the whole budget.

const streamBudgetMaxRequest = 64 << 10

// startBudgetDaemon starts such a daemon, with extra bytes of budget
// beyond the least, whose writes to gate's file are held until gate
// opens, at the latest when the test ends (before the daemon's shutdown,
// which waits for them).
func startBudgetDaemon(t *testing.T, extra int64, gate *writeGate) *daemon {
	d := startDaemon(t, func(c *Config) {
		c.Store.MaxRequestBytes = streamBudgetMaxRequest
		c.MaxInflightBytes = admit.MinInflightBytes(streamBudgetMaxRequest) + extra
		c.Store.Hooks = gate.hooks()
	})
	t.Cleanup(gate.open)
	return d
}

// tinyWrites is a message of n one-byte writes, ids and offsets from first.
func tinyWrites(first uint64, n int) *filewritev1.WriteStreamRequest {
	req := &filewritev1.WriteStreamRequest{}
	for id := first; id < first+uint64(n); id++ {
		req.Writes = append(req.Writes, streamWriteOf(id, int64(id), []byte{byte(id)}, 0))
	}
	return req
}

// pastFree is how many one-byte writes cost more than b has free.
func pastFree(b *admit.Budget) int {
	return int((b.Capacity()-b.Held())/admit.WriteCost(1)) + 1
}

// waitForWaiters waits until n callers wait for b, and fails the test if
// done is ready first: what should have waited went through. (A nil done
// is never ready.)
func waitForWaiters[T any](t *testing.T, b *admit.Budget, n int64, what string, done <-chan T) {
	t.Helper()
	for b.Waiting() < n {
		select {
		case v := <-done:
			t.Fatalf("%s did not wait for the budget (%d of %d bytes held): it ended with %v", what, b.Held(), b.Capacity(), v)
		case <-time.After(time.Millisecond):
		}
	}
}

func (e streamEnd) String() string { return fmt.Sprintf("%d acks, then %v", len(e.acks), e.err) }

// endOf reads stream to its end in the background.
func endOf(stream writeStreamClient) <-chan streamEnd {
	c := make(chan streamEnd, 1)
	go func() { c <- recvAll(stream) }()
	return c
}

// checkAllAcked checks that a stream ended OK with n acks, each OK.
func checkAllAcked(t *testing.T, what string, e streamEnd, n int) {
	t.Helper()
	if e.err != nil {
		t.Errorf("%s ended with %v, want OK", what, e.err)
	}
	if len(e.acks) != n {
		t.Errorf("%s: %d acks, want %d", what, len(e.acks), n)
	}
	for _, a := range e.acks {
		if a.GetStatus() != nil {
			t.Errorf("%s: write %d acked with %v, want OK", what, a.GetId(), a.GetStatus())
			break
		}
	}
}

// TestWriteStreamWaitsForTheBudget: a WriteStream whose message would take
// the daemon past --max-inflight-bytes, while a unary Write holds its
// share, waits with none of the message's writes applied, instead of
// failing; once the Write is done the stream goes on, acks every write
// OK and ends OK, and the budget is whole again.
func TestWriteStreamWaitsForTheBudget(t *testing.T) {
	gate := newWriteGate("held.bin")
	d := startBudgetDaemon(t, 0, gate)
	ctx := testContext(t)
	budget := d.srv.budget

	held := make(chan error, 1)
	go func() {
		_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "held.bin", Data: testutil.AllBytes(streamBudgetMaxRequest)})
		held <- err
	}()
	gate.waitEntered(t, ctx)

	stream := openStream(t, ctx, d.client, "stream.bin")
	n := pastFree(budget)
	if err := stream.Send(tinyWrites(0, n)); err != nil {
		t.Fatal(err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	end := endOf(stream)
	waitForWaiters(t, budget, 1, "a stream message past the free budget", end)
	if got := len(d.onDisk(t, "stream.bin")); got != 0 {
		t.Errorf("stream.bin holds %d bytes while its message waits for the budget, want 0", got)
	}
	if got := d.srv.files.StreamHeld(); got != 0 {
		t.Errorf("the stream holds %d bytes while it waits, want 0", got)
	}

	gate.open()
	if err := <-held; err != nil {
		t.Errorf("the Write that held the budget: %v", err)
	}
	checkAllAcked(t, "the stream that waited", <-end, n)
	if got, want := d.onDisk(t, "stream.bin"), tinyContent(n); string(got) != string(want) {
		t.Errorf("stream.bin holds %d bytes, not the %d written", len(got), len(want))
	}
	testutil.WaitFor(t, "the budget to be whole again", func() bool {
		return budget.Held() == 0 && d.srv.files.StreamHeld() == 0
	})
}

// tinyContent is what tinyWrites(0, n) leave in a new file.
func tinyContent(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

// TestStreamsAndUnaryShareTheBudget: the writes a WriteStream holds
// unacknowledged count against --max-inflight-bytes with unary calls: while
// a stream holds most of it (writes held inside the store), a gRPC Write
// and a REST PUT wait, and go through once the stream's writes are acked.
// The budget and the streams' held-bytes gauge agree all along.
func TestStreamsAndUnaryShareTheBudget(t *testing.T) {
	gate := newWriteGate("held.bin")
	d := startBudgetDaemon(t, 0, gate)
	ctx := testContext(t)
	budget := d.srv.budget

	stream := openStream(t, ctx, d.client, "held.bin")
	// The stream holds more than two thirds of the budget, so a unary
	// Write at --max-request-bytes (admit.GRPCCopies of it, once it arrived)
	// does not fit; a REST PUT's share is larger than the whole.
	const n = 1200
	if err := stream.Send(tinyWrites(0, n)); err != nil {
		t.Fatal(err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	gate.waitEntered(t, ctx)
	cost := int64(n) * admit.WriteCost(1)
	testutil.WaitFor(t, "the stream to hold its message", func() bool { return d.srv.files.StreamHeld() == cost })
	if got := budget.Held(); got != cost {
		t.Fatalf("the budget holds %d bytes while the stream holds %d unacknowledged: the stream is not counted", got, cost)
	}

	unary := make(chan error, 2)
	go func() {
		_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "unary.bin", Data: testutil.AllBytes(streamBudgetMaxRequest)})
		unary <- err
	}()
	waitForWaiters(t, budget, 1, "a gRPC Write", unary)
	go func() { unary <- putRaw(ctx, d.url+"/v1/files/put.bin", "rest") }()
	waitForWaiters(t, budget, 2, "a REST PUT", unary)

	gate.open()
	for range 2 {
		if err := <-unary; err != nil {
			t.Errorf("a request that waited for the stream's bytes: %v", err)
		}
	}
	checkAllAcked(t, "the stream", recvAll(stream), n)
	testutil.WaitFor(t, "the budget to be whole again", func() bool {
		return budget.Held() == 0 && d.srv.files.StreamHeld() == 0
	})
}

// TestWriteStreamBudgetReturnsToZero: every way a WriteStream can end gives
// back what it held of --max-inflight-bytes: half-closed, cancelled by its
// client (with writes held inside the store, and while waiting for the
// budget), ended by a stream error (a reused id, another path), by NOT_FOUND
// when its file is deleted, and by the daemon's shutdown (while waiting for
// the budget, and with writes held); and so do many streams opened,
// written and closed or cancelled at once. All along the budget holds
// exactly what the streams' held-bytes gauge says.
func TestWriteStreamBudgetReturnsToZero(t *testing.T) {
	gate := newWriteGate("held.bin")
	// Room for a unary call (Delete) while streams hold their writes.
	d := startBudgetDaemon(t, 512<<10, gate)
	ctx := testContext(t)
	budget := d.srv.budget
	streamHeld := d.srv.files.StreamHeld
	cancelled := func(path string) (writeStreamClient, context.CancelFunc) {
		sctx, cancel := context.WithCancel(ctx)
		t.Cleanup(cancel)
		return openStream(t, sctx, d.client, path), cancel
	}
	wantEnd := func(what string, e streamEnd, want codes.Code) {
		t.Helper()
		if got := status.Code(e.err); got != want {
			t.Errorf("%s ended with %v, want %v", what, e.err, want)
		}
	}

	// Two streams hold writes inside the store: one to be cancelled, one
	// to reuse an id. The first has a write held at the gate, which no
	// cancel ends; the other writes of both wait for the file's lock.
	const perHolder = 200
	holdCancelled, cancelHolder := cancelled("held.bin")
	holdReused := openStream(t, ctx, d.client, "held.bin")
	if err := holdCancelled.Send(tinyWrites(0, perHolder)); err != nil {
		t.Fatal(err)
	}
	gate.waitEntered(t, ctx)
	if err := holdReused.Send(tinyWrites(0, perHolder)); err != nil {
		t.Fatal(err)
	}
	heldCost := 2 * perHolder * admit.WriteCost(1)
	testutil.WaitFor(t, "two streams to hold their writes", func() bool { return streamHeld() == heldCost })
	if got := budget.Held(); got != heldCost {
		t.Fatalf("the budget holds %d bytes while streams hold %d unacknowledged: they are not counted", got, heldCost)
	}

	// A stream waits for the budget, and one behind it (first come, first
	// served, however long the first waits); the first is cancelled while
	// it waits, and the second goes on.
	budget.SetPatience(time.Hour)
	waitCancelled, cancelWaiter := cancelled("wait.bin")
	if err := waitCancelled.Send(tinyWrites(0, pastFree(budget))); err != nil {
		t.Fatal(err)
	}
	waitCancelledEnd := endOf(waitCancelled)
	waitForWaiters(t, budget, 1, "a stream message past the free budget", waitCancelledEnd)
	deleted := openStream(t, ctx, d.client, "deleted.bin")
	if err := deleted.Send(tinyWrites(0, 8)); err != nil {
		t.Fatal(err)
	}
	waitForWaiters[streamEnd](t, budget, 2, "a stream behind a waiting one", nil)
	cancelWaiter()
	wantEnd("a stream cancelled while waiting for the budget", <-waitCancelledEnd, codes.Canceled)
	for got := 0; got < 8; {
		resp, err := deleted.Recv()
		if err != nil {
			t.Fatalf("the stream behind the cancelled one: %v", err)
		}
		got += len(resp.GetAcks())
	}
	// Its file deleted, it ends with NOT_FOUND.
	if _, err := d.client.Delete(ctx, &filewritev1.DeleteRequest{Path: "deleted.bin"}); err != nil {
		t.Fatal(err)
	}
	wantEnd("a stream whose file was deleted", recvAll(deleted), codes.NotFound)

	// Stream errors: another path (refused before its cost is taken), and
	// an id still in use (refused after).
	other := openStream(t, ctx, d.client, "other.bin")
	if err := other.Send(&filewritev1.WriteStreamRequest{Path: "not-other.bin", Writes: tinyWrites(0, 4).Writes}); err != nil {
		t.Fatal(err)
	}
	wantEnd("a stream that named another path", recvAll(other), codes.InvalidArgument)
	if err := holdReused.Send(tinyWrites(perHolder-1, 4)); err != nil {
		t.Fatal(err)
	}
	holdReusedEnd := endOf(holdReused)
	// A client cancels with its writes held inside the store.
	cancelHolder()
	wantEnd("a stream cancelled with writes held", recvAll(holdCancelled), codes.Canceled)

	// Many streams at once, half of them cancelled with writes in flight.
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithCancel(ctx)
			defer cancel()
			s, err := d.client.WriteStream(sctx)
			if err != nil {
				t.Error(err)
				return
			}
			first := tinyWrites(0, 16)
			first.Path = fmt.Sprintf("churn/%d", i)
			for m := range 4 {
				if m > 0 {
					first = tinyWrites(uint64(m*16), 16)
				}
				if err := s.Send(first); err != nil {
					break // the server ended the stream: Recv says why
				}
			}
			if i%2 == 1 {
				return // cancelled, acks owed or not
			}
			s.CloseSend()
			checkAllAcked(t, fmt.Sprintf("churn stream %d", i), recvAll(s), 64)
		}()
	}
	wg.Wait()
	testutil.WaitFor(t, "the churn to give back all it held", func() bool {
		return budget.Held() == heldCost && streamHeld() == heldCost
	})

	// Shutdown: a stream waiting for the budget stops waiting, and ends
	// UNAVAILABLE; the streams with writes held end once they are acked.
	waitShutdown := openStream(t, ctx, d.client, "wait.bin")
	if err := waitShutdown.Send(tinyWrites(0, pastFree(budget))); err != nil {
		t.Fatal(err)
	}
	waitShutdownEnd := endOf(waitShutdown)
	waitForWaiters(t, budget, 1, "a stream message past the free budget", waitShutdownEnd)
	shutdown := make(chan error, 1)
	go func() { shutdown <- d.srv.Shutdown() }()
	wantEnd("a stream waiting for the budget at shutdown", <-waitShutdownEnd, codes.Unavailable)
	if got := len(d.onDisk(t, "wait.bin")); got != 0 {
		t.Errorf("wait.bin holds %d bytes: the message that waited at shutdown was applied", got)
	}
	gate.open()
	wantEnd("a stream that reused an id", <-holdReusedEnd, codes.InvalidArgument)
	if err := <-shutdown; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	testutil.WaitFor(t, "every stream to give back what it held", func() bool {
		return budget.Held() == 0 && streamHeld() == 0
	})
}
