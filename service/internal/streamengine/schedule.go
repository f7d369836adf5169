package streamengine

import (
	"errors"

	"github.com/filewrite/filewrite/store"
)

// Queue hands out writes, those of one message whose cost the framing has
// taken, and reports whether it did: not if the stream is stopping (no
// error: the message is dropped), nor if one reuses an id not yet acked
// (IDInUseError) or names a file not on the stream (UnknownFileError),
// the error that ends the stream; then none of them was handed out. The
// files of closes are closed after the writes are handed out. Queue keeps
// the writes, not the slice. It is the reader's: on its goroutine it
// applies the writes that can be made without waiting (applyInline).
func (s *Stream) Queue(writes []*Write, closes []uint32) (bool, error) {
	queued, err := s.queue(writes, closes)
	s.applyInline()
	return queued, err
}

// queue is Queue but for applyInline.
func (s *Stream) queue(writes []*Write, closes []uint32) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return false, nil // read, but neither applied nor acked
	}
	for i, w := range writes {
		w.file = s.fileLocked(w.FileIndex)
		err := error(nil)
		if w.file == nil {
			err = &UnknownFileError{Index: w.FileIndex}
		} else if _, dup := s.unacked[w.ID]; dup {
			err = &IDInUseError{ID: w.ID}
		}
		if err != nil {
			for _, v := range writes[:i] {
				delete(s.unacked, v.ID)
			}
			return false, err
		}
		s.unacked[w.ID] = struct{}{}
	}
	s.pending += len(writes)
	for _, w := range writes {
		f := w.file
		f.writes++
		if w.Err == nil && f.err != nil {
			w.Err = f.err
		}
		s.ordered++
		if w.Err != nil {
			// Refused before anything was written. It takes its place in
			// the file's order all the same, over every offset
			// (orderRange), so that its ack reports the size the writes
			// read before it leave, and none read after it.
			if f.order.add(w) {
				s.refusedLocked(w)
			}
			continue
		}
		if f.order.add(w) {
			if w.Sync == store.SyncNone && !w.Append {
				s.inline = append(s.inline, w)
			} else {
				s.readyLocked(w)
			}
		}
	}
	s.closeFilesLocked(closes)
	return true, nil
}

// fileLocked is the file that a write naming index goes to, nil if the
// stream has none by that index.
//
// Preconditions: s.mu is held.
func (s *Stream) fileLocked(index uint32) *File {
	if index == 0 {
		return s.main
	}
	return s.declared[index]
}

// applyInline tries the writes queue left in inline with TryWrite, and
// completes those it made as a worker does; it hands the others to the
// workers. Each of them is in its file's order, free to apply, and
// counted in ordered, so none of its file's later overlapping writes can
// start meanwhile, and the workers do not exit.
func (s *Stream) applyInline() {
	if len(s.inline) == 0 {
		return
	}
	for _, w := range s.inline {
		// A write TryWrite made has bytes written (it makes no empty
		// one); one it did not make is left with none, for the worker.
		var made bool
		if w.Res, made = w.file.h.TryWrite(s.ctx, w.Off, w.Data); made {
			w.Landed = w.Off
		} else {
			w.Res = store.AppliedWrite{}
		}
	}
	s.mu.Lock()
	for i, w := range s.inline {
		s.inline[i] = nil
		if w.Res.BytesWritten == 0 {
			s.readyLocked(w)
			continue
		}
		s.appliedLocked(w)
		s.doneLocked(w)
	}
	s.inline = s.inline[:0]
	s.mu.Unlock()
}

// refusedLocked is done with w, refused before anything was written and
// free to apply at once: its ack reports the file's size, which the
// writes read before it on its file left. One that waited for them goes
// to a worker instead (work), as it would free others in turn, each a
// frame deeper here.
//
// Preconditions: s.mu is held; w is free to apply.
func (s *Stream) refusedLocked(w *Write) {
	w.Res.Size = w.file.size()
	s.appliedLocked(w)
	s.doneLocked(w)
}

// readyLocked queues w, free to apply, for a worker, starting one if none
// is idle.
//
// Preconditions: s.mu is held.
func (s *Stream) readyLocked(w *Write) {
	w.file.ready.push(w)
	s.runnableLocked(w.file)
	limit := streamWorkers
	if w.Sync == store.SyncData && w.file.syncsItself() {
		limit = max(limit, durableWorkers)
	}
	if s.idle == 0 && s.workers < limit {
		s.workers++
		s.helpers.Add(1)
		go s.work()
		return
	}
	s.workCond.Signal()
}

// runnableLocked puts f in runnable if it has writes free to apply and
// may have one more applied at once: streamWorkers-1 at most when the
// stream has declared files, so that one file waiting for a lock leaves
// a worker to the others.
//
// Preconditions: s.mu is held.
func (s *Stream) runnableLocked(f *File) {
	if f.queued || f.ready.len() == 0 {
		return
	}
	perFile := streamWorkers
	if s.declared != nil {
		perFile = max(1, streamWorkers-1)
	}
	if f.syncsItself() {
		perFile = max(perFile, durableWorkers)
	}
	if f.running >= perFile {
		return
	}
	f.queued = true
	s.runnable.push(f)
}

// popReadyLocked takes the first write free to apply of the first file in
// runnable, which is not empty, and puts the file back at the end of
// runnable if it has more: files take turns.
//
// Preconditions: s.mu is held.
func (s *Stream) popReadyLocked() *Write {
	f := s.runnable.pop()
	f.queued = false
	w := f.ready.pop()
	f.running++
	s.runnableLocked(f)
	return w
}

// doneLocked queues w's ack and wakes the sender.
//
// Preconditions: s.mu is held.
func (s *Stream) doneLocked(w *Write) {
	s.ackLocked(w)
	s.wakeSenderLocked()
}

// ackLocked queues w's ack, and gives its file back if it was closed and
// this was its last write.
//
// Preconditions: s.mu is held.
func (s *Stream) ackLocked(w *Write) {
	s.acks = append(s.acks, w)
	w.file.writes--
	w.file.releaseLocked()
}

// fileDeletedLocked is called when a write found f deleted (or replaced
// by a Rename over it). The stream's path's file ends the stream, as
// watchDelete would a moment later; a declared file fails its writes read
// from then on, and the stream goes on.
//
// Preconditions: s.mu is held.
func (s *Stream) fileDeletedLocked(f *File) {
	if f == s.main {
		s.stopLocked(&FileDeletedError{Path: f.path})
		return
	}
	if f.err == nil {
		f.err = &FileDeletedError{Path: f.path}
	}
}

// appliedLocked takes w, whose bytes reached the file (or whose write
// failed), out of its file's order, freeing the writes that waited for
// it, and gives its message's bytes back once the message's last write is
// done with them.
//
// Preconditions: s.mu is held.
func (s *Stream) appliedLocked(w *Write) {
	s.ordered--
	w.file.order.remove(w, s.readyLocked)
	// Its bytes go back to gRPC's pool with the message's last write.
	w.Data, w.AppendID = nil, nil
	w.Msg.Applied()
}

// work is a worker: it applies the writes that the files' orders free
// until the reader is done and every write read has been applied.
func (s *Stream) work() {
	defer s.helpers.Done()
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		for s.runnable.len() == 0 && !(s.readerDone && s.ordered == 0) {
			s.idle++
			s.workCond.Wait()
			s.idle--
		}
		if s.runnable.len() == 0 {
			return
		}
		w := s.popReadyLocked()
		f := w.file
		s.mu.Unlock()
		switch {
		case w.Err != nil:
			// Refused, and free now that the writes before it are
			// applied (refusedLocked).
			w.Res.Size = f.size()
		case w.Append:
			// The store checks the id's length, as for a unary Append.
			opts := store.AppendOptions{ID: string(w.AppendID)}
			w.Res, w.Landed, w.Err = f.h.ApplyAppend(s.ctx, w.Data, w.Sync, opts)
		default:
			w.Res, w.Err = f.h.Write(s.ctx, w.Off, w.Data, w.Sync)
			w.Landed = w.Off
		}
		s.mu.Lock()
		if errors.Is(w.Err, store.ErrDeleted) {
			s.fileDeletedLocked(f)
		}
		f.running--
		s.appliedLocked(w)
		s.runnableLocked(f)
		if w.Res.Owed != store.SyncNone {
			f.owing = append(f.owing, w)
			if !f.syncer {
				f.syncer = true
				s.helpers.Add(1)
				go s.syncLoop(f)
			}
		} else {
			s.doneLocked(w)
		}
		if s.runnable.len() > 0 {
			s.workCond.Signal()
		}
		if s.readerDone && s.ordered == 0 {
			s.workCond.Broadcast()
		}
	}
}

// syncLoop is f's syncer: each round waits, with one group-commit sync,
// for every write of f that was applied and owed a sync when the round
// began, then queues their acks. Writes applied meanwhile join the next
// round; once a round finds none, it returns, and the next write that
// owes a sync starts another.
func (s *Stream) syncLoop(f *File) {
	defer s.helpers.Done()
	batch, applied := f.syncBatch, f.syncApplied
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if len(f.owing) == 0 {
			f.syncBatch, f.syncApplied = batch[:0], applied[:0]
			f.syncer = false
			return
		}
		batch = append(batch[:0], f.owing...)
		clear(f.owing)
		f.owing = f.owing[:0]
		s.mu.Unlock()
		applied = applied[:0]
		for _, w := range batch {
			applied = append(applied, w.Res)
		}
		err := f.h.Wait(s.ctx, applied...)
		s.mu.Lock()
		for _, w := range batch {
			w.Err = err
			s.ackLocked(w)
		}
		clear(batch)
		switch {
		case s.sending:
			// The sender takes them with the acks it is sending.
		case s.sendClosed || s.sendErr != nil:
			s.wakeSenderLocked()
		default:
			s.sending = true
			s.mu.Unlock()
			s.sendAcks(false)
			s.mu.Lock()
		}
	}
}
