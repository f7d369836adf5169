//go:build linux

package store

import (
	"context"
	"os"
	"testing"

	"github.com/filewrite/filewrite/internal/invariants"
)

// What the external tests (package store_test, which import store/faultfs
// and so cannot live in package store) need of the internals.

// FiemapExtents is what FIEMAP, after writing back dirty pages
// (FIEMAP_FLAG_SYNC), says of the file at osPath, listed the way
// Store.Extents lists [off, off+length) with blocks of blockSize.
func FiemapExtents(osPath string, blockSize, off, length int64) ([]Extent, error) {
	f, err := os.Open(osPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m, err := readFiemap(f.Fd(), blockSize)
	if err != nil {
		return nil, err
	}
	return m.extents(off, length), nil
}

// PendingSyncCallers is how many callers wait in the group-commit batch of
// path that has not started yet: a test waits for it to know that callers
// have queued behind a running sync.
func PendingSyncCallers(s *Store, path string) (int, error) {
	ino, err := s.table.get(context.Background(), path, false)
	if err != nil {
		return 0, err
	}
	defer s.table.put(ino)
	ino.commit.mu.Lock()
	defer ino.commit.mu.Unlock()
	if ino.commit.pending == nil {
		return 0, nil
	}
	return ino.commit.pending.callers, nil
}

// The deliberate breaks of the durability contract (hooks.go, breakID),
// for the power-loss tests to show that their checker catches each.
const (
	BreakAckFromRunningSync          = breakAckFromRunningSync
	BreakSkipNewFileDirSync          = breakSkipNewFileDirSync
	BreakAckUnalignedDirectWriteBack = breakAckUnalignedDirectWriteBack
	BreakRenameSyncsOldDirOnly       = breakRenameSyncsOldDirOnly
	BreakDeleteSkipsDirSync          = breakDeleteSkipsDirSync
	BreakDirectWriteWithoutDSync     = breakDirectWriteWithoutDSync
	BreakAckAppendUnordered          = breakAckAppendUnordered
)

// BrokenHooks are Hooks with the breaks on and nothing else. The breaks
// are compiled in only with the invariants build tag: without it,
// BrokenHooks skips t, saying so.
func BrokenHooks(t testing.TB, on ...breakID) *Hooks {
	t.Helper()
	if !invariants.Enabled {
		t.Skip("this test needs the deliberate durability breaks, compiled in only with -tags invariants (docs/development.md)")
	}
	h := &Hooks{}
	for _, id := range on {
		h.breaks |= 1 << id
	}
	return h
}

// SyncAll is s.syncAll, for the external tests.
func SyncAll(ctx context.Context, s *Store) error { return s.syncAll(ctx) }
