package streamengine

import (
	"slices"

	"github.com/filewrite/filewrite/store"
)

// File is one file of a stream: the file of its first message's path
// (index 0), or one declared by index. Its fields but index, path and h
// are guarded by Stream.mu.
type File struct {
	index uint32
	path  string
	// h is the file, nil if it could not be opened; immutable once the
	// file is on the stream.
	h *store.Handle
	// err, once set, is what the file's writes read from then on are
	// acked with: why it could not be opened, or was deleted, or its
	// scope revoked. Writes already handed out are applied as usual.
	err error
	// order keeps the file's overlapping writes in arrival order; writes
	// to different files never wait for each other.
	order writeOrder
	// ready holds its writes free to apply, in arrival order; running
	// counts those being applied. queued: it is in Stream.runnable.
	ready   fifo[*Write]
	running int
	queued  bool
	// owing holds its writes applied and waiting for their sync; syncer:
	// its syncer runs.
	owing  []*Write
	syncer bool
	// syncBatch and syncApplied are the syncer's scratch, kept from one
	// syncer to the next so that a sync round allocates nothing; only
	// the goroutine that set syncer uses them.
	syncBatch   []*Write
	syncApplied []store.AppliedWrite
	// writes counts its writes handed out and not yet acked; closing:
	// the client closed it (or the stream ends), and h is given back
	// once writes is 0.
	writes  int
	closing bool
}

// syncsItself reports whether the file's synced writes are made durable
// by themselves, each holding its worker for the device's round trip.
func (f *File) syncsItself() bool { return f.h != nil && f.h.SyncsWritesItself() }

// Path is the file's path as the stream named it.
func (f *File) Path() string { return f.path }

// size is the file's size now, 0 if it is not open.
func (f *File) size() int64 {
	if f.h == nil {
		return 0
	}
	return f.h.Size()
}

// releaseLocked gives the file back once it is closed and its last write
// is acked. Handle.Close only moves the file to the store's idle list (or
// closes a deleted one's descriptor): no I/O is waited for under s.mu.
//
// Preconditions: s.mu is held.
func (f *File) releaseLocked() {
	if f.closing && f.writes == 0 && f.h != nil {
		f.h.Close()
	}
}

// fifo is a queue that keeps its capacity: read from head, reset once
// empty, and moved down rather than grown when full with taken items at
// its start, so that one that never empties stays the size of what it
// holds.
type fifo[T any] struct {
	items []T
	head  int
}

func (q *fifo[T]) len() int { return len(q.items) - q.head }

func (q *fifo[T]) push(v T) {
	if q.head > 0 && len(q.items) == cap(q.items) {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	q.items = append(q.items, v)
}

// pop takes the first item; the queue is not empty.
func (q *fifo[T]) pop() T {
	var zero T
	v := q.items[q.head]
	q.items[q.head] = zero
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
	return v
}

// The stream's files. The reader opens them (the framing checks the
// caller's access and the open mode) and hands them over here; the
// engine gives them back.

// SetMain makes h, the file of the first message's path, the stream's
// file of index 0, reported with its generation in the answer to the
// first message, and ends the stream once it is deleted (watchDelete).
// The reader calls it once, before it hands out a write.
func (s *Stream) SetMain(path string, h *store.Handle) {
	s.mu.Lock()
	s.main = &File{path: path, h: h}
	s.statuses = append(s.statuses, FileStatus{Index: 0, Generation: h.Generation()})
	s.mu.Unlock()
	go s.watchDelete()
}

// Main is the file of the first message's path, nil on a stream that only
// declares files. It is set by the reader (SetMain) before the reader
// hands out a write or starts a goroutine that looks at it, and immutable
// after: those read it without the lock.
func (s *Stream) Main() *File { return s.main }

// Closing counts the declared files that closes (a message's list) names,
// each once: the files a message closes do not count against the bound of
// the files it declares.
func (s *Stream) Closing(closes []uint32) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	closing := 0
	for i, c := range closes {
		if _, ok := s.declared[c]; ok && !slices.Contains(closes[:i], c) {
			closing++
		}
	}
	return closing
}

// Slot reports whether index is declared on the stream, and how many
// files are declared beside the closing ones (Closing).
func (s *Stream) Slot(index uint32, closing int) (inUse bool, held int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, inUse = s.declared[index]
	return inUse, len(s.declared) - closing
}

// Declare puts the file of index on the stream: h, or, when it could not
// be opened (h nil), err, which its writes are then acked with until the
// client closes it. Its report (err, nil if it is open) goes out before
// the acks of its writes.
func (s *Stream) Declare(index uint32, path string, h *store.Handle, err error) {
	f := &File{index: index, path: path, h: h, err: err}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.declared == nil {
		s.declared = make(map[uint32]*File)
	}
	s.declared[index] = f
	st := FileStatus{Index: index, Err: f.err}
	if h != nil {
		st.Generation = h.Generation()
	}
	s.statuses = append(s.statuses, st)
	s.wakeSenderLocked()
}

// Declared appends to files the declared files whose writes are not
// refused yet, for a look at each (a reload of the credentials).
func (s *Stream) Declared(files []*File) []*File {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.declared {
		if f.err == nil {
			files = append(files, f)
		}
	}
	return files
}

// Refuse makes err what f's writes read from now on are acked with,
// unless they are refused already; the stream goes on.
func (s *Stream) Refuse(f *File, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f.err == nil {
		f.err = err
	}
}

// CloseFiles closes the declared files of indexes (see closeFilesLocked).
func (s *Stream) CloseFiles(indexes []uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeFilesLocked(indexes)
}

// closeFilesLocked closes the declared files of indexes: the index is free
// at once, and the file is given back once its last write is acked.
// Closing an index that names no file does nothing, so that a client may
// close a file whose declaration failed without tracking it.
//
// Preconditions: s.mu is held.
func (s *Stream) closeFilesLocked(indexes []uint32) {
	for _, i := range indexes {
		f := s.declared[i]
		if f == nil {
			continue
		}
		delete(s.declared, i)
		f.closing = true
		f.releaseLocked()
	}
}

// watchDelete ends the stream with a FileDeletedError once the file of its
// path is deleted (or replaced by a Rename over it), after the writes read
// before are acked: they fail with it too, having nowhere to go. A Rename
// of the file itself changes nothing: the stream writes to it under its
// new name. It returns when the stream stops, for whatever reason. A
// declared file has no watcher: its deletion fails its own writes
// (fileDeletedLocked), and the stream goes on.
func (s *Stream) watchDelete() {
	select {
	case <-s.main.h.Gone():
		s.Stop(&FileDeletedError{Path: s.main.path})
	case <-s.stopped.Done():
	}
}
