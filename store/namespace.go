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
	if err := validatePath(name); err != nil {
		return err
	}
	return s.delete(ctx, name, sync)
}

// delete is Delete of a validated name, or of a staged file's
// (RemoveStaged).
func (s *Store) delete(ctx context.Context, name string, sync bool) error {
	ino, h, err := s.lockFile(ctx, name, false, lockExclusive, "delete", ReasonDelete)
	if err != nil {
		return err
	}
	err = s.deleteLocked(ctx, ino, name)
	ino.lock.release(h)
	s.table.put(ino)
	if err != nil || !sync || s.opts.Hooks.broken(func(b *breaks) bool { return b.deleteSkipsDirSync }) {
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
// Renaming a file onto its own name does nothing. A directory on either
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
	if err := validatePath(oldName); err != nil {
		return err
	}
	if err := validatePathArg(newName, "new_path"); err != nil {
		return err
	}
	return s.rename(ctx, oldName, newName, noReplace, sync)
}

// rename is Rename of validated names, or of a staged file's onto a
// validated name (Publish).
func (s *Store) rename(ctx context.Context, oldName, newName string, noReplace, sync bool) error {
	if oldName == newName {
		// rename(2) does nothing here (and RENAME_NOREPLACE would refuse
		// the file its own name): report only whether there is a file.
		ino, err := s.table.get(ctx, oldName, false)
		if err != nil {
			return err
		}
		s.table.put(ino)
		return nil
	}
	// The parents of newName this call made, kept from one attempt to the
	// next and removed, while empty, if the Rename fails.
	var created []string
	for {
		made, err := s.renameOnce(ctx, oldName, newName, noReplace)
		created = append(created, made...)
		if errors.Is(err, errNameMoved) || errors.Is(err, errNameTaken) {
			continue
		}
		if err != nil {
			removeDirs(s.fsys, created)
			return err
		}
		if !sync {
			return nil
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
		if s.opts.Hooks.broken(func(b *breaks) bool { return b.renameSyncsOldDirOnly }) {
			dirs = dirs[:1]
		}
		return s.syncDirs(dirs)
	}
}

// renameOnce looks oldName and newName up, locks their files and renames.
// It returns the directories it created, also when the rename then failed.
// errNameMoved or errNameTaken mean that a name changed before the locks
// were held: nothing was renamed.
func (s *Store) renameOnce(ctx context.Context, oldName, newName string, noReplace bool) ([]string, error) {
	src, err := s.table.get(ctx, oldName, false)
	if err != nil {
		return nil, err
	}
	defer s.table.put(src)
	dst, err := s.table.lookup(ctx, newName)
	if err != nil {
		return nil, err
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
		return nil, err
	}
	defer src.lock.release(hs)
	if hd != nil {
		defer dst.lock.release(hd)
	}

	// Under the locks no name of src or dst moves any more: check that
	// they are still what the lookups found.
	if src.deleted.Load() || (dst != nil && (dst.deleted.Load() || dst.path() != newName)) {
		return nil, errNameMoved
	}
	fi, err := s.fsys.Lstat(oldName)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, s.nameLostLocked(src, oldName)
	case err != nil:
		return nil, mapOpenErr(oldName, err)
	case fi.Type&fs.ModeSymlink != 0:
		return nil, fmt.Errorf("%w: %s is a symbolic link; rename the file it names", ErrInvalidPath, oldName)
	case (fileID{fi.Dev, fi.Ino}) != src.id():
		return nil, s.nameLostLocked(src, oldName)
	}
	if src.path() == newName {
		// oldName is another link to the file newName names: rename(2)
		// leaves both (and so does RENAME_NOREPLACE's caller, refused).
		if noReplace {
			return nil, fmt.Errorf("%w: %s", ErrExists, newName)
		}
		return nil, nil
	}
	if noReplace && dst != nil {
		return nil, fmt.Errorf("%w: %s", ErrExists, newName)
	}

	if err := waitInflight(ctx, src, ReasonRename); err != nil {
		return nil, err
	}
	if dst != nil {
		if err := waitInflight(ctx, dst, ReasonRename); err != nil {
			return nil, err
		}
	}
	created, err := s.parentsFor(newName)
	if err != nil {
		return created, err
	}
	err = s.table.rename(src, dst, oldName, newName, func() error {
		return s.fsys.Rename(oldName, newName, noReplace)
	})
	switch {
	case err == nil, errors.Is(err, errNameTaken):
		return created, err
	case errors.Is(err, fs.ErrNotExist):
		// oldName is still there (checked under the lock): a parent of
		// newName that parentsFor found went away since. Start over.
		return created, errNameMoved
	case noReplace && errors.Is(err, fs.ErrExist):
		// RENAME_NOREPLACE says EEXIST before it looks at what is there:
		// a directory in the way is one, whatever the flag.
		if fi, serr := s.fsys.Lstat(newName); serr == nil && fi.IsDir {
			return created, fmt.Errorf("%w: rename %s to %s", ErrIsDirectory, oldName, newName)
		}
	}
	return created, nameError("rename "+oldName+" to", newName, err)
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
// Preconditions: src.lock is held exclusively.
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
