package admit

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/filewrite/filewrite/internal/testutil"
)

// TestInflightBudget: Acquire waits, first come first served, until
// enough is released; a request larger than the whole budget gets all of
// it; a context that ends leaves nothing taken.
func TestInflightBudget(t *testing.T) {
	b := NewBudget(100)
	b.patience = time.Hour // strictly in order here; see TestInflightBudgetPatience
	ctx := testutil.Context(t)
	if err := b.Acquire(ctx, 60); err != nil {
		t.Fatal(err)
	}
	// 50 does not fit, so it waits; 30 would fit, but comes after it, so
	// it waits too (a stream of small requests cannot starve a large one).
	granted := make(chan int64, 2)
	for i, n := range []int64{50, 30} {
		go func() {
			if err := b.Acquire(ctx, n); err == nil {
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
	b.Release(60)
	if got := <-granted + <-granted; got != 80 {
		t.Errorf("granted %d after the release, want 50 and 30", got)
	}
	if got, want := b.held.Load(), int64(80); got != want {
		t.Errorf("held %d, want %d", got, want)
	}

	// An ended context: an error, and nothing taken.
	short, cancel := context.WithCancel(ctx)
	cancel()
	if err := b.Acquire(short, 30); !errors.Is(err, context.Canceled) {
		t.Errorf("acquire with a cancelled context: %v, want context.Canceled", err)
	}
	b.Release(80)
	if got := b.held.Load(); got != 0 {
		t.Errorf("held %d after releasing everything, want 0", got)
	}

	// More than the whole budget waits for all of it, then gets it.
	if err := b.Acquire(ctx, 1000); err != nil {
		t.Fatalf("acquire over the budget: %v", err)
	}
	if got := b.held.Load(); got != 100 {
		t.Errorf("held %d after a request over the budget, want all 100", got)
	}
	b.Release(1000)

	var none *Budget // no bound
	if err := none.Acquire(ctx, 1<<40); err != nil {
		t.Errorf("a nil budget: %v", err)
	}
	none.Release(1 << 40)
}

// TestInflightBudgetPatience: once the first waiter's patience has run
// out, a request that fits in what is free goes ahead of it, whether it
// comes after (Acquire) or was already waiting (the timer), and the first
// waiter keeps its place: it is granted before the others once it fits.
func TestInflightBudgetPatience(t *testing.T) {
	ctx := testutil.Context(t)
	for _, tt := range []struct {
		name     string
		patience time.Duration
	}{{"run out", 0}, {"runs out while waiting", 50 * time.Millisecond}} {
		b := NewBudget(100)
		b.patience = tt.patience
		if err := b.Acquire(ctx, 60); err != nil {
			t.Fatal(err)
		}
		large := make(chan error, 1)
		go func() { large <- b.Acquire(ctx, 50) }()
		for b.waiting.Load() < 1 {
			time.Sleep(time.Millisecond)
		}
		// 30 fits in the 40 free: it goes ahead, at once or once the
		// first waiter's patience has run out.
		if err := b.Acquire(ctx, 30); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		// 20 does not fit in the 10 free: it waits behind 50, which is
		// granted first once 60 comes back, then 20.
		small := make(chan error, 1)
		go func() { small <- b.Acquire(ctx, 20) }()
		for b.waiting.Load() < 2 {
			time.Sleep(time.Millisecond)
		}
		b.Release(60)
		if err := <-large; err != nil {
			t.Fatalf("%s: the first waiter: %v", tt.name, err)
		}
		if err := <-small; err != nil {
			t.Fatalf("%s: the last waiter: %v", tt.name, err)
		}
		if got := b.held.Load(); got != 100 {
			t.Errorf("%s: held %d, want 100", tt.name, got)
		}
		b.Release(100)
	}
}
