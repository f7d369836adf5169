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
	// MappedWrite runs after a write's bytes went through the file's
	// memory mapping instead of pwrite(2) (mapped.go).
	MappedWrite func(path string)
	// DurableWrite runs after a synced write was made durable by itself,
	// on the file's O_DIRECT|O_DSYNC descriptor (durable.go).
	DurableWrite func(path string)

	// mapEagerly maps a file at its first overwrite and counts every
	// region hot, so that the store's own tests (export_test.go) reach
	// the mapped path with small files and few writes.
	mapEagerly bool

	// breaks are deliberate breaks of the durability contract, set only
	// by the power-loss tests (export_test.go) to show that their checker
	// catches each; the zero value breaks nothing.
	breaks breaks
}

// breaks break the durability contract on purpose, each in one way, so
// that the power-loss tests can show that their checker catches the break.
// Out of the exported API: only the store's own tests can set them.
type breaks struct {
	// ackFromRunningSync releases a caller of the group commit who arrives
	// while a sync of its file runs with that sync, which started before
	// the caller's write completed and so need not cover it (the caller
	// belongs in the next batch).
	ackFromRunningSync bool
	// skipNewFileDirSync leaves out the directory syncs of a new file's
	// first sync, so that its name is not durable when the sync returns.
	skipNewFileDirSync bool
	// ackUnalignedDirectWriteBack acknowledges an unaligned direct-mode
	// write that asked for a sync once its range is written back
	// (sync_file_range, which makes nothing durable), without a sync.
	ackUnalignedDirectWriteBack bool
	// renameSyncsOldDirOnly makes a Rename with sync fsync only the old
	// name's directory, not the new name's nor those the Rename made, so
	// that a rename between directories is not durable when it returns.
	renameSyncsOldDirOnly bool
	// deleteSkipsDirSync makes a Delete with sync return without its
	// directory's sync.
	deleteSkipsDirSync bool
	// directWriteWithoutDSync opens the descriptor of durable direct
	// writes without O_DSYNC: such a write is acknowledged durable once
	// it reached the device, whose volatile cache nothing flushes.
	directWriteWithoutDSync bool
	// ackAppendUnordered lets an append (under a reserving policy) go on
	// to its sync once its own bytes are written, without waiting for the
	// appends below it: a synced append is then acknowledged with a range
	// below it that no sync covered.
	ackAppendUnordered bool
}

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

// broken reports whether the break pick chooses is on. h may be nil.
func (h *Hooks) broken(pick func(*breaks) bool) bool {
	return h != nil && pick(&h.breaks)
}
