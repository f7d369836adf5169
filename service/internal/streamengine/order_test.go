package streamengine

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// empty reports whether every write read has been applied.
func (o *writeOrder) empty() bool { return o.held == 0 }

// overlaps reports whether w and v are ordered with each other: they write
// a byte in common, or one of them is an append. An empty positional
// write overlaps nothing. It is the slow rule the model checks writeOrder
// against.
func (w *Write) overlaps(v *Write) bool {
	ws, we := w.orderRange()
	vs, ve := v.orderRange()
	return ws < we && vs < ve && ws < ve && vs < we
}

// TestWriteOrderModel holds writeOrder to its rule, checked the slow way
// after every step: a held write has been started if and only if no
// write held ahead of it overlaps it, and writes freed together start in
// arrival order. Writes are small and crowded so that they overlap often,
// in every way (inside, across, equal, touching, empty, saturated).
func TestWriteOrderModel(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 1))
		var o writeOrder
		var held []*Write // arrival order
		started := map[*Write]bool{}
		seq := map[*Write]int{}
		var freed []*Write
		start := func(w *Write) { freed = append(freed, w) }
		for step := range 300 {
			var running []*Write
			for _, w := range held {
				if started[w] {
					running = append(running, w)
				}
			}
			if len(running) > 0 && rng.IntN(2) == 0 {
				w := running[rng.IntN(len(running))]
				freed = freed[:0]
				o.remove(w, start)
				held = slices.DeleteFunc(held, func(v *Write) bool { return v == w })
				if !slices.IsSortedFunc(freed, func(a, b *Write) int { return seq[a] - seq[b] }) {
					t.Fatalf("seed %d step %d: writes freed together started out of arrival order", seed, step)
				}
				for _, v := range freed {
					if started[v] {
						t.Fatalf("seed %d step %d: a write started twice", seed, step)
					}
					started[v] = true
				}
			} else {
				w := &Write{Off: int64(rng.IntN(48)), Data: make([]byte, rng.IntN(9))}
				if rng.IntN(50) == 0 {
					w.Off = math.MaxInt64 - int64(rng.IntN(3))
				}
				seq[w] = step
				held = append(held, w)
				if o.add(w) {
					started[w] = true
				}
			}
			for i, w := range held {
				free := true
				for _, e := range held[:i] {
					if e.overlaps(w) {
						free = false
					}
				}
				if started[w] != free {
					t.Fatalf("seed %d step %d: write [%d,+%d) started=%v, but free=%v", seed, step, w.Off, len(w.Data), started[w], free)
				}
			}
			if o.empty() != (len(held) == 0) {
				t.Fatalf("seed %d step %d: empty()=%v with %d held", seed, step, o.empty(), len(held))
			}
		}
	}
}

// TestWriteOrderCost: a message's writes cost writeOrder O(n log n), not
// n²: n writes to one byte, or each covering all the earlier ones, leave
// one segment each at most, and every write waits for one write only.
func TestWriteOrderCost(t *testing.T) {
	const n = 4096
	for _, tt := range []struct {
		name string
		make func(i int) *Write
	}{
		{"same byte", func(int) *Write { return &Write{Off: 7, Data: []byte{1}} }},
		{"growing", func(i int) *Write { return &Write{Off: int64(n - i), Data: make([]byte, 2*i+1)} }},
		{"disjoint", func(i int) *Write { return &Write{Off: int64(2 * i), Data: []byte{1}} }},
	} {
		var o writeOrder
		ws := make([]*Write, n)
		maxDeps, maxWaiters := 0, 0
		for i := range ws {
			ws[i] = tt.make(i)
			o.add(ws[i])
			maxDeps = max(maxDeps, ws[i].order.deps)
		}
		for _, w := range ws {
			maxWaiters = max(maxWaiters, len(w.order.waiters))
		}
		if maxDeps > 1 || maxWaiters > 1 {
			t.Errorf("%s: a write waits for up to %d, is waited for by up to %d; want 1", tt.name, maxDeps, maxWaiters)
		}
		if tt.name != "disjoint" && o.last.Len() > 3 {
			t.Errorf("%s: %d segments held for overlapping writes, want at most 3", tt.name, o.last.Len())
		}
		for _, w := range ws {
			o.remove(w, func(*Write) {})
		}
		if !o.empty() || o.last.Len() != 0 {
			t.Errorf("%s: %d segments left after every write was removed", tt.name, o.last.Len())
		}
	}
}
