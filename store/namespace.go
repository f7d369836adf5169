//go:build linux

package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
)

// Delete removes the file name. Writes that started before it finish first
// (it holds the inode lock exclusively and waits for writes in flight);
// once it returns, name names no file, an operation that waited for the
// lock meanwhile acts on what name names afterwards, and a later Write
// creates a new file. A directory is ErrIsDirectory. If name is a symlink,
// the symlink is removed, not the file it names.
//
// Durable when it returns: nothing, unless sync, which fsyncs the parent
// directory before returning; otherwise the removal is durable once that
// directory is synced (Fsync of the directory, or a later Delete or Rename
// with sync in it).
func (s *Store) Delete(ctx context.Context, name string, sync bool) error {
	return s.DeleteIf(ctx, name, sync, Precondition{})
}

// DeleteIf is Delete on the condition pre (see Precondition), checked
// with the file's lock held exclusively, after the writes in flight.
func (s *Store) DeleteIf(ctx context.Context, name string, sync bool, pre Precondition) error {
	if err := validatePath(name); err != nil {
		return err
	}
	if err := pre.validate(); err != nil {
		return err
	}
	return s.deleteIf(ctx, name, sync, pre)
}

// deleteIf is DeleteIf of a validated name and condition, or of a staged
// file's (RemoveStaged).
func (s *Store) deleteIf(ctx context.Context, name string, sync bool, pre Precondition) error {
	var ino *inode
	var h *holder
	var err error
	if pre.present() {
		ino, h, _, err = s.lockIf(ctx, name, false, pre, "delete")
	} else {
		ino, h, err = s.lockFile(ctx, name, false, lockExclusive, "delete", ReasonDelete)
	}
	if err != nil {
		return err
	}
	err = s.deleteLocked(ctx, ino, name)
	ino.lock.release(h)
	s.table.put(ino)
	if err != nil || !sync || s.opts.Hooks.broken(breakDeleteSkipsDirSync) {
		return err
	}
	return s.syncDir(path.Dir(name))
}

// deleteLocked unlinks name, which names ino's file (lockFile checked).
//
// Preconditions: ino.lock is held exclusively.
func (s *Store) deleteLocked(ctx context.Context, ino *inode, name string) error {
	if err := waitInflight(ctx, ino, ReasonDelete); err != nil {
		return err
	}
	return s.table.remove(ino, name, func() error {
		if err := s.fsys.Remove(name); err != nil {
			return nameError("delete", name, err)
		}
		return nil
	})
}

// namesFile checks, with stat (FS.Stat or FS.Lstat), that name still names
// ino's file; errNameMoved if it names nothing or another file.
func (s *Store) namesFile(name string, ino *inode, stat func(string) (FileInfo, error)) error {
	fi, err := stat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errNameMoved
	case err != nil:
		return mapOpenErr(name, err)
	case (fileID{fi.Dev, fi.Ino}) != ino.id():
		return errNameMoved
	}
	return nil
}

// Rename gives the file oldName the name newName, atomically (rename(2)):
// a concurrent operation finds the file under one name or the other, and a
// write racing the Rename lands in the file under one of its names, never
// in a file without a name. A file that newName named is replaced (its
// inode forgotten, like Delete), unless noReplace (renameat2's
// RENAME_NOREPLACE): then ErrExists and nothing changes. Writes to either
// file that started before Rename finish first. Missing parents of newName
// are created, and removed again, while empty, if the Rename fails.
// Renaming a file onto its own name does nothing but report whether it
// names a file (ErrNotFound if not), as every other call sees the
// directory: after a Delete of it that returned, or that has unlinked it
// and not yet returned, it names nothing. A directory on either
// side is ErrIsDirectory, and a symlink as oldName ErrInvalidPath: moving a
// relative symlink would change what it names.
//
// Durable when it returns: nothing, unless sync, which fsyncs the old
// name's directory, the new name's, and the parent of every directory up
// the new path that the store made and no sync has made durable yet
// (those this call made among them) before returning, so that the new
// name survives a crash even where the filesystem does not order its
// metadata writes.
func (s *Store) Rename(ctx context.Context, oldName, newName string, noReplace, sync bool) error {
	_, err := s.RenameIf(ctx, oldName, newName, noReplace, sync, Precondition{}, Precondition{})
	return err
}

// RenameIf is Rename on the conditions src, on the file oldName names, and
// dst, on the one newName names (see Precondition; dst's "no file may
// exist" is noReplace's condition, as a *GenerationMismatch), checked with
// both files' locks held exclusively, after their writes in flight. It
// returns the renamed file's size and generation under its new name: a
// file renamed onto a path is a new version there.
func (s *Store) RenameIf(ctx context.Context, oldName, newName string, noReplace, sync bool, src, dst Precondition) (ChangeResult, error) {
	if err := validatePath(oldName); err != nil {
		return ChangeResult{}, err
	}
	if err := validatePathArg(newName, "new_path"); err != nil {
		return ChangeResult{}, err
	}
	for _, pre := range []Precondition{src, dst} {
		if err := pre.validate(); err != nil {
			return ChangeResult{}, err
		}
	}
	return s.renameIf(ctx, oldName, newName, noReplace, sync, src, dst)
}

// renameIf is RenameIf of validated names and conditions, or of a staged
// file's onto a validated name (Publish).
func (s *Store) renameIf(ctx context.Context, oldName, newName string, noReplace, sync bool, src, dst Precondition) (ChangeResult, error) {
	if oldName == newName {
		return s.renameOntoItself(ctx, oldName, src, dst)
	}
	// The parents of newName this call made, kept from one attempt to the
	// next and removed, while empty, if the Rename fails.
	var created []string
	for {
		res, made, err := s.renameOnce(ctx, oldName, newName, noReplace, src, dst)
		created = append(created, made...)
		if errors.Is(err, errNameMoved) || errors.Is(err, errNameTaken) {
			continue
		}
		if err != nil {
			removeDirs(s.fsys, created)
			return ChangeResult{}, err
		}
		if !sync {
			return res, nil
		}
		// The old name's directory, the new name's, and the parent of
		// every directory up the new path that the store made and no
		// sync has covered yet (made by this Rename, or by an earlier
		// Write or Rename without sync): on a filesystem that does not
		// order its metadata writes, such a directory's entry could be
		// lost, and the new name below it with it, though its own
		// directory was synced. From the root down, one at a time: the
		// rename is durable once its two parents are synced, and a crash
		// before that leaves the old name, so by then the directories
		// above the new one must be durable already.
		dirs := append([]string{path.Dir(oldName)}, s.table.dirs.notDurable(newName)...)
		if s.opts.Hooks.broken(breakRenameSyncsOldDirOnly) {
			dirs = dirs[:1]
		}
		return res, s.syncDirs(dirs)
	}
}

// renameOntoItself is Rename of name onto itself. rename(2) does nothing
// then (and RENAME_NOREPLACE would refuse the file its own name), so it
// reports only whether name names a file, as every other call sees the
// directory: it waits for a Delete or Rename of the file that holds its
// lock (the table still knows a deleted file until its Delete is done,
// after its unlink(2)), and asks the directory whether the name reaches
// the file, which a removal from outside the store would have changed.
//
// It changes nothing, so its preconditions are checked with the lock
// shared: both src and dst are on the one file.
func (s *Store) renameOntoItself(ctx context.Context, name string, src, dst Precondition) (ChangeResult, error) {
	for {
		ino, h, err := s.lockFile(ctx, name, false, lockShared, "rename", ReasonRename)
		if errors.Is(err, ErrNotFound) {
			if cerr := errors.Join(src.check(name, 0), dst.check(name, 0)); cerr != nil {
				return ChangeResult{}, cerr
			}
		}
		if err != nil {
			return ChangeResult{}, err
		}
		res := ChangeResult{Size: ino.size.Load(), Generation: ino.gen.Load()}
		err = s.namesFile(name, ino, s.fsys.Stat)
		if errors.Is(err, errNameMoved) {
			err = s.nameLostLocked(ino, name)
		}
		if err == nil {
			err = errors.Join(src.check(name, res.Generation), dst.check(name, res.Generation))
		}
		ino.lock.release(h)
		s.table.put(ino)
		if !errors.Is(err, errNameMoved) {
			return res, err
		}
	}
}

// renameOnce looks oldName and newName up, locks their files, checks the
// preconditions srcPre and dstPre, and renames. It returns the renamed
// file's size and generation, and the directories it created, also when
// the rename then failed. errNameMoved or errNameTaken mean that a name
// changed before the locks were held: nothing was renamed.
func (s *Store) renameOnce(ctx context.Context, oldName, newName string, noReplace bool, srcPre, dstPre Precondition) (ChangeResult, []string, error) {
	src, err := s.table.get(ctx, oldName, false)
	if errors.Is(err, ErrNotFound) {
		if cerr := srcPre.check(oldName, 0); cerr != nil {
			return ChangeResult{}, nil, cerr
		}
	}
	if err != nil {
		return ChangeResult{}, nil, err
	}
	defer s.table.put(src)
	// A precondition on newName needs its file's generation: open it if
	// the table has not.
	var dst *inode
	if dstPre.present() {
		dst, err = s.table.get(ctx, newName, false)
		if errors.Is(err, ErrNotFound) {
			dst, err = nil, nil
		}
	} else {
		dst, err = s.table.lookup(ctx, newName)
	}
	if err != nil {
		return ChangeResult{}, nil, err
	}
	if dst != nil {
		defer s.table.put(dst)
		if dst == src {
			// Both names lead to one file the table knows by newName:
			// oldName is an alias, or src moved there meanwhile.
			dst = nil
		}
	}
	hs, hd, err := s.lockPair(ctx, src, dst, "rename", ReasonRename)
	if err != nil {
		return ChangeResult{}, nil, err
	}
	defer src.lock.release(hs)
	if hd != nil {
		defer dst.lock.release(hd)
	}

	// Under the locks no name of src or dst moves any more: check that
	// they are still what the lookups found.
	if src.deleted.Load() || (dst != nil && (dst.deleted.Load() || dst.path() != newName)) {
		return ChangeResult{}, nil, errNameMoved
	}
	fi, err := s.fsys.Lstat(oldName)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return ChangeResult{}, nil, s.nameLostLocked(src, oldName)
	case err != nil:
		return ChangeResult{}, nil, mapOpenErr(oldName, err)
	case fi.Type&fs.ModeSymlink != 0:
		return ChangeResult{}, nil, fmt.Errorf("%w: %s is a symbolic link; rename the file it names", ErrInvalidPath, oldName)
	case (fileID{fi.Dev, fi.Ino}) != src.id():
		return ChangeResult{}, nil, s.nameLostLocked(src, oldName)
	}

	// oldName may be another link to the file newName names: rename(2)
	// leaves both then (and so does RENAME_NOREPLACE's caller, refused).
	alias := src.path() == newName
	pre := srcPre.present() || dstPre.present()
	if noReplace && (alias || dst != nil) {
		return ChangeResult{}, nil, fmt.Errorf("%w: %s", ErrExists, newName)
	}
	if alias && !pre {
		return ChangeResult{Size: src.size.Load(), Generation: src.gen.Load()}, nil, nil
	}

	if err := waitInflight(ctx, src, ReasonRename); err != nil {
		return ChangeResult{}, nil, err
	}
	if dst != nil {
		if err := waitInflight(ctx, dst, ReasonRename); err != nil {
			return ChangeResult{}, nil, err
		}
	}
	if pre {
		// With no write in flight to either file.
		dstGen := int64(0)
		switch {
		case alias:
			dstGen = src.gen.Load()
		case dst != nil:
			dstGen = dst.gen.Load()
		}
		if err := errors.Join(srcPre.check(oldName, src.gen.Load()), dstPre.check(newName, dstGen)); err != nil {
			return ChangeResult{}, nil, err
		}
	}
	if alias {
		return ChangeResult{Size: src.size.Load(), Generation: src.gen.Load()}, nil, nil
	}

	created, err := s.parentsFor(newName)
	if err != nil {
		return ChangeResult{}, created, err
	}
	err = s.table.rename(src, dst, oldName, newName, func() error {
		return s.fsys.Rename(oldName, newName, noReplace)
	})
	switch {
	case err == nil:
		// A new version of the path newName: the file moves on.
		return ChangeResult{Size: src.size.Load(), Generation: src.bump()}, created, nil
	case errors.Is(err, errNameTaken):
		return ChangeResult{}, created, err
	case errors.Is(err, fs.ErrNotExist):
		// oldName is still there (checked under the lock): a parent of
		// newName that parentsFor found went away since. Start over.
		return ChangeResult{}, created, errNameMoved
	case noReplace && errors.Is(err, fs.ErrExist):
		// RENAME_NOREPLACE says EEXIST before it looks at what is there:
		// a directory in the way is one, whatever the flag.
		if fi, serr := s.fsys.Lstat(newName); serr == nil && fi.IsDir {
			return ChangeResult{}, created, fmt.Errorf("%w: rename %s to %s", ErrIsDirectory, oldName, newName)
		}
	}
	return ChangeResult{}, created, nameError("rename "+oldName+" to", newName, err)
}

// nameLostLocked is renameOnce's answer when oldName, by which the table
// found src, no longer names src's file once src's lock is held. If the
// table still knows src by oldName, no Rename or Delete of the store can
// have changed that name (they hold src's lock to), so the change came
// from outside (rm, mv): src is marked unlinked, like a file a sync or
// Stat found without a name, and the next lookup of oldName forgets it
// and reaches what the name names now, or nothing (ErrNotFound). Without
// that mark the table would hand src out again for oldName, and Rename
// would retry for ever. Otherwise oldName was another name of src's file
// (an alias), or the store moved src while this Rename waited for its
// lock: oldName is looked up afresh anyway.
//
// Preconditions: src.lock is held, in any mode (a Rename or Delete, which
// changes names, holds it exclusively).
func (s *Store) nameLostLocked(src *inode, oldName string) error {
	if src.path() == oldName {
		src.unlinked.Store(true)
	}
	return errNameMoved
}

// lockPair takes a's lock and, if b is not nil, b's, both exclusively for
// op, in the order of their file IDs (doc.go), so that two Renames between
// the same two files cannot each hold one lock and wait for the other.
// Release them with lock.release.
func (s *Store) lockPair(ctx context.Context, a, b *inode, op, reason string) (ha, hb *holder, err error) {
	if b == nil {
		ha, err = lockInode(ctx, a, lockExclusive, op, reason)
		return ha, nil, err
	}
	first, second := a, b
	if b.id().less(a.id()) {
		first, second = b, a
	}
	h1, err := lockInode(ctx, first, lockExclusive, op, reason)
	if err != nil {
		return nil, nil, err
	}
	h2, err := lockInode(ctx, second, lockExclusive, op, reason)
	if err != nil {
		first.lock.release(h1)
		return nil, nil, err
	}
	if first == a {
		return h1, h2, nil
	}
	return h2, h1, nil
}

// parentsFor makes the missing directories above name, like MkdirAll,
// and returns those it made, parents first (also on error), so that a
// failed request can take them back and a synced one sync them.
func (s *Store) parentsFor(name string) ([]string, error) {
	dir := path.Dir(name)
	if dir == "." {
		return nil, nil
	}
	fi, err := s.fsys.Stat(dir)
	switch {
	case err == nil && fi.IsDir:
		return nil, nil // the common case: one call
	case err == nil:
		return nil, fmt.Errorf("%w: %s is not a directory", ErrInvalidPath, dir)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, mapOpenErr(dir, err)
	}
	made, err := makeParents(s.fsys, s.table.dirs, name)
	if err != nil {
		return made, mapOpenErr(dir, err)
	}
	return made, nil
}

// syncDir is fsync(2) of directory name: its entries' creations, removals
// and renames are durable when it returns nil.
func (s *Store) syncDir(name string) error {
	// Through the table's directory group commit: an fsync of name that
	// starts after this stamp, taken after the caller's change returned,
	// covers the change, and concurrent callers share one.
	if err := s.table.dirs.sync(name, s.table.dirs.now()); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: directory %s", ErrNotFound, name)
		}
		return fmt.Errorf("%w: sync directory %s: %w", ErrSyncFailed, name, err)
	}
	return nil
}

// syncDirs syncs each of dirs once.
func (s *Store) syncDirs(dirs []string) error {
	done := make(map[string]bool, len(dirs))
	for _, dir := range dirs {
		if done[dir] {
			continue
		}
		done[dir] = true
		if err := s.syncDir(dir); err != nil {
			return err
		}
	}
	return nil
}
