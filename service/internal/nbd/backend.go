package nbd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
)

// Backend is what the server serves: the daemon implements it by calling
// the store the way its gRPC handlers do, with its authorization, scope,
// limits and tracing applied as functions (StoreBackend is the store part
// of it). The server calls it from many goroutines at once.
type Backend interface {
	// Open opens the export name for the client p: NBD_OPT_GO,
	// NBD_OPT_INFO and NBD_OPT_EXPORT_NAME. It fails with an error that
	// wraps ErrNotFound when there is no such export (nothing is created),
	// ErrPermission when p may not reach it, ErrShutdown while the daemon
	// stops; any other error is reported as the export being unavailable.
	// The export's size is fixed by Open: it is what the client is told.
	Open(ctx context.Context, p *Peer, name string) (Export, error)
	// List returns up to limit export names p may open, for NBD_OPT_LIST.
	List(ctx context.Context, p *Peer, limit int) ([]string, error)
}

// Export is one open export, used by one connection. Its methods are
// called concurrently, for the requests the client has in flight; the
// server has checked every range against Size before it calls them (a
// request never reaches past Size), and never calls a writing method
// when ReadOnly is true. Errors are reported to the client by the
// sentinel they wrap (ErrInvalid, ErrNoSpace, ErrPermission,
// ErrNotSupported, ErrShutdown; anything else is EIO).
type Export interface {
	// Size is the export's size in bytes, fixed when it was opened.
	Size() int64
	// ReadOnly reports whether the client may only read.
	ReadOnly() bool
	// ReadAt reads len(p) bytes at off into p and returns how many it read:
	// fewer only where the file ends before Size (another client shrank
	// it), and the server reads the rest as zeros.
	ReadAt(ctx context.Context, p []byte, off int64) (int, error)
	// WriteAt writes p at off. With fua the bytes are durable when it
	// returns (NBD_CMD_FLAG_FUA); without, they are readable by every
	// later read on any connection, and durable after the next Flush.
	WriteAt(ctx context.Context, p []byte, off int64, fua bool) error
	// Flush makes every write, trim and zero that returned before it was
	// called durable, whichever connection made it (NBD_CMD_FLUSH; the
	// server advertises NBD_FLAG_CAN_MULTI_CONN on this promise).
	Flush(ctx context.Context) error
	// Trim deallocates the range; it reads as zeros afterwards. fua as for
	// WriteAt.
	Trim(ctx context.Context, off, length int64, fua bool) error
	// Zero makes the range read as zeros (NBD_CMD_WRITE_ZEROES): with
	// NoHole leaving it allocated, otherwise as it finds cheapest. With
	// Fast it fails at once with ErrNotSupported, having changed nothing,
	// where zeroing would cost as much as writing zeros.
	Zero(ctx context.Context, off, length int64, f ZeroFlags) error
	// Extents describes [off, off+length) in order from off, in at most
	// limit extents (it may stop short of off+length; the server answers
	// for what it is given).
	Extents(ctx context.Context, off, length int64, limit int) ([]Extent, error)
	// Close gives the export back; called once, after every other call
	// returned.
	Close() error
}

// TryWriter is an Export that can make a write without blocking, when it
// happens to be cheap (the store's mapped write below EOF): the server
// then makes it on the goroutine that reads the connection and answers it
// at once, rather than handing it to a goroutine of its own.
type TryWriter interface {
	// TryWriteAt makes the write of p at off, as WriteAt without fua, if
	// it can without blocking, and reports whether it did; false means
	// nothing changed.
	TryWriteAt(ctx context.Context, p []byte, off int64) bool
}

// ZeroFlags are NBD_CMD_WRITE_ZEROES's flags.
type ZeroFlags struct {
	// NoHole is NBD_CMD_FLAG_NO_HOLE: the range stays allocated.
	NoHole bool
	// Fast is NBD_CMD_FLAG_FAST_ZERO: fail rather than zero slowly.
	Fast bool
	// FUA as for WriteAt.
	FUA bool
}

// Extent is a range of an export and what base:allocation says of it.
type Extent struct {
	Offset, Length int64
	// Hole: no storage is allocated (NBD_STATE_HOLE).
	Hole bool
	// Zero: the range reads as zeros (NBD_STATE_ZERO).
	Zero bool
}

// Peer is the client at the other end of a connection, for the backend
// to decide what it may reach.
type Peer struct {
	// Addr is the client's address.
	Addr net.Addr
	// Local is the address the client connected to.
	Local net.Addr
	// TLS is the connection's TLS state once NBD_OPT_STARTTLS succeeded,
	// its verified client certificate included; nil without TLS.
	TLS *tls.ConnectionState
}

// Budget bounds the bytes that requests hold in memory, daemon-wide (the
// daemon's --max-inflight-bytes). Acquire waits until n bytes are free or
// ctx ends; every Acquire that returned nil is matched by one Release of
// the same n. A request larger than the whole budget must still be
// granted once the budget is otherwise empty (clamped), never refused.
type Budget interface {
	Acquire(ctx context.Context, n int64) error
	Release(n int64)
}

// Observer sees every request, for metrics and traces. Begin is called as
// a request starts, on the goroutine that will run it; the context it
// returns is the one the request runs under (so that the store records
// its lock waits on the request's span), and end is called once with the
// request's outcome when its reply has been sent: nil, or the error the
// client was told of. It is called from many goroutines at once.
type Observer interface {
	Begin(ctx context.Context, cmd Command, offset int64, length uint32) (context.Context, func(error))
}

// Command is a request type, for observers.
type Command uint16

// The commands an observer sees, by their protocol names.
const (
	CmdRead        Command = cmdRead
	CmdWrite       Command = cmdWrite
	CmdFlush       Command = cmdFlush
	CmdTrim        Command = cmdTrim
	CmdCache       Command = cmdCache
	CmdWriteZeroes Command = cmdWriteZeroes
	CmdBlockStatus Command = cmdBlockStatus
)

var commandNames = [...]string{
	cmdRead:        "NBD_CMD_READ",
	cmdWrite:       "NBD_CMD_WRITE",
	cmdDisc:        "NBD_CMD_DISC",
	cmdFlush:       "NBD_CMD_FLUSH",
	cmdTrim:        "NBD_CMD_TRIM",
	cmdCache:       "NBD_CMD_CACHE",
	cmdWriteZeroes: "NBD_CMD_WRITE_ZEROES",
	cmdBlockStatus: "NBD_CMD_BLOCK_STATUS",
}

// String is the command's name in the protocol document.
func (c Command) String() string {
	if int(c) < len(commandNames) {
		return commandNames[c]
	}
	return fmt.Sprintf("NBD_CMD(%d)", uint16(c))
}

// Errors a Backend and an Export wrap (with %w) to tell the server what
// to answer. Anything else is an I/O error (NBD_EIO), or for Open an
// export that is not available (NBD_REP_ERR_UNKNOWN with the message).
var (
	// ErrNotFound: Open of a name that names no export.
	ErrNotFound = errors.New("no such export")
	// ErrPermission: the client may not do this (NBD_EPERM;
	// NBD_REP_ERR_POLICY from Open).
	ErrPermission = errors.New("operation not permitted")
	// ErrInvalid: a request the export refuses as invalid (NBD_EINVAL).
	ErrInvalid = errors.New("invalid request")
	// ErrNoSpace: no space left, or a file size limit (NBD_ENOSPC).
	ErrNoSpace = errors.New("no space left")
	// ErrNotSupported: NBD_CMD_FLAG_FAST_ZERO where zeroing is not fast
	// (NBD_ENOTSUP).
	ErrNotSupported = errors.New("not supported")
	// ErrShutdown: the daemon is stopping (NBD_ESHUTDOWN;
	// NBD_REP_ERR_SHUTDOWN from Open).
	ErrShutdown = errors.New("server shutting down")
)

// ErrnoName is the name of the error value ("Error values") that a client
// was told of err, for metrics: "EPERM", "EINVAL", ..., "EIO" for any
// error the server does not name otherwise; "OK" for nil.
func ErrnoName(err error) string {
	if err == nil {
		return "OK"
	}
	errno := errnoOf(err)
	var ref refusal
	if errors.As(err, &ref) {
		errno = ref.errno
	}
	switch errno {
	case errnoPERM:
		return "EPERM"
	case errnoINVAL:
		return "EINVAL"
	case errnoNOSPC:
		return "ENOSPC"
	case errnoOVERFLOW:
		return "EOVERFLOW"
	case errnoNOTSUP:
		return "ENOTSUP"
	case errnoSHUTDOWN:
		return "ESHUTDOWN"
	case errnoNOMEM:
		return "ENOMEM"
	}
	return "EIO"
}

// errnoOf is the error value ("Error values") that tells a client of err.
func errnoOf(err error) uint32 {
	switch {
	case errors.Is(err, ErrPermission):
		return errnoPERM
	case errors.Is(err, ErrInvalid):
		return errnoINVAL
	case errors.Is(err, ErrNoSpace):
		return errnoNOSPC
	case errors.Is(err, ErrNotSupported):
		return errnoNOTSUP
	case errors.Is(err, ErrShutdown), errors.Is(err, context.Canceled):
		return errnoSHUTDOWN
	}
	return errnoIO
}
