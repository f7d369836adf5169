//go:build linux

package store

import (
	"context"
	"sync"
	"testing"
)

// TestDecisionTable runs one write per policy and file layout on a real
// file and checks the lock mode and reason the store chose.
func TestDecisionTable(t *testing.T) {
	const bs = 4096
	layouts := []struct {
		name     string
		prepare  func(ctx context.Context, s *Store, path string) error
		off, len int64
	}{
		{"written", func(ctx context.Context, s *Store, p string) error {
			_, err := s.Write(ctx, p, 0, make([]byte, 4*bs), SyncNone)
			return err
		}, bs, bs},
		{"unwritten", func(ctx context.Context, s *Store, p string) error {
			_, err := s.Fallocate(ctx, p, FallocAllocate, 0, 4*bs)
			return err
		}, bs, bs},
		{"hole", func(ctx context.Context, s *Store, p string) error {
			return s.Truncate(ctx, p, 4*bs)
		}, bs, bs},
		{"extending", func(ctx context.Context, s *Store, p string) error {
			_, err := s.Write(ctx, p, 0, make([]byte, 4*bs), SyncNone)
			return err
		}, 4 * bs, bs},
		{"unaligned-over-unwritten", func(ctx context.Context, s *Store, p string) error {
			_, err := s.Fallocate(ctx, p, FallocAllocate, 0, 4*bs)
			return err
		}, bs + 100, 200},
	}
	type decision struct{ mode, reason string }
	want := map[Policy][]decision{
		PolicyExclusive: {
			{"exclusive", ReasonPolicy}, {"exclusive", ReasonPolicy}, {"exclusive", ReasonPolicy},
			{"exclusive", ReasonExtending}, {"exclusive", ReasonPolicy},
		},
		PolicyUnlockedBelowEOF: {
			{"none", ReasonBelowEOF}, {"none", ReasonBelowEOF}, {"none", ReasonBelowEOF},
			{"exclusive", ReasonExtending}, {"none", ReasonBelowEOF},
		},
		PolicySharedWritten: {
			{"shared", ReasonOverwrite}, {"exclusive", ReasonUnwritten}, {"exclusive", ReasonHole},
			{"exclusive", ReasonExtending}, {"exclusive", ReasonUnwritten},
		},
		PolicySharedOverwrite: {
			{"shared", ReasonOverwrite}, {"shared", ReasonOverwrite}, {"exclusive", ReasonHole},
			{"exclusive", ReasonExtending}, {"exclusive", ReasonUnaligned},
		},
	}
	for _, p := range Policies() {
		for i, l := range layouts {
			t.Run(p.String()+"/"+l.name, func(t *testing.T) {
				var mu sync.Mutex
				var got []decision
				hooks := &Hooks{InsideWrite: func(_ context.Context, path, mode, reason string) {
					if path == "f" {
						mu.Lock()
						got = append(got, decision{mode, reason})
						mu.Unlock()
					}
				}}
				s, _ := newTestStore(t, Options{Policy: p, Hooks: hooks})
				ctx := context.Background()
				if err := l.prepare(ctx, s, "f"); err != nil {
					t.Fatal(err)
				}
				mu.Lock()
				got = nil
				mu.Unlock()
				if _, err := s.Write(ctx, "f", l.off, make([]byte, l.len), SyncNone); err != nil {
					t.Fatal(err)
				}
				if len(got) != 1 || got[0] != want[p][i] {
					t.Errorf("got %v, want [%v]", got, want[p][i])
				}
			})
		}
	}
}

// TestWriteLockModeDirectUnaligned: in direct mode an unaligned write below EOF
// always goes exclusive, whatever the policy.
func TestWriteLockModeDirectUnaligned(t *testing.T) {
	written := rangeClass{written: true}
	for _, p := range Policies() {
		mode, reason := writeLockMode(p, IODirect, 8192, 4196, false, written)
		if mode != lockExclusive || reason != ReasonUnaligned {
			t.Errorf("%v: got %v %s, want exclusive %s", p, mode, reason, ReasonUnaligned)
		}
	}
}
