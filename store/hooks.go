//go:build linux

package store

import (
	"context"

	"github.com/filewrite/filewrite/internal/invariants"
)

// Hooks let tests hold an operation at a known point to observe locking
// without timing. nil in production; a nil field is skipped.
type Hooks struct {
	// InsideWrite runs after a write took its lock (or registered in flight,
	// mode "none") and before its data reaches the file.
	InsideWrite func(ctx context.Context, path, mode, reason string)
	// WaitingForSync runs when a caller of a file's group commit starts to
	// wait for a sync that another caller issues (not when it issues the
	// sync itself, nor under FsyncPerCall).
	WaitingForSync func(path string)
	// MappedWrite runs after a write's bytes went through the file's
	// memory mapping instead of pwrite(2) (mapped.go).
	MappedWrite func(path string)
	// DurableWrite runs after a synced write was made durable by itself,
	// on the file's O_DIRECT|O_DSYNC descriptor (durable.go).
	DurableWrite func(path string)

	// mapEagerly counts every region hot, so that a file is mapped at its
	// first overwrite and the store's own tests (export_test.go) reach the
	// mapped path with small files and few writes.
	mapEagerly bool
	// maxMappings, if positive, lowers the bound on the mappings the
	// process's stores hold (mappingBound), so that a test reaches it.
	maxMappings int64

	// breaks are the deliberate breaks of the durability contract that
	// are on, one bit a breakID, set only by the power-loss tests
	// (export_test.go, BrokenHooks) to show that their checker catches
	// each; the zero value breaks nothing. Read only through broken.
	breaks uint32
}

// breakID is a deliberate break of the durability contract: each breaks
// it in one way, so that the power-loss tests can show that their checker
// catches the break. A break exists only in builds with the invariants
// tag (internal/invariants): in any other, broken is the constant false,
// and the code it guards is compiled out. To add one, see
// docs/development.md ("Invariants and deliberate breaks").
type breakID uint8

const (
	// breakAckFromRunningSync releases a caller of the group commit who
	// arrives while a sync of its file runs with that sync, which started
	// before the caller's write completed and so need not cover it (the
	// caller belongs in the next batch).
	breakAckFromRunningSync breakID = iota
	// breakSkipNewFileDirSync leaves out the directory syncs of a new
	// file's first sync, so that its name is not durable when the sync
	// returns.
	breakSkipNewFileDirSync
	// breakAckUnalignedDirectWriteBack acknowledges an unaligned
	// direct-mode write that asked for a sync once its range is written
	// back (sync_file_range, which makes nothing durable), without a sync.
	breakAckUnalignedDirectWriteBack
	// breakRenameSyncsOldDirOnly makes a Rename with sync fsync only the
	// old name's directory, not the new name's nor those the Rename made,
	// so that a rename between directories is not durable when it returns.
	breakRenameSyncsOldDirOnly
	// breakDeleteSkipsDirSync makes a Delete with sync return without its
	// directory's sync.
	breakDeleteSkipsDirSync
	// breakDirectWriteWithoutDSync opens the descriptor of durable direct
	// writes without O_DSYNC: such a write is acknowledged durable once
	// it reached the device, whose volatile cache nothing flushes.
	breakDirectWriteWithoutDSync
	// breakAckAppendUnordered lets an append (under a reserving policy) go
	// on to its sync once its own bytes are written, without waiting for
	// the appends below it: a synced append is then acknowledged with a
	// range below it that no sync covered.
	breakAckAppendUnordered

	// breakCount is not a break: it counts them (each is a bit of
	// Hooks.breaks).
	breakCount
)

// insideWrite calls InsideWrite, if set.
func (h *Hooks) insideWrite(ctx context.Context, ino *inode, mode lockMode, reason string) {
	if h != nil && h.InsideWrite != nil {
		h.InsideWrite(ctx, ino.path(), mode.String(), reason)
	}
}

// mappedWrite calls MappedWrite, if set.
func (h *Hooks) mappedWrite(ino *inode) {
	if h != nil && h.MappedWrite != nil {
		h.MappedWrite(ino.path())
	}
}

// durableWrite calls DurableWrite, if set.
func (h *Hooks) durableWrite(ino *inode) {
	if h != nil && h.DurableWrite != nil {
		h.DurableWrite(ino.path())
	}
}

// broken reports whether the break id is on. h may be nil. Without the
// invariants build tag it is the constant false: the branch it guards is
// compiled out, and so is breakOn.
func (h *Hooks) broken(id breakID) bool {
	return invariants.Enabled && h.breakOn(id)
}

// breakOn is broken's lookup. It is never inlined, so that a binary that
// carries the breaks has a symbol of its name: .ci/run looks for it in
// the daemon built without the tag, and finds none.
//
//go:noinline
func (h *Hooks) breakOn(id breakID) bool {
	return h != nil && h.breaks&(1<<id) != 0
}
