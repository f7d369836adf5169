//go:build linux

package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
)

// Staged files: a file that a door fills before it has a name (a tus
// upload, a WebDAV PUT), kept under StateDir where no path reaches it and
// List does not look, on the same filesystem as the names it will get, so
// that Publish can give it one with rename(2): a reader of the name sees
// the old file or the whole new one, never a part (docs/api.md's
// atomic publish, done by the daemon). A staged file is a file of the
// store like any other while it is written (OpenStaged gives a Handle:
// the same limits, locks, traces and group commit), and its name is the
// door's to choose, unique (a random ID).
//
// Records are small files kept beside staged files for a door's own
// bookkeeping (a tus upload's length and metadata), each replaced whole
// and durably (PutRecord), outside the inode table: they are read and
// written whole, once in a while.

const (
	// stagedDir holds the staged files.
	stagedDir = StateDir + "/staged"
	// recordsDir holds the records.
	recordsDir = StateDir + "/records"
	// MaxStagedNameLen is the longest name of a staged file or a record.
	MaxStagedNameLen = 128
	// MaxRecordLen is the largest record PutRecord takes.
	MaxRecordLen = 64 << 10
)

// validateStagedName checks a staged file's or a record's name: one
// element of letters, digits, '-', '_' and '.', not starting with '.', at
// most MaxStagedNameLen bytes.
func validateStagedName(name string) error {
	if name == "" || len(name) > MaxStagedNameLen {
		return refuseLimit(ErrInvalidPath, "name", MaxStagedNameLen, "staged name %q: want 1 to %d bytes", name, MaxStagedNameLen)
	}
	if name[0] == '.' || strings.IndexFunc(name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.')
	}) >= 0 {
		return refuse(ErrInvalidPath, "name", "staged name %q: want letters, digits, '-', '_' and '.', not starting with '.'", name)
	}
	return nil
}

// OpenStaged opens the staged file name as open says (OpenCreate,
// OpenMustExist: ErrNotFound if there is none, OpenExclusive: ErrExists if
// there is one), as OpenHandle opens a path. Writes through the Handle
// are writes of the store like any other; the file is durable as they and
// Handle.Sync say, its name (in StateDir) with its first sync.
func (s *Store) OpenStaged(ctx context.Context, name string, open OpenMode) (*Handle, error) {
	if err := validateStagedName(name); err != nil {
		return nil, err
	}
	if err := validateOpenMode(open); err != nil {
		return nil, err
	}
	return s.openHandle(ctx, path.Join(stagedDir, name), open)
}

// Publish gives the staged file name the path p: it makes the file
// durable (fsync: its data, size and attributes), then renames it onto p
// as Rename with sync does, replacing the file p names unless noReplace
// (ErrExists then, and nothing changes), creating p's missing parents.
// When it returns nil the file is at p, whole, and survives a crash; a
// reader of p sees the file p named before or this one, never a part of
// it. The staged name is gone: a Handle of it goes on writing to the file
// under its new name.
func (s *Store) Publish(ctx context.Context, name, p string, noReplace bool) error {
	return s.PublishIf(ctx, name, p, noReplace, Precondition{})
}

// PublishIf is Publish under a condition on the file p names, the one the
// staged file would replace (as RenameIf's dst): with it the rename holds
// that file's lock exclusively and checks before it replaces it, and a
// failed check (*GenerationMismatch) leaves p as it was and the staged
// file staged.
func (s *Store) PublishIf(ctx context.Context, name, p string, noReplace bool, dst Precondition) error {
	if err := validateStagedName(name); err != nil {
		return err
	}
	if err := validatePath(p); err != nil {
		return err
	}
	if err := dst.validate(); err != nil {
		return err
	}
	staged := path.Join(stagedDir, name)
	ino, err := s.table.get(ctx, staged, false)
	if err != nil {
		return err
	}
	// The staged name goes now: the directories above it need no sync
	// for it (a file created and published at once, a WebDAV PUT, would
	// sync three), as the rename with sync makes the new name durable.
	ino.pendingDirs.Store(nil)
	s.table.put(ino)
	if err := s.fsyncFile(ctx, staged, SyncFull); err != nil {
		return err
	}
	_, err = s.renameIf(ctx, staged, p, noReplace, true, Precondition{}, dst)
	return err
}

// RemoveStaged removes the staged file name (ErrNotFound if there is
// none), as Delete removes a file: writes to it that started before finish
// first, and a Handle of it fails from then on.
func (s *Store) RemoveStaged(ctx context.Context, name string) error {
	if err := validateStagedName(name); err != nil {
		return err
	}
	return s.deleteIf(ctx, path.Join(stagedDir, name), false, Precondition{})
}

// StagedFile describes a staged file or a record.
type StagedFile struct {
	Name string
	Size int64
	// Ctime is the last change of the file (st_ctime), in nanoseconds
	// since the epoch.
	Ctime int64
}

// Staged lists the staged files, in name order. It reads the directory
// whole: a door keeps few of them, and removes the ones it abandons.
func (s *Store) Staged() ([]StagedFile, error) { return s.listPrivate(stagedDir) }

// Records lists the records, in name order.
func (s *Store) Records() ([]StagedFile, error) { return s.listPrivate(recordsDir) }

// StatStaged describes the staged file name: ErrNotFound if there is
// none.
func (s *Store) StatStaged(name string) (StagedFile, error) {
	if err := validateStagedName(name); err != nil {
		return StagedFile{}, err
	}
	fi, err := s.fsys.Lstat(path.Join(stagedDir, name))
	if err != nil {
		return StagedFile{}, mapOpenErr(name, err)
	}
	return StagedFile{Name: name, Size: fi.Size, Ctime: fi.Ctime}, nil
}

func (s *Store) listPrivate(dir string) ([]StagedFile, error) {
	d, err := s.fsys.OpenDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, listError(dir, err)
	}
	defer d.Close()
	var out []StagedFile
	for {
		names, err := d.Names(listChunk)
		for _, n := range names {
			if validateStagedName(n) != nil {
				continue // not ours: a record's temporary, or left by hand
			}
			fi, err := d.Lstat(n)
			if err != nil || fi.Type != 0 {
				continue
			}
			out = append(out, StagedFile{Name: n, Size: fi.Size, Ctime: fi.Ctime})
		}
		if errors.Is(err, io.EOF) || (err == nil && len(names) == 0) {
			break
		}
		if err != nil {
			return nil, listError(dir, err)
		}
	}
	slices.SortFunc(out, func(a, b StagedFile) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// PutRecord stores data as the record name, replacing a record of that
// name whole: written to a temporary, synced, renamed over it, and the
// directory synced, so that when it returns nil the record survives a
// crash, and a crash at any point leaves the old record or the new one.
// Concurrent PutRecords of one name must be ordered by the caller.
func (s *Store) PutRecord(name string, data []byte) error {
	if err := validateStagedName(name); err != nil {
		return err
	}
	if len(data) > MaxRecordLen {
		return refuseLimit(ErrRequestTooLarge, "data", MaxRecordLen, "record of %d bytes, the limit is %d", len(data), MaxRecordLen)
	}
	if err := s.fsys.MkdirAll(recordsDir, 0o755); err != nil {
		return mapOpenErr(recordsDir, err)
	}
	final := path.Join(recordsDir, name)
	// A leading '.' marks the temporary: no record's name has one.
	tmp := path.Join(recordsDir, "."+name)
	f, err := s.fsys.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return mapOpenErr(tmp, err)
	}
	_, err = f.WriteAt(data, 0)
	if err == nil {
		err = f.Sync(SyncFull)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		if err = s.fsys.Rename(tmp, final, false); err != nil {
			err = nameError("rename "+tmp+" to", final, err)
		}
	} else {
		err = ioError("write", tmp, err, 0)
	}
	if err != nil {
		s.fsys.Remove(tmp)
		return err
	}
	// StateDir itself may be new: its entry in the root too.
	return errors.Join(s.fsys.SyncDir(recordsDir), s.fsys.SyncDir(StateDir), s.fsys.SyncDir("."))
}

// Record returns the record name, ErrNotFound if there is none.
func (s *Store) Record(name string) ([]byte, error) {
	if err := validateStagedName(name); err != nil {
		return nil, err
	}
	b, err := readStateFile(s.fsys, path.Join(recordsDir, name))
	if err != nil {
		return nil, mapOpenErr(name, err)
	}
	return b, nil
}

// RemoveRecord removes the record name; one that does not exist is no
// error. Durable when it returns: nothing, until the next PutRecord.
func (s *Store) RemoveRecord(name string) error {
	if err := validateStagedName(name); err != nil {
		return err
	}
	if err := s.fsys.Remove(path.Join(recordsDir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nameError("delete", name, err)
	}
	return nil
}

// Sync makes everything written through h durable, as Fsync does for a
// path: the data and the size with SyncData, all metadata too with
// SyncFull, in a sync that started after the call, shared with concurrent
// ones.
func (h *Handle) Sync(ctx context.Context, mode SyncMode) error {
	if err := validateFsync(mode); err != nil {
		return err
	}
	if err := h.ino.commit.waitDurable(ctx, mode); err != nil {
		return err
	}
	return removedError(ctx, h.ino, false)
}

// Truncate sets the file's size, as Store.Truncate does for a path: writes
// through h that started before it finish first, and none lands after.
// Durable when it returns: nothing, until a sync.
func (h *Handle) Truncate(ctx context.Context, size int64) error {
	if size < 0 {
		return refuse(ErrInvalidOffset, "size", "size %d is negative", size)
	}
	if size > h.s.opts.MaxFileSize {
		return refuseLimit(ErrFileTooLarge, "size", h.s.opts.MaxFileSize, "size %d, the maximum file size is %d bytes", size, h.s.opts.MaxFileSize)
	}
	held, err := lockInode(ctx, h.ino, lockExclusive, "truncate", ReasonTruncate)
	if err != nil {
		return err
	}
	defer putHolder(held)
	defer h.ino.lock.release(held)
	if h.ino.deleted.Load() {
		return fmt.Errorf("%w: %s", ErrDeleted, h.path)
	}
	if err := waitInflight(ctx, h.ino, ReasonTruncate); err != nil {
		return err
	}
	if err := h.ino.truncate(size); err != nil {
		return ioError("truncate", h.path, err, 0)
	}
	return nil
}
