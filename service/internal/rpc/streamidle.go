package rpc

import (
	"sync/atomic"
	"time"

	"github.com/filewrite/filewrite/service/internal/status"
)

// A WriteStream that carries nothing still holds its file, a slot of
// --max-open-files: a client that leaves Files open can lock every other
// client out of new files. The idle timer ends such a stream once it has
// gone --stream-idle-timeout without a message and without a write to
// apply or acknowledge, as stop does, with STREAM_IDLE. Nothing is lost: a
// write is acked before the stream ends unless the reader dropped it,
// never applied, because it came after the stop; either way the client
// may send again every write it holds no ack for.

// idleWatch is a stream's idle clock: when it last went quiet, and
// whether the reader is handling a message now.
type idleWatch struct {
	// quietSince is when the stream last went quiet (monoNow): its last
	// message handled, or the last ack owed taken to be sent.
	quietSince atomic.Int64
	// handling is set while the reader handles a message (its writes may
	// wait for the budgets before they count as pending).
	handling atomic.Bool
	// timer runs checkIdle; set under writeStream.mu before it can fire,
	// nil when there is no timeout.
	timer *time.Timer
}

// monoEpoch and monoNow give the daemon's monotonic clock as a number.
var monoEpoch = time.Now()

func monoNow() int64 { return int64(time.Since(monoEpoch)) }

// startIdleTimer arms the idle timer, unless streams have no timeout.
func (ws *writeStream) startIdleTimer() {
	timeout := ws.files.streamIdleTimeout
	if timeout <= 0 {
		return
	}
	ws.idleWatch.quietSince.Store(monoNow())
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.idleWatch.timer = time.AfterFunc(timeout, ws.checkIdle)
}

// checkIdle is the timer's: it ends the stream if it has been idle for the
// timeout, or else re-arms the timer for when it would be. Holding mu, it
// sees pending as queue leaves it: a message whose writes were handed out
// counts; one that comes after the stop is dropped by queue.
func (ws *writeStream) checkIdle() {
	timeout := ws.files.streamIdleTimeout
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.stopping {
		return
	}
	quiet := time.Duration(monoNow() - ws.idleWatch.quietSince.Load())
	if ws.pending > 0 || ws.idleWatch.handling.Load() {
		quiet = 0 // busy: a full timeout from now at least
	}
	if quiet < timeout {
		ws.idleWatch.timer.Reset(timeout - quiet)
		return
	}
	ws.stopLocked(status.StreamIdle(timeout))
}

// stopIdleTimer is called once the stream is over.
func (ws *writeStream) stopIdleTimer() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.idleWatch.timer != nil {
		ws.idleWatch.timer.Stop()
	}
}

// receiving is called by the reader once a message arrived, and handled
// once it is done with it (its writes handed out, or the message dropped).
func (iw *idleWatch) receiving() { iw.handling.Store(true) }

func (iw *idleWatch) handled() {
	iw.quietSince.Store(monoNow())
	iw.handling.Store(false)
}

// acked is called when the last write owed an ack was taken to be sent.
func (iw *idleWatch) acked() { iw.quietSince.Store(monoNow()) }
