//go:build linux

package store

import "context"

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

	// The fields below break the durability contract on purpose, each in
	// one way, so that the power-loss test can show that its checker
	// catches the break. Never set outside that test.

	// AckFromRunningSync releases a caller of the group commit who arrives
	// while a sync of its file runs with that sync, which started before
	// the caller's write completed and so need not cover it (the caller
	// belongs in the next batch).
	AckFromRunningSync bool
	// SkipNewFileDirSync leaves out the directory syncs of a new file's
	// first sync, so that its name is not durable when the sync returns.
	SkipNewFileDirSync bool
	// AckUnalignedDirectWriteBack acknowledges an unaligned direct-mode
	// write that asked for a sync once its range is written back
	// (sync_file_range, which makes nothing durable), without a sync.
	AckUnalignedDirectWriteBack bool
	// RenameSyncsOldDirOnly makes a Rename with sync fsync only the old
	// name's directory, not the new name's nor those the Rename made, so
	// that a rename between directories is not durable when it returns.
	RenameSyncsOldDirOnly bool
	// DeleteSkipsDirSync makes a Delete with sync return without its
	// directory's sync.
	DeleteSkipsDirSync bool
}

// set reports whether the break pick chooses is on. h may be nil.
func (h *Hooks) set(pick func(*Hooks) bool) bool {
	return h != nil && pick(h)
}
