//go:build linux

package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"syscall"
)

// Directories as names of their own (WebDAV's collections). Everywhere
// else the store makes the directories a file needs and leaves them; these
// make and remove one on request.

// ErrNotEmpty is returned by RemoveDir for a directory that has entries.
var ErrNotEmpty = errors.New("directory not empty")

// Mkdir makes the directory p. Its parent must exist (ErrNotFound
// otherwise), and p must name nothing yet (ErrExists, whatever it names).
// Durable when it returns: the parent directory is synced, so that the
// new directory survives a crash.
func (s *Store) Mkdir(ctx context.Context, p string) error {
	if err := validatePath(p); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	done := s.table.dirs.making(p)
	err := s.fsys.Mkdir(p, 0o755)
	done(err == nil)
	switch {
	case err == nil:
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("%w: %s", ErrExists, p)
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: the parent of %s", ErrNotFound, p)
	default:
		return mapOpenErr(p, err)
	}
	return s.syncDir(path.Dir(p))
}

// RemoveDir removes the empty directory p: ErrNotEmpty if it has entries,
// ErrNotFound if it does not exist, ErrInvalidPath if it is not a
// directory. Durable when it returns: nothing, unless sync, which syncs
// the parent before returning.
func (s *Store) RemoveDir(ctx context.Context, p string, sync bool) error {
	if err := validatePath(p); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	fi, err := s.fsys.Lstat(p)
	switch {
	case err != nil:
		return mapOpenErr(p, err)
	case !fi.IsDir:
		return fmt.Errorf("%w: %s is not a directory", ErrInvalidPath, p)
	}
	if err := s.fsys.Remove(p); err != nil {
		if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("%w: %s", ErrNotEmpty, p)
		}
		return nameError("remove directory", p, err)
	}
	if !sync {
		return nil
	}
	return s.syncDir(path.Dir(p))
}

// DirInfo is what Dir says of a directory.
type DirInfo struct {
	// ChangeTime is st_ctime in nanoseconds since the epoch.
	ChangeTime int64
}

// Dir describes the directory p ("" is the root): ErrNotFound if there is
// none, ErrInvalidPath if p names something else. It takes no lock.
func (s *Store) Dir(ctx context.Context, p string) (DirInfo, error) {
	name := p
	if p == "" {
		name = "."
	} else if err := validatePath(p); err != nil {
		return DirInfo{}, err
	}
	if err := ctx.Err(); err != nil {
		return DirInfo{}, err
	}
	fi, err := s.fsys.Stat(name)
	switch {
	case err != nil:
		return DirInfo{}, mapOpenErr(p, err)
	case !fi.IsDir:
		return DirInfo{}, fmt.Errorf("%w: %s is not a directory", ErrInvalidPath, p)
	}
	return DirInfo{ChangeTime: fi.Ctime}, nil
}
