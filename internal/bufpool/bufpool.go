// Package bufpool is a gRPC buffer pool that does not zero the buffers it
// hands out.
//
// gRPC's default pool (mem.DefaultBufferPool) clears the whole capacity of
// every buffer it hands out again, in case its user reads before it
// writes. Its users in filewrite never do: gRPC's transport reads a frame
// into exactly the buffer it asked for, and the codecs encode into exactly
// theirs. On the stream path, at some 70 KiB a message in buffers of twice
// that, the clearing was a sixth of the CPU of daemon and client together.
package bufpool

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc/mem"
)

// Size classes are powers of two from minClass to maxClass; larger
// buffers are made and dropped, not pooled.
const (
	minClass = 8  // 256 B
	maxClass = 24 // 16 MiB
)

// Dirty is a mem.BufferPool whose Get returns a buffer of the size asked
// for whose bytes are whatever its last user left there: the caller must
// write every byte before it reads any. It is safe for concurrent use.
type Dirty struct {
	classes [maxClass + 1]sync.Pool
}

var _ mem.BufferPool = (*Dirty)(nil)

// Shared is the pool the daemon and the client use.
var Shared = new(Dirty)

func class(n int) int {
	if n <= 1<<minClass {
		return minClass
	}
	return bits.Len(uint(n - 1))
}

// Get returns a buffer of length n.
func (p *Dirty) Get(n int) *[]byte {
	c := class(n)
	if c > maxClass {
		b := make([]byte, n)
		return &b
	}
	if v := p.classes[c].Get(); v != nil {
		b := v.(*[]byte)
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<c)
	return &b
}

// Put takes b back if its capacity is one of the pool's classes.
func (p *Dirty) Put(b *[]byte) {
	c := cap(*b)
	if c < 1<<minClass || c > 1<<maxClass || c&(c-1) != 0 {
		return
	}
	p.classes[bits.Len(uint(c))-1].Put(b)
}
