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
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"golang.org/x/sys/unix"
)

func ptr[T any](v T) *T { return &v }

// TestAppendRules holds Append to its rules one case at a time, under
// every policy: where it lands, what it refuses, what it remembers.
func TestAppendRules(t *testing.T) {
	type step struct {
		data     string
		sync     SyncMode
		opts     AppendOptions
		wantOff  int64
		wantSize int64
		wantErr  error
		replayed bool
	}
	cases := []struct {
		name  string
		steps []step
		want  string // the file's bytes after the steps
	}{
		{"creates and appends", []step{
			{data: "abc", wantOff: 0, wantSize: 3},
			{data: "de", wantOff: 3, wantSize: 5},
		}, "abcde"},
		{"zero-length returns the end and reserves nothing", []step{
			{data: "abc", wantOff: 0, wantSize: 3},
			{data: "", sync: SyncData, wantOff: 3, wantSize: 3},
			{data: "d", wantOff: 3, wantSize: 4},
		}, "abcd"},
		{"conditional append", []step{
			{data: "abc", opts: AppendOptions{ExpectedOffset: ptr[int64](0)}, wantOff: 0, wantSize: 3},
			{data: "x", opts: AppendOptions{ExpectedOffset: ptr[int64](0)}, wantErr: ErrAppendOffsetMismatch},
			{data: "d", opts: AppendOptions{ExpectedOffset: ptr[int64](3)}, wantOff: 3, wantSize: 4},
		}, "abcd"},
		{"a resend with a remembered id writes nothing", []step{
			{data: "abc", opts: AppendOptions{ID: "1"}, wantOff: 0, wantSize: 3},
			{data: "de", opts: AppendOptions{ID: "2"}, wantOff: 3, wantSize: 5},
			{data: "abc", sync: SyncFull, opts: AppendOptions{ID: "1"}, wantOff: 0, wantSize: 3, replayed: true},
		}, "abcde"},
		{"an id reused with other data", []step{
			{data: "abc", opts: AppendOptions{ID: "1"}, wantOff: 0, wantSize: 3},
			{data: "abd", opts: AppendOptions{ID: "1"}, wantErr: ErrAppendIDReused},
		}, "abc"},
		{"past the maximum file size, refused before reserving", []step{
			{data: "0123456789", wantOff: 0, wantSize: 10},
			{data: "0123456789", wantErr: ErrFileTooLarge},
			{data: "01234", wantOff: 10, wantSize: 15},
		}, "0123456789" + "01234"},
		{"bad sync mode", []step{
			{data: "a", sync: SyncMode(99), wantErr: ErrInvalidMode},
		}, "(none)"},
		{"a conditional append to a missing file creates nothing", []step{
			{data: "a", opts: AppendOptions{ExpectedOffset: ptr[int64](3)}, wantErr: ErrAppendOffsetMismatch},
			{data: "0123456789abcdefg", wantErr: ErrFileTooLarge},
		}, "(none)"},
		{"negative expected offset", []step{
			{data: "a", opts: AppendOptions{ExpectedOffset: ptr[int64](-1)}, wantErr: ErrInvalidOffset},
		}, "(none)"},
	}
	for _, p := range Policies() {
		for _, c := range cases {
			t.Run(p.String()+"/"+c.name, func(t *testing.T) {
				s, dir := newTestStore(t, Options{Policy: p, MaxFileSize: 16})
				ctx := context.Background()
				for i, st := range c.steps {
					got, err := s.Append(ctx, "f", []byte(st.data), st.sync, st.opts)
					if !errors.Is(err, st.wantErr) {
						t.Fatalf("step %d: got error %v, want %v", i, err, st.wantErr)
					}
					if err != nil {
						continue
					}
					if got.Generation == 0 {
						t.Errorf("step %d: no generation", i)
					}
					got.Generation = 0 // generation_test.go's
					if want := (AppendResult{Offset: st.wantOff, Size: st.wantSize, Replayed: st.replayed}); got != want {
						t.Errorf("step %d: got %+v, want %+v", i, got, want)
					}
				}
				b, err := os.ReadFile(filepath.Join(dir, "f"))
				if errors.Is(err, os.ErrNotExist) {
					b = []byte("(none)")
				} else if err != nil {
					t.Fatal(err)
				}
				if got := string(b); got != c.want {
					t.Errorf("file: got %q, want %q", got, c.want)
				}
			})
		}
	}
}

// TestAppendMismatchSaysTheEnd checks that a conditional append's refusal
// names where the file ends.
func TestAppendMismatchSaysTheEnd(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	ctx := context.Background()
	if _, err := s.Append(ctx, "f", []byte("abc"), SyncNone, AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := s.Append(ctx, "f", []byte("x"), SyncNone, AppendOptions{ExpectedOffset: ptr[int64](1)})
	var m *AppendMismatch
	if !errors.As(err, &m) {
		t.Fatalf("got %v, want an *AppendMismatch", err)
	}
	if got, want := *m, (AppendMismatch{Expected: 1, End: 3}); got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

// TestAppendRefusesWhatWriteRefuses: a directory is not appended to.
func TestAppendRefusesWhatWriteRefuses(t *testing.T) {
	s, dir := newTestStore(t, Options{})
	if err := os.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..", filepath.Join(dir, "up")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want error
	}{{"d", ErrIsDirectory}, {"fifo", ErrNotRegular}, {"up/x", ErrPathEscapes}, {"../x", ErrInvalidPath}, {"/x", ErrInvalidPath}} {
		if _, err := s.Append(context.Background(), c.path, []byte("a"), SyncNone, AppendOptions{}); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.path, err, c.want)
		}
	}
}

// TestAppendIDWindowBounds checks that the window forgets the oldest ids
// past its count and its age.
func TestAppendIDWindowBounds(t *testing.T) {
	w := appendIDWindow{max: 2, ttl: time.Hour}
	ctx := context.Background()
	for _, id := range []string{"a", "b", "c"} {
		rec, role, err := w.claim(ctx, "f", id, []byte(id))
		if err != nil || role != claimOwner {
			t.Fatalf("claim %s: role %v, err %v, want claimOwner", id, role, err)
		}
		w.settle(rec, AppendResult{}, nil)
	}
	if _, role, _ := w.claim(ctx, "f", "a", []byte("a")); role != claimOwner {
		t.Errorf("a: got remembered, want forgotten (count bound 2)")
	}
	w.mu.Lock()
	for _, rec := range w.order {
		rec.at = rec.at.Add(-2 * time.Hour)
	}
	w.mu.Unlock()
	if _, role, _ := w.claim(ctx, "f", "c", []byte("c")); role != claimOwner {
		t.Errorf("c: got remembered, want forgotten (time bound)")
	}
}

// TestConcurrentAppendsTile appends from many goroutines under every
// policy and checks that the ranges they got tile the file and hold their
// bytes, and that the concurrent resends of one id land once.
func TestConcurrentAppendsTile(t *testing.T) {
	const writers, each = 16, 40
	for _, p := range Policies() {
		t.Run(p.String(), func(t *testing.T) {
			s, dir := newTestStore(t, Options{Policy: p})
			ctx := context.Background()
			if _, err := s.Append(ctx, "f", []byte("head"), SyncNone, AppendOptions{}); err != nil {
				t.Fatal(err)
			}
			type landed struct {
				off  int64
				data []byte
			}
			var mu sync.Mutex
			var all []landed
			var wg sync.WaitGroup
			for w := range writers {
				wg.Go(func() {
					for i := range each {
						data := bytes.Repeat([]byte{byte('A' + w)}, 1+(w*7+i*13)%300)
						sync := SyncNone
						if i%10 == 0 {
							sync = SyncData
						}
						// Two goroutines' appends share an id: one lands.
						id := fmt.Sprintf("%d-%d", w/2, i)
						data[0] = byte(i)
						if w%2 == 1 {
							data = bytes.Repeat([]byte{byte('A' + w - 1)}, 1+((w-1)*7+i*13)%300)
							data[0] = byte(i)
						}
						res, err := s.Append(ctx, "f", data, sync, AppendOptions{ID: id})
						if err != nil {
							t.Error(err)
							return
						}
						if res.Size < res.Offset+int64(len(data)) {
							t.Errorf("size %d below the append's end %d", res.Size, res.Offset+int64(len(data)))
						}
						if !res.Replayed {
							mu.Lock()
							all = append(all, landed{res.Offset, data})
							mu.Unlock()
						}
					}
				})
			}
			wg.Wait()
			slices.SortFunc(all, func(a, b landed) int { return int(a.off - b.off) })
			b, err := os.ReadFile(filepath.Join(dir, "f"))
			if err != nil {
				t.Fatal(err)
			}
			if got, want := len(all), writers/2*each; got != want {
				t.Errorf("appends landed: got %d, want %d (one per id)", got, want)
			}
			end := int64(4)
			for _, l := range all {
				if l.off != end {
					t.Fatalf("append at %d, want %d: the ranges do not tile the file", l.off, end)
				}
				end += int64(len(l.data))
				if !bytes.Equal(b[l.off:end], l.data) {
					t.Fatalf("bytes at %d are not the append's", l.off)
				}
			}
			if got := int64(len(b)); got != end {
				t.Errorf("file size: got %d, want %d", got, end)
			}
		})
	}
}

// The append linearizability test checks Append against a sequential model
// of one file, mixed with positional one-byte writes, truncates, one-byte
// reads and stats. One-byte writes and reads cannot tear, so the model can
// hold every byte: the file's content as a string.
type appendLinOp struct {
	kind int // appendLinAppend...
	n    int64
	off  int64
	val  byte
}

const (
	appendLinAppend = iota
	appendLinWrite
	appendLinTruncate
	appendLinRead
	appendLinStat
)

type appendLinOut struct {
	off  int64  // append: where it landed
	size int64  // stat: the size; read: 1 if a byte came back
	val  byte   // read
	err  string // any error: the history fails
}

var appendLinModel = porcupine.Model{
	Init: func() any { return "" },
	Step: func(state, input, output any) (bool, any) {
		f := state.(string)
		in, out := input.(appendLinOp), output.(appendLinOut)
		if out.err != "" {
			return false, f
		}
		switch in.kind {
		case appendLinAppend:
			if out.off != int64(len(f)) {
				return false, f
			}
			return true, f + string(bytes.Repeat([]byte{in.val}, int(in.n)))
		case appendLinWrite:
			b := []byte(f)
			if in.off >= int64(len(b)) {
				b = append(b, make([]byte, in.off+1-int64(len(b)))...)
			}
			b[in.off] = in.val
			return true, string(b)
		case appendLinTruncate:
			b := []byte(f)
			if in.n <= int64(len(b)) {
				return true, string(b[:in.n])
			}
			return true, string(append(b, make([]byte, in.n-int64(len(b)))...))
		case appendLinRead:
			if in.off >= int64(len(f)) {
				return out.size == 0, f
			}
			return out.size == 1 && out.val == f[in.off], f
		case appendLinStat:
			return out.size == int64(len(f)), f
		}
		return false, f
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(appendLinOp), output.(appendLinOut)
		switch in.kind {
		case appendLinAppend:
			return fmt.Sprintf("append(%d×%d) → %d %s", in.n, in.val, out.off, out.err)
		case appendLinWrite:
			return fmt.Sprintf("write(%d, %d) %s", in.off, in.val, out.err)
		case appendLinTruncate:
			return fmt.Sprintf("truncate(%d) %s", in.n, out.err)
		case appendLinRead:
			return fmt.Sprintf("read(%d) → %d×%d %s", in.off, out.size, out.val, out.err)
		}
		return fmt.Sprintf("stat → %d %s", out.size, out.err)
	},
}

// TestAppendLinearizability runs histories of appends, positional writes,
// truncates, reads and stats of one file from many goroutines, under every
// policy and both I/O modes, and checks each against appendLinModel: appends never overlap,
// land at the end, and no reader sees a range before its append completed.
func TestAppendLinearizability(t *testing.T) {
	const histories, clients, opsPerClient = 6, 6, 30
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	for _, io := range []IOMode{IOBuffered, IODirect} {
		for _, p := range Policies() {
			t.Run(io.String()+"/"+p.String(), func(t *testing.T) {
				s, _ := newJitterStore(t, Options{Policy: p, IO: io})
				if err := s.Truncate(context.Background(), "o-direct-probe", 0); io == IODirect && errors.Is(err, ErrUnsupported) {
					t.Skipf("O_DIRECT is not supported here: %v", err)
				}
				for h := range histories {
					path := fmt.Sprintf("h%d", h)
					ops := runAppendLinHistory(t, s, path, seed+uint64(h), clients, opsPerClient)
					res, info := porcupine.CheckOperationsVerbose(appendLinModel, ops, time.Minute)
					switch res {
					case porcupine.Ok:
						// The extent map the appends marked is the file's.
						extentsMatchFile(t, s, path)
					case porcupine.Illegal:
						t.Errorf("history %d (%d operations) is not linearizable; visualization: %s", h, len(ops), writeAppendVisualization(t, info, path))
					default:
						t.Errorf("history %d: the checker gave up (%v)", h, res)
					}
				}
			})
		}
	}
}

func writeAppendVisualization(t *testing.T, info porcupine.LinearizationInfo, name string) string {
	out := filepath.Join(t.TempDir(), name+".html")
	if err := porcupine.VisualizePath(appendLinModel, info, out); err != nil {
		return err.Error()
	}
	return out
}

func runAppendLinHistory(t *testing.T, s *Store, path string, seed uint64, clients, opsPerClient int) []porcupine.Operation {
	ctx := context.Background()
	// The file exists empty before the history: the model starts there.
	if err := s.Truncate(ctx, path, 0); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var mu sync.Mutex
	var ops []porcupine.Operation
	var wg sync.WaitGroup
	for c := range clients {
		r := rand.New(rand.NewPCG(seed, uint64(c)))
		wg.Go(func() {
			for range opsPerClient {
				var in appendLinOp
				switch k := r.IntN(20); {
				case k < 9:
					in = appendLinOp{kind: appendLinAppend, n: 1 + r.Int64N(8), val: byte(1 + r.IntN(255))}
				case k < 12:
					in = appendLinOp{kind: appendLinWrite, off: r.Int64N(24), val: byte(1 + r.IntN(255))}
				case k < 13:
					in = appendLinOp{kind: appendLinTruncate, n: r.Int64N(16)}
				case k < 17:
					in = appendLinOp{kind: appendLinRead, off: r.Int64N(48)}
				default:
					in = appendLinOp{kind: appendLinStat}
				}
				var out appendLinOut
				call := time.Since(start).Nanoseconds()
				var err error
				switch in.kind {
				case appendLinAppend:
					var res AppendResult
					res, err = s.Append(ctx, path, bytes.Repeat([]byte{in.val}, int(in.n)), SyncNone, AppendOptions{})
					out.off = res.Offset
				case appendLinWrite:
					_, err = s.Write(ctx, path, in.off, []byte{in.val}, SyncNone)
				case appendLinTruncate:
					err = s.Truncate(ctx, path, in.n)
				case appendLinRead:
					var b []byte
					b, err = s.Read(ctx, path, in.off, 1)
					out.size = int64(len(b))
					if len(b) == 1 {
						out.val = b[0]
					}
				case appendLinStat:
					var st FileStat
					st, err = s.Stat(ctx, path)
					out.size = st.Size
				}
				ret := time.Since(start).Nanoseconds()
				if err != nil {
					out.err = err.Error()
					t.Errorf("%+v: %v", in, err)
				}
				mu.Lock()
				ops = append(ops, porcupine.Operation{ClientId: c, Input: in, Output: out, Call: call, Return: ret})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return ops
}

// TestHandleAppend appends through a Handle under every policy: offsets
// follow one another, an id is remembered by the Handle's path, and once
// the file is deleted an append fails with ErrDeleted.
func TestHandleAppend(t *testing.T) {
	for _, p := range Policies() {
		t.Run(p.String(), func(t *testing.T) {
			s, _ := newTestStore(t, Options{Policy: p})
			ctx := context.Background()
			h, err := s.OpenHandle(ctx, "log", OpenCreate)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			for i, want := range []int64{0, 3, 6} {
				res, err := h.Append(ctx, []byte("abc"), SyncData, AppendOptions{})
				if err != nil || res.Offset != want {
					t.Errorf("append %d: got %+v, %v, want offset %d", i, res, err, want)
				}
			}
			if _, err := h.Append(ctx, []byte("xy"), SyncNone, AppendOptions{ID: "i"}); err != nil {
				t.Fatal(err)
			}
			if res, err := s.Append(ctx, "log", []byte("xy"), SyncNone, AppendOptions{ID: "i"}); err != nil || !res.Replayed || res.Offset != 9 {
				t.Errorf("resend by path: got %+v, %v, want a replay at 9", res, err)
			}
			if err := s.Delete(ctx, "log", false); err != nil {
				t.Fatal(err)
			}
			if _, err := h.Append(ctx, []byte("z"), SyncNone, AppendOptions{}); !errors.Is(err, ErrDeleted) {
				t.Errorf("append after Delete: got %v, want ErrDeleted", err)
			}
		})
	}
}
