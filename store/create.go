//go:build linux

package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"syscall"
)

// Creating a file with the directories above it, and taking them back when
// the request that made them fails: a refused request changes nothing.
//
// A directory is taken back only by the create that made it (its mkdir(2)
// succeeded), and only while it is empty (rmdir(2) refuses otherwise), so a
// create that failed never removes what another one put there. It may
// remove a directory that another create found and is about to create its
// file in; that create then gets ENOENT and starts over, making the
// directory itself.

// openFlags open every descriptor of the store. O_NONBLOCK, because the
// path may name a FIFO or a device whose open(2) waits (for a peer, for a
// carrier), and the kind of file is only known, from fstat(2), once it is
// open. The regular files the store keeps stay as opened: O_NONBLOCK "has
// no effect for regular files and block devices" (open(2)).
const openFlags = os.O_RDWR | syscall.O_NONBLOCK

// createAttempts bounds how often a create starts over after a directory
// it made or found vanished. Each time, a failed create in that directory
// took it back, so it takes as many concurrent failures to use them up.
const createAttempts = 16

// creation is what createFile made, for undo.
type creation struct {
	name string
	file bool     // name was created here (O_EXCL), not found
	dirs []string // directories made here, parents first
}

// undo removes what c made: the file, then each directory, deepest first,
// while it is empty. A directory that is not empty is in use by another
// file, and so are the ones above it.
func (c creation) undo(fsys FS) {
	if c.file {
		if err := fsys.Remove(c.name); err != nil {
			return
		}
	}
	removeDirs(fsys, c.dirs)
}

// createFile opens name with openFlags, creating it, and the directories
// above it that are missing, if it does not exist; dirs learns of the
// directories it makes (makeParents). The caller undoes the creation if it
// refuses the file after all.
func createFile(fsys FS, dirs *dirSyncs, name string) (File, creation, error) {
	for attempt := 1; ; attempt++ {
		// Most creates are of files in a directory that exists: try that
		// first, without a mkdir(2) for each directory above.
		f, made, err := createOrOpen(fsys, name)
		if err == nil || !errors.Is(err, fs.ErrNotExist) {
			return f, creation{name: name, file: made}, err
		}
		madeDirs, err := makeParents(fsys, dirs, name)
		if err == nil {
			f, made, err = createOrOpen(fsys, name)
			if err == nil {
				return f, creation{name: name, file: made, dirs: madeDirs}, nil
			}
		}
		removeDirs(fsys, madeDirs)
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, creation{}, err
		}
		if attempt == createAttempts {
			// Every directory of the path was there or made, and still
			// nothing could be created: a symlink leads to a directory
			// that does not exist. os.Root follows it, but the store makes
			// only the directories of the path it was given.
			return nil, creation{}, fmt.Errorf("%w: %s leads through a symlink to a directory that does not exist; only the directories of the path as given are created", ErrInvalidPath, name)
		}
		// A directory on the way was taken back by a create that failed
		// (see above): start over.
	}
}

// createOrOpen creates name, or opens it if it exists, and reports whether
// it created it. O_EXCL tells which, but never follows a symlink in the
// last element: a symlink whose target does not exist is followed without
// it, as open(2) would, creating the target if its directory exists.
func createOrOpen(fsys FS, name string) (File, bool, error) {
	f, err := fsys.OpenFile(name, openFlags|os.O_CREATE|os.O_EXCL, 0o644)
	if err == nil {
		return f, true, nil
	}
	if !errors.Is(err, fs.ErrExist) {
		return nil, false, err
	}
	// It exists: created meanwhile, or a symlink.
	f, err = fsys.OpenFile(name, openFlags, 0)
	if errors.Is(err, fs.ErrNotExist) {
		f, err = fsys.OpenFile(name, openFlags|os.O_CREATE, 0o644)
	}
	return f, false, err
}

// makeParents makes the directories above name that are missing, parents
// first, and returns those it made: also when it fails, so that the caller
// can take them back. dirs counts each as not durable from
// before its mkdir(2) (dirSyncs.making), so that no one finds it on disk
// and takes it for durable.
func makeParents(fsys FS, dirs *dirSyncs, name string) ([]string, error) {
	var above []string
	for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
		above = append(above, dir)
	}
	var made []string
	for i := len(above) - 1; i >= 0; i-- {
		done := dirs.making(above[i])
		err := fsys.Mkdir(above[i], 0o755)
		done(err == nil)
		switch {
		case err == nil:
			made = append(made, above[i])
		case errors.Is(err, fs.ErrExist):
			// A directory, a symlink to one, or something else, which the
			// next mkdir or the open finds out (ENOTDIR).
		default:
			return made, err
		}
	}
	return made, nil
}

// removeDirs removes dirs, deepest first, until one is not empty.
func removeDirs(fsys FS, dirs []string) {
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := fsys.Remove(dirs[i]); err != nil {
			return
		}
	}
}
