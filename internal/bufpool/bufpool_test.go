package bufpool

import "testing"

// TestDirty: a buffer has the length asked for and a power-of-two
// capacity, and comes back from the pool for a request of its class.
func TestDirty(t *testing.T) {
	p := new(Dirty)
	for _, tt := range []struct{ n, cap int }{
		{0, 256}, {1, 256}, {256, 256}, {257, 512}, {70000, 131072}, {1 << 24, 1 << 24}, {1<<24 + 1, 1<<24 + 1},
	} {
		b := p.Get(tt.n)
		if len(*b) != tt.n || cap(*b) != tt.cap {
			t.Errorf("Get(%d): len %d cap %d, want %d, %d", tt.n, len(*b), cap(*b), tt.n, tt.cap)
		}
		p.Put(b)
	}
	b := p.Get(1000)
	(*b)[0] = 42
	p.Put(b)
	// sync.Pool may drop what it holds at any time; when it does not, the
	// buffer comes back as it was left: not zeroed.
	if c := p.Get(600); cap(*c) != 1024 {
		t.Errorf("Get(600): cap %d, want 1024", cap(*c))
	}
}
