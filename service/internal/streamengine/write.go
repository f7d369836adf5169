package streamengine

import (
	"fmt"
	"time"

	"github.com/filewrite/filewrite/store"
)

// Write is one write of a stream, from the message that carried it to its
// ack. The framing fills the fields above file before it hands the write
// to Queue, and reads Res, Landed and Err once the write is in a batch
// given to its Sender.
type Write struct {
	// As decoded; Data aliases Msg's bytes until the write has been
	// applied.
	ID     uint64
	Off    int64
	Data   []byte
	Append bool // an append: Off is 0, and Landed says where it went
	// AppendID is an append's id (store.AppendOptions.ID), aliasing Msg's
	// bytes as Data does; empty for none.
	AppendID  []byte
	FileIndex uint32
	Sync      store.SyncMode
	// Msg is the message that carried the write, told once the write no
	// longer needs its bytes.
	Msg Message
	// Cost is what the write counts against the framing's budgets, given
	// back once it is acked; the engine only carries it to the Sender.
	Cost int64

	// file is the file it goes to, set when it is handed out.
	file *File

	// Landed is where the write's bytes begin, for its ack: Off, or
	// where an append landed. Written as Res is.
	Landed int64

	// order is guarded by Stream.mu: the writes of its file it waits
	// for and that wait for it (writeOrder).
	order orderState
	// Res and Err are written by the goroutine that applies the write (or
	// waits for its sync), then read by the sender once it is in acks.
	// An Err set before Queue refuses the write: nothing is written, and
	// its ack carries Err.
	Res store.AppliedWrite
	Err error
}

// Path is the path of the file w went to; w is in a batch given to the
// Sender.
func (w *Write) Path() string { return w.file.path }

// Message is the message that carried writes: Applied is called once for
// each of its writes, when the write no longer needs the message's bytes
// (applied, refused or dropped), from any goroutine.
type Message interface {
	Applied()
}

// FileStatus is the report of one file of the stream: Err is nil if it
// is open, and Generation then its generation when it was opened. The
// file of the stream's path is reported as index 0, in the answer to the
// first message.
type FileStatus struct {
	Index      uint32
	Err        error
	Generation int64
}

// The stream's own errors, which the framing turns into its refusals: a
// write's Err, a declared file's, or the stream's end.

// FileDeletedError is the error of the writes to a file deleted (or
// replaced by a Rename over it) while the stream wrote to it, and the end
// of the stream when that file is the stream's path's.
type FileDeletedError struct{ Path string }

func (e *FileDeletedError) Error() string {
	return fmt.Sprintf("%s was deleted or replaced while the stream wrote to it", e.Path)
}

// UnknownFileError ends a stream whose message names a file index that is
// not on it.
type UnknownFileError struct{ Index uint32 }

func (e *UnknownFileError) Error() string {
	return fmt.Sprintf("a write names file %d, which is not on the stream", e.Index)
}

// IDInUseError ends a stream whose message reuses the id of a write not
// yet acked.
type IDInUseError struct{ ID uint64 }

func (e *IDInUseError) Error() string {
	return fmt.Sprintf("write id %d is already in use by a write not yet acknowledged", e.ID)
}

// IdleError ends a stream that was idle for Timeout (see idle.go).
type IdleError struct{ Timeout time.Duration }

func (e *IdleError) Error() string {
	return fmt.Sprintf("the stream was idle for %v", e.Timeout)
}
