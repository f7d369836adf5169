//go:build linux

package store

import (
	"errors"
	"io"
	"os"
)

// The store's own state lives in files below StateDir, at the root: the
// append-ID journal (appendjournal.go) and the generations' lease and
// records (generation.go). They go through the FS like the files the
// store serves, so that store/crashfs's images hold them as a power cut
// would leave them.

// readStateFile reads the state file name (below StateDir) whole.
func readStateFile(fsys FS, name string) ([]byte, error) {
	f, err := fsys.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	b := make([]byte, fi.Size)
	n, err := f.ReadAt(b, 0)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return b[:n], err
}
