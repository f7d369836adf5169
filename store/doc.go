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
// cache and writes that range back before the lock is dropped. An
// extending write, once it holds X, waits for in-flight writes too (like
// ext4's inode_dio_wait() before an extending write): a write in flight
// that read the size before the extension was stored but landed its bytes
// after the extension's would be ordered both before and after it, by its
// returned size and by its bytes. Reads take S.
// Fallocate allocate and keep-size take X without waiting for in-flight
// writes when they stay below EOF: they change no data. Past EOF they wait,
// for appends in flight reserve ranges there.
//
// # Appends
//
//	policy               append
//	exclusive            X policy (the whole append, its sync too)
//	every other          S append to reserve, then - (counted in flight)
//
// An append reserves [end, end+len) on the file's reserved end
// (appendQueue, in append.go) while it holds the lock shared, registers in
// flight, drops the lock and writes its bytes. The size that readers see
// (inode.size, the published end) advances over completed appends only, in
// offset order: the append that completes the lowest pending range
// publishes it and every completed one above it. Each append returns once
// its range is published, so a Read after it sees its bytes. Truncate,
// Fallocate past EOF and extending writes hold X and wait for in-flight
// writes, so they never run while a range is reserved; the next append
// starts from the end they leave. An append that fails after reserving
// fails those above it too (ErrAppendAborted), the size never passes its
// offset, and the last of them truncates the file back to it before
// leaving the in-flight count; new appends wait for that. A synced append
// joins the group commit after its range is published, so its sync covers
// every append below it. Under exclusive the lock is held throughout, the
// baseline that the experiment measures the reservation against.
//
// An append with an ID is remembered (appendIDWindow, appendids.go) and written to the
// append-ID journal under StateDir (appendjournal.go) once its range is
// reserved and before its bytes are written, so that a store opened after
// its process was killed replays a resend of it. A record loaded from the
// journal is checked before it is replayed: its range must be within the
// file and hold bytes of its CRC-32C, or its bytes never landed and the
// resend appends afresh.
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
// truncate and extending writes out, so the count is skipped where it is
// not needed.
//
// # Names
//
// The table knows each open file by one path. Delete and Rename hold the
// file's inode lock exclusively (Rename: both files') and wait for writes
// in flight, under every policy, like truncate. Rename re-keys the inode;
// Delete, and a Rename over a file, mark it deleted and the table forgets
// it. An operation that found the inode by a path and then waited for its
// lock checks, once it holds it, that the path still names the file
// (checkNamed), and otherwise looks the path up again: acting on the file
// under its new name, or on a deleted one, would be acting after the
// Rename or Delete on what the path named before it, which no order of the
// calls explains. Stat and Extents, which take no lock, check after they
// read. A Handle, which holds the inode rather than a path, follows renames
// and fails with ErrDeleted once the file is deleted.
//
// What the table keeps of a closed file apart from its inode (its extent
// cache entry, a failed sync, directories it owes a sync) goes with its
// last name: Delete opens the file first and so takes it all back, and a
// Rename over a file the table had closed drops it by the inode number
// lstat(2) gave while the new name was reserved. The kernel may give that
// number to the next file created, which must not inherit any of it. A
// Rename of a created file whose directories are still pending adds to
// them the directories above the new name, so that its first sync makes
// the name it has then durable: the create's entry is in the old
// directory, and a rename is durable once both its directories are.
//
// A Write, Truncate or Fallocate that creates its file holds the new
// inode's lock, exclusively, from before anyone else can reach the inode
// (getOrCreate), and Stat and Extents lock while it does: to the store's
// callers a file appears with its first operation done, never empty.
//
// # Generations
//
// Every file has a generation (generation.go) that moves with every
// mutation the store acknowledges, through every face: a write (one atomic
// add, made while it still holds its lock mode or is counted in flight,
// after its bytes are in), an append (when its range is published, while
// it is counted in flight), a Truncate, Fallocate or Rename onto the path
// (under the exclusive lock). A mutation with a Precondition
// (precondition.go) takes the inode lock exclusively, whatever the policy,
// waits for writes in flight, and checks the generation before it
// changes anything, so no acknowledged mutation lands between the check
// and the change; without one it pays nothing more. Digest (digest.go)
// reads without the lock and then checks, holding it exclusively after
// the writes in flight, that the generation did not move meanwhile: a
// checksum is of one generation, and is kept by it.
//
// # Lock order
//
// This is the one statement of the lock order; docs/design.md says why it
// is this one. Lock order:
//
//	inode.lock               (the rwsem: inodeLock, FIFO, abandonable; held
//	                          across the write it protects)
//	  inode.lock             (of a second file: Rename, both exclusive, and
//	                          Handle.CopyFrom, the destination exclusive and
//	                          the source shared; the lower file ID (dev, ino)
//	                          first)
//	    inodeTable.mu        (Delete and Rename, to forget or re-key inodes)
//	  inode.extentMu         (the extent map, like ext4's i_data_sem)
//	  inodeMap.mu            (an inode's mappings, mapped.go: making one,
//	                          held across its mmap(2) and mincore(2), or
//	                          its heat, by a writer holding inode.lock or
//	                          counted in flight; taking the retired ones to
//	                          unmap, by a holder of inode.lock exclusively
//	                          with no write in flight (waitInflight), and
//	                          all of them when the inode closes, also
//	                          under inodeTable.mu; never held across
//	                          munmap(2); a leaf)
//	  durableState.openMu    (opening a file's O_DIRECT|O_DSYNC descriptor,
//	                          durable.go: held across that open(2) and
//	                          fstat(2) by a writer holding inode.lock shared
//	                          or counted in flight; a leaf)
//	  aioRing.mu             (the writes in OSFS's AIO ring, aio.go: taken
//	                          by a durable direct write around its
//	                          io_submit(2), and by the ring's reaper;
//	                          never held across a syscall; a leaf)
//	  genClock.mu            (extending the generations' lease, held across
//	                          its write and syncs: by a mutation whose
//	                          generation starts a fresh span (bump),
//	                          holding inode.lock or counted in flight, and
//	                          by an open, alone; a leaf)
//	  appendQueue.mu         (an inode's reservations; a leaf, taken with
//	                          inode.lock shared to reserve, and without any
//	                          lock to publish; never across I/O)
//	  appendIDWindow.mu      (remembered append IDs; a leaf, also taken
//	                          alone; under inode.lock where an exclusive
//	                          append reserves)
//	  appendJournal.rotateMu (creating and removing the append-ID journal's
//	                          generations, and its Close; held across that
//	                          I/O; under inode.lock by an exclusive append
//	                          whose record opens the journal or fills a
//	                          generation, also taken alone)
//	    appendJournal.mu     (the current generation's offsets; a leaf,
//	                          never held across I/O)
//
//	inodeTable.mu          (the path → inode table and reference counts)
//	  groupCommit.mu       (fsync batching state, to evict, reopen or close
//	                        a file)
//	  inodeMap.mu          (unmapping a file closed under the table lock:
//	                        see above)
//	  extentCache.mu       (the extent maps of files closed for room; a
//	                        leaf, also taken alone when a file opens)
//	  genRecords.mu        (the generations of files closed for room or
//	                        by Close; a leaf, also taken alone when a file
//	                        opens and by Close)
//
//	dirSyncs.mu            (the directories being synced, and those made
//	                        and not yet durable; a leaf)
//	dirSync.mu             (one directory's fsyncs; a leaf, taken alone)
//	unlistedNames.mu       (names List left out and reported; a leaf)
//	digestCache.mu         (the checksums Digest computed, by generation;
//	                        a leaf, taken alone)
//
// Nothing waits for an inode lock while holding inodeTable.mu: get and put
// take and drop it before the caller touches inode.lock, and /debug/locks
// snapshots each lock after dropping it. Only Delete and Rename take
// inodeTable.mu under inode locks, to forget a deleted file's inode or to
// re-key a renamed one once the unlink(2) or rename(2) is done. While
// rename(2) runs, Rename reserves the new name in the table (an inode that
// is never ready, like one being opened), in place of the inode of the
// file it replaces: a get of that name waits for it holding no lock, and
// Rename waits for nothing but the syscall meanwhile. So no one reaches
// the renamed file by its new name before the table has re-keyed it,
// which also takes its old name away.
// Rename's two inode locks, and CopyFrom's, are taken in file ID order: the IDs of open
// inodes are distinct (the kernel does not reuse an inode number while a
// descriptor holds the file) and never change. A file's creator takes its
// inode lock before the inode is ready (getOrCreate), when no one else can
// wait for it. inodeTable.mu is never held across I/O but the fstat(2) of
// an idle file evicted for room, the close(2) of a file left without a name
// or of an alias's descriptors, and the final syncs of Close (table.go); an
// evicted file is closed once the table has dropped it. The evicted file's
// extent map is offered to the extent cache without extentMu: with no
// reference left, nothing can change it. inodeLock.mu
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
// them asked, and no caller ever sleeps to gather company. With
// SyncedWritesDirect an aligned write below EOF that asks for SyncData,
// to a file that owes no sync (every change to it covered by a sync that
// succeeded) and whose last sync did not fail, is instead written through
// an O_DIRECT|O_DSYNC descriptor, durable when it returns, and leaves the
// file owing nothing (durable.go): a synced write always makes durable
// what was written before it too. A failed sync
// makes the next one fail too (Linux reports a writeback error once per
// descriptor), and so does a failed sync_file_range of a direct-mode
// unaligned write, which consumes the error on the descriptor fsync uses.
// An acknowledged synced append has every append below it complete and
// synced. After a crash the size comes from the file: a non-durable
// append may be gone, or read as zeros where a lower one had not reached
// the disk when a higher one's blocks did. The append-ID journal is
// written without a sync, and synced only by Close: a killed process
// loses none of it (the page cache keeps it), a power cut may lose the
// records since the last Close, and then a resend of such an append lands
// again. A record that outlived its data is caught by the check of its
// bytes.
// Delete and Rename change directory entries: durable once the directory
// is synced (their sync flag, or Fsync of the directory). Rename's sync
// flag also syncs, root first, the parent of each directory up the new
// name's path that the store made and no sync has covered yet
// (dirSyncs.made): on a filesystem that does not order its metadata
// writes the new name would be lost with such a directory. Close syncs
// those parents, so that a store opened later may take every directory
// it did not make as durable.
//
// A sync that finds its file without a name (fstat(2) says st_nlink 0)
// fails with ErrFileRemoved only if the name went from outside the store.
// A Delete, or a Rename over the file, through the store may unlink it
// while a synced write or an Fsync that it raced still waits for its
// sync; that caller came first in one order of the calls and succeeds. To
// tell the two apart the sync takes the inode lock shared, holding no
// other, after the Delete that holds it exclusively has marked the inode
// deleted (removedError). A sync, a Stat or a mapped write's probe that
// finds the file shorter than the store's size (cut from outside, or a
// Truncate in the middle of its ftruncate) takes the inode lock
// exclusively, holding no other, and waits for writes in flight before it
// believes it (checkCut, cut.go).
//
// store/crashfs simulates a power cut below the FS seam, and the
// power-loss tests hold the store to these rules on the images it leaves:
// powerloss_test.go for data, powerloss_append_test.go for appends,
// powerloss_names_test.go for Rename and
// Delete (a cut before each FS call they make, and every image of each
// cut). Deliberate breaks of them (hooks.go, breakID), compiled in only
// with the invariants build tag and set only by those tests, are what the
// tests must catch; a production build has none.
package store
