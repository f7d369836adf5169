package service

import (
	"math"
	"slices"
)

// writeOrder makes the writes of one stream land as if applied one by one
// in arrival order, while letting those that do not overlap run at once.
// It holds every write read and not yet applied, in arrival order; a write
// may start when no write ahead of it in held overlaps it. Writes that
// overlap so keep their arrival order; the others are free.
//
// It is guarded by the stream's mu. held is short in practice (the writes
// in flight); its bound is the stream's budget divided by
// streamWriteOverhead.
type writeOrder struct {
	held []*streamWrite
}

// add appends w, the latest write read, and reports whether it may start
// now. If not, it is marked blocked until remove frees it.
func (o *writeOrder) add(w *streamWrite) bool {
	w.blocked = false
	for _, e := range o.held {
		if e.overlaps(w) {
			w.blocked = true
			break
		}
	}
	o.held = append(o.held, w)
	return !w.blocked
}

// remove drops w, now applied, and calls start for each write that was
// waiting for it and waits for nothing else now, in arrival order. Only a
// write that overlapped w can have been waiting for it.
func (o *writeOrder) remove(w *streamWrite, start func(*streamWrite)) {
	i := slices.Index(o.held, w)
	if i < 0 {
		return
	}
	o.held = slices.Delete(o.held, i, i+1)
	for j := i; j < len(o.held); j++ {
		b := o.held[j]
		if !b.blocked || !b.overlaps(w) || o.overlapsAhead(j) {
			continue
		}
		b.blocked = false
		start(b)
	}
}

// overlapsAhead reports whether a write ahead of held[j] overlaps it.
func (o *writeOrder) overlapsAhead(j int) bool {
	for _, e := range o.held[:j] {
		if e.overlaps(o.held[j]) {
			return true
		}
	}
	return false
}

// empty reports whether every write read has been applied.
func (o *writeOrder) empty() bool { return len(o.held) == 0 }

// end is where w's bytes end, saturated: the store refuses a range that
// overflows, and it must not wrap around to overlap nothing here.
func (w *streamWrite) end() int64 {
	if w.off > math.MaxInt64-int64(len(w.data)) {
		return math.MaxInt64
	}
	return w.off + int64(len(w.data))
}

// overlaps reports whether w and v write a byte in common. An empty write
// overlaps nothing.
func (w *streamWrite) overlaps(v *streamWrite) bool {
	return len(w.data) > 0 && len(v.data) > 0 && w.off < v.end() && v.off < w.end()
}
