package service

import (
	"context"
	"io/fs"
	"os"
	"sync"
	"syscall"
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/filewrite/filewrite/store"
)

// faultFS wraps the store's file layer (Config.WrapFS) to fail writes for
// lack of space and to hold syncs, for the service-level tests of disk full
// and of deadlines in the group commit. The store's own fault tests use a
// fuller fault-injection package; this one does only what these tests need.
type faultFS struct {
	store.FS

	// mu guards the fields below.
	mu sync.Mutex
	// full maps a path to the bytes it may still take before its writes
	// fail with errno (a disk filling up): the write that crosses the
	// budget writes what fits first.
	full  map[string]int64
	errno syscall.Errno
	// syncHold, when set, holds every Sync until it is closed; syncEntered
	// is closed by the first Sync that waits on it.
	syncHold    chan struct{}
	syncEntered chan struct{}
}

var _ store.FS = (*faultFS)(nil)

func (f *faultFS) OpenFile(name string, flag int, perm fs.FileMode) (store.File, error) {
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &faultFile{File: file, fs: f, name: name}, nil
}

// fill makes writes to name fail with errno once budget more bytes were
// written.
func (f *faultFS) fill(name string, budget int64, errno syscall.Errno) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.full == nil {
		f.full = map[string]int64{}
	}
	f.full[name] = budget
	f.errno = errno
}

// holdSyncs makes every Sync wait until the returned release is called.
// entered is closed once one Sync waits.
func (f *faultFS) holdSyncs() (entered <-chan struct{}, release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.syncHold, f.syncEntered = make(chan struct{}), make(chan struct{})
	hold := f.syncHold
	var once sync.Once
	return f.syncEntered, func() { once.Do(func() { close(hold) }) }
}

type faultFile struct {
	store.File
	fs   *faultFS
	name string
}

func (f *faultFile) WriteAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	budget, limited := f.fs.full[f.name]
	errno := f.fs.errno
	if limited {
		f.fs.full[f.name] = max(0, budget-int64(len(p)))
	}
	f.fs.mu.Unlock()
	if !limited || budget >= int64(len(p)) {
		return f.File.WriteAt(p, off)
	}
	n, err := f.File.WriteAt(p[:budget], off)
	if err == nil {
		err = &os.PathError{Op: "write", Path: f.name, Err: errno}
	}
	return n, err
}

func (f *faultFile) Sync(dataOnly bool) error {
	f.fs.mu.Lock()
	hold, entered := f.fs.syncHold, f.fs.syncEntered
	f.fs.mu.Unlock()
	if hold != nil {
		select {
		case <-entered:
		default:
			close(entered)
		}
		<-hold
	}
	return f.File.Sync(dataOnly)
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
