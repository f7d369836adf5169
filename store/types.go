//go:build linux

package store

import (
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/sys/unix"
)

// Policy selects which inode-lock mode a write takes (the lock-mode table in
// doc.go). It is fixed for the life of a Store.
type Policy int

const (
	// PolicyExclusive takes the inode lock exclusively for every write: the
	// "before" of every kernel experiment.
	PolicyExclusive Policy = iota + 1
	// PolicyUnlockedBelowEOF writes below EOF without the inode lock, counted
	// in flight (the btrfs unlocked buffered write).
	PolicyUnlockedBelowEOF
	// PolicySharedWritten takes the lock shared for overwrites of written
	// blocks only (ext4 before the unwritten-extent patch).
	PolicySharedWritten
	// PolicySharedOverwrite takes the lock shared for overwrites of written
	// and of unwritten (preallocated) blocks (the ext4 patch).
	PolicySharedOverwrite
)

// DefaultPolicy is the fastest safe policy.
const DefaultPolicy = PolicyUnlockedBelowEOF

var policyNames = [...]string{
	PolicyExclusive:        "exclusive",
	PolicyUnlockedBelowEOF: "unlocked-below-eof",
	PolicySharedWritten:    "shared-written",
	PolicySharedOverwrite:  "shared-overwrite",
}

func (p Policy) String() string {
	if p > 0 && int(p) < len(policyNames) {
		return policyNames[p]
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// Policies lists every policy in table order.
func Policies() []Policy {
	return []Policy{PolicyExclusive, PolicyUnlockedBelowEOF, PolicySharedWritten, PolicySharedOverwrite}
}

// ParsePolicy is the inverse of Policy.String.
func ParsePolicy(s string) (Policy, error) {
	for i, n := range policyNames {
		if n == s && i > 0 {
			return Policy(i), nil
		}
	}
	return 0, fmt.Errorf("unknown policy %q (want one of exclusive, unlocked-below-eof, shared-written, shared-overwrite)", s)
}

// IOMode selects how data reaches the file.
type IOMode int

const (
	// IOBuffered writes into the page cache with pwrite.
	IOBuffered IOMode = iota
	// IODirect writes block-aligned ranges with O_DIRECT from aligned
	// buffers. Unaligned writes are accepted: they take the inode lock
	// exclusively, wait for in-flight writes and go through the page cache,
	// whose range is then written back before the lock is dropped, so that
	// later direct I/O sees them.
	IODirect
)

func (m IOMode) String() string {
	switch m {
	case IOBuffered:
		return "buffered"
	case IODirect:
		return "direct"
	}
	return fmt.Sprintf("IOMode(%d)", int(m))
}

// ParseIOMode is the inverse of IOMode.String.
func ParseIOMode(s string) (IOMode, error) {
	switch s {
	case "buffered":
		return IOBuffered, nil
	case "direct":
		return IODirect, nil
	}
	return 0, fmt.Errorf("unknown io mode %q (want buffered or direct)", s)
}

// OpenMode says whether a write may create its file, like open(2)'s
// O_CREAT and O_EXCL (WriteOpen, OpenHandle).
type OpenMode int

const (
	// OpenCreate opens the file, creating it and its missing parent
	// directories if it does not exist.
	OpenCreate OpenMode = iota
	// OpenMustExist opens an existing file only: ErrNotFound otherwise,
	// and nothing is created.
	OpenMustExist
	// OpenExclusive creates the file, with its missing parents: ErrExists
	// if it exists. The create is O_EXCL's, so of two callers racing to
	// create one path, in this store or another process, one wins.
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
	return fmt.Sprintf("OpenMode(%d)", int(m))
}

// SyncMode is the durability a Write asks for.
type SyncMode int

const (
	// SyncNone: the data is in the page cache (buffered) or on the device's
	// volatile cache (direct) when Write returns; nothing is durable.
	SyncNone SyncMode = iota
	// SyncData: like O_DSYNC/FUA, the written bytes and the metadata needed
	// to read them back (the size) are durable when Write returns.
	SyncData
	// SyncFull: like O_SYNC, the data and all the file's metadata are durable
	// when Write returns.
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
	return fmt.Sprintf("SyncMode(%d)", int(m))
}

// FsyncMode selects how concurrent syncs of one file are combined.
type FsyncMode int

const (
	// FsyncGroup is group commit without a timer: callers that arrive while a
	// sync runs share the next one, which starts the moment the running one
	// ends.
	FsyncGroup FsyncMode = iota
	// FsyncPerCall issues one fdatasync/fsync per caller.
	FsyncPerCall
	// FsyncTimer gathers callers for Options.FsyncTimerDelay before syncing
	// (the "before" of the btrfs fsync unplug patch).
	FsyncTimer
)

func (m FsyncMode) String() string {
	switch m {
	case FsyncGroup:
		return "group"
	case FsyncPerCall:
		return "per-call"
	case FsyncTimer:
		return "timer"
	}
	return fmt.Sprintf("FsyncMode(%d)", int(m))
}

// ParseFsyncMode is the inverse of FsyncMode.String.
func ParseFsyncMode(s string) (FsyncMode, error) {
	switch s {
	case "group":
		return FsyncGroup, nil
	case "per-call":
		return FsyncPerCall, nil
	case "timer":
		return FsyncTimer, nil
	}
	return 0, fmt.Errorf("unknown fsync mode %q (want group, per-call or timer)", s)
}

// FallocateMode is the operation of Fallocate.
type FallocateMode int

const (
	// FallocAllocate allocates blocks (unwritten) and grows the size to
	// offset+length if that is larger.
	FallocAllocate FallocateMode = iota + 1
	// FallocKeepSize allocates blocks without changing the size.
	FallocKeepSize
	// FallocPunchHole deallocates the whole blocks in the range; partial
	// blocks at the edges are zeroed. The size does not change.
	FallocPunchHole
	// FallocZeroRange makes the range read as zeros, converting whole blocks
	// to unwritten extents. The size does not change.
	FallocZeroRange
)

func (m FallocateMode) String() string {
	switch m {
	case FallocAllocate:
		return "allocate"
	case FallocKeepSize:
		return "keep-size"
	case FallocPunchHole:
		return "punch-hole"
	case FallocZeroRange:
		return "zero-range"
	}
	return fmt.Sprintf("FallocateMode(%d)", int(m))
}

// ExtentState is what a range of a file is backed by.
type ExtentState int

const (
	// ExtentHole: no blocks; reads as zeros.
	ExtentHole ExtentState = iota + 1
	// ExtentUnwritten: blocks allocated (fallocate) but never written; reads
	// as zeros.
	ExtentUnwritten
	// ExtentWritten: blocks that hold data.
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

// Extent is a byte range of one state. Offsets are block-aligned except where
// the query range cuts them.
type Extent struct {
	Offset int64
	Length int64
	State  ExtentState
}

// WriteResult is what a Write did.
type WriteResult struct {
	// BytesWritten is len(data) on success.
	BytesWritten int
	// Size is the file size after the write.
	Size int64
	// Created says that this call created the file (Store.WriteOpen
	// only).
	Created bool
	// Generation is the file's generation after the write (see
	// FileStat.Generation): moved by it, unless it wrote nothing.
	Generation int64
}

// ChangeResult is the file a Truncate, Fallocate or Rename left: its size
// and its generation (see FileStat.Generation) right after it.
type ChangeResult struct {
	Size       int64
	Generation int64
}

// FileStat describes a file.
type FileStat struct {
	Size           int64
	AllocatedBytes int64
	BlockSize      int32
	// Dev and Ino name the file itself, not its path: a file renamed over
	// the path has others.
	Dev, Ino uint64
	// ChangeTime is st_ctime in nanoseconds since the epoch (see
	// FileInfo.Ctime): 0 when the filesystem cannot say.
	ChangeTime int64
	// Generation is the file's version: it moves with every mutation the
	// store acknowledges (every write, through any face, append,
	// Truncate, Fallocate, a Rename onto the path, a re-creation), and
	// never repeats for a path with other content, across restarts and
	// crashes; it may move without a change (after a crash, or a file
	// closed for room and not known unchanged). Always in [1, 2^63), so it
	// fits an int64 and 0 can mean "no file" (Precondition). Read it
	// before the bytes it is to vouch for: a generation read after them
	// may cover a write they missed, one read before covers no write they
	// hold that it does not.
	Generation int64
	// ContentType is the file's media type (AttrContentType), "" if it
	// has none.
	ContentType string
}

// Options configure a Store. The zero value is usable: defaults are filled
// in by Open.
type Options struct {
	// Policy is the lock-mode policy; zero means DefaultPolicy.
	Policy Policy
	// IO is the I/O mode; default IOBuffered.
	IO IOMode
	// Fsync is how syncs are combined; default FsyncGroup.
	Fsync FsyncMode
	// SyncedWrites is how a write that asks for SyncData is made durable
	// (durable.go); zero means DefaultSyncedWrites.
	SyncedWrites SyncedWriteMode
	// FsyncTimerDelay is the gathering delay of FsyncTimer; default
	// DefaultFsyncTimerDelay.
	FsyncTimerDelay time.Duration
	// MaxFileSize bounds the size any operation may give a file; default
	// DefaultMaxFileSize.
	MaxFileSize int64
	// MaxRequestBytes bounds the data one Write or Read moves (the
	// daemon's --max-request-bytes); default DefaultMaxRequestBytes.
	MaxRequestBytes int64
	// MaxOpenFiles bounds the files held open; idle files beyond it are
	// closed and reopened on next use. Default DefaultMaxOpenFiles; the
	// daemon derives its own from the descriptor limit (MaxOpenFilesFor).
	MaxOpenFiles int
	// MaxWaitersPerFile bounds how many callers may queue for one file's
	// inode lock; beyond it an operation fails with ErrTooManyWaiters.
	// 0 means unbounded.
	MaxWaitersPerFile int
	// ExtentCacheBytes bounds the memory of the extent maps kept for files
	// closed to make room (see extentCache): a file reopened unchanged
	// takes its map from there instead of FIEMAP. Past the bound the maps
	// of the files closed longest ago are dropped, and those files rebuild
	// theirs from FIEMAP when they reopen. 0 means
	// DefaultExtentCacheBytes; a negative value turns the cache off.
	ExtentCacheBytes int64
	// AppendIDs bounds how many append IDs the store remembers (see
	// AppendOptions.ID), and AppendIDTTL for how long; defaults
	// DefaultAppendIDs and DefaultAppendIDTTL. A resend after either has
	// passed is a new append. The bounds hold across restarts: the
	// append-ID journal keeps at least the last AppendIDs records on
	// disk, and a store drops those older than AppendIDTTL when it opens.
	AppendIDs   int
	AppendIDTTL time.Duration
	// MapFileBytes bounds the files whose overwrites may go through a
	// shared memory mapping instead of pwrite(2) (see mapped.go): files
	// up to this size that keep being overwritten. 0 means
	// DefaultMapFileBytes; a negative value writes every file with
	// pwrite.
	MapFileBytes int64
	// Telemetry receives lock waits; default no-op.
	Telemetry *Telemetry
	// Logger, if not nil, receives the store's warnings: an entry that List
	// leaves out because its name is not valid UTF-8 (made outside the
	// store: no path the store accepts can name it), once per directory
	// and name for the store's life (up to maxUnlistedReports of them),
	// not on every page that skips it.
	Logger *slog.Logger
	// Hooks are test hooks; nil in production.
	Hooks *Hooks
}

// Defaults of Options, filled in by Open for fields left zero: the one
// source of these values (the daemon's flags default to them too).
const (
	// DefaultMaxFileSize is 1 TiB.
	DefaultMaxFileSize = 1 << 40
	// DefaultMaxRequestBytes is 64 MiB.
	DefaultMaxRequestBytes = 64 << 20
	// DefaultMaxOpenFiles bounds the files a store holds open when its
	// caller says nothing; the daemon derives its own bound from the
	// descriptor limit (MaxOpenFilesFor).
	DefaultMaxOpenFiles = 1024
	// DefaultFsyncTimerDelay is FsyncTimer's gathering delay.
	DefaultFsyncTimerDelay = 3 * time.Millisecond
	// DefaultAppendIDs is how many append IDs are remembered: some 100
	// bytes each, and the IDs themselves.
	DefaultAppendIDs = 65536
	// DefaultAppendIDTTL is how long an append ID is remembered: longer
	// than a client's retries take.
	DefaultAppendIDTTL = 10 * time.Minute
)

// The daemon's default bound on open files comes from its descriptor limit,
// RLIMIT_NOFILE, whose soft value Go raises to the hard one at start.
const (
	// MaxOpenFilesCap caps that default. An open file costs the daemon
	// about 2.3 KiB of heap (measured with 10,000 files of 16 KiB: the
	// inode, its extent map, lock, group commit and in-flight shards) and
	// the kernel a struct file; a container's hard limit can be a million,
	// and idle files would then hold gigabytes. 16384 open files cost
	// about 37 MiB.
	MaxOpenFilesCap = 16384
	// MinSpareDescriptors is the fewest descriptors an explicit bound
	// must leave to everything but files: listeners, the runtime's,
	// standard streams, a directory being synced, connections.
	MinSpareDescriptors = 64
)

// MaxOpenFilesFor is the default bound on open files for a process allowed
// nofile descriptors: a quarter of them, and at least 256, stay for
// connections, listeners and the rest; the files share what is left, each
// holding two descriptors in IODirect mode (the buffered one and the
// O_DIRECT one); and the figure is capped at MaxOpenFilesCap. At least 1.
func MaxOpenFilesFor(nofile uint64, io IOMode) int {
	spare := max(256, nofile/4)
	if nofile <= spare {
		return 1
	}
	n := (nofile - spare) / uint64(DescriptorsPerFile(io))
	return int(min(max(n, 1), MaxOpenFilesCap))
}

// DescriptorsPerFile is how many descriptors an open file holds in io mode.
func DescriptorsPerFile(io IOMode) int {
	if io == IODirect {
		return 2
	}
	return 1
}

// NoFileLimit is the process's soft RLIMIT_NOFILE, or 1024, Linux's usual
// soft limit, if it cannot be read.
func NoFileLimit() uint64 {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return 1024
	}
	return lim.Cur
}

// checkMaxOpenFiles refuses a bound on open files (Options.MaxOpenFiles,
// given explicitly) whose descriptors, in io mode, would not fit in nofile
// with MinSpareDescriptors to spare.
func checkMaxOpenFiles(maxOpenFiles int, io IOMode, nofile uint64) error {
	need := uint64(maxOpenFiles) * uint64(DescriptorsPerFile(io))
	if maxOpenFiles > 0 && need+MinSpareDescriptors <= nofile {
		return nil
	}
	per := ""
	if io == IODirect {
		per = " (two per file with direct I/O)"
	}
	return fmt.Errorf("%d open files need %d descriptors%s and %d to spare, but RLIMIT_NOFILE is %d: raise the limit (ulimit -n, systemd's LimitNOFILE=) or lower the bound (%d is the default here)",
		maxOpenFiles, need, per, MinSpareDescriptors, nofile, MaxOpenFilesFor(nofile, io))
}

// DefaultExtentCacheBytes is the default of Options.ExtentCacheBytes: the
// maps of about 200,000 closed files of a few extents each (an entry costs
// some 160 bytes and 24 per run of blocks).
const DefaultExtentCacheBytes = 32 << 20

// DefaultMapFileBytes is the default of Options.MapFileBytes: a mapping
// takes address space, not memory, but a page written through it stays in
// the daemon's resident set (as file pages the kernel can reclaim) until
// the file closes.
const DefaultMapFileBytes = 1 << 30

// DefaultOptions are the options a zero Options stands for, each default
// filled in: Options{}.WithDefaults().
func DefaultOptions() Options { return Options{}.WithDefaults() }

// WithDefaults is o with each field left zero set to its default, as Open
// sets it (a negative ExtentCacheBytes or MapFileBytes, off, becomes -1).
func (o Options) WithDefaults() Options {
	if o.Policy == 0 {
		o.Policy = DefaultPolicy
	}
	if o.SyncedWrites == 0 {
		o.SyncedWrites = DefaultSyncedWrites
	}
	if o.FsyncTimerDelay <= 0 {
		o.FsyncTimerDelay = DefaultFsyncTimerDelay
	}
	if o.MaxFileSize <= 0 {
		o.MaxFileSize = DefaultMaxFileSize
	}
	if o.MaxRequestBytes <= 0 {
		o.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if o.MaxOpenFiles <= 0 {
		o.MaxOpenFiles = DefaultMaxOpenFiles
	}
	if o.AppendIDs <= 0 {
		o.AppendIDs = DefaultAppendIDs
	}
	if o.AppendIDTTL <= 0 {
		o.AppendIDTTL = DefaultAppendIDTTL
	}
	switch {
	case o.ExtentCacheBytes == 0:
		o.ExtentCacheBytes = DefaultExtentCacheBytes
	case o.ExtentCacheBytes < 0:
		o.ExtentCacheBytes = -1
	}
	switch {
	case o.MapFileBytes == 0:
		o.MapFileBytes = DefaultMapFileBytes
	case o.MapFileBytes < 0:
		o.MapFileBytes = -1
	}
	return o
}

// Validate refuses options that Open cannot use, each with an
// *OptionError: an enum out of its range, a negative bound or delay (0
// means the default, and a negative ExtentCacheBytes or MapFileBytes turns
// the feature off), or a MaxOpenFiles whose descriptors would not fit in
// the process's RLIMIT_NOFILE with MinSpareDescriptors to spare.
func (o Options) Validate() error {
	if o.Policy != 0 {
		if _, err := ParsePolicy(o.Policy.String()); err != nil {
			return &OptionError{"Policy", fmt.Sprintf("is %v: %v", o.Policy, err)}
		}
	}
	if _, err := ParseIOMode(o.IO.String()); err != nil {
		return &OptionError{"IO", fmt.Sprintf("is %v: %v", o.IO, err)}
	}
	if _, err := ParseFsyncMode(o.Fsync.String()); err != nil {
		return &OptionError{"Fsync", fmt.Sprintf("is %v: %v", o.Fsync, err)}
	}
	if o.SyncedWrites != 0 {
		if _, err := ParseSyncedWriteMode(o.SyncedWrites.String()); err != nil {
			return &OptionError{"SyncedWrites", fmt.Sprintf("is %v: %v", o.SyncedWrites, err)}
		}
	}
	for _, f := range []struct {
		name     string
		negative bool
		value    any
	}{
		{"FsyncTimerDelay", o.FsyncTimerDelay < 0, o.FsyncTimerDelay},
		{"MaxFileSize", o.MaxFileSize < 0, o.MaxFileSize},
		{"MaxRequestBytes", o.MaxRequestBytes < 0, o.MaxRequestBytes},
		{"MaxOpenFiles", o.MaxOpenFiles < 0, o.MaxOpenFiles},
		{"MaxWaitersPerFile", o.MaxWaitersPerFile < 0, o.MaxWaitersPerFile},
		{"AppendIDs", o.AppendIDs < 0, o.AppendIDs},
		{"AppendIDTTL", o.AppendIDTTL < 0, o.AppendIDTTL},
	} {
		if f.negative {
			return &OptionError{f.name, fmt.Sprintf("is %v: want 0 (the default) or more", f.value)}
		}
	}
	if o.MaxOpenFiles > 0 {
		if err := checkMaxOpenFiles(o.MaxOpenFiles, o.IO, NoFileLimit()); err != nil {
			return &OptionError{"MaxOpenFiles", fmt.Sprintf("is %d: %v", o.MaxOpenFiles, err)}
		}
	}
	return nil
}

// OptionError is Validate's refusal of one field of Options. A caller that
// sets the field from a setting of its own (the daemon's flags) names its
// setting instead, with Problem.
type OptionError struct {
	// Option is the field, as Go spells it: "MaxFileSize".
	Option string
	// Problem says what its value is, what is wrong with it, and what
	// would do: "is -1: want 0 (the default) or more".
	Problem string
}

func (e *OptionError) Error() string { return "store option " + e.Option + " " + e.Problem }
