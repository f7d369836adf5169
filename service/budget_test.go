package service

import (
	"bytes"
	"context"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/admit"
)

// TestBudgetMakesRequestsWait: past --max-inflight-bytes, a gRPC Write and
// a REST PUT wait rather than fail: one whose deadline passes while it
// waits is DEADLINE_EXCEEDED and never performed, the others go through
// once the request that holds the budget is done.
func TestBudgetMakesRequestsWait(t *testing.T) {
	const maxRequest = 64 << 10
	gate := newWriteGate("held.bin")
	d := startDaemon(t, func(c *Config) {
		c.Store.MaxRequestBytes = maxRequest
		c.MaxInflightBytes = admit.MinInflightBytes(maxRequest) // one message being received at most
		c.Store.Hooks = gate.hooks()
	})
	ctx := testContext(t)
	budget := d.srv.budget
	write := func(ctx context.Context, path string) error {
		_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: path, Data: testutil.AllBytes(maxRequest)})
		return err
	}
	// Two Writes held inside the store hold two thirds of the budget
	// (admit.GRPCCopies of a message each): a third one does not fit.
	held := make(chan error, 2)
	for range 2 {
		go func() { held <- write(ctx, "held.bin") }()
	}
	gate.waitEntered(t, ctx)
	testutil.WaitFor(t, "two Writes to hold their share", func() bool {
		return budget.Held() >= 2*admit.GRPCCopies*maxRequest
	})

	// A Write whose deadline passes in the queue for the budget.
	err := expireWhile(t, func(int) bool { return budget.Waiting() > 0 }, func(ctx context.Context, attempt int) error {
		return write(ctx, "expired.bin")
	})
	wantCode(t, "Write whose deadline passed while it waited for the budget", err, codes.DeadlineExceeded)

	// A Write and a PUT with time to wait.
	waited := make(chan error, 2)
	go func() { waited <- write(ctx, "waited.bin") }()
	waitForWaiters(t, budget, 1, "a Write", waited)
	go func() { waited <- putRaw(ctx, d.url+"/v1/files/put.bin", "put") }()
	waitForWaiters(t, budget, 2, "a Write or a PUT", waited)
	gate.open()
	for range 2 {
		if err := <-held; err != nil {
			t.Errorf("a Write that held the budget: %v", err)
		}
	}
	for range 2 {
		if err := <-waited; err != nil {
			t.Errorf("a request that waited for the budget: %v", err)
		}
	}
	for name, want := range map[string]bool{"held.bin": true, "waited.bin": true, "put.bin": true, "expired.bin": false} {
		if _, err := os.Stat(filepath.Join(d.root, name)); (err == nil) != want {
			t.Errorf("%s exists: %v, want %v", name, err == nil, want)
		}
	}
	// A call gives its share back when grpc-go has sent its reply and
	// ends the call (the stats handler's End), which can come after the
	// client has the reply in hand.
	testutil.WaitFor(t, "every byte of the budget given back once nothing is in flight", func() bool {
		return budget.Held() == 0
	})
}

// TestHealthNeverWaitsForTheBudget: with every byte of
// --max-inflight-bytes held, gRPC health's Check and Watch answer at once,
// while a Write waits.
func TestHealthNeverWaitsForTheBudget(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	budget := d.srv.budget
	if err := budget.Acquire(ctx, budget.Capacity()); err != nil {
		t.Fatal(err)
	}
	defer budget.Release(budget.Capacity())

	health := healthpb.NewHealthClient(d.conn)
	resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("Check with the budget all held: %v, %v", resp, err)
	}
	watch, err := health.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := watch.Recv(); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("Watch with the budget all held: %v, %v", resp, err)
	}
	written := make(chan error, 1)
	go func() {
		_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "f", Data: []byte("x")})
		written <- err
	}()
	waitForWaiters(t, budget, 1, "a Write", written)
}

// TestReadRepliesFromThePool: a Read's reply is sent from the pooled
// buffer the file was read into (admit.ReplyBuffer), with its CRC-32C:
// replies of every size (past the end, below gRPC's pooling threshold,
// short at the end, large), many at once, carry the file's bytes, and
// every share of the budget comes back once they are written.
func TestReadRepliesFromThePool(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	const size = 3<<20 + 100
	data := testutil.AllBytes(size)
	for off := 0; off < size; off += 1 << 20 {
		chunk := data[off:min(size, off+1<<20)]
		if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "pooled", Offset: int64(off), Data: chunk}); err != nil {
			t.Fatal(err)
		}
	}
	reads := []struct{ off, length int64 }{
		{size + 10, 100}, {0, 0}, {5, 100}, {1000, 10000}, {0, 1 << 20}, {1 << 20, 1 << 20}, {size - 50, 1 << 20}, {3, size},
	}
	var wg sync.WaitGroup
	for range 8 {
		for _, r := range reads {
			wg.Go(func() {
				resp, err := d.client.Read(ctx, &filewritev1.ReadRequest{Path: "pooled", Offset: r.off, Length: r.length})
				if err != nil {
					t.Errorf("Read(%d, %d): %v", r.off, r.length, err)
					return
				}
				want := data[min(size, r.off):min(size, r.off+r.length)]
				if got := resp.GetData(); !bytes.Equal(got, want) {
					t.Errorf("Read(%d, %d): %d bytes, not the file's %d", r.off, r.length, len(got), len(want))
				}
				if sum := crc32.Checksum(want, crc32.MakeTable(crc32.Castagnoli)); resp.Crc32C == nil || resp.GetCrc32C() != sum {
					t.Errorf("Read(%d, %d): crc32c %v, want %#x", r.off, r.length, resp.Crc32C, sum)
				}
			})
		}
	}
	wg.Wait()
	testutil.WaitFor(t, "the Reads' shares of the budget to come back", func() bool { return d.srv.budget.Held() == 0 })
}
