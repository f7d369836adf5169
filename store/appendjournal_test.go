//go:build linux

package store

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// reopenStore opens a second store over dir while the first may still be
// open: what a daemon started again after a SIGKILL finds (the page cache
// kept everything the killed one wrote, nothing was closed or synced).
func reopenStore(t *testing.T, dir string, opts Options) *Store {
	t.Helper()
	fsys, err := OpenOSFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	return openTestStore(t, fsys, opts)
}

func appendID(t *testing.T, s *Store, path, id, data string) AppendResult {
	t.Helper()
	res, err := s.Append(context.Background(), path, []byte(data), SyncNone, AppendOptions{ID: id})
	if err != nil {
		t.Fatalf("append %q (id %q) to %s: %v", data, id, path, err)
	}
	return res
}

// TestAppendJournalReplaysAfterKill: appends with IDs made by one store
// are replayed, at their first offsets and writing nothing, by a store
// opened over the same root after it (a daemon killed and started
// again), under every policy; a resend with other data is refused.
func TestAppendJournalReplaysAfterKill(t *testing.T) {
	for _, p := range Policies() {
		t.Run(p.String(), func(t *testing.T) {
			opts := Options{Policy: p}
			a, dir := newTestStore(t, opts)
			type sent struct{ path, id, data string }
			sends := []sent{{"log", "1", "one\n"}, {"log", "2", "two\n"}, {"d/other", "1", "other one\n"}, {"log", "3", "three\n"}}
			first := make([]AppendResult, len(sends))
			for i, s := range sends {
				first[i] = appendID(t, a, s.path, s.id, s.data)
			}
			b := reopenStore(t, dir, opts)
			for i, s := range sends {
				got := appendID(t, b, s.path, s.id, s.data)
				if got.Offset != first[i].Offset || !got.Replayed {
					t.Errorf("resend of %s id %s: got offset %d, replayed %v, want %d, replayed", s.path, s.id, got.Offset, got.Replayed, first[i].Offset)
				}
			}
			if got, want := string(readFile(t, dir, "log")), "one\ntwo\nthree\n"; got != want {
				t.Errorf("log holds %q, want %q", got, want)
			}
			_, err := b.Append(context.Background(), "log", []byte("not two\n"), SyncNone, AppendOptions{ID: "2"})
			if !errors.Is(err, ErrAppendIDReused) {
				t.Errorf("resend of id 2 with other data: got %v, want ErrAppendIDReused", err)
			}
			if got := appendID(t, b, "log", "4", "four\n"); got.Offset != 14 || got.Replayed {
				t.Errorf("a new id: got offset %d, replayed %v, want 14, not replayed", got.Offset, got.Replayed)
			}
		})
	}
}

// TestAppendJournalRotates: with a window of 4 IDs, the journal keeps two
// generations on disk, which hold at least the last 4 records: those are
// replayed after a restart, and older ones are appended afresh.
func TestAppendJournalRotates(t *testing.T) {
	opts := Options{AppendIDs: 4}
	a, dir := newTestStore(t, opts)
	offs := map[string]int64{}
	for i := 1; i <= 11; i++ {
		id := string(rune('a' + i - 1))
		offs[id] = appendID(t, a, "log", id, id).Offset
	}
	gens, err := os.ReadDir(filepath.Join(dir, StateDir))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range gens {
		if strings.HasPrefix(g.Name(), journalPrefix) {
			names = append(names, g.Name())
		}
	}
	if want := []string{"appends.2", "appends.3"}; strings.Join(names, ",") != strings.Join(want, ",") {
		t.Errorf("generations on disk: got %v, want %v", names, want)
	}
	b := reopenStore(t, dir, opts)
	for _, tc := range []struct {
		id       string
		replayed bool
	}{{"h", true}, {"i", true}, {"j", true}, {"k", true}, {"a", false}, {"e", false}} {
		got := appendID(t, b, "log", tc.id, tc.id)
		if got.Replayed != tc.replayed || (tc.replayed && got.Offset != offs[tc.id]) {
			t.Errorf("resend of %s: got offset %d, replayed %v, want replayed %v (first at %d)", tc.id, got.Offset, got.Replayed, tc.replayed, offs[tc.id])
		}
	}
}

// TestAppendJournalTTLOnLoad: a record older than AppendIDTTL is dropped
// when the store opens; a younger one is replayed.
func TestAppendJournalTTLOnLoad(t *testing.T) {
	for _, tc := range []struct {
		ttl      time.Duration
		replayed bool
	}{{time.Hour, true}, {time.Nanosecond, false}} {
		t.Run(tc.ttl.String(), func(t *testing.T) {
			a, dir := newTestStore(t, Options{})
			appendID(t, a, "log", "x", "x")
			time.Sleep(time.Millisecond) // older than a nanosecond, whatever the clock's grain
			b := reopenStore(t, dir, Options{AppendIDTTL: tc.ttl})
			if got := appendID(t, b, "log", "x", "x"); got.Replayed != tc.replayed {
				t.Errorf("resend: got replayed %v, want %v", got.Replayed, tc.replayed)
			}
		})
	}
}

// writeJournal writes the records recs, then tail, as the first
// generation of the journal under dir.
func writeJournal(t *testing.T, dir string, tail []byte, recs ...journalRecord) {
	t.Helper()
	var b []byte
	for _, r := range recs {
		b = append(b, r.encode()...)
	}
	b = append(b, tail...)
	if err := os.MkdirAll(filepath.Join(dir, StateDir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(journalName(1))), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func journalRec(path, id string, off int64, data string) journalRecord {
	return journalRecord{at: time.Now().UnixNano(), off: off, n: int64(len(data)), crc: crc32.Checksum([]byte(data), castagnoli), path: path, id: id}
}

// TestAppendJournalChecksBytes: a record whose bytes are not in the file
// (its range past the end, or other bytes there: the process was killed
// between the record and the data) is forgotten, and its resend appends
// once; a record whose bytes are there is replayed.
func TestAppendJournalChecksBytes(t *testing.T) {
	a, dir := newTestStore(t, Options{})
	if _, err := a.Write(context.Background(), "log", 0, []byte("0123456789"), SyncNone); err != nil {
		t.Fatal(err)
	}
	writeJournal(t, dir, nil,
		journalRec("log", "past", 10, "hello"),
		journalRec("log", "mismatch", 0, "hello"),
		journalRec("log", "ok", 2, "234"),
		journalRec("gone", "ok", 0, "x"))
	b := reopenStore(t, dir, Options{})
	for _, tc := range []struct {
		path, id, data string
		wantOff        int64
		replayed       bool
	}{
		{"log", "ok", "234", 2, true},
		{"log", "mismatch", "hello", 10, false},
		{"log", "past", "hello", 15, false},
		{"log", "mismatch", "hello", 10, true},
		{"gone", "ok", "x", 0, false},
	} {
		got := appendID(t, b, tc.path, tc.id, tc.data)
		if got.Offset != tc.wantOff || got.Replayed != tc.replayed {
			t.Errorf("%s id %s: got offset %d, replayed %v, want %d, replayed %v", tc.path, tc.id, got.Offset, got.Replayed, tc.wantOff, tc.replayed)
		}
	}
	if got, want := string(readFile(t, dir, "log")), "0123456789hellohello"; got != want {
		t.Errorf("log holds %q, want %q", got, want)
	}
}

// TestAppendJournalToleratesDamage: records around a damaged one (zeros
// where a killed writer's record never came, a flipped byte) and before a
// torn tail (a kill mid-record) are loaded; the damaged ones are not; and
// records written after the damage, by the next store, are found by the
// one after it.
func TestAppendJournalToleratesDamage(t *testing.T) {
	a, dir := newTestStore(t, Options{})
	if _, err := a.Write(context.Background(), "log", 0, []byte("abcdefgh"), SyncNone); err != nil {
		t.Fatal(err)
	}
	flipped := journalRec("log", "flipped", 2, "cd").encode()
	flipped[len(flipped)-9] ^= 1
	torn := journalRec("log", "torn", 6, "gh").encode()
	var b []byte
	b = append(b, journalRec("log", "first", 0, "ab").encode()...)
	b = append(b, make([]byte, 48)...) // a record handed out, never written
	b = append(b, flipped...)
	b = append(b, journalRec("log", "after", 4, "ef").encode()...)
	b = append(b, torn[:len(torn)-10]...) // into the record, past its padding
	writeJournal(t, dir, b)
	s2 := reopenStore(t, dir, Options{})
	for _, tc := range []struct {
		id, data string
		replayed bool
	}{{"first", "ab", true}, {"after", "ef", true}, {"flipped", "cd", false}, {"torn", "gh", false}} {
		if got := appendID(t, s2, "log", tc.id, tc.data); got.Replayed != tc.replayed {
			t.Errorf("%s: got offset %d, replayed %v, want replayed %v", tc.id, got.Offset, got.Replayed, tc.replayed)
		}
	}
	s3 := reopenStore(t, dir, Options{})
	for _, id := range []string{"first", "flipped", "torn"} {
		if got := appendID(t, s3, "log", id, map[string]string{"first": "ab", "flipped": "cd", "torn": "gh"}[id]); !got.Replayed {
			t.Errorf("%s, recorded again by the second store: got offset %d, not replayed, want replayed", id, got.Offset)
		}
	}
}

// TestJournalRecordRoundTrip: records of every kind and size decode to
// what was encoded, each padded to the alignment.
func TestJournalRecordRoundTrip(t *testing.T) {
	for _, r := range []journalRecord{
		journalRec("f", "i", 0, "x"),
		{forget: true, at: 1, path: "d/f", id: "id"},
		journalRec(strings.Repeat("p", MaxPathLen), strings.Repeat("i", MaxAppendIDLen), 1<<40, "data"),
	} {
		b := r.encode()
		if len(b)%journalAlign != 0 {
			t.Errorf("%d-byte path: the record takes %d bytes, not a multiple of %d", len(r.path), len(b), journalAlign)
		}
		got := decodeJournal(b)
		if len(got) != 1 || got[0] != r {
			t.Errorf("%d-byte path: got %+v, want %+v", len(r.path), got, r)
		}
	}
}

// holdFS holds the first WriteAt to the file name once armed: it waits
// for release and then fails with EIO, writing nothing, as a process
// killed between an append's journal record and its data would.
type holdFS struct {
	FS
	name          string
	armed         *atomic.Bool
	held, release chan struct{}
}

func (f holdFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil || name != f.name {
		return file, err
	}
	return holdFile{file, f}, nil
}

type holdFile struct {
	File
	fs holdFS
}

func (f holdFile) WriteAt(p []byte, off int64) (int, error) {
	if !f.fs.armed.CompareAndSwap(true, false) {
		return f.File.WriteAt(p, off)
	}
	close(f.fs.held)
	<-f.fs.release
	return 0, syscall.EIO
}

// TestAppendJournalKillBeforeData: a store is "killed" while an append
// with an ID has its journal record written and not its bytes (its write
// is held); the store opened after it appends the resend once, at the
// end, and a second resend replays that.
func TestAppendJournalKillBeforeData(t *testing.T) {
	for _, p := range Policies() {
		t.Run(p.String(), func(t *testing.T) {
			hold := holdFS{name: "log", armed: new(atomic.Bool), held: make(chan struct{}), release: make(chan struct{})}
			opts := Options{Policy: p}
			a, dir := newWrappedStore(t, func(fsys FS) FS { hold.FS = fsys; return hold }, opts)
			appendID(t, a, "log", "head", "head")
			hold.armed.Store(true)
			killed := make(chan error, 1)
			go func() {
				_, err := a.Append(context.Background(), "log", []byte("lost"), SyncNone, AppendOptions{ID: "x"})
				killed <- err
			}()
			<-hold.held
			b := reopenStore(t, dir, opts)
			first := appendID(t, b, "log", "x", "lost")
			second := appendID(t, b, "log", "x", "lost")
			if first.Replayed || first.Offset != 4 || second.Offset != first.Offset || !second.Replayed {
				t.Errorf("resends after the kill: got %+v then %+v, want one append at 4, then its replay", first, second)
			}
			if got, want := string(readFile(t, dir, "log")), "headlost"; got != want {
				t.Errorf("log holds %q, want %q", got, want)
			}
			// Let the "killed" store finish, which a killed process never
			// does: its failed append gives its range back, over b's bytes.
			close(hold.release)
			if err := <-killed; err == nil {
				t.Errorf("the held append: got nil, want its write's error")
			}
			// To b, that give-back cut the file from outside: it says so,
			// once.
			if _, err := b.Stat(context.Background(), "log"); !errors.Is(err, ErrChangedOutside) {
				t.Errorf("b's Stat after the give-back: %v, want ErrChangedOutside", err)
			}
		})
	}
}

// TestAppendJournalCannotOpen: where the journal cannot be made (a file
// named StateDir at the root), appends go on, those with an ID remembered
// in memory, and the store says so once in its log.
func TestAppendJournalCannotOpen(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, StateDir), []byte("not a directory"), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	var logMu sync.Mutex
	s := reopenStore(t, dir, Options{Logger: slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil))})
	if _, err := s.Append(context.Background(), "log", []byte("no id"), SyncNone, AppendOptions{}); err != nil {
		t.Fatalf("append without an id: %v", err)
	}
	for range 2 {
		appendID(t, s, "log", "a", "with id")
	}
	if got := appendID(t, s, "log", "a", "with id"); !got.Replayed || got.Offset != 5 {
		t.Errorf("resend in the same store: got %+v, want replayed at 5", got)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if n := strings.Count(logs.String(), "append-ID journal"); n != 1 {
		t.Errorf("the journal's failure logged %d times, want once; log:\n%s", n, logs.String())
	}
}

// TestAppendJournalForgetsFailed: an append with an ID that fails after
// its record was written is forgotten by the journal too, so that after a
// restart its resend is not replayed from bytes that another append with
// the same data put at its offset since.
func TestAppendJournalForgetsFailed(t *testing.T) {
	for _, p := range Policies() {
		t.Run(p.String(), func(t *testing.T) {
			hold := holdFS{name: "log", armed: new(atomic.Bool), held: make(chan struct{}), release: make(chan struct{})}
			close(hold.release)
			opts := Options{Policy: p}
			a, dir := newWrappedStore(t, func(fsys FS) FS { hold.FS = fsys; return hold }, opts)
			appendID(t, a, "log", "head", "head")
			hold.armed.Store(true)
			if _, err := a.Append(context.Background(), "log", []byte("data"), SyncNone, AppendOptions{ID: "x"}); err == nil {
				t.Fatal("the failing append: got nil, want its write's error")
			}
			if got := appendID(t, a, "log", "y", "data"); got.Offset != 4 {
				t.Fatalf("the append after the failed one: got offset %d, want 4 (the failed range given back)", got.Offset)
			}
			b := reopenStore(t, dir, opts)
			if got := appendID(t, b, "log", "x", "data"); got.Replayed || got.Offset != 8 {
				t.Errorf("resend of the failed append after a restart: got %+v, want appended at 8", got)
			}
		})
	}
}

// TestAppendJournalConcurrentResends: many resends of one loaded ID at
// once, whose bytes landed or not, agree on one offset, and the bytes are
// in the file once.
func TestAppendJournalConcurrentResends(t *testing.T) {
	a, dir := newTestStore(t, Options{})
	if _, err := a.Write(context.Background(), "log", 0, []byte("0123456789"), SyncNone); err != nil {
		t.Fatal(err)
	}
	writeJournal(t, dir, nil, journalRec("log", "landed", 2, "234"), journalRec("log", "lost", 0, "hello"))
	b := reopenStore(t, dir, Options{})
	for _, tc := range []struct {
		id, data string
		wantOff  int64
	}{{"landed", "234", 2}, {"lost", "hello", 10}} {
		const resends = 8
		offs := make([]int64, resends)
		var wg sync.WaitGroup
		for i := range resends {
			wg.Go(func() { offs[i] = appendID(t, b, "log", tc.id, tc.data).Offset })
		}
		wg.Wait()
		for i, off := range offs {
			if off != tc.wantOff {
				t.Errorf("%s, resend %d: got offset %d, want %d", tc.id, i, off, tc.wantOff)
			}
		}
	}
	if got, want := string(readFile(t, dir, "log")), "0123456789hello"; got != want {
		t.Errorf("log holds %q, want %q", got, want)
	}
}

// TestAppendJournalHandle: appends with IDs through a Handle (a stream's
// ApplyAppend) are journaled as unary ones are: after a restart, a unary
// resend of one is replayed.
func TestAppendJournalHandle(t *testing.T) {
	for _, p := range Policies() {
		t.Run(p.String(), func(t *testing.T) {
			ctx := context.Background()
			opts := Options{Policy: p}
			a, dir := newTestStore(t, opts)
			h, err := a.OpenHandle(ctx, "log", OpenCreate)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			var offs []int64
			for _, id := range []string{"s1", "s2"} {
				w, off, err := h.ApplyAppend(ctx, []byte(id), SyncData, AppendOptions{ID: id})
				if err == nil {
					err = h.Wait(ctx, w)
				}
				if err != nil {
					t.Fatalf("ApplyAppend %s: %v", id, err)
				}
				offs = append(offs, off)
			}
			b := reopenStore(t, dir, opts)
			for i, id := range []string{"s1", "s2"} {
				if got := appendID(t, b, "log", id, id); !got.Replayed || got.Offset != offs[i] {
					t.Errorf("resend of %s: got %+v, want replayed at %d", id, got, offs[i])
				}
			}
		})
	}
}

// TestAppendJournalConcurrentRotation: appenders with IDs race through
// many rotations of a journal of 16 records a generation; a store opened
// after them replays at least the last 16, each at the offset it was
// first given. (Its window is larger, so that the resends that append
// afresh do not push the loaded records out of it.)
func TestAppendJournalConcurrentRotation(t *testing.T) {
	const appenders, each, perGen = 8, 40, 16
	a, dir := newTestStore(t, Options{AppendIDs: perGen})
	offs := make([][]int64, appenders)
	var wg sync.WaitGroup
	for w := range appenders {
		offs[w] = make([]int64, each)
		wg.Go(func() {
			for i := range each {
				offs[w][i] = appendID(t, a, "log", fmt.Sprintf("%d-%d", w, i), fmt.Sprintf("<%d-%d>", w, i)).Offset
			}
		})
	}
	wg.Wait()
	if gens, err := filepath.Glob(filepath.Join(dir, StateDir, journalPrefix+"*")); err != nil || len(gens) != 2 {
		t.Errorf("generations on disk: %v, %v, want 2", gens, err)
	}
	b := reopenStore(t, dir, Options{AppendIDs: 2 * appenders * each})
	replayed := 0
	for w := range appenders {
		for i := range each {
			got := appendID(t, b, "log", fmt.Sprintf("%d-%d", w, i), fmt.Sprintf("<%d-%d>", w, i))
			switch {
			case got.Replayed && got.Offset != offs[w][i]:
				t.Errorf("%d-%d: replayed at %d, first at %d", w, i, got.Offset, offs[w][i])
			case got.Replayed:
				replayed++
			}
		}
	}
	if replayed < perGen {
		t.Errorf("%d appends replayed after the restart, want at least %d", replayed, perGen)
	}
}
