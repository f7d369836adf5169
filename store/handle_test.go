//go:build linux

package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store"
	"github.com/filewrite/filewrite/store/faultfs"
)

// TestHandleWrite: a write through a Handle does what the same Write does,
// refusals included (they change nothing), and reports the same result.
func TestHandleWrite(t *testing.T) {
	const maxRequest = 64 << 10
	tests := []struct {
		name    string
		off     int64
		data    []byte
		sync    store.SyncMode
		wantErr error
		// wantOwed is what Handle.Write leaves for Wait.
		wantOwed store.SyncMode
	}{
		{name: "extending", off: 8192, data: pattern(100, 1), wantOwed: store.SyncNone},
		{name: "below EOF, sync data", off: 0, data: pattern(4096, 2), sync: store.SyncData, wantOwed: store.SyncData},
		{name: "sync full", off: 100, data: pattern(10, 3), sync: store.SyncFull, wantOwed: store.SyncFull},
		{name: "empty", off: 1 << 20, data: nil, sync: store.SyncData, wantOwed: store.SyncData}, // synced like any synced write
		{name: "negative offset", off: -1, data: pattern(10, 4), wantErr: store.ErrInvalidOffset},
		{name: "over the request limit", off: 0, data: make([]byte, maxRequest+1), wantErr: store.ErrRequestTooLarge},
		{name: "past the file size limit", off: 1 << 30, data: pattern(1, 5), wantErr: store.ErrFileTooLarge},
		{name: "unknown sync mode", off: 0, data: pattern(1, 6), sync: 7, wantErr: store.ErrInvalidMode},
	}
	ctx := context.Background()
	opts := store.Options{MaxRequestBytes: maxRequest, MaxFileSize: 1 << 30}
	viaWrite, viaHandle := newFaultStore(t, opts), newFaultStore(t, opts)
	h, err := viaHandle.OpenHandle(ctx, faultPath, store.OpenCreate)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := viaWrite.Write(ctx, faultPath, 0, nil, store.SyncNone); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		want, wantErr := viaWrite.Write(ctx, faultPath, tt.off, tt.data, tt.sync)
		if !errors.Is(wantErr, tt.wantErr) {
			t.Fatalf("%s: Write: got %v, want %v", tt.name, wantErr, tt.wantErr)
		}
		got, err := h.Write(ctx, tt.off, tt.data, tt.sync)
		if !errors.Is(err, tt.wantErr) {
			t.Errorf("%s: Handle.Write: got error %v, want %v", tt.name, err, tt.wantErr)
		}
		if err == nil {
			if got.Owed != tt.wantOwed {
				t.Errorf("%s: owed %v, want %v", tt.name, got.Owed, tt.wantOwed)
			}
			err = h.Wait(ctx, got)
		}
		if err == nil {
			// Two files, two generations: each must be there.
			if got.Generation == 0 || want.Generation == 0 {
				t.Errorf("%s: generations %d and %d (as Write), want both set", tt.name, got.Generation, want.Generation)
			}
			got.Generation, want.Generation = 0, 0
			if got.WriteResult != want {
				t.Errorf("%s: got %+v, want %+v (as Write)", tt.name, got.WriteResult, want)
			}
		}
		testutil.SameBytes(t, tt.name, viaHandle.content(t, faultPath), viaWrite.content(t, faultPath))
	}
}

// TestHandleHoldsTheFile: a handle counts against MaxOpenFiles for its
// whole life, so the file is never closed under it to make room.
func TestHandleHoldsTheFile(t *testing.T) {
	ctx := context.Background()
	s := newFaultStore(t, store.Options{MaxOpenFiles: 1})
	h, err := s.OpenHandle(ctx, "a", store.OpenCreate)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write(ctx, "b", 0, []byte("b"), store.SyncNone); !errors.Is(err, store.ErrTooManyOpenFiles) {
		t.Errorf("Write to another file while a handle holds the only slot: got %v, want %v", err, store.ErrTooManyOpenFiles)
	}
	if _, err := s.Write(ctx, "a", 0, []byte("a"), store.SyncNone); err != nil {
		t.Errorf("Write to the held file: %v", err)
	}
	h.Close()
	h.Close() // harmless
	if _, err := s.Write(ctx, "b", 0, []byte("b"), store.SyncNone); err != nil {
		t.Errorf("Write to another file after Close: %v", err)
	}
	if _, err := s.OpenHandle(ctx, "../x", store.OpenCreate); !errors.Is(err, store.ErrInvalidPath) {
		t.Errorf("OpenHandle(../x): got %v, want %v", err, store.ErrInvalidPath)
	}
}

// TestHandleSyncDoesNotHoldBackWrites: a synced write's bytes are in the
// file when Handle.Write returns, and while its sync is held a later write
// goes through; only Wait waits. Under the exclusive policy the sync runs
// under the lock, so the later write queues behind it.
func TestHandleSyncDoesNotHoldBackWrites(t *testing.T) {
	for _, policy := range store.Policies() {
		t.Run(policy.String(), func(t *testing.T) {
			ctx := context.Background()
			s := newFaultStore(t, store.Options{Policy: policy})
			h, err := s.OpenHandle(ctx, faultPath, store.OpenCreate)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			if _, err := h.Write(ctx, 0, pattern(8192, 0), store.SyncNone); err != nil {
				t.Fatal(err)
			}
			g := testutil.NewGate(t)
			held := s.fsys.Inject(faultfs.Rule{Op: faultfs.OpSync, Hold: g.Opened(), Times: 1})

			first := make(chan error, 1)
			go func() {
				w, err := h.Write(ctx, 0, pattern(4096, 1), store.SyncData)
				if err == nil {
					err = h.Wait(ctx, w)
				}
				first <- err
			}()
			testutil.WaitFor(t, "the first write's sync to be held", func() bool { return held.Hits() == 1 })

			second := make(chan error, 1)
			go func() {
				_, err := h.Write(ctx, 4096, pattern(4096, 2), store.SyncNone)
				second <- err
			}()
			if policy == store.PolicyExclusive {
				testutil.WaitFor(t, "the second write to queue for the lock", func() bool {
					locks := s.Locks(1)
					return len(locks) == 1 && locks[0].Waiting == 1
				})
				select {
				case err := <-second:
					t.Fatalf("the second write returned (%v) while the first one's sync held the exclusive lock", err)
				default:
				}
			} else if err := <-second; err != nil {
				t.Fatalf("second write while the first one's sync is held: %v", err)
			}
			g.Open()
			if err := <-first; err != nil {
				t.Errorf("first write: %v", err)
			}
			if policy == store.PolicyExclusive {
				if err := <-second; err != nil {
					t.Errorf("second write: %v", err)
				}
			}
			testutil.SameBytes(t, "file", s.content(t, faultPath), append(pattern(4096, 1), pattern(4096, 2)...))
		})
	}
}

// TestHandleGone: Gone is open while the file keeps its name, shared by
// every Handle of the file, and closed by a Delete; a new file by the
// name has a Gone of its own.
func TestHandleGone(t *testing.T) {
	ctx := context.Background()
	s := newFaultStore(t, store.Options{})
	h1, err := s.OpenHandle(ctx, "a", store.OpenCreate)
	if err != nil {
		t.Fatal(err)
	}
	defer h1.Close()
	h2, err := s.OpenHandle(ctx, "a", store.OpenCreate)
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Close()
	if h1.Gone() != h2.Gone() {
		t.Error("two Handles of one file have two Gone channels")
	}
	select {
	case <-h1.Gone():
		t.Fatal("Gone is closed before any Delete")
	default:
	}
	if err := s.Delete(ctx, "a", false); err != nil {
		t.Fatal(err)
	}
	for i, h := range []*store.Handle{h1, h2} {
		select {
		case <-h.Gone():
		default:
			t.Errorf("handle %d: Gone is open after the Delete", i+1)
		}
	}
	// A new file by the name is another file, with a Gone of its own.
	h3, err := s.OpenHandle(ctx, "a", store.OpenCreate)
	if err != nil {
		t.Fatal(err)
	}
	defer h3.Close()
	select {
	case <-h3.Gone():
		t.Error("the new file's Gone is closed")
	default:
	}
}

// TestHandleApplyAppendID: ApplyAppend with an ID goes through the same
// window as Append, by the Handle's path: a resend writes nothing and
// returns the first offset, still owing the sync it asks for (under
// PolicyExclusive it syncs now, owing nothing), and refusals are Append's.
func TestHandleApplyAppendID(t *testing.T) {
	for _, policy := range []store.Policy{store.PolicyExclusive, store.PolicySharedOverwrite} {
		t.Run(policy.String(), func(t *testing.T) {
			ctx := context.Background()
			s := newFaultStore(t, store.Options{Policy: policy})
			h, err := s.OpenHandle(ctx, faultPath, store.OpenCreate)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			wantOwed := store.SyncData
			if policy == store.PolicyExclusive {
				wantOwed = store.SyncNone
			}
			apply := func(data, id string) (store.AppliedWrite, int64, error) {
				return h.ApplyAppend(ctx, []byte(data), store.SyncData, store.AppendOptions{ID: id})
			}
			for _, step := range []struct {
				name, data, id string
				wantOff        int64
				wantErr        error
			}{
				{"first", "head|", "", 0, nil},
				{"with an id", "once|", "a", 5, nil},
				{"resent", "once|", "a", 5, nil},
				{"next", "tail", "b", 10, nil},
				{"reused with other data", "other", "a", 0, store.ErrAppendIDReused},
				{"id too long", "x", string(make([]byte, store.MaxAppendIDLen+1)), 0, store.ErrArgumentTooLong},
			} {
				w, off, err := apply(step.data, step.id)
				if !errors.Is(err, step.wantErr) {
					t.Fatalf("%s: got %v, want %v", step.name, err, step.wantErr)
				}
				if err != nil {
					continue
				}
				if off != step.wantOff || w.Owed != wantOwed || w.BytesWritten != len(step.data) {
					t.Errorf("%s: got offset %d, owed %v, %d bytes, want %d, %v, %d", step.name, off, w.Owed, w.BytesWritten, step.wantOff, wantOwed, len(step.data))
				}
				if err := h.Wait(ctx, w); err != nil {
					t.Errorf("%s: Wait: %v", step.name, err)
				}
			}
			// The window is the path's: Append finds what ApplyAppend made.
			res, err := s.Append(ctx, faultPath, []byte("tail"), store.SyncNone, store.AppendOptions{ID: "b"})
			if err != nil || res.Offset != 10 || !res.Replayed {
				t.Errorf("Append resending b: got %+v, %v, want offset 10, replayed", res, err)
			}
			testutil.SameBytes(t, "file", s.content(t, faultPath), []byte("head|once|tail"))
		})
	}
}
