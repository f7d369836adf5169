package streamengine

import (
	"math"

	"github.com/google/btree"
)

// writeOrder makes the writes of one stream land as if applied one by one
// in arrival order, while letting those that do not overlap run at once:
// a write may start when no write read before it and not yet applied
// overlaps it. Writes that overlap so keep their arrival order; the
// others are free.
//
// It does not compare a write with every write held (that made a message
// of n writes cost n² under the stream's lock). It keeps, for each byte
// range written by a held write, the latest held write that covers it
// (last: disjoint segments, ordered by offset), and a new write waits only
// for those: each of them itself waited for every earlier held write
// overlapping it on that range, so once they are applied, so are all the
// writes ahead of the new one that overlap it. A write's add and remove
// cost O((1+k) log n), k the segments it covers, each of which it deletes;
// an add creates at most three, so a message of n writes costs O(n log n).
// An empty write overlaps nothing and is free at once.
//
// It is guarded by the stream's mu, as is every write's orderState.
type writeOrder struct {
	last *btree.BTreeG[*segment]
	// held counts the writes added and not yet removed: the tests'
	// check that every write read was applied (empty, in a test file).
	held int
	// pivot, bound and found are scratch space for lookups in last.
	pivot, bound segment
	found        []*segment
}

// orderState is a write's place in its stream's writeOrder.
type orderState struct {
	// deps counts the held writes it waits for; waiters are the writes
	// that wait for it, in arrival order.
	deps    int
	waiters []*Write
	// segs are the segments of last that it is the latest write of,
	// linked through segment.nextOf.
	segs *segment
	// seenBy is the write being added that last counted this one among
	// its deps: a write owning several segments of a range counts once.
	seenBy *Write
	// seg is the segment add made for the write's whole range, in segs
	// until later writes cover it; what remains of it may be shortened.
	seg segment
}

// segment is a byte range [start, end) and the latest held write to
// cover it.
type segment struct {
	start, end int64
	w          *Write
	// prevOf and nextOf link w's segments.
	prevOf, nextOf *segment
}

func segmentLess(a, b *segment) bool { return a.start < b.start }

// add appends w, the latest write read, and reports whether it may start
// now. If not, remove starts it once the writes it waits for are applied.
func (o *writeOrder) add(w *Write) bool {
	o.held++
	w.order = orderState{}
	start, end := w.orderRange()
	if start >= end {
		return true // empty, or saturated at the largest offset
	}
	if o.last == nil {
		o.last = btree.NewG(16, segmentLess)
	}
	// The segments that w overlaps: the one that starts at or before
	// start, if it reaches past it, and every one that starts in
	// (start, end).
	found := o.found[:0]
	o.pivot.start = start
	o.last.DescendLessOrEqual(&o.pivot, func(s *segment) bool {
		if s.end > start {
			found = append(found, s)
		}
		return false
	})
	o.pivot.start = start + 1
	if start < end-1 {
		o.bound.start = end
		o.last.AscendRange(&o.pivot, &o.bound, func(s *segment) bool {
			found = append(found, s)
			return true
		})
	}
	for _, s := range found {
		v := s.w
		if v.order.seenBy != w {
			v.order.seenBy = w
			v.order.waiters = append(v.order.waiters, w)
			w.order.deps++
		}
		// w is now the latest write of [start, end): what s keeps is
		// what lies outside it, on either side.
		o.last.Delete(s)
		left, right := s.start < start, s.end > end
		switch {
		case left && right:
			o.insert(&segment{start: end, end: s.end, w: v})
			s.end = start
			o.last.ReplaceOrInsert(s)
		case left:
			s.end = start
			o.last.ReplaceOrInsert(s)
		case right:
			s.start = end
			o.last.ReplaceOrInsert(s)
		default:
			unlink(s)
		}
	}
	clear(found)
	o.found = found[:0]
	// w's own segment lives in its orderState, in the message's slab of
	// writes: an add allocates only when it splits another's segment.
	w.order.seg = segment{start: start, end: end, w: w}
	o.insert(&w.order.seg)
	return w.order.deps == 0
}

// insert puts s, a range of s.w's, into last and s.w's list.
func (o *writeOrder) insert(s *segment) {
	s.prevOf, s.nextOf = nil, s.w.order.segs
	if s.nextOf != nil {
		s.nextOf.prevOf = s
	}
	s.w.order.segs = s
	o.last.ReplaceOrInsert(s)
}

// unlink takes s out of its write's list.
func unlink(s *segment) {
	if s.prevOf != nil {
		s.prevOf.nextOf = s.nextOf
	} else {
		s.w.order.segs = s.nextOf
	}
	if s.nextOf != nil {
		s.nextOf.prevOf = s.prevOf
	}
	s.prevOf, s.nextOf = nil, nil
}

// remove drops w, now applied, and calls start for each write that was
// waiting for it and waits for nothing else now, in arrival order.
func (o *writeOrder) remove(w *Write, start func(*Write)) {
	o.held--
	for s := w.order.segs; s != nil; s = s.nextOf {
		o.last.Delete(s)
	}
	w.order.segs = nil
	waiters := w.order.waiters
	w.order.waiters = nil
	for _, v := range waiters {
		if v.order.deps--; v.order.deps == 0 {
			start(v)
		}
	}
}

// end is where w's bytes end, saturated: the store refuses a range that
// overflows, and it must not wrap around to overlap nothing here.
func (w *Write) end() int64 {
	if w.Off > math.MaxInt64-int64(len(w.Data)) {
		return math.MaxInt64
	}
	return w.Off + int64(len(w.Data))
}

// orderRange is the range w is ordered by: its bytes, or every offset for
// an append, whose range is known only once it is applied, and for a
// write refused before it was handed out (Err set), whose ack reports the
// size: it waits for every write read before it, and every write read
// after it waits for it, so the stream's appends land in arrival order,
// each after the writes before it (an empty append too: it answers the
// end they leave), and a refusal's size is the one those writes leave.
// A refusal is done with as soon as they are applied, so the writes
// behind it wait no longer than for the writes before it.
func (w *Write) orderRange() (int64, int64) {
	if w.Append || w.Err != nil {
		return 0, math.MaxInt64
	}
	return w.Off, w.end()
}
