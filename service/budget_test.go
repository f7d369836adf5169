package service

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
)

// TestInflightBudget: acquire waits, first come first served, until
// enough is released; a request larger than the whole budget gets all of
// it; a context that ends leaves nothing taken.
func TestInflightBudget(t *testing.T) {
	b := newInflightBudget(100)
	b.patience = time.Hour // strictly in order here; see TestInflightBudgetPatience
	ctx := testContext(t)
	if err := b.acquire(ctx, 60); err != nil {
		t.Fatal(err)
	}
	// 50 does not fit, so it waits; 30 would fit, but comes after it, so
	// it waits too (a stream of small requests cannot starve a large one).
	granted := make(chan int64, 2)
	for i, n := range []int64{50, 30} {
		go func() {
			if err := b.acquire(ctx, n); err == nil {
				granted <- n
			}
		}()
		for b.waiting.Load() < int64(i+1) {
			time.Sleep(time.Millisecond)
		}
	}
	if got := b.held.Load(); got != 60 {
		t.Fatalf("held %d with two waiting, want 60", got)
	}
	b.release(60)
	if got := <-granted + <-granted; got != 80 {
		t.Errorf("granted %d after the release, want 50 and 30", got)
	}
	if got, want := b.held.Load(), int64(80); got != want {
		t.Errorf("held %d, want %d", got, want)
	}

	// An ended context: an error, and nothing taken.
	short, cancel := context.WithCancel(ctx)
	cancel()
	if err := b.acquire(short, 30); !errors.Is(err, context.Canceled) {
		t.Errorf("acquire with a cancelled context: %v, want context.Canceled", err)
	}
	b.release(80)
	if got := b.held.Load(); got != 0 {
		t.Errorf("held %d after releasing everything, want 0", got)
	}

	// More than the whole budget waits for all of it, then gets it.
	if err := b.acquire(ctx, 1000); err != nil {
		t.Fatalf("acquire over the budget: %v", err)
	}
	if got := b.held.Load(); got != 100 {
		t.Errorf("held %d after a request over the budget, want all 100", got)
	}
	b.release(1000)

	var none *inflightBudget // no bound
	if err := none.acquire(ctx, 1<<40); err != nil {
		t.Errorf("a nil budget: %v", err)
	}
	none.release(1 << 40)
}

// setPatience sets how long b's first waiter holds back the others, for a
// test that needs them served strictly in order (a long patience).
func (b *inflightBudget) setPatience(d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.patience = d
}

// TestInflightBudgetPatience: once the first waiter's patience has run
// out, a request that fits in what is free goes ahead of it, whether it
// comes after (acquire) or was already waiting (the timer), and the first
// waiter keeps its place: it is granted before the others once it fits.
func TestInflightBudgetPatience(t *testing.T) {
	ctx := testContext(t)
	for _, tt := range []struct {
		name     string
		patience time.Duration
	}{{"run out", 0}, {"runs out while waiting", 50 * time.Millisecond}} {
		b := newInflightBudget(100)
		b.patience = tt.patience
		if err := b.acquire(ctx, 60); err != nil {
			t.Fatal(err)
		}
		large := make(chan error, 1)
		go func() { large <- b.acquire(ctx, 50) }()
		for b.waiting.Load() < 1 {
			time.Sleep(time.Millisecond)
		}
		// 30 fits in the 40 free: it goes ahead, at once or once the
		// first waiter's patience has run out.
		if err := b.acquire(ctx, 30); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		// 20 does not fit in the 10 free: it waits behind 50, which is
		// granted first once 60 comes back, then 20.
		small := make(chan error, 1)
		go func() { small <- b.acquire(ctx, 20) }()
		for b.waiting.Load() < 2 {
			time.Sleep(time.Millisecond)
		}
		b.release(60)
		if err := <-large; err != nil {
			t.Fatalf("%s: the first waiter: %v", tt.name, err)
		}
		if err := <-small; err != nil {
			t.Fatalf("%s: the last waiter: %v", tt.name, err)
		}
		if got := b.held.Load(); got != 100 {
			t.Errorf("%s: held %d, want 100", tt.name, got)
		}
		b.release(100)
	}
}

// TestBudgetMakesRequestsWait: past --max-inflight-bytes, a gRPC Write and
// a REST PUT wait rather than fail: one whose deadline passes while it
// waits is DEADLINE_EXCEEDED and never performed, the others go through
// once the request that holds the budget is done.
func TestBudgetMakesRequestsWait(t *testing.T) {
	const maxRequest = 64 << 10
	gate := newWriteGate("held.bin")
	d := startDaemon(t, func(c *Config) {
		c.Store.MaxRequestBytes = maxRequest
		c.MaxInflightBytes = minInflightBytes(maxRequest) // one message being received at most
		c.Store.Hooks = gate.hooks()
	})
	ctx := testContext(t)
	budget := d.srv.budget
	write := func(ctx context.Context, path string) error {
		_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: path, Data: allBytes(maxRequest)})
		return err
	}
	// Two Writes held inside the store hold two thirds of the budget
	// (grpcCopies of a message each): a third one does not fit.
	held := make(chan error, 2)
	for range 2 {
		go func() { held <- write(ctx, "held.bin") }()
	}
	gate.waitEntered(t, ctx)
	testutil.WaitFor(t, "two Writes to hold their share", func() bool {
		return budget.held.Load() >= 2*grpcCopies*maxRequest
	})

	// A Write whose deadline passes in the queue for the budget.
	err := expireWhile(t, func(int) bool { return budget.waiting.Load() > 0 }, func(ctx context.Context, attempt int) error {
		return write(ctx, "expired.bin")
	})
	wantCode(t, "Write whose deadline passed while it waited for the budget", err, codes.DeadlineExceeded)

	// A Write and a PUT with time to wait.
	waited := make(chan error, 2)
	go func() { waited <- write(ctx, "waited.bin") }()
	for budget.waiting.Load() < 1 {
		time.Sleep(time.Millisecond)
	}
	go func() { waited <- putRaw(ctx, d.url+"/v1/files/put.bin", "put") }()
	for budget.waiting.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
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
	if got := budget.held.Load(); got != 0 {
		t.Errorf("%d bytes still held with nothing in flight", got)
	}
}

// TestHealthNeverWaitsForTheBudget: with every byte of
// --max-inflight-bytes held, gRPC health's Check and Watch answer at once,
// while a Write waits.
func TestHealthNeverWaitsForTheBudget(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	budget := d.srv.budget
	if err := budget.acquire(ctx, budget.capacity); err != nil {
		t.Fatal(err)
	}
	defer budget.release(budget.capacity)

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
