//go:build linux

package store

import (
	"io/fs"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

// syncRecorder is an FS wrapper that records when each sync started and
// ended on a logical clock shared with the test, and can hold a sync
// before it starts (holdNext).
type syncRecorder struct {
	FS
	clock atomic.Int64
	// mu guards log, dirs and hold.
	mu   sync.Mutex
	log  []syncSpan
	dirs []string  // directories synced, in order
	hold *heldSync // for the next file sync; nil: none is held
}

// heldSync is a sync that waits, before it starts, until release closes.
type heldSync struct {
	entered chan struct{} // closed once the sync waits
	release <-chan struct{}
}

// holdNext makes the next file sync wait until release is closed, before
// it starts; the channel returned is closed once it waits.
func (r *syncRecorder) holdNext(release <-chan struct{}) <-chan struct{} {
	h := &heldSync{entered: make(chan struct{}), release: release}
	r.mu.Lock()
	r.hold = h
	r.mu.Unlock()
	return h.entered
}

type syncSpan struct{ start, end int64 }

var _ FS = (*syncRecorder)(nil)

func (r *syncRecorder) now() int64 { return r.clock.Add(1) }

func (r *syncRecorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.log)
}

func (r *syncRecorder) since(i int) []syncSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]syncSpan(nil), r.log[i:]...)
}

func (r *syncRecorder) SyncDir(name string) error {
	r.mu.Lock()
	r.dirs = append(r.dirs, name)
	r.mu.Unlock()
	return r.FS.SyncDir(name)
}

func (r *syncRecorder) syncedDirs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.dirs...)
}

func (r *syncRecorder) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := r.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return recordedFile{f, r}, nil
}

type recordedFile struct {
	File
	r *syncRecorder
}

func (f recordedFile) Sync(mode SyncMode) error {
	f.r.mu.Lock()
	h := f.r.hold
	f.r.hold = nil
	f.r.mu.Unlock()
	if h != nil {
		close(h.entered)
		<-h.release
	}
	start := f.r.now()
	err := f.File.Sync(mode)
	end := f.r.now()
	f.r.mu.Lock()
	f.r.log = append(f.r.log, syncSpan{start, end})
	f.r.mu.Unlock()
	return err
}

// newRecordedStore is newTestStore with syncs recorded by rec.
func newRecordedStore(t testing.TB, rec *syncRecorder, opts Options) (*Store, string) {
	t.Helper()
	dir := testutil.Dir(t)
	fsys, err := OpenOSFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	rec.FS = fsys
	s, err := Open(rec, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, dir
}
