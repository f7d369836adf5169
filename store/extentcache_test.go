//go:build linux

package store

import (
	"context"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"golang.org/x/sys/unix"

	"github.com/filewrite/filewrite/internal/testutil"
)

// extentsCounter is an FS wrapper that counts, by name, the calls of
// File.Extents: the FIEMAP rebuilds the extent cache saves.
type extentsCounter struct {
	FS
	mu    sync.Mutex
	calls map[string]int
}

func (c *extentsCounter) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := c.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return extentsCountedFile{f, c, name}, nil
}

func (c *extentsCounter) count(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[name]
}

type extentsCountedFile struct {
	File
	c    *extentsCounter
	name string
}

func (f extentsCountedFile) Extents() ([]Extent, error) {
	f.c.mu.Lock()
	if f.c.calls == nil {
		f.c.calls = make(map[string]int)
	}
	f.c.calls[f.name]++
	f.c.mu.Unlock()
	return f.File.Extents()
}

// closeIfIdle closes name's file the way the table does to make room,
// if it is open and idle, and reports whether name is closed now.
func closeIfIdle(s *Store, name string) bool {
	t := s.table
	t.mu.Lock()
	defer t.mu.Unlock()
	ino := t.byPath[name]
	if ino == nil {
		return true
	}
	if ino.refs > 0 || ino.openErr != nil {
		return false
	}
	if !t.closeIdleLocked(ino) {
		return false
	}
	ino.closeFiles()
	return true
}

// waitSettled waits until the file at osPath has had no change for longer
// than the extent cache asks of a file it keeps (a tick of the coarse
// clock, or the ctime's granularity), so that closing it now keeps its
// map. It waits on the clock, not for a guessed time.
func waitSettled(t testing.TB, s *Store, osPath string) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(osPath, &st); err != nil {
		t.Fatal(err)
	}
	for !s.table.closedExtents.settled(st.Ctim.Nano(), coarseNow()) {
		time.Sleep(time.Millisecond)
	}
}

// TestCtimeSettled: a file's map is kept at its close only if any later
// change must show as a new ctime: the ctime is older than the close by a
// tick of the coarse clock, or by the ctime's own granularity if coarser.
func TestCtimeSettled(t *testing.T) {
	const tick = 4e6 // HZ=250
	c := &extentCache{tick: tick}
	const base = int64(1_700_000_000_123_456_789) // a nanosecond ctime
	const whole = int64(1_700_000_000_000_000_000)
	tests := []struct {
		name            string
		ctime, closedAt int64
		want            bool
	}{
		{"changed two ticks before the close", base, base + 2*tick, true},
		{"changed exactly a tick before", base, base + tick, true},
		{"changed within the tick of the close", base, base + tick - 1, false},
		{"changed at the close", base, base, false},
		{"no ctime known", 0, base, false},
		{"no clock", base, 0, false},
		{"whole-second ctime, closed half a second later", whole, whole + 5e8, false},
		{"whole-second ctime, closed a second later", whole, whole + 1e9, true},
		{"10 ms granularity, closed 5 ms later", whole + 3e7, whole + 3e7 + 5e6, false},
		{"10 ms granularity, closed 10 ms later", whole + 3e7, whole + 4e7, true},
	}
	for _, tt := range tests {
		if got := c.settled(tt.ctime, tt.closedAt); got != tt.want {
			t.Errorf("%s: settled(%d, %d) = %v, want %v", tt.name, tt.ctime, tt.closedAt, got, tt.want)
		}
	}
}

// TestExtentCacheBound: the cache holds what fits in its bytes, drops the
// files closed longest ago first, keeps no map too large for it, and
// gives an entry back only for the same size and ctime, once.
func TestExtentCacheBound(t *testing.T) {
	const bs = 4096
	oneRun := newExtentMap(bs)
	oneRun.set(0, 4, ExtentWritten)
	entry := closedFileCost + extentRunSize
	fi := func(ino uint64) FileInfo { return FileInfo{Dev: 1, Ino: ino, Size: 4 * bs, Ctime: 1e9 + 1} }
	newCache := func(maxBytes int64) *extentCache {
		c := newExtentCache(maxBytes)
		c.now = func() int64 { return 5e9 }
		return c
	}

	c := newCache(int64(3 * entry))
	for ino := range uint64(4) {
		c.put(fi(ino), oneRun)
	}
	if n, b := c.size(); n != 3 || b != int64(3*entry) {
		t.Errorf("after 4 puts into room for 3: %d entries of %d bytes, want 3 of %d", n, b, 3*entry)
	}
	if m := c.take(fi(0), bs); m != nil {
		t.Errorf("the file closed first was kept past the bound: %v", m)
	}
	if m := c.take(fi(1), bs); m == nil || !m.equal(oneRun) {
		t.Errorf("take of a kept file = %v, want %v", m, oneRun)
	}
	if m := c.take(fi(1), bs); m != nil {
		t.Errorf("a second take of one entry = %v, want nil", m)
	}
	changed := fi(2)
	changed.Ctime++
	if m := c.take(changed, bs); m != nil {
		t.Errorf("take with another ctime = %v, want nil", m)
	}
	resized := fi(3)
	resized.Size++
	if m := c.take(resized, bs); m != nil {
		t.Errorf("take with another size = %v, want nil", m)
	}
	if n, b := c.size(); n != 0 || b != 0 {
		t.Errorf("after every entry was taken: %d entries of %d bytes, want none", n, b)
	}

	large := newExtentMap(bs)
	for i := range int64(64) {
		large.set(2*i, 2*i+1, ExtentWritten)
	}
	c = newCache(int64(64 * extentRunSize * 4)) // the map is half of it
	c.put(fi(9), large)
	if n, _ := c.size(); n != 0 {
		t.Errorf("a map of half the cache was kept (%d entries)", n)
	}
	c = newCache(0)
	c.put(fi(9), oneRun)
	if m := c.take(fi(9), bs); m != nil {
		t.Errorf("a cache of 0 bytes gave back %v", m)
	}
}

// TestExtentCacheSlots: puts, takes and forgets in random order, of maps
// of one run and of several, against a model of the cache (an LRU list of
// the files and their maps): the slots freed and reused, the runs kept
// apart for the maps of several, and the bytes counted, stay as the model
// says, and every take gives back the map put, or nothing once the file
// was dropped for room.
func TestExtentCacheSlots(t *testing.T) {
	const bs, files = 4096, 40
	rng := rand.New(rand.NewPCG(7, 7))
	maps := make([]*extentMap, files)
	for i := range maps {
		maps[i] = newExtentMap(bs)
		for r := range int64(1 + i%4) { // 1 to 4 runs
			maps[i].set(3*r, 3*r+1+int64(i%2), ExtentWritten)
		}
	}
	fi := func(i int) FileInfo { return FileInfo{Dev: 1, Ino: uint64(i), Size: 16 * bs, Ctime: 1e9 + 1} }
	cost := func(i int) int64 { return closedFileCost + int64(maps[i].runs())*extentRunSize }
	c := newExtentCache(12 * (closedFileCost + extentRunSize))
	c.now = func() int64 { return 5e9 }
	var lru []int // the model: most recently put first
	remove := func(i int) bool {
		for j, f := range lru {
			if f == i {
				lru = slices.Delete(lru, j, j+1)
				return true
			}
		}
		return false
	}
	for step := range 5000 {
		i := rng.IntN(files)
		switch op := rng.IntN(3); op {
		case 0:
			c.put(fi(i), maps[i])
			remove(i)
			lru = slices.Insert(lru, 0, i)
			var total int64
			for _, f := range lru {
				total += cost(f)
			}
			for total > c.maxBytes {
				total -= cost(lru[len(lru)-1])
				lru = lru[:len(lru)-1]
			}
		case 1:
			m := c.take(fi(i), bs)
			if kept := remove(i); kept != (m != nil) || (m != nil && !m.equal(maps[i])) {
				t.Fatalf("step %d: take(%d) = %v, want the map put: %v", step, i, m, kept)
			}
		default:
			c.forget(fileID{1, uint64(i)})
			remove(i)
		}
		var want int64
		for _, f := range lru {
			want += cost(f)
		}
		if n, b := c.size(); n != len(lru) || b != want {
			t.Fatalf("step %d: %d entries of %d bytes, want %d of %d", step, n, b, len(lru), want)
		}
		if len(c.spilled) > len(lru) || len(c.entries)-len(c.free) != len(lru) {
			t.Fatalf("step %d: %d slots, %d free, %d spilled, for %d entries", step, len(c.entries), len(c.free), len(c.spilled), len(lru))
		}
	}
	// Newest first, as the model has them.
	var order []int
	for i := c.head; i != noSlot; i = c.entries[i].next {
		order = append(order, int(c.entries[i].id.ino))
	}
	if !slices.Equal(order, lru) {
		t.Errorf("entries newest first: %v, want %v", order, lru)
	}
}

// TestReopenTakesExtentsFromCache: a file closed for room and reopened
// unchanged takes its extent map from the cache, without FIEMAP; one
// changed from outside the store while closed, even to the same size,
// rebuilds it from FIEMAP. Either way the map is the file's.
func TestReopenTakesExtentsFromCache(t *testing.T) {
	const b = 4096
	open := func(t *testing.T, p string) *os.File {
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	tests := []struct {
		name string
		// outside changes the file at p while the store has it closed;
		// nil leaves it alone.
		outside   func(t *testing.T, p string)
		inDoubt   bool // an I/O error left the store unsure of the map
		wantCache bool
	}{
		{name: "unchanged", wantCache: true},
		{name: "a block punched, same size", outside: func(t *testing.T, p string) {
			fileOps{t, open(t, p)}.fallocate(punchHole, 0, b)
		}},
		{name: "blocks preallocated past EOF, same size", outside: func(t *testing.T, p string) {
			fileOps{t, open(t, p)}.fallocate(keepSize, 8*b, 8*b)
		}},
		{name: "a hole written, same size", outside: func(t *testing.T, p string) {
			fileOps{t, open(t, p)}.pwrite(5*b, b)
		}},
		{name: "mtime set back to what it was", outside: func(t *testing.T, p string) {
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "replaced by another file of the same size", outside: func(t *testing.T, p string) {
			if err := os.WriteFile(p+".new", make([]byte, 8*b), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(p+".new", p); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "map in doubt", inDoubt: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			dir := testutil.Dir(t)
			osfs, err := OpenOSFS(dir)
			if err != nil {
				t.Fatal(err)
			}
			counter := &extentsCounter{FS: osfs}
			s, err := Open(counter, Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			// Blocks 0-1 written, 2-3 preallocated, 4-7 holes.
			if _, err := s.Fallocate(ctx, "f", FallocAllocate, 2*b, 2*b); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Write(ctx, "f", 0, make([]byte, 2*b), SyncNone); err != nil {
				t.Fatal(err)
			}
			if err := s.Truncate(ctx, "f", 8*b); err != nil {
				t.Fatal(err)
			}
			if tt.inDoubt {
				ino, err := s.table.get(ctx, "f", false)
				if err != nil {
					t.Fatal(err)
				}
				ino.extentsInDoubt.Store(true)
				s.table.put(ino)
			}
			p := filepath.Join(dir, "f")
			waitSettled(t, s, p)
			if !closeIfIdle(s, "f") {
				t.Fatal("f is busy; nothing else runs")
			}
			if tt.outside != nil {
				tt.outside(t, p)
			}
			before := counter.count("f")
			if _, err := s.Stat(ctx, "f"); err != nil { // reopens
				t.Fatal(err)
			}
			if got, want := counter.count("f")-before == 0, tt.wantCache; got != want {
				t.Errorf("reopened from the cache = %v, want %v", got, want)
			}
			extentsMatchFile(t, s, "f")
		})
	}
}

// TestRenamedFileKeepsNoStaleMap: the cache is keyed by inode, so a file
// renamed from outside while closed is found under its new name; rename
// moves its ctime, so that open rebuilds the map once, and the old name,
// if created anew with the same size, is another inode.
func TestRenamedFileKeepsNoStaleMap(t *testing.T) {
	ctx := context.Background()
	s, dir := newTestStore(t, Options{})
	if _, err := s.Write(ctx, "a", 0, make([]byte, 8192), SyncNone); err != nil {
		t.Fatal(err)
	}
	waitSettled(t, s, filepath.Join(dir, "a"))
	if !closeIfIdle(s, "a") {
		t.Fatal("a is busy")
	}
	if err := os.Rename(filepath.Join(dir, "a"), filepath.Join(dir, "b")); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(8192); err != nil { // a hole of the same size
		t.Fatal(err)
	}
	f.Close()
	for _, name := range []string{"a", "b"} {
		if _, err := s.Stat(ctx, name); err != nil {
			t.Fatal(err)
		}
		extentsMatchFile(t, s, name)
	}
	if st, err := os.Stat(filepath.Join(dir, "a")); err != nil || st.Sys().(*syscall.Stat_t).Blocks != 0 {
		t.Errorf("a is not the new, empty file: %v", err)
	}
}

// TestExtentCacheMetrics: opens are counted by where their extent map came
// from, closes for room are counted, and the gauges show the cache. The
// cache's clock is the test's, to say which closes are late enough to keep
// their file's map.
func TestExtentCacheMetrics(t *testing.T) {
	ctx := context.Background()
	ts := newTracedStore(t, nil, Options{MaxOpenFiles: 1})
	var closedAt atomic.Int64
	ts.table.closedExtents.now = closedAt.Load
	late, early := func() { closedAt.Store(coarseNow() + 1e9) }, func() { closedAt.Store(0) }
	if _, err := ts.Write(ctx, "a", 0, make([]byte, 8192), SyncNone); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name  string
		clock func()
		do    func() error
		// want: opens from the file, from the cache, closes, entries
		want [4]int64
	}{
		{"b opens, a closes and is kept", late, func() error { _, err := ts.Write(ctx, "b", 0, []byte("b"), SyncNone); return err }, [4]int64{2, 0, 1, 1}},
		{"a reopens from the cache, b closes too soon to be kept", early, func() error { _, err := ts.Stat(ctx, "a"); return err }, [4]int64{2, 1, 2, 0}},
		{"b reopens from the file", early, func() error { _, err := ts.Stat(ctx, "b"); return err }, [4]int64{3, 1, 3, 0}},
	}
	for _, st := range steps {
		st.clock()
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		var rm metricdata.ResourceMetrics
		if err := ts.metrics.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		entries, _ := gaugeValue(t, rm, MetricExtentCacheEntries)
		got := [4]int64{
			counterValue(rm, MetricFileOpens, AttrExtentsSource.String("file")),
			counterValue(rm, MetricFileOpens, AttrExtentsSource.String("cache")),
			counterValue(rm, MetricFileCloses),
			entries,
		}
		if got != st.want {
			t.Errorf("%s: opens from file, from cache, closes, cache entries = %v, want %v", st.name, got, st.want)
		}
	}
}

// counterValue sums the points of an int64 counter that carry every
// attribute in attrs.
func counterValue(rm metricdata.ResourceMetrics, name string, attrs ...attribute.KeyValue) int64 {
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != name || !ok {
				continue
			}
		points:
			for _, p := range sum.DataPoints {
				for _, kv := range attrs {
					if v, ok := p.Attributes.Value(kv.Key); !ok || v != kv.Value {
						continue points
					}
				}
				n += p.Value
			}
		}
	}
	return n
}
