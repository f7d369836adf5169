package streamengine

import (
	"sync/atomic"
	"time"
)

// A WriteStream that carries nothing still holds its file, a slot of
// --max-open-files: a client that leaves Files open can lock every other
// client out of new files. The idle timer ends such a stream once it has
// gone its idle timeout without a message and without a write to apply or
// acknowledge, as Stop does, with an IdleError. Nothing is lost: a write
// is acked before the stream ends unless the reader dropped it, never
// applied, because it came after the stop; either way the client may send
// again every write it holds no ack for.

// idleWatch is a stream's idle clock: when it last went quiet, and
// whether the reader is handling a message now.
type idleWatch struct {
	// quietSince is when the stream last went quiet (monoNow): its last
	// message handled, or the last ack owed taken to be sent.
	quietSince atomic.Int64
	// handling is set while the reader handles a message (its writes may
	// wait for the budgets before they count as pending).
	handling atomic.Bool
	// timer runs checkIdle; set under Stream.mu before it can fire,
	// nil when there is no timeout.
	timer *time.Timer
}

// monoEpoch and monoNow give the daemon's monotonic clock as a number.
var monoEpoch = time.Now()

func monoNow() int64 { return int64(time.Since(monoEpoch)) }

// StartIdleTimer arms the idle timer, unless the stream has no timeout.
func (s *Stream) StartIdleTimer() {
	timeout := s.idleTimeout
	if timeout <= 0 {
		return
	}
	s.idleWatch.quietSince.Store(monoNow())
	s.mu.Lock()
	defer s.mu.Unlock()
	s.idleWatch.timer = time.AfterFunc(timeout, s.checkIdle)
}

// checkIdle is the timer's: it ends the stream if it has been idle for the
// timeout, or else re-arms the timer for when it would be. Holding mu, it
// sees pending as queue leaves it: a message whose writes were handed out
// counts; one that comes after the stop is dropped by queue.
func (s *Stream) checkIdle() {
	timeout := s.idleTimeout
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return
	}
	quiet := time.Duration(monoNow() - s.idleWatch.quietSince.Load())
	if s.pending > 0 || s.idleWatch.handling.Load() {
		quiet = 0 // busy: a full timeout from now at least
	}
	if quiet < timeout {
		s.idleWatch.timer.Reset(timeout - quiet)
		return
	}
	s.stopLocked(&IdleError{Timeout: timeout})
}

// stopIdleTimer is called once the stream is over.
func (s *Stream) stopIdleTimer() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.idleWatch.timer != nil {
		s.idleWatch.timer.Stop()
	}
}

// Receiving is called by the reader once a message arrived, and Handled
// once it is done with it (its writes handed out, or the message dropped).
func (s *Stream) Receiving() { s.idleWatch.handling.Store(true) }

// Handled: see Receiving.
func (s *Stream) Handled() {
	s.idleWatch.quietSince.Store(monoNow())
	s.idleWatch.handling.Store(false)
}

// acked is called when the last write owed an ack was taken to be sent.
func (iw *idleWatch) acked() { iw.quietSince.Store(monoNow()) }
