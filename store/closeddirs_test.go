//go:build linux

package store

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestClosedDirsModel: puts, takes and forgets of records in random order,
// against a map of the records put: take gives back the directories and
// stamp put, the files of one directory share one list, and a list goes
// with its last record, its slot reused.
func TestClosedDirsModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	c := newClosedDirs()
	model := map[fileID]*dirRecord{}
	var stamp int64
	for step := range 5000 {
		id := fileID{1, uint64(rng.IntN(50))}
		switch rng.IntN(3) {
		case 0:
			stamp++
			rec := &dirRecord{dirs: dirsAbove(fmt.Sprintf("r/d%d/f%d", rng.IntN(6), id.ino)), since: stamp}
			if rng.IntN(5) == 0 { // a renamed file's list: two directories' worth
				rec.dirs = slices.Concat(rec.dirs, dirsAbove(fmt.Sprintf("s/e%d/f", rng.IntN(3))))
			}
			c.put(id, rec)
			model[id] = rec
		case 1:
			got, want := c.take(id), model[id]
			delete(model, id)
			if (got == nil) != (want == nil) || (got != nil && (!slices.Equal(got.dirs, want.dirs) || got.since != want.since)) {
				t.Fatalf("step %d: take(%v) = %+v, want %+v", step, id, got, want)
			}
		default:
			c.forget(id)
			delete(model, id)
		}
		// One list per distinct set of directories in use, each counted.
		lists := map[string]int{}
		for _, rec := range model {
			lists[fmt.Sprint(rec.dirs)]++
		}
		if len(c.byID) != len(model) || len(c.byKey) != len(lists) || len(c.lists)-len(c.free) != len(lists) {
			t.Fatalf("step %d: %d records, %d lists (%d slots, %d free), want %d records and %d lists", step, len(c.byID), len(c.byKey), len(c.lists), len(c.free), len(model), len(lists))
		}
		for _, i := range c.byKey {
			if l := c.lists[i]; lists[fmt.Sprint(l.dirs)] != l.refs {
				t.Fatalf("step %d: list %v counts %d records, want %d", step, l.dirs, l.refs, lists[fmt.Sprint(l.dirs)])
			}
		}
	}
}

// TestClosedDirsForgetIf: after a sync of a snapshot, the records it
// covered go, and one put again since (a file reopened, renamed and closed)
// stays, as does one put after the snapshot.
func TestClosedDirsForgetIf(t *testing.T) {
	c := newClosedDirs()
	a, b, n := fileID{1, 1}, fileID{1, 2}, fileID{1, 3}
	c.put(a, &dirRecord{dirs: dirsAbove("d/a"), since: 1})
	c.put(b, &dirRecord{dirs: dirsAbove("d/b"), since: 2})
	lists, records := c.snapshot()
	if len(lists) != 1 || !slices.Equal(lists[0], []string{"d", "."}) || len(records) != 2 {
		t.Fatalf("snapshot: %v, %v; want one list [d .] for two records", lists, records)
	}
	c.put(b, &dirRecord{dirs: dirsAbove("e/b"), since: 3}) // renamed meanwhile
	c.put(n, &dirRecord{dirs: dirsAbove("d/n"), since: 4})
	c.forgetIf(records)
	if c.has(a) || !c.has(b) || !c.has(n) {
		t.Errorf("after forgetIf: a %v, b %v, n %v; want only b and n kept", c.has(a), c.has(b), c.has(n))
	}
}
