//go:build linux

package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/filewrite/filewrite/internal/testutil"
)

// mappedCounter counts the writes that went through a mapping, by path.
type mappedCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *mappedCounter) hooks(eager bool) *Hooks {
	c.n = map[string]int{}
	return &Hooks{mapEagerly: eager, MappedWrite: func(path string) {
		c.mu.Lock()
		c.n[path]++
		c.mu.Unlock()
	}}
}

func (c *mappedCounter) count(path string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[path]
}

// prepareFile writes name whole, size bytes in pieces of chunk, through s.
func prepareFile(t *testing.T, s *Store, name string, size, chunk int64) []byte {
	t.Helper()
	model := make([]byte, size)
	for i := range model {
		model[i] = byte(i / 4096)
	}
	for off := int64(0); off < size; off += chunk {
		if _, err := s.Write(context.Background(), name, off, model[off:off+chunk], SyncNone); err != nil {
			t.Fatal(err)
		}
	}
	return model
}

// checkContent compares name, read through the store and from the file
// itself, with model.
func checkContent(t *testing.T, s *Store, dir, name string, model []byte) {
	t.Helper()
	got, err := s.Read(context.Background(), name, 0, int64(len(model))+1)
	if err != nil {
		t.Fatal(err)
	}
	testutil.SameBytes(t, "Read of "+name, got, model)
	onDisk, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	testutil.SameBytes(t, "file "+name, onDisk, model)
}

// TestMappedWritesAgainstModel has writers overwrite a file concurrently,
// each its own blocks with random pieces of them (aligned or not), under
// every policy, while a truncater cuts the file's tail
// and writes it back: the file, read through the store and read from the
// disk, must hold what a model of the writes says, and most writes must
// have gone through the mapping.
func TestMappedWritesAgainstModel(t *testing.T) {
	const size, writers, perWriter = 1 << 20, 4, 400
	for _, p := range Policies() {
		t.Run(p.String(), func(t *testing.T) {
			var c mappedCounter
			s, dir := newTestStore(t, Options{Policy: p, Hooks: c.hooks(true)})
			model := prepareFile(t, s, "f", size, 64<<10)
			ctx := context.Background()
			var wg sync.WaitGroup
			var mu sync.Mutex // guards model
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(w), 1))
					for i := range perWriter {
						// Writer w owns the blocks b with b%writers == w,
						// and the first three quarters of the file: the
						// truncater owns the rest.
						block := int64(rng.IntN(size/4096*3/4/writers)*writers + w)
						off := block*4096 + int64(rng.IntN(4096))
						n := int64(1 + rng.IntN(int(block*4096+4096-off)))
						data := bytes.Repeat([]byte{byte(w<<6 | i%64)}, int(n))
						if _, err := s.Write(ctx, "f", off, data, SyncNone); err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						copy(model[off:], data)
						mu.Unlock()
					}
				}()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				tail := int64(size * 3 / 4)
				for i := range 20 {
					if err := s.Truncate(ctx, "f", tail+int64(i)*512); err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					piece := append([]byte(nil), model[tail:]...)
					mu.Unlock()
					if _, err := s.Write(ctx, "f", tail, piece, SyncNone); err != nil {
						t.Error(err)
						return
					}
				}
			}()
			wg.Wait()
			checkContent(t, s, dir, "f", model)
			if got := c.count("f"); got < writers*perWriter/2 {
				t.Errorf("%d of %d writes went through the mapping, want most", got, writers*perWriter)
			}
		})
	}
}

// TestMappedWriteMovesChangeTime: Stat's change time, which ETags are made
// of, moves after a write that went through the mapping, as it does after
// a pwrite, though the store into an already writable page tells the
// kernel nothing.
func TestMappedWriteMovesChangeTime(t *testing.T) {
	var c mappedCounter
	s, _ := newTestStore(t, Options{Hooks: c.hooks(true)})
	prepareFile(t, s, "f", 64<<10, 64<<10)
	ctx := context.Background()
	// A write that maps the page writable (if its first store
	// is a pwrite, the second).
	for range 2 {
		if _, err := s.Write(ctx, "f", 0, []byte("a"), SyncNone); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		before, err := s.Stat(ctx, "f")
		if err != nil {
			t.Fatal(err)
		}
		// Past the coarsest timestamp granularity, so that the test does
		// not lean on the kernel's fine-grained ctime after a stat.
		time.Sleep(20 * time.Millisecond)
		n := c.count("f")
		if _, err := s.Write(ctx, "f", 1, []byte{byte(i)}, SyncNone); err != nil {
			t.Fatal(err)
		}
		if c.count("f") != n+1 {
			t.Fatalf("write %d did not go through the mapping", i)
		}
		after, err := s.Stat(ctx, "f")
		if err != nil {
			t.Fatal(err)
		}
		if after.ChangeTime <= before.ChangeTime {
			t.Errorf("write %d: change time %d after it, %d before", i, after.ChangeTime, before.ChangeTime)
		}
	}
}

// TestMappedWriteFileCutOutside: a file cut short from outside the store
// makes a store into its mapping fault (SIGBUS); the write is recovered,
// made again with pwrite, and reports the cut (ErrChangedOutside); the
// store takes the file's size, the next write succeeds, and the file is
// not written through its mapping again while it stays open.
func TestMappedWriteFileCutOutside(t *testing.T) {
	var c mappedCounter
	s, dir := newTestStore(t, Options{Hooks: c.hooks(true)})
	prepareFile(t, s, "f", 256<<10, 64<<10)
	ctx := context.Background()
	data := []byte("through the mapping")
	for range 2 {
		if _, err := s.Write(ctx, "f", 200<<10, data, SyncNone); err != nil {
			t.Fatal(err)
		}
	}
	before := c.count("f")
	if before == 0 {
		t.Fatal("no write went through the mapping")
	}
	if err := os.Truncate(filepath.Join(dir, "f"), 0); err != nil {
		t.Fatal(err)
	}
	// The store still believes the size is 256 KiB: the write is below
	// its EOF, its page is resident by the bits and gone from the file.
	res, err := s.Write(ctx, "f", 200<<10, data, SyncNone)
	if !errors.Is(err, ErrChangedOutside) {
		t.Fatalf("write after the file was cut outside: %v, want ErrChangedOutside", err)
	}
	if res.BytesWritten != len(data) {
		t.Errorf("the write that found the cut wrote %d bytes, want %d (made with pwrite)", res.BytesWritten, len(data))
	}
	if _, err := s.Write(ctx, "f", 200<<10, data, SyncNone); err != nil {
		t.Fatal(err)
	}
	if n := c.count("f") - before; n != 0 {
		t.Errorf("%d writes went through the mapping after the fault, want none", n)
	}
	want := make([]byte, 200<<10+len(data))
	copy(want[200<<10:], data)
	checkContent(t, s, dir, "f", want)
	if st, err := s.Stat(ctx, "f"); err != nil || st.Size != int64(len(want)) {
		t.Errorf("Stat: size %d, %v; want %d, nil", st.Size, err, len(want))
	}
}

// TestMappedWritesOnlyWhereHot is the default thresholds' test: a writer
// that syncs after each write, and one that writes a region sparsely, stay
// with pwrite (a fault would dirty whole folios the syncs just cleaned);
// a writer that overwrites a region densely without syncs gets the
// mapping.
func TestMappedWritesOnlyWhereHot(t *testing.T) {
	var c mappedCounter
	s, dir := newTestStore(t, Options{Hooks: c.hooks(false)})
	ctx := context.Background()
	for _, name := range []string{"synced", "sparse", "dense"} {
		prepareFile(t, s, name, 4<<20, 1<<20)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	page := bytes.Repeat([]byte{7}, 4096)
	for range 400 {
		off := int64(rng.IntN(512)) * 4096
		if _, err := s.Write(ctx, "synced", off, page, SyncData); err != nil {
			t.Fatal(err)
		}
	}
	for i := range hotWrites - 1 {
		// One write per page of the first region (below hotWrites).
		if _, err := s.Write(ctx, "sparse", int64(i)*4096, page, SyncNone); err != nil {
			t.Fatal(err)
		}
	}
	const dense = 4000
	model := prepareFile(t, s, "dense-model", 4<<20, 1<<20) // the same content as dense
	for range dense {
		off := int64(rng.IntN(512)) * 4096
		if _, err := s.Write(ctx, "dense", off, page, SyncNone); err != nil {
			t.Fatal(err)
		}
		copy(model[off:], page)
	}
	if n := c.count("synced"); n != 0 {
		t.Errorf("synced writer: %d writes went through the mapping, want none", n)
	}
	if n := c.count("sparse"); n != 0 {
		t.Errorf("sparse writer: %d writes went through the mapping, want none", n)
	}
	// The first hotWrites of the period, and the first to each page, are
	// pwrites; a period boundary in the middle costs another hotWrites.
	if n := c.count("dense"); n < dense-3*hotWrites-512 {
		t.Errorf("dense writer: %d of %d writes went through the mapping, want all but the first of each page and period", n, dense)
	}
	checkContent(t, s, dir, "dense", model)
}

// TestHotRegionCarried: a region hot in one period is hot from the first
// write of the next, if no sync came between, and counts on there; one
// that was hot only by that carry, a sync, or a period without writes
// starts cold. TryWrite's peek counts only where the region is hot.
func TestHotRegionCarried(t *testing.T) {
	const size, bs = 4 << 20, 4096
	m := &regionHeat{covers: 2 * hotRegion, words: make([]atomic.Uint64, 2)}
	stamp := func(syncs, period uint64) uint64 { return syncs<<24 | period }
	// writes makes n writes to the first region and returns how many
	// found it hot.
	writes := func(st uint64, n int, peek bool) int {
		hot := 0
		for range n {
			if m.hot(0, size, bs, st, peek) {
				hot++
			}
		}
		return hot
	}
	steps := []struct {
		name  string
		stamp uint64
		n     int
		peek  bool
		hot   int
	}{
		{"cold: peeks count nothing", stamp(0, 10), 300, true, 0},
		{"warming", stamp(0, 10), hotWrites + 10, false, 10},
		{"next period: carried", stamp(0, 11), hotWrites, true, hotWrites},
		{"carried and counted on: carried again", stamp(0, 12), 1, true, 1},
		{"a few writes only", stamp(0, 12), 0, false, 0},
		{"carried once, not twice", stamp(0, 13), 1, false, 0},
		{"warm again", stamp(0, 13), hotWrites, false, 1},
		{"after a sync: cold", stamp(1, 14), 1, false, 0},
		{"warm in the sync's period", stamp(1, 14), hotWrites, false, 1},
		{"a period skipped: cold", stamp(1, 16), 1, true, 0},
	}
	for _, st := range steps {
		if got := writes(st.stamp, st.n, st.peek); got != st.hot {
			t.Errorf("%s: %d of %d writes found the region hot, want %d", st.name, got, st.n, st.hot)
		}
	}
	// The region's end cuts what it needs: a 256 KiB file is hot after
	// 32 writes, and none after fewer than hotMinWrites (a byte written
	// over and over earns no mapping).
	for _, tt := range []struct{ size, after int64 }{
		{256 << 10, 32},
		{64 << 10, hotMinWrites},
		{1, hotMinWrites},
	} {
		small := &regionHeat{covers: hotRegion, words: make([]atomic.Uint64, 1)}
		for i := range tt.after + 1 {
			if got, want := small.hot(0, tt.size, bs, stamp(0, 1), false), i == tt.after; got != want {
				t.Errorf("file of %d bytes, write %d: hot %v, want %v", tt.size, i+1, got, want)
			}
		}
		if !small.hot(0, tt.size, bs, stamp(0, 2), true) {
			t.Errorf("file of %d bytes: not carried into the next period", tt.size)
		}
	}
}

// TestMappedFilesClosedForRoom: files closed for room (and at Close) give
// their mappings back, and keep what was stored through them.
func TestMappedFilesClosedForRoom(t *testing.T) {
	var c mappedCounter
	dir := t.TempDir()
	fsys, err := OpenOSFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(fsys, Options{MaxOpenFiles: 2, Hooks: c.hooks(true)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	models := map[string][]byte{}
	for i := range 4 {
		name := fmt.Sprintf("f%d", i)
		models[name] = prepareFile(t, s, name, 64<<10, 64<<10)
	}
	var mapped atomic.Int64
	for round := range 6 {
		for name, model := range models {
			for k := range 4 {
				off := int64(k*4096 + round)
				b := []byte{byte(round*16 + k)}
				if _, err := s.Write(ctx, name, off, b, SyncNone); err != nil {
					t.Fatal(err)
				}
				copy(model[off:], b)
			}
			mapped.Store(s.table.mappedBytes.Load())
		}
	}
	for name := range models {
		if c.count(name) == 0 {
			t.Errorf("%s: no write went through a mapping", name)
		}
	}
	if mapped.Load() > 2*minMapBytes {
		t.Errorf("%d bytes mapped with 2 files open, want at most %d", mapped.Load(), 2*minMapBytes)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := s.table.mappedBytes.Load(); n != 0 {
		t.Errorf("%d bytes still mapped after Close", n)
	}
	for name, model := range models {
		onDisk, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		testutil.SameBytes(t, name+" after Close", onDisk, model)
	}
}

// TestTryWrite: Handle.TryWrite makes a write only where it waits for
// nothing and calls no syscall, and otherwise changes nothing: not before
// the file has a mapping, not while another holds the lock, not for a
// write that extends the file; and when it does, the bytes are there.
func TestTryWrite(t *testing.T) {
	var c mappedCounter
	s, dir := newTestStore(t, Options{Hooks: c.hooks(true)})
	ctx := context.Background()
	model := prepareFile(t, s, "f", 64<<10, 64<<10)
	h, err := s.OpenHandle(ctx, "f", OpenMustExist)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	try := func(off int64, b []byte, want bool) {
		t.Helper()
		res, made := h.TryWrite(ctx, off, b)
		if made != want {
			t.Fatalf("TryWrite(%d, %d bytes) = %v, want %v", off, len(b), made, want)
		}
		if made {
			if res.BytesWritten != len(b) || res.Size != int64(len(model)) || res.Owed != SyncNone {
				t.Errorf("TryWrite(%d, %d bytes) = %+v", off, len(b), res.WriteResult)
			}
			copy(model[off:], b)
		}
	}
	try(100, []byte("no mapping yet"), false)
	if _, err := h.Write(ctx, 200, []byte("maps it"), SyncNone); err != nil {
		t.Fatal(err)
	}
	copy(model[200:], "maps it")
	try(300, []byte("mapped"), true)

	held, err := lockInode(ctx, h.ino, lockExclusive, "test", "test")
	if err != nil {
		t.Fatal(err)
	}
	try(400, []byte("lock held"), false)
	h.ino.lock.release(held)
	putHolder(held)
	try(400, []byte("lock free"), true)
	try(int64(len(model))-2, []byte("past the end"), false)
	checkContent(t, s, dir, "f", model)
}
