package faultfs_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store"
	"github.com/filewrite/filewrite/store/faultfs"
)

// newFS wraps an OSFS over a fresh directory next to the package source
// (not /tmp, which may be tmpfs) and returns it with the directory.
func newFS(t *testing.T) (*faultfs.FS, string) {
	t.Helper()
	dir := testutil.Dir(t)
	base, err := store.OpenOSFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	f := faultfs.New(base)
	t.Cleanup(func() { f.Close() })
	return f, dir
}

func open(t *testing.T, fsys *faultfs.FS, name string) store.File {
	t.Helper()
	f, err := fsys.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// call is one file operation of a test case and what it should return.
type call struct {
	file    string
	op      faultfs.Op
	off     int64
	data    string // OpWrite
	length  int64  // OpFallocate, OpWriteBack; OpTruncate's size is off
	wantN   int    // OpWrite
	wantErr syscall.Errno
}

func (c call) run(f store.File) (int, error) {
	switch c.op {
	case faultfs.OpWrite:
		return f.WriteAt([]byte(c.data), c.off)
	case faultfs.OpSync:
		return 0, f.Sync(store.SyncData)
	case faultfs.OpFallocate:
		return 0, f.Fallocate(0, c.off, c.length)
	case faultfs.OpTruncate:
		return 0, f.Truncate(c.off)
	case faultfs.OpWriteBack:
		return 0, f.WriteBack(c.off, c.length)
	case faultfs.OpExtents:
		_, err := f.Extents()
		return 0, err
	}
	panic("unknown op")
}

func TestRules(t *testing.T) {
	const enospc, eio = syscall.ENOSPC, syscall.EIO
	w := func(off int64, data string, wantN int, wantErr syscall.Errno) call {
		return call{file: "f", op: faultfs.OpWrite, off: off, data: data, wantN: wantN, wantErr: wantErr}
	}
	tests := []struct {
		name    string
		rules   []faultfs.Rule
		calls   []call
		wantF   string // content of f afterwards
		wantHit []int  // Hits of each rule afterwards
	}{
		{
			name:    "short write reaches the file, then the error",
			rules:   []faultfs.Rule{{Op: faultfs.OpWrite, After: 3, Err: enospc}},
			calls:   []call{w(0, "abcdef", 3, enospc)},
			wantF:   "abc",
			wantHit: []int{1},
		},
		{
			name:  "After is a budget shared by later writes",
			rules: []faultfs.Rule{{Op: faultfs.OpWrite, After: 4, Err: enospc}},
			calls: []call{
				w(0, "ab", 2, 0),
				w(2, "cdef", 2, enospc),
				w(4, "x", 0, enospc),
			},
			wantF:   "abcd",
			wantHit: []int{2},
		},
		{
			name:    "path scope",
			rules:   []faultfs.Rule{{Op: faultfs.OpWrite, Path: "g", Err: eio}},
			calls:   []call{w(0, "abc", 3, 0), {file: "g", op: faultfs.OpWrite, data: "x", wantErr: eio}},
			wantF:   "abc",
			wantHit: []int{1},
		},
		{
			name:  "range scope",
			rules: []faultfs.Rule{{Op: faultfs.OpWrite, Off: 4, Len: 2, Err: eio}},
			calls: []call{
				w(0, "abcd", 4, 0),   // ends where the range starts
				w(6, "gh", 2, 0),     // starts where it ends
				w(3, "DEFG", 0, eio), // overlaps
			},
			wantF:   "abcd\x00\x00gh",
			wantHit: []int{1},
		},
		{
			name:  "open range scope",
			rules: []faultfs.Rule{{Op: faultfs.OpWrite, Off: 4, Err: enospc}},
			calls: []call{w(0, "abcd", 4, 0), w(100, "x", 0, enospc)},
			wantF: "abcd", wantHit: []int{1},
		},
		{
			name:  "a failed extent listing, then one that passes",
			rules: []faultfs.Rule{{Op: faultfs.OpExtents, Err: eio, Times: 1}},
			calls: []call{
				{file: "f", op: faultfs.OpExtents, wantErr: eio},
				{file: "f", op: faultfs.OpExtents},
			},
			wantF:   "",
			wantHit: []int{1},
		},
		{
			name:  "Times retires the rule",
			rules: []faultfs.Rule{{Op: faultfs.OpSync, Err: eio, Times: 2}},
			calls: []call{
				{file: "f", op: faultfs.OpSync, wantErr: eio},
				{file: "f", op: faultfs.OpSync, wantErr: eio},
				{file: "f", op: faultfs.OpSync},
			},
			wantHit: []int{2},
		},
		{
			name: "the oldest matching rule applies",
			rules: []faultfs.Rule{
				{Op: faultfs.OpSync, Err: eio, Times: 1},
				{Op: faultfs.OpSync, Err: syscall.EROFS},
			},
			calls: []call{
				{file: "f", op: faultfs.OpSync, wantErr: eio},
				{file: "f", op: faultfs.OpSync, wantErr: syscall.EROFS},
			},
			wantHit: []int{1, 1},
		},
		{
			name:  "fallocate",
			rules: []faultfs.Rule{{Op: faultfs.OpFallocate, Off: 8192, Err: syscall.EOPNOTSUPP}},
			calls: []call{
				{file: "f", op: faultfs.OpFallocate, off: 0, length: 4096},
				{file: "f", op: faultfs.OpFallocate, off: 4096, length: 8192, wantErr: syscall.EOPNOTSUPP},
			},
			wantF:   strings.Repeat("\x00", 4096), // mode 0 grows the file
			wantHit: []int{1},
		},
		{
			name:  "truncate matches on its new size",
			rules: []faultfs.Rule{{Op: faultfs.OpTruncate, Off: 2, Len: 1, Err: eio}},
			calls: []call{
				w(0, "abcd", 4, 0),
				{file: "f", op: faultfs.OpTruncate, off: 2, wantErr: eio},
				{file: "f", op: faultfs.OpTruncate, off: 3},
			},
			wantF:   "abc",
			wantHit: []int{1},
		},
		{
			name:  "writeback matches on its range",
			rules: []faultfs.Rule{{Op: faultfs.OpWriteBack, Off: 4096, Err: eio}},
			calls: []call{
				w(0, "abcd", 4, 0),
				{file: "f", op: faultfs.OpWriteBack, off: 0, length: 4},
				{file: "f", op: faultfs.OpWriteBack, off: 0, length: 8192, wantErr: eio},
			},
			wantF:   "abcd",
			wantHit: []int{1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fsys, dir := newFS(t)
			files := map[string]store.File{"f": open(t, fsys, "f"), "g": open(t, fsys, "g")}
			var faults []*faultfs.Fault
			for _, r := range tt.rules {
				faults = append(faults, fsys.Inject(r))
			}
			for i, c := range tt.calls {
				n, err := c.run(files[c.file])
				if n != c.wantN {
					t.Errorf("call %d (%v %s at %d): got n=%d, want %d", i, c.op, c.file, c.off, n, c.wantN)
				}
				checkErr(t, i, err, c.wantErr)
			}
			got, err := os.ReadFile(filepath.Join(dir, "f"))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.wantF {
				t.Errorf("got content %q, want %q", got, tt.wantF)
			}
			for i, flt := range faults {
				if got, want := flt.Hits(), tt.wantHit[i]; got != want {
					t.Errorf("rule %d: got %d hits, want %d", i, got, want)
				}
			}
		})
	}
}

// checkErr checks that err is what the OS would return for want: an
// *os.PathError around the errno.
func checkErr(t *testing.T, i int, err error, want syscall.Errno) {
	t.Helper()
	if want == 0 {
		if err != nil {
			t.Errorf("call %d: got error %v, want none", i, err)
		}
		return
	}
	var pe *os.PathError
	if !errors.As(err, &pe) || !errors.Is(err, want) {
		t.Errorf("call %d: got error %#v, want an *os.PathError wrapping %v", i, err, want)
	}
}

func TestHoldRemoveReset(t *testing.T) {
	fsys, _ := newFS(t)
	f := open(t, fsys, "f")
	hold := make(chan struct{})
	held := fsys.Inject(faultfs.Rule{Op: faultfs.OpSync, Err: syscall.EIO, Times: 1, Hold: hold})
	done := make(chan error)
	go func() { done <- f.Sync(store.SyncData) }()
	// Hits counts the call before it waits, so this ends once the sync is
	// held; the sync cannot have returned, because hold is still open.
	for held.Hits() == 0 {
		select {
		case err := <-done:
			t.Fatalf("held sync returned %v before it was released", err)
		default:
			time.Sleep(time.Millisecond)
		}
	}
	close(hold)
	if err := <-done; !errors.Is(err, syscall.EIO) {
		t.Errorf("released sync: got %v, want EIO", err)
	}

	w := fsys.Inject(faultfs.Rule{Op: faultfs.OpWrite, Err: syscall.EIO})
	if _, err := f.WriteAt([]byte("x"), 0); !errors.Is(err, syscall.EIO) {
		t.Errorf("write with a rule: got %v, want EIO", err)
	}
	w.Remove()
	if _, err := f.WriteAt([]byte("x"), 0); err != nil {
		t.Errorf("write after Remove: got %v, want none", err)
	}
	fsys.Inject(faultfs.Rule{Op: faultfs.OpTruncate, Err: syscall.EIO})
	fsys.Inject(faultfs.Rule{Op: faultfs.OpSync, Err: syscall.EIO})
	fsys.Reset()
	if err := f.Truncate(0); err != nil {
		t.Errorf("truncate after Reset: got %v, want none", err)
	}
	if err := f.Sync(store.SyncFull); err != nil {
		t.Errorf("sync after Reset: got %v, want none", err)
	}
}

func TestInjectRejectsMalformedRules(t *testing.T) {
	fsys, _ := newFS(t)
	for _, r := range []faultfs.Rule{
		{},
		{Op: faultfs.OpSync, Off: 1},
		{Op: faultfs.OpExtents, Len: 1},
		{Op: faultfs.OpOpen, Off: 1},
		{Op: faultfs.OpTruncate, After: 1},
		{Op: faultfs.OpWrite, Len: -1},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Inject(%+v) did not panic", r)
				}
			}()
			fsys.Inject(r)
		}()
	}
}

// TestOpenRule: an OpOpen rule fails the open of its file as open(2)
// would, an *os.PathError around the errno, and creates nothing; other
// files, and the file once the rule retires, open as usual.
func TestOpenRule(t *testing.T) {
	fsys, dir := newFS(t)
	r := fsys.Inject(faultfs.Rule{Op: faultfs.OpOpen, Path: "g", Err: syscall.EMFILE, Times: 1})
	_, err := fsys.OpenFile("g", os.O_RDWR|os.O_CREATE, 0o644)
	var pe *os.PathError
	if !errors.Is(err, syscall.EMFILE) || !errors.As(err, &pe) {
		t.Errorf("open g: got %v, want an *os.PathError with EMFILE", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "g")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("g after a failed open: %v, want it not to exist", err)
	}
	open(t, fsys, "f")
	open(t, fsys, "g")
	if got := r.Hits(); got != 1 {
		t.Errorf("hits %d, want 1", got)
	}
}
