// Package testutil holds the helpers that the tests of several packages
// share: fresh directories, contexts, polling, gates, byte comparisons,
// snapshots of a tree that a rejected request must leave alone, HTTP
// requests and error bodies, span starts, free ports, the goroutine leak
// check, and the daemon binary started as a child process. It imports neither store nor service,
// so that the tests of both (in package and external) can import it.
package testutil

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Dir returns a fresh absolute directory next to the test's package source
// and removes it when the test ends. It is not under os.TempDir because
// /tmp may be tmpfs, where FIEMAP, O_DIRECT and unwritten extents behave
// differently from the filesystem the store is meant to run on. Its name
// starts with "testdata-tmp-", which git ignores; the path is absolute so
// that it survives a t.Chdir.
func Dir(t testing.TB) string {
	t.Helper()
	base, err := filepath.Abs(".")
	if err != nil {
		t.Fatalf("package directory: %v", err)
	}
	dir, err := os.MkdirTemp(base, "testdata-tmp-")
	if err != nil {
		t.Fatalf("create test directory: %v", err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove test directory: %v", err)
		}
	})
	return dir
}

// Context is the test's context, ended after 30 seconds at most, so that a
// call that hangs fails the test instead of the whole run.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// WaitFor polls cond until it holds. It is not a timing assertion: it
// fails only when cond stays false for a minute, which means the code
// under test is stuck.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// SameBytes fails t (without stopping it) unless got equals want, saying
// what was compared, both lengths and the first byte that differs.
func SameBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	i := 0
	for i < min(len(got), len(want)) && got[i] == want[i] {
		i++
	}
	t.Errorf("%s: got %d bytes, want %d; first difference at byte %d", what, len(got), len(want), i)
}

// Gate holds whoever waits on it (a faultfs Rule's Hold, say) until the
// test opens it, and opens by itself when the test ends, so that a failing
// test leaves nothing held.
type Gate struct {
	c    chan struct{}
	once sync.Once
}

// NewGate returns a gate that holds its waiters until Open.
func NewGate(t testing.TB) *Gate {
	g := &Gate{c: make(chan struct{})}
	t.Cleanup(g.Open)
	return g
}

// Opened is closed once the gate is open.
func (g *Gate) Opened() <-chan struct{} { return g.c }

// Open lets every waiter through, now and later; opening twice is fine.
func (g *Gate) Open() { g.once.Do(func() { close(g.c) }) }

// LockedBuffer is a bytes.Buffer for one writer and concurrent readers: a
// child process's log that the test reads while it runs.
type LockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is what was written so far.
func (b *LockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// AllBytes is n bytes cycling through every byte value.
func AllBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

// FreeAddr is a loopback address with a port nobody listened on a moment
// ago, for a process that cannot be told to pick its own and log it, or
// that must listen on the same one each time it starts.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
