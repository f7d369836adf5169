package service

import (
	"context"
	"sync"
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/filewrite/filewrite/store"
	"github.com/filewrite/filewrite/store/faultfs"
)

// withFaultFS puts a faultfs.FS under the store the daemon opens, so that
// tests can fail and hold its file operations, and returns a pointer that
// holds it once Start has run.
func withFaultFS(c *Config) **faultfs.FS {
	var ffs *faultfs.FS
	c.WrapFS = func(base store.FS) store.FS {
		ffs = faultfs.New(base)
		return ffs
	}
	return &ffs
}

// writeGate holds writes inside the store (store.Hooks.InsideWrite) after
// they took their lock and before their data reaches the file, and records
// which requests got that far by their "x-request-id" metadata.
type writeGate struct {
	path string // the file whose writes are held; others pass

	mu       sync.Mutex
	entered  chan struct{} // closed when the first held write arrives
	release  chan struct{} // held writes wait for it
	released bool
	reached  []string // x-request-id of every write that reached its data
}

func newWriteGate(path string) *writeGate {
	return &writeGate{path: path, entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *writeGate) hooks() *store.Hooks { return &store.Hooks{InsideWrite: g.inside} }

func (g *writeGate) inside(ctx context.Context, path, mode, reason string) {
	md, _ := metadata.FromIncomingContext(ctx)
	g.mu.Lock()
	g.reached = append(g.reached, md.Get("x-request-id")...)
	held := path == g.path && !g.released
	if held {
		select {
		case <-g.entered:
		default:
			close(g.entered)
		}
	}
	g.mu.Unlock()
	if held {
		<-g.release
	}
}

// open lets held writes go, and every later one pass.
func (g *writeGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.released {
		g.released = true
		close(g.release)
	}
}

// waitEntered waits until a write is held.
func (g *writeGate) waitEntered(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-g.entered:
	case <-ctx.Done():
		t.Fatal("no write reached the gate")
	}
}

func (g *writeGate) reachedData(id string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, r := range g.reached {
		if r == id {
			return true
		}
	}
	return false
}

// requestID tags an outgoing call, so that a writeGate can tell it apart.
func requestID(ctx context.Context, id string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "x-request-id", id)
}

// waiting is how many callers queue for path's inode lock.
func (d *daemon) waiting(path string) int {
	for _, f := range d.srv.store.Locks(1 << 20) {
		if f.Path == path {
			return f.Waiting
		}
	}
	return 0
}
