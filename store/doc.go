// Package store is filewrite's file engine: positional writes, reads,
// truncates, fallocates and syncs of real files below a root directory,
// opened through os.Root, with the Linux kernel's inode-locking policies
// carried into userspace so that many writers can write one file at once.
//
// # Policies
//
// A write of [off, off+len) takes the inode lock (the rwsem) in the mode the
// policy table gives. X is exclusive, S shared, "-" no lock while writing
// (the write registers in flight under the lock, then drops it). EOF is the
// size read atomically (like i_size_read()) and re-checked once the lock is
// held, because it can change in between; if the re-check asks for a
// stronger mode the write starts over exclusively.
//
//	policy               ≤EOF written  ≤EOF unwritten       ≤EOF hole  extending  truncate, punch, zero
//	exclusive            X policy      X policy             X policy   X extending  X, then wait in-flight
//	unlocked-below-eof   - below-eof   - below-eof          - below-eof X extending  X, then wait in-flight
//	shared-written       S overwrite   X unwritten          X hole     X extending  X, then wait in-flight
//	shared-overwrite     S overwrite   S (X unaligned)      X hole     X extending  X, then wait in-flight
//
// The word after each mode is the reason recorded with the decision (traces,
// metrics, /debug/locks). "Unaligned" means the write does not start and end
// on block boundaries. In IODirect mode an unaligned write always takes X,
// reason unaligned: it waits for in-flight writes, goes through the page
// cache and writes that range back before the lock is dropped. Reads take S.
// Fallocate allocate and keep-size take X without waiting for in-flight
// writes: they change no data.
//
// A synced write (SyncData, SyncFull) under the exclusive policy syncs
// before it drops the lock: that policy is the naive baseline, one lock
// around each whole operation. Under every other policy a synced write
// leaves its lock mode (or the in-flight count) first and then joins the
// group commit, so concurrent writers share their syncs.
//
// Applying a write and waiting for its sync are two steps of one path
// (applyWrite, then waitWrites): Write takes both at once, and a Handle
// (a file held open for a stream's life) lets its caller take them apart,
// so that a synced write's bytes reach the file and the writes behind it
// go on while it waits for its group commit. Under the exclusive policy
// the sync is part of the first step, under the lock, and holds them back.
//
// Only unlocked writes are counted in flight: a locked writer already keeps
// truncate out, so the count is skipped where it is not needed.
//
// # Lock order
//
// Lock order:
//
//	inode.lock             (the rwsem: inodeLock, FIFO, abandonable; held
//	                        across the write it protects)
//	  inode.extentMu       (the extent map, like ext4's i_data_sem)
//
//	inodeTable.mu          (the path → inode table and reference counts)
//	  groupCommit.mu       (fsync batching state, to evict, reopen or close
//	                        a file)
//	  extentCache.mu       (the extent maps of files closed for room; a
//	                        leaf, also taken alone when a file opens)
//
//	dirSyncs.mu            (the directories being synced; a leaf)
//	dirSync.mu             (one directory's fsyncs; a leaf, taken alone)
//
// The two trees never nest: get and put take and drop inodeTable.mu before
// the caller touches inode.lock, and /debug/locks snapshots each lock after
// dropping it. inodeTable.mu is never held across I/O but the fstat(2) and
// close(2) of an evicted idle file and the final syncs of Close. The
// evicted file's extent map is copied for the extent cache then without
// extentMu: with no reference left, nothing can change it. inodeLock.mu
// guards only the lock's queue and is a leaf. The in-flight counter is
// begun with inode.lock held (any mode) and ended without it; its waiter
// holds inode.lock exclusively. The same rule makes its span slots (which link a
// waiter's trace to the writes it waits for) safe to read for the waiter.
// The gauges (inodeTable.gauges) sum in-flight counts under inodeTable.mu, but
// those are atomics: no lock nests there. extentMu and groupCommit.mu are
// never held together, and neither across a syscall.
//
// # Durability
//
// Write with SyncNone leaves the data in the page cache (IOBuffered) or the
// device cache (IODirect); SyncData and Fsync(SyncData) make it durable with
// the size (fdatasync); SyncFull and Fsync make all metadata durable too
// (fsync). Synced writes and Fsync go through a group commit (FsyncGroup):
// concurrent callers of one file share a sync that started after each of
// them asked, and no caller ever sleeps to gather company. A failed sync
// makes the next one fail too (Linux reports a writeback error once per
// descriptor), and so does a failed sync_file_range of a direct-mode
// unaligned write, which consumes the error on the descriptor fsync uses.
//
// store/crashfs simulates a power cut below the FS seam, and the
// power-loss test (powerloss_test.go) holds the store to these rules on
// the images it leaves. Hooks holds three deliberate breaks of them, off
// in production, that the test must catch.
package store
