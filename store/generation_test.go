//go:build linux

package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/filewrite/filewrite/internal/testutil"
)

// genOf is f's generation, by Stat.
func genOf(t *testing.T, s *Store, path string) int64 {
	t.Helper()
	st, err := s.Stat(context.Background(), path)
	if err != nil {
		t.Fatalf("Stat(%s): %v", path, err)
	}
	if st.Generation <= 0 {
		t.Fatalf("Stat(%s): generation %d", path, st.Generation)
	}
	return st.Generation
}

// TestGenerationMovesWithEveryMutation: each mutation, through each face
// and path, moves the file's generation to one the path never showed
// before, and a mutation that reports a generation reports the one Stat
// shows after it; what changes nothing moves nothing.
func TestGenerationMovesWithEveryMutation(t *testing.T) {
	ctx := context.Background()
	const size = 64 << 10
	type env struct {
		t    *testing.T
		s    *Store
		dir  string
		h    *Handle
		maps *mappedCounter
	}
	// A mutation returns the generation it reports, 0 if none.
	tests := []struct {
		name   string
		policy Policy
		do     func(e env) (int64, error)
		// still: the operation changes nothing, and must not move it.
		still bool
	}{
		{name: "Write below the end", do: func(e env) (int64, error) {
			r, err := e.s.Write(ctx, "f", 100, []byte("x"), SyncNone)
			return r.Generation, err
		}},
		{name: "Write past the end", do: func(e env) (int64, error) {
			r, err := e.s.Write(ctx, "f", size+10, []byte("x"), SyncNone)
			return r.Generation, err
		}},
		{name: "synced Write", do: func(e env) (int64, error) {
			r, err := e.s.Write(ctx, "f", 100, []byte("x"), SyncData)
			return r.Generation, err
		}},
		{name: "Write under the exclusive policy", policy: PolicyExclusive, do: func(e env) (int64, error) {
			r, err := e.s.Write(ctx, "f", 100, []byte("x"), SyncFull)
			return r.Generation, err
		}},
		{name: "Write through the mapping", do: func(e env) (int64, error) {
			n := e.maps.count("f")
			r, err := e.s.Write(ctx, "f", 200, []byte("y"), SyncNone)
			if e.maps.count("f") != n+1 {
				e.t.Fatal("the write did not go through the mapping")
			}
			return r.Generation, err
		}},
		{name: "Handle.Write", do: func(e env) (int64, error) {
			w, err := e.h.Write(ctx, 300, []byte("z"), SyncNone)
			return w.Generation, err
		}},
		{name: "Handle.TryWrite, a store with no syscall", do: func(e env) (int64, error) {
			w, ok := e.h.TryWrite(ctx, 400, []byte("t"))
			if !ok {
				e.t.Fatal("TryWrite refused the write")
			}
			return w.Generation, nil
		}},
		{name: "Append", do: func(e env) (int64, error) {
			r, err := e.s.Append(ctx, "f", []byte("a"), SyncNone, AppendOptions{})
			return r.Generation, err
		}},
		{name: "Append under the exclusive policy", policy: PolicyExclusive, do: func(e env) (int64, error) {
			r, err := e.s.Append(ctx, "f", []byte("a"), SyncNone, AppendOptions{})
			return r.Generation, err
		}},
		{name: "Handle.ApplyAppend", do: func(e env) (int64, error) {
			w, _, err := e.h.ApplyAppend(ctx, []byte("a"), SyncNone, AppendOptions{})
			return w.Generation, err
		}},
		{name: "Truncate shorter", do: func(e env) (int64, error) {
			r, err := e.s.TruncateIf(ctx, "f", size/2, Precondition{})
			return r.Generation, err
		}},
		{name: "Truncate longer", do: func(e env) (int64, error) {
			r, err := e.s.TruncateIf(ctx, "f", 2*size, Precondition{})
			return r.Generation, err
		}},
		{name: "Truncate to its size", do: func(e env) (int64, error) {
			r, err := e.s.TruncateIf(ctx, "f", size, Precondition{})
			return r.Generation, err
		}},
		{name: "Fallocate allocate", do: func(e env) (int64, error) {
			r, err := e.s.FallocateIf(ctx, "f", FallocAllocate, size, 4096, Precondition{})
			return r.Generation, err
		}},
		{name: "Fallocate keep-size", do: func(e env) (int64, error) {
			r, err := e.s.FallocateIf(ctx, "f", FallocKeepSize, size, 4096, Precondition{})
			return r.Generation, err
		}},
		{name: "Fallocate punch", do: func(e env) (int64, error) {
			r, err := e.s.FallocateIf(ctx, "f", FallocPunchHole, 4096, 4096, Precondition{})
			return r.Generation, err
		}},
		{name: "Fallocate zero", do: func(e env) (int64, error) {
			r, err := e.s.FallocateIf(ctx, "f", FallocZeroRange, 4096, 4096, Precondition{})
			return r.Generation, err
		}},
		{name: "Rename onto the path", do: func(e env) (int64, error) {
			if _, err := e.s.Write(ctx, "g", 0, []byte("other"), SyncNone); err != nil {
				return 0, err
			}
			r, err := e.s.RenameIf(ctx, "g", "f", false, false, Precondition{}, Precondition{})
			return r.Generation, err
		}},
		{name: "Rename away and back", do: func(e env) (int64, error) {
			if err := e.s.Rename(ctx, "f", "away", false, false); err != nil {
				return 0, err
			}
			r, err := e.s.RenameIf(ctx, "away", "f", false, false, Precondition{}, Precondition{})
			return r.Generation, err
		}},
		{name: "Delete, then Write", do: func(e env) (int64, error) {
			if err := e.s.Delete(ctx, "f", false); err != nil {
				return 0, err
			}
			r, err := e.s.Write(ctx, "f", 0, []byte("new"), SyncNone)
			return r.Generation, err
		}},
		{name: "cut from outside, seen by Stat", do: func(e env) (int64, error) {
			if err := os.Truncate(filepath.Join(e.dir, "f"), 100); err != nil {
				return 0, err
			}
			if _, err := e.s.Stat(ctx, "f"); !errors.Is(err, ErrChangedOutside) {
				e.t.Fatalf("Stat after the cut: %v, want ErrChangedOutside", err)
			}
			return 0, nil
		}},
		{name: "an empty Write", still: true, do: func(e env) (int64, error) {
			r, err := e.s.Write(ctx, "f", 100, nil, SyncData)
			return r.Generation, err
		}},
		{name: "Read, Fsync, Extents", still: true, do: func(e env) (int64, error) {
			if _, err := e.s.Read(ctx, "f", 0, 10); err != nil {
				return 0, err
			}
			if _, err := e.s.Extents(ctx, "f", 0, 0); err != nil {
				return 0, err
			}
			return 0, e.s.Fsync(ctx, "f", SyncFull)
		}},
		{name: "Rename onto itself", still: true, do: func(e env) (int64, error) {
			r, err := e.s.RenameIf(ctx, "f", "f", false, false, Precondition{}, Precondition{})
			return r.Generation, err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c mappedCounter
			s, dir := newTestStore(t, Options{Policy: tt.policy, Hooks: c.hooks(true)})
			prepareFile(t, s, "f", size, size)
			h, err := s.OpenHandle(ctx, "f", OpenMustExist)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			// Seen at f: every generation it showed, each write here one
			// more, and then the mapping made.
			seen := map[int64]bool{genOf(t, s, "f"): true}
			for range 2 {
				r, err := s.Write(ctx, "f", 0, []byte("w"), SyncNone)
				if err != nil {
					t.Fatal(err)
				}
				seen[r.Generation] = true
			}
			before := genOf(t, s, "f")
			if !seen[before] {
				t.Fatalf("Stat shows %d, which no write reported", before)
			}
			reported, err := tt.do(env{t, s, dir, h, &c})
			if err != nil {
				t.Fatal(err)
			}
			after := genOf(t, s, "f")
			switch {
			case tt.still && after != before:
				t.Errorf("generation %d, then %d: moved by an operation that changes nothing", before, after)
			case !tt.still && seen[after]:
				t.Errorf("generation %d after the mutation, seen at f before (last %d)", after, before)
			case reported != 0 && reported != after:
				t.Errorf("the mutation reported generation %d, Stat shows %d", reported, after)
			}
		})
	}
}

// TestPreconditions: each conditional mutation goes ahead when its
// precondition holds, and otherwise returns a *GenerationMismatch naming
// the file's generation and changes nothing: not the bytes, the size, the
// generation, nor whether the file exists.
func TestPreconditions(t *testing.T) {
	ctx := context.Background()
	type op func(s *Store, h *Handle, pre Precondition) error
	ops := []struct {
		name string
		do   op
		// creates: with "no file may exist", the operation makes a
		// missing file.
		creates bool
	}{
		{"WriteIf", func(s *Store, _ *Handle, pre Precondition) error {
			_, err := s.WriteIf(ctx, "f", OpenCreate, 0, []byte("new"), SyncNone, pre)
			return err
		}, true},
		{"Handle.WriteIf", func(_ *Store, h *Handle, pre Precondition) error {
			_, err := h.WriteIf(ctx, 0, []byte("new"), SyncNone, pre)
			return err
		}, false},
		{"Append", func(s *Store, _ *Handle, pre Precondition) error {
			_, err := s.Append(ctx, "f", []byte("new"), SyncNone, AppendOptions{If: pre})
			return err
		}, true},
		{"Handle.Append", func(_ *Store, h *Handle, pre Precondition) error {
			_, err := h.Append(ctx, []byte("new"), SyncNone, AppendOptions{If: pre})
			return err
		}, false},
		{"TruncateIf", func(s *Store, _ *Handle, pre Precondition) error {
			_, err := s.TruncateIf(ctx, "f", 3, pre)
			return err
		}, true},
		{"FallocateIf", func(s *Store, _ *Handle, pre Precondition) error {
			_, err := s.FallocateIf(ctx, "f", FallocAllocate, 0, 8192, pre)
			return err
		}, true},
		{"DeleteIf", func(s *Store, _ *Handle, pre Precondition) error {
			return s.DeleteIf(ctx, "f", false, pre)
		}, false},
		{"RenameIf, on the source", func(s *Store, _ *Handle, pre Precondition) error {
			_, err := s.RenameIf(ctx, "f", "g", false, false, pre, Precondition{})
			return err
		}, false},
	}
	// The preconditions, given f's generation (0: no file).
	conds := []struct {
		name string
		pre  func(gen int64) Precondition
		// holds says whether it holds for f with generation gen.
		holds func(gen int64) bool
	}{
		// Where no file exists, "its generation" is 0.
		{"IfMatch its generation", func(g int64) Precondition { return Precondition{IfMatch: new(g)} }, func(int64) bool { return true }},
		{"IfMatch another", func(g int64) Precondition { return Precondition{IfMatch: new(g + 1)} }, func(int64) bool { return false }},
		{"IfMatch 0", func(int64) Precondition { return Precondition{IfMatch: new(int64(0))} }, func(g int64) bool { return g == 0 }},
		{"IfNotMatch its generation", func(g int64) Precondition { return Precondition{IfNotMatch: new(g)} }, func(int64) bool { return false }},
		{"IfNotMatch another", func(g int64) Precondition { return Precondition{IfNotMatch: new(g + 1)} }, func(g int64) bool { return g != 0 }},
		{"IfNotMatch 0", func(int64) Precondition { return Precondition{IfNotMatch: new(int64(0))} }, func(g int64) bool { return g != 0 }},
	}
	for _, o := range ops {
		for _, c := range conds {
			for _, exists := range []bool{true, false} {
				if !exists && (o.name == "Handle.WriteIf" || o.name == "Handle.Append") {
					continue // a Handle holds a file
				}
				t.Run(fmt.Sprintf("%s/%s/exists=%v", o.name, c.name, exists), func(t *testing.T) {
					s, dir := newTestStore(t, Options{})
					var h *Handle
					gen := int64(0)
					if exists {
						if _, err := s.Write(ctx, "f", 0, []byte("original"), SyncNone); err != nil {
							t.Fatal(err)
						}
						var err error
						if h, err = s.OpenHandle(ctx, "f", OpenMustExist); err != nil {
							t.Fatal(err)
						}
						defer h.Close()
						gen = genOf(t, s, "f")
					}
					before := readOrNone(t, dir, "f")
					err := o.do(s, h, c.pre(gen))
					after := readOrNone(t, dir, "f")
					switch {
					case c.holds(gen):
						if err != nil && !(errors.Is(err, ErrNotFound) && !exists) {
							t.Fatalf("the precondition holds: %v, want it done", err)
						}
						if !exists && o.creates && after == "(none)" {
							t.Error("no file was created")
						}
					default:
						var mm *GenerationMismatch
						if !errors.As(err, &mm) || !errors.Is(err, ErrGenerationMismatch) {
							t.Fatalf("the precondition fails: %v, want a *GenerationMismatch", err)
						}
						if mm.Current != gen {
							t.Errorf("the mismatch says generation %d, the file has %d", mm.Current, gen)
						}
						if after != before {
							t.Errorf("the refused mutation changed the file: %q, then %q", before, after)
						}
						if exists && genOf(t, s, "f") != gen {
							t.Error("the refused mutation moved the generation")
						}
					}
				})
			}
		}
	}
}

// readOrNone is the content of dir/name, or "(none)".
func readOrNone(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return "(none)"
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRenamePreconditionOnTheNewName: a Rename's precondition on the new
// name is on the file it names, opened for it if the store has not, and
// "no file may exist" there refuses a taken name as a mismatch.
func TestRenamePreconditionOnTheNewName(t *testing.T) {
	ctx := context.Background()
	s, dir := newTestStore(t, Options{MaxOpenFiles: 4})
	for _, name := range []string{"a", "b"} {
		if _, err := s.Write(ctx, name, 0, []byte(name), SyncNone); err != nil {
			t.Fatal(err)
		}
	}
	gb := genOf(t, s, "b")
	for _, tt := range []struct {
		name string
		dst  Precondition
		ok   bool
	}{
		{"IfMatch 0 on a taken name", Precondition{IfMatch: new(int64(0))}, false},
		{"IfMatch another", Precondition{IfMatch: new(gb + 1)}, false},
		{"IfNotMatch its generation", Precondition{IfNotMatch: new(gb)}, false},
		{"IfMatch its generation", Precondition{IfMatch: new(gb)}, true},
	} {
		_, err := s.RenameIf(ctx, "a", "b", false, false, Precondition{}, tt.dst)
		if tt.ok != (err == nil) || !tt.ok && !errors.Is(err, ErrGenerationMismatch) {
			t.Errorf("%s: %v, want ok %v", tt.name, err, tt.ok)
		}
	}
	if got := readOrNone(t, dir, "b"); got != "a" {
		t.Errorf("b holds %q, want a's bytes", got)
	}
	// A free name meets "no file may exist".
	if _, err := s.RenameIf(ctx, "b", "c", false, false, Precondition{}, Precondition{IfMatch: new(int64(0))}); err != nil {
		t.Errorf("onto a free name with IfMatch 0: %v", err)
	}
}

// TestConditionalIncrements: writers increment a counter in a file, each
// reading the generation, then the counter, then writing the counter plus
// one on the condition that the generation is the one it read, through
// Write and through a Handle, until each has made its increments, while
// other writers write elsewhere in the file (through its mapping where
// they can) and append to it without condition, a fixed number of times.
// Every increment that succeeded is in the counter, and no other: the
// count equals the successes, and every failure is a mismatch.
func TestConditionalIncrements(t *testing.T) {
	const incrementers, each, noise, noiseWrites = 8, 25, 2, 300
	for _, p := range []Policy{PolicyUnlockedBelowEOF, PolicySharedWritten, PolicyExclusive} {
		t.Run(p.String(), func(t *testing.T) {
			ctx := context.Background()
			var c mappedCounter
			s, _ := newTestStore(t, Options{Policy: p, Hooks: c.hooks(true)})
			if _, err := s.Write(ctx, "counter", 0, make([]byte, 64<<10), SyncNone); err != nil {
				t.Fatal(err)
			}
			var successes, mismatches atomic.Int64
			var wg sync.WaitGroup
			for n := range noise {
				wg.Go(func() {
					h, err := s.OpenHandle(ctx, "counter", OpenMustExist)
					if err != nil {
						t.Error(err)
						return
					}
					defer h.Close()
					for i := range noiseWrites {
						off := int64(4096 + (i*noise+n)%8*4096)
						if _, err := h.Write(ctx, off, []byte{byte(i)}, SyncNone); err != nil {
							t.Error(err)
							return
						}
						if i%8 == 0 {
							if _, err := s.Append(ctx, "counter", []byte{1}, SyncNone, AppendOptions{}); err != nil {
								t.Error(err)
								return
							}
						}
					}
				})
			}
			var inc sync.WaitGroup
			for w := range incrementers {
				inc.Go(func() {
					h, err := s.OpenHandle(ctx, "counter", OpenMustExist)
					if err != nil {
						t.Error(err)
						return
					}
					defer h.Close()
					for made := 0; made < each; {
						gen := genOf(t, s, "counter") // before the bytes it vouches for
						b, err := s.Read(ctx, "counter", 0, 8)
						if err != nil {
							t.Error(err)
							return
						}
						next := binary.LittleEndian.AppendUint64(nil, binary.LittleEndian.Uint64(b)+1)
						pre := Precondition{IfMatch: new(gen)}
						if w%2 == 0 {
							_, err = s.WriteIf(ctx, "counter", OpenMustExist, 0, next, SyncNone, pre)
						} else {
							_, err = h.WriteIf(ctx, 0, next, SyncNone, pre)
						}
						switch {
						case err == nil:
							successes.Add(1)
							made++
						case errors.Is(err, ErrGenerationMismatch):
							mismatches.Add(1)
						default:
							t.Error(err)
							return
						}
					}
				})
			}
			inc.Wait()
			wg.Wait()
			b, err := s.Read(ctx, "counter", 0, 8)
			if err != nil {
				t.Fatal(err)
			}
			if got := int64(binary.LittleEndian.Uint64(b)); got != successes.Load() {
				t.Errorf("counter %d, %d conditional increments succeeded (%d mismatched)", got, successes.Load(), mismatches.Load())
			}
			t.Logf("%d increments, %d mismatched", successes.Load(), mismatches.Load())
		})
	}
}

// TestGenerationRebase: a file whose generation reaches the middle of its
// span moves to a fresh span, and its generations never repeat across it.
func TestGenerationRebase(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t, Options{})
	if _, err := s.Write(ctx, "f", 0, make([]byte, 4096), SyncNone); err != nil {
		t.Fatal(err)
	}
	ino := lookupInode(t, s, "f")
	start := ino.gen.Load()&^genCountMask | (genRebaseAt - 3)
	ino.gen.Store(start)
	seen := map[int64]bool{start: true}
	for i := range 6 {
		r, err := s.Write(ctx, "f", 0, []byte{byte(i)}, SyncNone)
		if err != nil {
			t.Fatal(err)
		}
		if seen[r.Generation] {
			t.Fatalf("write %d: generation %d again", i, r.Generation)
		}
		seen[r.Generation] = true
	}
	if got := ino.gen.Load(); got>>genCountBits == start>>genCountBits {
		t.Errorf("generation %x: still in the span of %x past its middle", got, start)
	}
}

// TestGenerationAcrossRestarts: a store closed in order keeps the
// generation of a file nothing changed, for the store opened next and
// across a close for room; a change made through the store, or from
// outside while it was closed, gives a generation never seen before; and
// after a crash (a store never closed) every file has a generation never
// seen before. TestGenerationAfterPowerCut has store/crashfs's crashes.
func TestGenerationAcrossRestarts(t *testing.T) {
	ctx := context.Background()
	// settle waits until changes made now have a ctime the store trusts
	// (see extentCache).
	settle := func() { time.Sleep(time.Duration(3*max(coarseTick(), 10e6)) * time.Nanosecond) }
	t.Run("closed in order", func(t *testing.T) {
		dir := testutil.Dir(t)
		seen := map[int64]bool{}
		open := func() *Store { return openStore(t, dir, Options{MaxOpenFiles: 1}) }
		a := open()
		r, err := a.Write(ctx, "f", 0, []byte("first"), SyncNone)
		if err != nil {
			t.Fatal(err)
		}
		seen[r.Generation] = true
		settle()
		// Closed for room (MaxOpenFiles 1) and opened again: kept.
		if _, err := a.Write(ctx, "other", 0, []byte("o"), SyncNone); err != nil {
			t.Fatal(err)
		}
		if g := genOf(t, a, "f"); g != r.Generation {
			t.Errorf("after a close for room: generation %d, want %d", g, r.Generation)
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		b := open()
		if g := genOf(t, b, "f"); g != r.Generation {
			t.Errorf("after a Close and Open: generation %d, want %d kept", g, r.Generation)
		}
		r, err = b.Write(ctx, "f", 0, []byte("second"), SyncNone)
		if err != nil {
			t.Fatal(err)
		}
		if seen[r.Generation] {
			t.Errorf("a write after the restart: generation %d, seen before", r.Generation)
		}
		seen[r.Generation] = true
		settle()
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		// Changed from outside, same size, while no store held it.
		if err := os.WriteFile(filepath.Join(dir, "f"), []byte("SECOND"), 0o644); err != nil {
			t.Fatal(err)
		}
		c := open()
		defer c.Close()
		if g := genOf(t, c, "f"); seen[g] {
			t.Errorf("changed from outside while closed: generation %d, seen before", g)
		}
	})
	t.Run("never closed", func(t *testing.T) {
		dir := testutil.Dir(t)
		seen := map[int64]bool{}
		for round := range 3 {
			s := openStore(t, dir, Options{})
			if round > 0 {
				if g := genOf(t, s, "f"); seen[g] {
					t.Errorf("round %d, after a crash: generation %d, seen before", round, g)
				}
			}
			for i := range 3 {
				r, err := s.Write(ctx, "f", 0, []byte{byte(round), byte(i)}, SyncNone)
				if err != nil {
					t.Fatal(err)
				}
				if seen[r.Generation] {
					t.Errorf("round %d: generation %d, seen before", round, r.Generation)
				}
				seen[r.Generation] = true
			}
			// Left open, as a killed process leaves it (closed when the
			// test ends).
			t.Cleanup(func() { s.Close() })
		}
	})
}

// TestNegativeGenerationRefused: a precondition naming a negative
// generation is refused before anything happens, by every mutation.
func TestNegativeGenerationRefused(t *testing.T) {
	ctx := context.Background()
	s, dir := newTestStore(t, Options{})
	bad := Precondition{IfNotMatch: new(int64(-1))}
	for name, do := range map[string]func() error{
		"WriteIf": func() error {
			_, err := s.WriteIf(ctx, "f", OpenCreate, 0, []byte("x"), SyncNone, bad)
			return err
		},
		"Append": func() error {
			_, err := s.Append(ctx, "f", []byte("x"), SyncNone, AppendOptions{If: bad})
			return err
		},
		"TruncateIf": func() error {
			_, err := s.TruncateIf(ctx, "f", 1, bad)
			return err
		},
		"FallocateIf": func() error {
			_, err := s.FallocateIf(ctx, "f", FallocAllocate, 0, 1, bad)
			return err
		},
		"DeleteIf": func() error { return s.DeleteIf(ctx, "f", false, bad) },
		"RenameIf": func() error {
			_, err := s.RenameIf(ctx, "f", "g", false, false, Precondition{}, bad)
			return err
		},
	} {
		var r *Refusal
		if err := do(); !errors.As(err, &r) || !errors.Is(err, ErrInvalidOffset) || r.Arg != "if_generation_not_match" {
			t.Errorf("%s: %v, want ErrInvalidOffset refusing if_generation_not_match", name, err)
		}
	}
	if got := readOrNone(t, dir, "f"); got != "(none)" {
		t.Errorf("f after the refusals: %q, want none", got)
	}
}
