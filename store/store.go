package store

import (
	"context"
	"errors"
)

// Store is the file engine. All methods are safe for concurrent use.
type Store struct {
	opts Options
}

var errTODO = errors.New("not implemented yet")

// Open opens a store over fsys (see OpenOSFS) with opts.
func Open(fsys FS, opts Options) (*Store, error) {
	return &Store{opts: opts.withDefaults()}, nil
}

// Options returns the options in force, defaults filled in.
func (s *Store) Options() Options { return s.opts }

// Close syncs and closes every open file. Operations after Close fail with
// ErrClosed.
func (s *Store) Close() error { return nil }

// SyncAll syncs every open file (fsync).
func (s *Store) SyncAll(ctx context.Context) error { return nil }

// Write writes data at off. Durable on return: see SyncMode.
func (s *Store) Write(ctx context.Context, path string, off int64, data []byte, sync SyncMode) (WriteResult, error) {
	return WriteResult{}, errTODO
}

// Read reads up to length bytes at off; short at EOF.
func (s *Store) Read(ctx context.Context, path string, off, length int64) ([]byte, error) {
	return nil, errTODO
}

// Fsync makes everything written to path before the call durable
// (fdatasync when dataOnly, else fsync).
func (s *Store) Fsync(ctx context.Context, path string, dataOnly bool) error { return errTODO }

// Truncate sets the size of path.
func (s *Store) Truncate(ctx context.Context, path string, size int64) error { return errTODO }

// Fallocate allocates, punches or zeroes a range; it returns the size after.
func (s *Store) Fallocate(ctx context.Context, path string, mode FallocateMode, off, length int64) (int64, error) {
	return 0, errTODO
}

// Stat describes path.
func (s *Store) Stat(ctx context.Context, path string) (FileStat, error) { return FileStat{}, errTODO }

// Extents lists the hole, unwritten and written ranges of path within
// [off, off+length); length 0 means to EOF.
func (s *Store) Extents(ctx context.Context, path string, off, length int64) ([]Extent, error) {
	return nil, errTODO
}
