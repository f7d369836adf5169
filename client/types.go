package client

import (
	"fmt"

	"google.golang.org/grpc/codes"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// SyncMode is the durability a write asks for, as in the daemon's
// durability contract.
type SyncMode int32

const (
	// SyncNone: nothing is durable when the write's ack arrives; every
	// later read sees the bytes.
	SyncNone SyncMode = iota
	// SyncData: the bytes and the size needed to read them are durable
	// when the ack arrives (fdatasync, like O_DSYNC or FUA).
	SyncData
	// SyncFull: the bytes and all of the file's metadata are durable when
	// the ack arrives (fsync, like O_SYNC).
	SyncFull
)

func (m SyncMode) String() string {
	switch m {
	case SyncNone:
		return "none"
	case SyncData:
		return "data"
	case SyncFull:
		return "full"
	}
	return fmt.Sprintf("SyncMode(%d)", int32(m))
}

func (m SyncMode) proto() filewritev1.SyncMode {
	switch m {
	case SyncData:
		return filewritev1.SyncMode_SYNC_MODE_DATA
	case SyncFull:
		return filewritev1.SyncMode_SYNC_MODE_FULL
	case SyncNone:
		return filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED
	}
	return filewritev1.SyncMode(m) // unknown: the daemon refuses it
}

// OpenMode says whether Open may create the file (WithOpenMode).
type OpenMode int32

const (
	// OpenCreate opens the file, creating it and its missing parent
	// directories if it does not exist (O_CREATE).
	OpenCreate OpenMode = iota
	// OpenMustExist opens an existing file only: Open fails with
	// NOT_FOUND, wrapping fs.ErrNotExist, and creates nothing otherwise.
	OpenMustExist
	// OpenExclusive creates the file, with its missing parents: Open
	// fails with ALREADY_EXISTS, wrapping fs.ErrExist, if it exists
	// (O_CREATE|O_EXCL).
	OpenExclusive
)

func (m OpenMode) String() string {
	switch m {
	case OpenCreate:
		return "create"
	case OpenMustExist:
		return "must-exist"
	case OpenExclusive:
		return "exclusive"
	}
	return fmt.Sprintf("OpenMode(%d)", int32(m))
}

func (m OpenMode) check() error {
	if m < OpenCreate || m > OpenExclusive {
		return newError(codes.InvalidArgument, nil, "open mode %d (want OpenCreate, OpenMustExist or OpenExclusive)", int32(m))
	}
	return nil
}

func (m OpenMode) proto() filewritev1.OpenMode {
	switch m {
	case OpenMustExist:
		return filewritev1.OpenMode_OPEN_MODE_MUST_EXIST
	case OpenExclusive:
		return filewritev1.OpenMode_OPEN_MODE_EXCLUSIVE
	}
	return filewritev1.OpenMode_OPEN_MODE_UNSPECIFIED
}

// FileInfo describes a file (File.Stat, Client.Stat).
type FileInfo struct {
	// Path is the path the file was asked for by.
	Path string
	// Size is the file's size in bytes.
	Size int64
	// AllocatedBytes is the storage the file uses.
	AllocatedBytes int64
	// BlockSize is the block size of the daemon's extent map.
	BlockSize int32
	// Generation is the file's generation: it moves with every mutation
	// the daemon acknowledges, through any face, and never repeats for
	// the path (docs/api.md). WithIfGeneration and the daemon's
	// if_generation_match take it.
	Generation int64
	// ETag is the file's strong entity tag, as REST answers it: the
	// generation in decimal between double quotes.
	ETag string
}

// Digest is the checksum of a range of a file at one generation
// (File.Digest).
type Digest struct {
	// Algorithm is "crc32c" or "sha-256".
	Algorithm string
	// Offset and Length are the range covered: Length is cut at the end
	// of the file.
	Offset, Length int64
	// Sum is the checksum: 4 bytes big-endian for crc32c, 32 for sha-256.
	Sum []byte
	// Generation is the file's generation the checksum is of.
	Generation int64
}

// ExtentState is what backs a range of a file.
type ExtentState int

const (
	// ExtentHole: no storage; reads as zeros.
	ExtentHole ExtentState = iota + 1
	// ExtentUnwritten: storage allocated but never written; reads as zeros.
	ExtentUnwritten
	// ExtentWritten: storage that holds data.
	ExtentWritten
)

func (s ExtentState) String() string {
	switch s {
	case ExtentHole:
		return "hole"
	case ExtentUnwritten:
		return "unwritten"
	case ExtentWritten:
		return "written"
	}
	return fmt.Sprintf("ExtentState(%d)", int(s))
}

func extentStateFromProto(s filewritev1.ExtentState) ExtentState {
	switch s {
	case filewritev1.ExtentState_EXTENT_STATE_HOLE:
		return ExtentHole
	case filewritev1.ExtentState_EXTENT_STATE_UNWRITTEN:
		return ExtentUnwritten
	case filewritev1.ExtentState_EXTENT_STATE_WRITTEN:
		return ExtentWritten
	}
	return 0
}

// Extent is a byte range of one state.
type Extent struct {
	Offset, Length int64
	State          ExtentState
}

// DirEntry is one entry of a directory, as List returns it.
type DirEntry struct {
	// Name is the entry's name in the directory.
	Name string
	// IsDir says whether it is a directory. A symlink is described as
	// itself: not a directory, size 0.
	IsDir bool
	// Size is a file's size in bytes; 0 for anything else.
	Size int64
}
