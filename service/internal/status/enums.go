package status

import (
	"fmt"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/store"
)

// SyncModeFromProto rejects values outside the enum: proto3 enums are open,
// so a client can send any number.
func SyncModeFromProto(m filewritev1.SyncMode) (store.SyncMode, error) {
	switch m {
	case filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED:
		return store.SyncNone, nil
	case filewritev1.SyncMode_SYNC_MODE_DATA:
		return store.SyncData, nil
	case filewritev1.SyncMode_SYNC_MODE_FULL:
		return store.SyncFull, nil
	}
	return 0, &store.Refusal{Err: store.ErrInvalidMode, Arg: "sync", Detail: fmt.Sprintf("sync mode %d (want SYNC_MODE_UNSPECIFIED, SYNC_MODE_DATA or SYNC_MODE_FULL)", int32(m))}
}

// OpenModeFromProto rejects unknown numbers: a mode this daemon does not
// know might have forbidden the create it would do.
func OpenModeFromProto(m filewritev1.OpenMode) (store.OpenMode, error) {
	switch m {
	case filewritev1.OpenMode_OPEN_MODE_UNSPECIFIED:
		return store.OpenCreate, nil
	case filewritev1.OpenMode_OPEN_MODE_MUST_EXIST:
		return store.OpenMustExist, nil
	case filewritev1.OpenMode_OPEN_MODE_EXCLUSIVE:
		return store.OpenExclusive, nil
	}
	return 0, &store.Refusal{Err: store.ErrInvalidMode, Arg: "open_mode", Detail: fmt.Sprintf("open mode %d (want OPEN_MODE_UNSPECIFIED, OPEN_MODE_MUST_EXIST or OPEN_MODE_EXCLUSIVE)", int32(m))}
}

// FallocateModeFromProto rejects FALLOCATE_MODE_UNSPECIFIED as well as
// unknown numbers: there is no safe default between allocating and punching.
func FallocateModeFromProto(m filewritev1.FallocateMode) (store.FallocateMode, error) {
	switch m {
	case filewritev1.FallocateMode_FALLOCATE_MODE_ALLOCATE:
		return store.FallocAllocate, nil
	case filewritev1.FallocateMode_FALLOCATE_MODE_KEEP_SIZE:
		return store.FallocKeepSize, nil
	case filewritev1.FallocateMode_FALLOCATE_MODE_PUNCH_HOLE:
		return store.FallocPunchHole, nil
	case filewritev1.FallocateMode_FALLOCATE_MODE_ZERO_RANGE:
		return store.FallocZeroRange, nil
	}
	return 0, &store.Refusal{Err: store.ErrInvalidMode, Arg: "mode", Detail: fmt.Sprintf("fallocate mode %s (want ALLOCATE, KEEP_SIZE, PUNCH_HOLE or ZERO_RANGE)", m)}
}

func ExtentStateToProto(s store.ExtentState) filewritev1.ExtentState {
	switch s {
	case store.ExtentHole:
		return filewritev1.ExtentState_EXTENT_STATE_HOLE
	case store.ExtentUnwritten:
		return filewritev1.ExtentState_EXTENT_STATE_UNWRITTEN
	case store.ExtentWritten:
		return filewritev1.ExtentState_EXTENT_STATE_WRITTEN
	}
	return filewritev1.ExtentState_EXTENT_STATE_UNSPECIFIED
}
