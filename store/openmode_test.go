//go:build linux

package store

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestWriteOpenModes: each open mode on a file that exists, one that does
// not, and one whose directory does not: what the write answers, and what
// is on disk after. A refused write creates nothing, not even a directory.
func TestWriteOpenModes(t *testing.T) {
	tests := []struct {
		name     string
		open     OpenMode
		path     string // "old" exists, holding "old!"
		wantErr  error
		wantData string // "" with wantGone: the path names nothing
		wantGone bool
	}{
		{name: "create, exists", open: OpenCreate, path: "old", wantData: "new!"},
		{name: "create, missing", open: OpenCreate, path: "fresh", wantData: "new!"},
		{name: "create, missing dir", open: OpenCreate, path: "d/e/fresh", wantData: "new!"},
		{name: "must-exist, exists", open: OpenMustExist, path: "old", wantData: "new!"},
		{name: "must-exist, missing", open: OpenMustExist, path: "fresh", wantErr: ErrNotFound, wantGone: true},
		{name: "must-exist, missing dir", open: OpenMustExist, path: "d/e/fresh", wantErr: ErrNotFound, wantGone: true},
		{name: "exclusive, exists", open: OpenExclusive, path: "old", wantErr: ErrExists, wantData: "old!"},
		{name: "exclusive, missing", open: OpenExclusive, path: "fresh", wantData: "new!"},
		{name: "exclusive, missing dir", open: OpenExclusive, path: "d/e/fresh", wantData: "new!"},
		{name: "unknown mode", open: OpenExclusive + 1, path: "fresh", wantErr: ErrInvalidMode, wantGone: true},
	}
	for _, tt := range tests {
		for _, via := range []string{"WriteOpen", "OpenHandle"} {
			t.Run(tt.name+"/"+via, func(t *testing.T) {
				ctx := context.Background()
				s, dir := newTestStore(t, Options{})
				if _, err := s.Write(ctx, "old", 0, []byte("old!"), SyncNone); err != nil {
					t.Fatal(err)
				}
				var err error
				switch via {
				case "WriteOpen":
					_, err = s.WriteOpen(ctx, tt.path, tt.open, 0, []byte("new!"), SyncNone)
				case "OpenHandle":
					var h *Handle
					h, err = s.OpenHandle(ctx, tt.path, tt.open)
					if err == nil {
						_, err = h.Write(ctx, 0, []byte("new!"), SyncNone)
						h.Close()
					}
				}
				if !errors.Is(err, tt.wantErr) || (err != nil && tt.wantErr == nil) {
					t.Errorf("got error %v, want %v", err, tt.wantErr)
				}
				got, err := os.ReadFile(filepath.Join(dir, tt.path))
				switch {
				case tt.wantGone:
					if !errors.Is(err, fs.ErrNotExist) {
						t.Errorf("%s after the write: got %q, %v; want no file", tt.path, got, err)
					}
					if _, err := os.Stat(filepath.Join(dir, "d")); !errors.Is(err, fs.ErrNotExist) {
						t.Errorf("directory d after the write: got %v, want none", err)
					}
				case err != nil:
					t.Errorf("%s after the write: %v", tt.path, err)
				case string(got) != tt.wantData:
					t.Errorf("%s after the write: got %q, want %q", tt.path, got, tt.wantData)
				}
			})
		}
	}
}

// TestExclusiveCreateRace: creators racing for one path, through the
// store's WriteOpen and OpenHandle and from outside it with O_EXCL: exactly
// one wins, every other gets ErrExists, and the file holds the winner's
// bytes. Repeated on fresh paths so that the race is run many times.
func TestExclusiveCreateRace(t *testing.T) {
	ctx := context.Background()
	s, dir := newTestStore(t, Options{})
	const rounds, racers = 50, 6
	for round := range rounds {
		name := filepath.Join("race", string(rune('a'+round%26)), string(rune('a'+round/26)))
		var wg sync.WaitGroup
		errs := make([]error, racers)
		for i := range racers {
			data := []byte{byte('0' + i)}
			wg.Go(func() {
				switch i % 3 {
				case 0:
					_, errs[i] = s.WriteOpen(ctx, name, OpenExclusive, 0, data, SyncNone)
				case 1:
					h, err := s.OpenHandle(ctx, name, OpenExclusive)
					if err == nil {
						_, err = h.Write(ctx, 0, data, SyncNone)
						h.Close()
					}
					errs[i] = err
				case 2:
					// Another process's O_EXCL create, which the store
					// must lose to or beat like any of its own callers.
					if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
						errs[i] = err
						return
					}
					f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
					if err == nil {
						_, err = f.Write(data)
						f.Close()
					} else if errors.Is(err, fs.ErrExist) {
						err = ErrExists
					}
					errs[i] = err
				}
			})
		}
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Fatalf("round %d: racers %d and %d both created %s", round, winner, i, name)
			case err == nil:
				winner = i
			case !errors.Is(err, ErrExists):
				t.Fatalf("round %d: racer %d: got %v, want nil or %v", round, i, err, ErrExists)
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: no racer created %s", round, name)
		}
		got, err := os.ReadFile(filepath.Join(dir, name))
		if want := string(rune('0' + winner)); err != nil || string(got) != want {
			t.Fatalf("round %d: %s holds %q, %v; want the winner's %q", round, name, got, err, want)
		}
	}
}

// TestMustExistAfterDelete: once a Delete returns, a must-exist write of
// the path is refused, and a handle opened must-exist before the Delete
// fails like any handle of a deleted file.
func TestMustExistAfterDelete(t *testing.T) {
	ctx := context.Background()
	s, dir := newTestStore(t, Options{})
	if _, err := s.Write(ctx, "f", 0, []byte("x"), SyncNone); err != nil {
		t.Fatal(err)
	}
	h, err := s.OpenHandle(ctx, "f", OpenMustExist)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := s.Delete(ctx, "f", false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteOpen(ctx, "f", OpenMustExist, 0, []byte("y"), SyncNone); !errors.Is(err, ErrNotFound) {
		t.Errorf("must-exist write after Delete: got %v, want %v", err, ErrNotFound)
	}
	if _, err := h.Write(ctx, 0, []byte("y"), SyncNone); !errors.Is(err, ErrDeleted) {
		t.Errorf("write through a handle of the deleted file: got %v, want %v", err, ErrDeleted)
	}
	if _, err := os.Stat(filepath.Join(dir, "f")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("f after the refused writes: got %v, want no file", err)
	}
}
