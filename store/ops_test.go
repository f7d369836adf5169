//go:build linux

package store

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

// fileModel is what a file should hold: its bytes (len is the size).
type fileModel struct{ data []byte }

func (m *fileModel) write(off int64, p []byte) {
	if end := off + int64(len(p)); end > int64(len(m.data)) {
		m.data = append(m.data, make([]byte, end-int64(len(m.data)))...)
	}
	copy(m.data[off:], p)
}

func (m *fileModel) truncate(size int64) {
	if size <= int64(len(m.data)) {
		m.data = m.data[:size]
		return
	}
	m.data = append(m.data, make([]byte, size-int64(len(m.data)))...)
}

// zero clears [off, end) within the size; fallocate allocate may grow it.
func (m *fileModel) fallocate(mode FallocateMode, off, length int64) {
	end := off + length
	switch mode {
	case FallocAllocate:
		if end > int64(len(m.data)) {
			m.truncate(end)
		}
	case FallocPunchHole, FallocZeroRange:
		for i := off; i < end && i < int64(len(m.data)); i++ {
			m.data[i] = 0
		}
	}
}

// checkFile compares the store's view of path with the real file: content
// and size with the model, and the extent map with FIEMAP.
func checkFile(t *testing.T, s *Store, dir, path string, m *fileModel, step string) {
	t.Helper()
	ctx := context.Background()
	got, err := os.ReadFile(filepath.Join(dir, path))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, m.data) {
		t.Fatalf("%s: file content differs from the model (len %d, want %d)", step, len(got), len(m.data))
	}
	st, err := s.Stat(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size != int64(len(m.data)) {
		t.Fatalf("%s: Stat size = %d, want %d", step, st.Size, len(m.data))
	}
	ino, err := s.table.get(ctx, path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.table.put(ino)
	f, err := os.Open(filepath.Join(dir, path))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	real, err := readFiemap(f.Fd(), ino.blockSize)
	if err != nil {
		t.Skipf("FIEMAP unsupported here: %v", err)
	}
	ino.extentMu.Lock()
	defer ino.extentMu.Unlock()
	if !ino.extents.equal(real) {
		t.Fatalf("%s: extent map\n got %v\nwant %v (FIEMAP)", step, ino.extents, real)
	}
}

type fileOp struct {
	// kind is write, truncate or fallocate through the store; close,
	// which closes the file as the table does for room (the next step
	// reopens it); or outside-write, outside-punch, outside-keep-size or
	// outside-truncate, which close it and then change it from outside
	// the store.
	kind   string
	mode   FallocateMode
	off    int64
	length int64
}

func (o fileOp) String() string {
	switch o.kind {
	case "fallocate":
		return fmt.Sprintf("%s(%d,%d)", o.mode, o.off, o.length)
	case "close":
		return "close"
	}
	return fmt.Sprintf("%s(%d,%d)", o.kind, o.off, o.length)
}

func applyOp(t *testing.T, s *Store, m *fileModel, dir, path string, o fileOp, fill byte) {
	t.Helper()
	ctx := context.Background()
	if strings.HasPrefix(o.kind, "outside-") || o.kind == "close" {
		// Settled, so that the close keeps the map: the next step's
		// reopen then takes it from the extent cache unless the change
		// from outside shows.
		waitSettled(t, s, filepath.Join(dir, path))
		if !closeIfIdle(s, path) {
			t.Fatalf("%v: %s is busy; nothing else runs", o, path)
		}
	}
	if strings.HasPrefix(o.kind, "outside-") {
		f, err := os.OpenFile(filepath.Join(dir, path), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fo := fileOps{t, f}
		switch o.kind {
		case "outside-write":
			p := bytes.Repeat([]byte{fill}, int(o.length))
			if _, err := f.WriteAt(p, o.off); err != nil {
				t.Fatalf("%v: %v", o, err)
			}
			m.write(o.off, p)
		case "outside-punch":
			fo.fallocate(punchHole, o.off, o.length)
			m.fallocate(FallocPunchHole, o.off, o.length)
		case "outside-keep-size":
			fo.fallocate(keepSize, o.off, o.length)
		case "outside-truncate":
			fo.truncate(o.off)
			m.truncate(o.off)
		}
		return
	}
	switch o.kind {
	case "write":
		p := bytes.Repeat([]byte{fill}, int(o.length))
		r, err := s.Write(ctx, path, o.off, p, SyncNone)
		if err != nil {
			t.Fatalf("%v: %v", o, err)
		}
		m.write(o.off, p)
		if r.Size != int64(len(m.data)) || r.BytesWritten != len(p) {
			t.Fatalf("%v = %+v, want size %d", o, r, len(m.data))
		}
	case "truncate":
		if err := s.Truncate(ctx, path, o.off); err != nil {
			t.Fatalf("%v: %v", o, err)
		}
		m.truncate(o.off)
	case "fallocate":
		size, err := s.Fallocate(ctx, path, o.mode, o.off, o.length)
		if err != nil {
			t.Fatalf("%v: %v", o, err)
		}
		m.fallocate(o.mode, o.off, o.length)
		if size != int64(len(m.data)) {
			t.Fatalf("%v returned size %d, want %d", o, size, len(m.data))
		}
	}
}

const kb = 1024

// TestOperationsAgainstFIEMAP runs fixed and random sequences of writes,
// fallocates, punches, zero-ranges and truncates on real files and checks
// content, size and the extent map against FIEMAP after every step. Some
// steps close the file as the table does for room, and some then change
// it from outside the store: the check after them reopens it, from the
// extent cache where the file is unchanged.
func TestOperationsAgainstFIEMAP(t *testing.T) {
	w := func(off, n int64) fileOp { return fileOp{kind: "write", off: off, length: n} }
	tr := func(size int64) fileOp { return fileOp{kind: "truncate", off: size} }
	fa := func(m FallocateMode, off, n int64) fileOp {
		return fileOp{kind: "fallocate", mode: m, off: off, length: n}
	}
	cl := fileOp{kind: "close"}
	out := func(kind string, off, n int64) fileOp { return fileOp{kind: "outside-" + kind, off: off, length: n} }
	sequences := map[string][]fileOp{
		"sparse writes":           {w(0, 100), w(40*kb, 4*kb), w(13*kb, 5000), w(100*kb, 1)},
		"prealloc then overwrite": {fa(FallocAllocate, 0, 64*kb), w(4*kb, 4*kb), w(10*kb+7, 3), w(60*kb, 8*kb)},
		"keep-size past EOF":      {w(0, 8*kb), fa(FallocKeepSize, 8*kb, 32*kb), w(12*kb, 4*kb), tr(8 * kb)},
		"punch and zero": {w(0, 64*kb), fa(FallocPunchHole, 4*kb, 8*kb), fa(FallocPunchHole, 20*kb+1, 5000),
			fa(FallocZeroRange, 32*kb, 8*kb), fa(FallocZeroRange, 45*kb+100, 6*kb)},
		"zero over holes": {tr(64 * kb), fa(FallocZeroRange, 5*kb, 10*kb), w(0, 1), fa(FallocZeroRange, 30*kb+10, 100)},
		"truncates":       {w(0, 40*kb), tr(10*kb + 5), tr(10*kb + 5), tr(64 * kb), w(50*kb, 10), tr(0), w(3*kb, 3)},
		"closed and reopened": {w(0, 100), cl, w(40*kb, 4*kb), cl, fa(FallocPunchHole, 0, 4*kb), cl,
			fa(FallocKeepSize, 64*kb, 16*kb), cl, w(42*kb, 10), tr(20*kb + 3), cl, fa(FallocZeroRange, 8*kb, 8*kb), cl},
		"changed outside while closed": {w(0, 64*kb), out("punch", 4*kb, 8*kb), w(6*kb, 100),
			out("keep-size", 64*kb, 32*kb), w(60*kb, 8*kb), out("write", 20*kb, 4*kb), out("truncate", 72*kb, 0),
			fa(FallocKeepSize, 80*kb, 8*kb), out("truncate", 72*kb, 0), cl, w(1, 1)},
	}
	for _, io := range []IOMode{IOBuffered, IODirect} {
		for name, seq := range sequences {
			t.Run(io.String()+"/"+name, func(t *testing.T) {
				s, dir := newTestStore(t, Options{IO: io, Policy: PolicySharedOverwrite})
				m := &fileModel{}
				for i, o := range seq {
					applyOp(t, s, m, dir, "f", o, byte(i+1))
					checkFile(t, s, dir, "f", m, fmt.Sprintf("step %d %v", i, o))
				}
			})
		}
	}
	for _, p := range Policies() {
		t.Run("random/"+p.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(p), 7))
			s, dir := newTestStore(t, Options{Policy: p})
			m := &fileModel{}
			modes := []FallocateMode{FallocAllocate, FallocKeepSize, FallocPunchHole, FallocZeroRange}
			for i := range 60 {
				off := rng.Int64N(96 * kb)
				if rng.IntN(2) == 0 {
					off &^= 4*kb - 1
				}
				n := 1 + rng.Int64N(16*kb)
				var o fileOp
				switch r := rng.IntN(20); {
				case r < 9:
					o = w(off, n)
				case r < 11:
					o = tr(off)
				case r < 12 && i > 0: // the file exists from step 0 on
					o = cl
				case r < 13 && i > 0:
					o = out([]string{"write", "punch", "keep-size"}[rng.IntN(3)], off, n)
				default:
					o = fa(modes[rng.IntN(len(modes))], off, n)
				}
				applyOp(t, s, m, dir, "f", o, byte(i+1))
				checkFile(t, s, dir, "f", m, fmt.Sprintf("step %d %v", i, o))
			}
		})
	}
}

// TestReopenRebuildsState: a store opened on an existing root rebuilds size
// and extent map from the files.
func TestReopenRebuildsState(t *testing.T) {
	ctx := context.Background()
	dir := testutil.Dir(t)
	open := func() *Store {
		fsys, err := OpenOSFS(dir)
		if err != nil {
			t.Fatal(err)
		}
		s, err := Open(fsys, Options{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := open()
	if _, err := s.Fallocate(ctx, "d/f", FallocAllocate, 0, 64*kb); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write(ctx, "d/f", 8*kb, make([]byte, 4*kb), SyncNone); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Fallocate(ctx, "d/f", FallocPunchHole, 32*kb, 8*kb); err != nil {
		t.Fatal(err)
	}
	want, err := s.Extents(ctx, "d/f", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open()
	defer s.Close()
	got, err := s.Extents(ctx, "d/f", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("extents after reopen\n got %v\nwant %v", got, want)
	}
	st, err := s.Stat(ctx, "d/f")
	if err != nil || st.Size != 64*kb {
		t.Errorf("Stat after reopen = %+v, %v; want size %d", st, err, 64*kb)
	}
}

// TestNewFileSyncsItsDirectories: the first sync of a file the store
// created also syncs every directory above it, once; a file that existed
// before costs no directory sync.
func TestNewFileSyncsItsDirectories(t *testing.T) {
	ctx := context.Background()
	rec := &syncRecorder{}
	s, dir := newRecordedStore(t, rec, Options{})
	if err := os.WriteFile(filepath.Join(dir, "old"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name     string
		do       func() error
		wantDirs []string
	}{
		{"unsynced create", func() error { _, err := s.Write(ctx, "a/b/c", 0, []byte("1"), SyncNone); return err }, nil},
		{"first sync", func() error { return s.Fsync(ctx, "a/b/c", SyncData) }, []string{"a/b", "a", "."}},
		{"synced write", func() error { _, err := s.Write(ctx, "a/b/c", 1, []byte("2"), SyncData); return err }, nil},
		{"existing file", func() error { _, err := s.Write(ctx, "old", 0, []byte("y"), SyncFull); return err }, nil},
		{"synced create", func() error { _, err := s.Write(ctx, "d", 0, []byte("z"), SyncData); return err }, []string{"."}},
	}
	for _, st := range steps {
		before := len(rec.syncedDirs())
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		// In any order: a file's directories are synced at once.
		got := slices.Sorted(slices.Values(rec.syncedDirs()[before:]))
		if fmt.Sprint(got) != fmt.Sprint(slices.Sorted(slices.Values(st.wantDirs))) && !(len(got) == 0 && len(st.wantDirs) == 0) {
			t.Errorf("%s: synced directories %v, want %v", st.name, got, st.wantDirs)
		}
	}
}

// TestUnsyncedDirectoriesSurviveClose: a file the store created and then
// closed for lack of descriptors before its first sync still has its
// directories synced, by the next Fsync of it (after it is reopened), by
// SyncAll or by Close; once every name is durable, none is synced again.
func TestUnsyncedDirectoriesSurviveClose(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		// sync is the sync after a/b/c was closed for room; it must sync
		// a/b/c's directories.
		sync func(s *Store) error
	}{
		{"Fsync after reopen", func(s *Store) error { return s.Fsync(ctx, "a/b/c", SyncData) }},
		{"SyncAll", func(s *Store) error { return s.syncAll(ctx) }},
		{"Close", func(s *Store) error { return s.Close() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &syncRecorder{}
			s, _ := newRecordedStore(t, rec, Options{MaxOpenFiles: 1})
			for _, name := range []string{"a/b/c", "other"} {
				if _, err := s.Write(ctx, name, 0, []byte(name), SyncNone); err != nil {
					t.Fatal(err)
				}
			}
			if got, want := isOpen(s, "a/b/c"), false; got != want {
				t.Fatalf("a/b/c open = %v, want %v (closed for room)", got, want)
			}
			if err := tt.sync(s); err != nil {
				t.Fatal(err)
			}
			synced := make(map[string]bool)
			for _, dir := range rec.syncedDirs() {
				synced[dir] = true
			}
			for _, dir := range []string{"a/b", "a", "."} {
				if !synced[dir] {
					t.Errorf("directory %q not synced; synced %v", dir, rec.syncedDirs())
				}
			}
			if tt.name == "Close" {
				return
			}
			// Once every name is durable, syncing again syncs no directory.
			if err := s.syncAll(ctx); err != nil {
				t.Fatal(err)
			}
			before := len(rec.syncedDirs())
			if err := s.syncAll(ctx); err != nil {
				t.Fatal(err)
			}
			if got := rec.syncedDirs()[before:]; len(got) != 0 {
				t.Errorf("SyncAll once every name is durable synced directories %v, want none", got)
			}
		})
	}
}
