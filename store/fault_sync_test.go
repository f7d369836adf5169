//go:build linux

package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store"
	"github.com/filewrite/filewrite/store/faultfs"
)

// syncCall is a way of asking for durability.
type syncCall int

const (
	fsyncData syncCall = iota // Fsync(SyncData): fdatasync
	fsyncFull                 // Fsync: fsync
	writeData                 // Write(SyncData)
	writeFull                 // Write(SyncFull)
)

func (c syncCall) String() string {
	return [...]string{"Fsync(data)", "Fsync(full)", "Write(sync=data)", "Write(sync=full)"}[c]
}

// run makes the call; i spreads the writes of concurrent callers.
func (c syncCall) run(s *store.Store, i int) error {
	ctx := context.Background()
	switch c {
	case fsyncData:
		return s.Fsync(ctx, faultPath, store.SyncData)
	case fsyncFull:
		return s.Fsync(ctx, faultPath, store.SyncFull)
	}
	sync := store.SyncData
	if c == writeFull {
		sync = store.SyncFull
	}
	data := pattern(100, byte(i))
	res, err := s.Write(ctx, faultPath, int64(i)*4096, data, sync)
	if res.BytesWritten != len(data) {
		// The data went in: only its durability is in doubt.
		return fmt.Errorf("wrote %d of %d bytes: %w", res.BytesWritten, len(data), err)
	}
	return err
}

// outcome is what a caller is told about durability.
type outcome int

const (
	durable     outcome = iota // nil: what it wrote before asking is durable
	syncEIO                    // ErrSyncFailed from its own sync's EIO
	notBelieved                // ErrSyncFailed although its syscall succeeded: a sync failed before or while it ran
)

func (o outcome) String() string { return [...]string{"durable", "sync EIO", "not believed"}[o] }

func checkOutcome(t *testing.T, who string, err error, want outcome) {
	t.Helper()
	var got outcome
	switch {
	case err == nil:
		got = durable
	case errors.Is(err, store.ErrSyncFailed) && errors.Is(err, syscall.EIO):
		got = syncEIO
	case errors.Is(err, store.ErrSyncFailed):
		got = notBelieved
	default:
		t.Errorf("%s: got unexpected error %v, want %v", who, err, want)
		return
	}
	if got != want {
		t.Errorf("%s: got %v (%v), want %v", who, got, err, want)
	}
}

// TestSyncFailureGroup: with group commit, every caller covered by a failed
// fdatasync/fsync gets ErrSyncFailed; the batch right after it gets
// ErrSyncFailed too although its own syscall succeeded (Linux reports a
// writeback error once, so that success proves nothing: PostgreSQL's
// fsyncgate); a later batch is believed again.
//
// Batches are lined up without timing: each batch's sync is held in faultfs
// until the next batch's callers have queued behind it.
func TestSyncFailureGroup(t *testing.T) {
	type batch struct {
		callers []syncCall
		// queued: the callers gather while the previous batch's sync is
		// held, and so share one sync; otherwise the one caller comes
		// after the previous batch returned.
		queued bool
		fail   bool // the batch's syscall fails with EIO
		want   outcome
	}
	tests := []struct {
		name    string
		batches []batch
	}{
		{
			name: "concurrent callers share a failure, the next batch is not believed",
			batches: []batch{
				{callers: []syncCall{fsyncData}},
				{queued: true, callers: []syncCall{writeData, fsyncData, fsyncFull, writeFull}, fail: true, want: syncEIO},
				{queued: true, callers: []syncCall{fsyncData, writeData, writeFull}, want: notBelieved},
				{queued: true, callers: []syncCall{fsyncFull, writeData}},
				{callers: []syncCall{fsyncData}},
			},
		},
		{
			name: "a failure with no one waiting: the next caller is not believed",
			batches: []batch{
				{callers: []syncCall{writeData}, fail: true, want: syncEIO},
				{callers: []syncCall{fsyncData}, want: notBelieved},
				{callers: []syncCall{writeData}},
			},
		},
		{
			name: "two failures in a row",
			batches: []batch{
				{callers: []syncCall{fsyncData}},
				{queued: true, callers: []syncCall{fsyncData, writeData}, fail: true, want: syncEIO},
				{queued: true, callers: []syncCall{writeFull, fsyncFull}, fail: true, want: syncEIO},
				{queued: true, callers: []syncCall{fsyncData, writeData}, want: notBelieved},
				{queued: true, callers: []syncCall{fsyncData}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := newFaultStore(t, store.Options{Fsync: store.FsyncGroup})
			if _, err := fs.Write(context.Background(), faultPath, 0, pattern(64<<10, 'a'), store.SyncData); err != nil {
				t.Fatal(err)
			}
			errs := make([][]error, len(tt.batches))
			var prev *testutil.Gate
			var prevDone *sync.WaitGroup
			var all []*sync.WaitGroup
			caller := 0
			for i, b := range tt.batches {
				if !b.queued && len(b.callers) != 1 || i == 0 && b.queued {
					t.Fatalf("batch %d: only a queued batch (not the first) can have several callers", i)
				}
				g := testutil.NewGate(t)
				var errno syscall.Errno
				if b.fail {
					errno = syscall.EIO
				}
				rule := fs.fsys.Inject(faultfs.Rule{Op: faultfs.OpSync, Path: faultPath, Err: errno, Times: 1, Hold: g.Opened()})
				if !b.queued && prev != nil {
					prev.Open()
					prevDone.Wait()
				}
				errs[i] = make([]error, len(b.callers))
				done := new(sync.WaitGroup)
				for j, c := range b.callers {
					done.Add(1)
					go func(k int) {
						defer done.Done()
						errs[i][j] = c.run(fs.Store, k)
					}(caller)
					caller++
				}
				if b.queued {
					testutil.WaitFor(t, fmt.Sprintf("batch %d to queue", i), func() bool {
						n, err := store.PendingSyncCallers(fs.Store, faultPath)
						return err == nil && n == len(b.callers)
					})
					prev.Open()
				}
				testutil.WaitFor(t, fmt.Sprintf("the sync of batch %d", i), func() bool { return rule.Hits() == 1 })
				prev, prevDone = g, done
				all = append(all, done)
			}
			prev.Open()
			for _, done := range all {
				done.Wait()
			}
			for i, b := range tt.batches {
				for j, c := range b.callers {
					checkOutcome(t, fmt.Sprintf("batch %d, caller %d (%v)", i, j, c), errs[i][j], b.want)
				}
			}
			checkUsable(t, fs)
		})
	}
}

// TestSyncFailurePerCall: with one sync per caller, syncs of one file run
// at once. A caller whose sync failed gets ErrSyncFailed; so does one whose
// sync was still running when another failed (the kernel reports the error
// to one of them only), and the first to start after the failure; a sync
// that returned before the failure stands.
func TestSyncFailurePerCall(t *testing.T) {
	type held struct {
		call syncCall
		fail bool // its syscall fails with EIO
		want outcome
	}
	tests := []struct {
		name    string
		held    []held // started in order, each held inside its sync
		release []int  // the order in which they are let go
		then    []outcome
	}{
		{
			name:    "a failed sync poisons the next",
			held:    []held{{call: writeData, fail: true, want: syncEIO}},
			release: []int{0},
			then:    []outcome{notBelieved, durable},
		},
		{
			name:    "a sync running when another fails is not believed",
			held:    []held{{call: fsyncData, fail: true, want: syncEIO}, {call: writeData, want: notBelieved}},
			release: []int{0, 1},
			then:    []outcome{notBelieved, durable},
		},
		{
			name:    "a sync that returned before the failure stands",
			held:    []held{{call: fsyncData, fail: true, want: syncEIO}, {call: writeFull, want: durable}},
			release: []int{1, 0},
			then:    []outcome{notBelieved, durable},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := newFaultStore(t, store.Options{Fsync: store.FsyncPerCall})
			if _, err := fs.Write(context.Background(), faultPath, 0, pattern(64<<10, 'a'), store.SyncData); err != nil {
				t.Fatal(err)
			}
			gates := make([]*testutil.Gate, len(tt.held))
			dones := make([]chan error, len(tt.held))
			for i, h := range tt.held {
				gates[i] = testutil.NewGate(t)
				var errno syscall.Errno
				if h.fail {
					errno = syscall.EIO
				}
				rule := fs.fsys.Inject(faultfs.Rule{Op: faultfs.OpSync, Path: faultPath, Err: errno, Times: 1, Hold: gates[i].Opened()})
				dones[i] = make(chan error, 1)
				go func() { dones[i] <- h.call.run(fs.Store, i) }()
				testutil.WaitFor(t, fmt.Sprintf("sync %d", i), func() bool { return rule.Hits() == 1 })
			}
			errs := make([]error, len(tt.held))
			for _, i := range tt.release {
				gates[i].Open()
				errs[i] = <-dones[i]
			}
			for i, h := range tt.held {
				checkOutcome(t, fmt.Sprintf("held sync %d (%v)", i, h.call), errs[i], h.want)
			}
			for i, want := range tt.then {
				err := fsyncData.run(fs.Store, 0)
				checkOutcome(t, fmt.Sprintf("later Fsync %d", i), err, want)
			}
			checkUsable(t, fs)
		})
	}
}

// checkUsable: after the faults, a synced write reads back and the store's
// view is still the file's.
func checkUsable(t *testing.T, fs faultStore) {
	t.Helper()
	ctx := context.Background()
	data := pattern(10000, 'z')
	if _, err := fs.Write(ctx, faultPath, 3000, data, store.SyncData); err != nil {
		t.Fatalf("Write after the faults: %v", err)
	}
	got, err := fs.Read(ctx, faultPath, 3000, int64(len(data)))
	if err != nil {
		t.Fatalf("Read after the faults: %v", err)
	}
	testutil.SameBytes(t, "Read after the faults", got, data)
	if err := fs.Fsync(ctx, faultPath, store.SyncFull); err != nil {
		t.Errorf("Fsync after the faults: %v", err)
	}
	fs.checkTrue(t, faultPath, true)
}

// TestSyncFailureRemembered: a failed sync is not forgotten by the other
// ways the store syncs or by closing an idle file: the next sync that
// could report the file durable — SyncAll, Close, or an Fsync after the
// file was closed for lack of descriptors and reopened, whose new
// descriptor would never see the old error — reports ErrSyncFailed.
func TestSyncFailureRemembered(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		opts store.Options
		// next makes the sync after the failed one, returning its error.
		next func(t *testing.T, fs faultStore) error
		// then, if set, makes one more sync, which must be believed.
		then func(fs faultStore) error
	}{
		{
			name: "SyncAll",
			next: func(t *testing.T, fs faultStore) error { return store.SyncAll(ctx, fs.Store) },
			then: func(fs faultStore) error { return store.SyncAll(ctx, fs.Store) },
		},
		{
			name: "Close",
			next: func(t *testing.T, fs faultStore) error { return fs.close() },
		},
		{
			name: "Close after the file was closed while idle",
			opts: store.Options{MaxOpenFiles: 1},
			next: func(t *testing.T, fs faultStore) error {
				if _, err := fs.Write(ctx, "other", 0, []byte("x"), store.SyncNone); err != nil {
					t.Fatalf("Write of another file: %v", err)
				}
				return fs.close()
			},
		},
		{
			name: "file closed while idle, then reopened",
			opts: store.Options{MaxOpenFiles: 1},
			next: func(t *testing.T, fs faultStore) error {
				// Opening another file closes the idle one.
				if _, err := fs.Write(ctx, "other", 0, []byte("x"), store.SyncNone); err != nil {
					t.Fatalf("Write of another file: %v", err)
				}
				if n := len(fs.Locks(10)); n != 1 {
					t.Fatalf("%d files open, want 1: %v", n, fs.Locks(10))
				}
				return fs.Fsync(ctx, faultPath, store.SyncData)
			},
			then: func(fs faultStore) error { return fs.Fsync(ctx, faultPath, store.SyncData) },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := newFaultStore(t, tt.opts)
			if _, err := fs.Write(ctx, faultPath, 0, pattern(8192, 'a'), store.SyncNone); err != nil {
				t.Fatal(err)
			}
			fs.fsys.Inject(faultfs.Rule{Op: faultfs.OpSync, Path: faultPath, Err: syscall.EIO, Times: 1})
			checkOutcome(t, "the failing Fsync", fs.Fsync(ctx, faultPath, store.SyncData), syncEIO)
			checkOutcome(t, "the next sync", tt.next(t, fs), notBelieved)
			if tt.then != nil {
				checkOutcome(t, "the sync after it", tt.then(fs), durable)
			}
		})
	}
}

// TestSyncAllHoldsOneFileAtATime: while SyncAll waits for the sync of one
// file, the other idle files stay idle, so a new file can still be opened
// by closing one of them; SyncAll then reopens the closed file for its
// sync and leaves both durable.
func TestSyncAllHoldsOneFileAtATime(t *testing.T) {
	ctx := context.Background()
	fs := newFaultStore(t, store.Options{MaxOpenFiles: 2})
	// "a" is written first: the least recently used, so synced first.
	for _, name := range []string{"a", "b"} {
		if _, err := fs.Write(ctx, name, 0, []byte(name), store.SyncNone); err != nil {
			t.Fatal(err)
		}
	}
	g := testutil.NewGate(t)
	held := fs.fsys.Inject(faultfs.Rule{Op: faultfs.OpSync, Path: "a", Hold: g.Opened(), Times: 1})
	bSyncs := fs.fsys.Inject(faultfs.Rule{Op: faultfs.OpSync, Path: "b"})
	syncAll := make(chan error, 1)
	go func() { syncAll <- store.SyncAll(ctx, fs.Store) }()
	testutil.WaitFor(t, "SyncAll to sync a", func() bool { return held.Hits() == 1 })
	// SyncAll holds "a"; "b" is idle and can make room.
	if _, err := fs.Write(ctx, "c", 0, []byte("c"), store.SyncNone); err != nil {
		t.Errorf("Write of a new file while SyncAll waits for another: got %v, want success", err)
	}
	g.Open()
	if err := <-syncAll; err != nil {
		t.Errorf("SyncAll: %v", err)
	}
	if got, want := bSyncs.Hits(), 1; got != want {
		t.Errorf("SyncAll synced b (closed for room meanwhile) %d times, want %d", got, want)
	}
}

// TestWriteBackFailureIsASyncFailure: in direct mode an unaligned write
// goes through the page cache and writes its range back with
// sync_file_range on the descriptor that fsync uses, so a writeback error
// it meets is consumed there and the next fsync succeeds. The store counts
// it as a failed sync: the next sync is not believed, the one after is.
func TestWriteBackFailureIsASyncFailure(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		sync store.SyncMode
	}{
		{"unsynced write", store.SyncNone},
		{"synced write", store.SyncData},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fs := newFaultStore(t, store.Options{IO: store.IODirect})
			if _, err := fs.Write(ctx, faultPath, 0, pattern(8192, 'a'), store.SyncNone); errors.Is(err, store.ErrUnsupported) {
				t.Skipf("O_DIRECT is not supported here: %v", err)
			} else if err != nil {
				t.Fatal(err)
			}
			fs.fsys.Inject(faultfs.Rule{Op: faultfs.OpWriteBack, Path: faultPath, Err: syscall.EIO, Times: 1})
			if _, err := fs.Write(ctx, faultPath, 100, pattern(100, 'u'), tt.sync); !errors.Is(err, syscall.EIO) {
				t.Fatalf("unaligned Write whose writeback fails: got %v, want EIO", err)
			}
			checkOutcome(t, "the Fsync after the failed writeback", fs.Fsync(ctx, faultPath, store.SyncData), notBelieved)
			checkOutcome(t, "the Fsync after it", fs.Fsync(ctx, faultPath, store.SyncData), durable)
		})
	}
}
