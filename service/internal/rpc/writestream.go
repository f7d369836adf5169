package rpc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"sync/atomic"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	grpcstatus "google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/internal/streamwire"
	"github.com/filewrite/filewrite/service/internal/admit"
	"github.com/filewrite/filewrite/service/internal/auth"
	"github.com/filewrite/filewrite/service/internal/status"
	"github.com/filewrite/filewrite/service/internal/streamengine"
	"github.com/filewrite/filewrite/store"
)

// WriteStream carries many writes to one file, or to many files declared
// on it (see the RPC's contract in the proto). The handler only checks
// what the stream carries and calls the store; writeStream runs it.
func (s *FileServer) WriteStream(ss grpc.BidiStreamingServer[filewritev1.WriteStreamRequest, filewritev1.WriteStreamResponse]) error {
	return newWriteStream(s, ss).serve()
}

// writeStream is one WriteStream's gRPC framing over its engine
// (streamengine.Stream), which applies the writes and decides when acks
// are ready and who sends them. Two goroutines are the framing's:
//
//   - the handler's (serve) sends the acks when the engine has some
//     (Deliver), stops the stream at the daemon's drain, and returns its
//     outcome;
//   - the reader (read) alone calls Recv: it opens the files, checks each
//     message, takes its cost from the budgets and hands its writes to
//     the engine (Queue).
//
// The engine's syncers send too, through send, when it is their turn.
// Whichever of the handler and the reader is done last (users) closes the
// engine and the budget; the reader waits for the engine's goroutines
// first (ReaderDone).
type writeStream struct {
	files  *FileServer
	ss     grpc.BidiStreamingServer[filewritev1.WriteStreamRequest, filewritev1.WriteStreamResponse]
	ctx    context.Context
	budget *admit.StreamBudget
	engine *streamengine.Stream

	// users counts the handler and the reader: the last to finish closes
	// the engine and the budget.
	users atomic.Int32
	// queued holds the writes of the message being read, for the engine;
	// the reader's alone.
	queued []*streamengine.Write
	// resp is the response being sent, owned by whoever the engine gave
	// the turn to send.
	resp encodedMessage
}

func newWriteStream(files *FileServer, ss grpc.BidiStreamingServer[filewritev1.WriteStreamRequest, filewritev1.WriteStreamResponse]) *writeStream {
	ws := &writeStream{
		files:  files,
		ss:     ss,
		ctx:    ss.Context(),
		budget: admit.NewStreamBudget(files.maxStreamBytes, &files.streamHeld, files.budget),
	}
	ws.engine = streamengine.New(ws.ctx, files.streamIdleTimeout, ws.send)
	return ws
}

// serve runs the stream until it ends, on the handler's goroutine: it
// sends acks as they become ready, several per response, and returns once
// every write read has been acked after the stream was told to stop (by
// the client's half-close, a stream error, or the daemon's shutdown).
func (ws *writeStream) serve() error {
	ws.files.streamMetrics.opened(ws.ctx)
	ws.users.Store(2)
	defer ws.release()
	ws.engine.StartIdleTimer()
	go ws.read()
	draining := ws.files.draining
	for {
		select {
		case <-ws.engine.Wake():
			// Let the workers that are already runnable finish first, so
			// that their acks go in this response: a yield, not a wait.
			runtime.Gosched()
		case <-draining:
			draining = nil
			ws.engine.Stop(status.Refusal(filewritev1.ErrorReason_SHUTTING_DOWN, nil, "the daemon is shutting down: writes read before are acked, resend the others"))
		case <-ws.ctx.Done():
			ws.engine.Stop(ws.ctx.Err())
			ws.engine.CloseSends()
			return status.Of(ws.ctx.Err())
		}
		if done, end := ws.engine.Deliver(); done {
			ws.engine.CloseSends()
			return engineStatus(end)
		}
	}
}

// send is the engine's Sender: it sends one response of acks (and the
// reports of files declared), then gives back what the acked writes held
// of the budgets.
func (ws *writeStream) send(acked []*streamengine.Write, statuses []streamengine.FileStatus) error {
	encodeAcks(acked, statuses, &ws.resp)
	if err := ws.ss.SendMsg(&ws.resp); err != nil {
		return err
	}
	var cost int64
	for _, w := range acked {
		cost += w.Cost
	}
	ws.budget.Give(cost)
	ws.logFailures(acked)
	return nil
}

// logFailures logs the writes acked with a code that means the server or
// the disk failed, as logRPC logs such a unary Write.
func (ws *writeStream) logFailures(acked []*streamengine.Write) {
	for _, w := range acked {
		if w.Err == nil {
			continue
		}
		err := engineStatus(w.Err)
		code := grpcstatus.Code(status.Of(err))
		if status.FailureLevel(code) != slog.LevelError {
			continue
		}
		ws.files.log.LogAttrs(ws.ctx, slog.LevelError, "stream write",
			slog.String("path", w.Path()),
			slog.Uint64("id", w.ID),
			slog.String("code", code.String()),
			slog.String("error", err.Error()))
	}
}

// ackStatus is a write's outcome as its ack carries it: nil on success.
func ackStatus(err error) *spb.Status {
	if err == nil {
		return nil
	}
	return grpcstatus.Convert(status.Of(engineStatus(err))).Proto()
}

// engineStatus is err with the engine's own errors turned into the
// refusals they stand for; any other error is left to status.Of.
func engineStatus(err error) error {
	var (
		deleted *streamengine.FileDeletedError
		unknown *streamengine.UnknownFileError
		inUse   *streamengine.IDInUseError
		idle    *streamengine.IdleError
	)
	switch {
	case errors.As(err, &deleted):
		return deletedStatus(deleted.Path)
	case errors.As(err, &unknown):
		return status.UnknownStreamFile(unknown.Index)
	case errors.As(err, &inUse):
		return status.WriteIDInUse(inUse.ID)
	case errors.As(err, &idle):
		return status.StreamIdle(idle.Timeout)
	}
	return err
}

// watchAuth looks again at the stream's files at each reload of
// --auth-token-file. One that removes the credential, or narrows its scope
// away from the file of the stream's path, ends the stream
// (UNAUTHENTICATED, PERMISSION_DENIED) as Stop does: the writes read
// before the reload are acked, none after. A declared file the new scope
// leaves out fails its writes read from then on with the refusal, and the
// stream goes on. It returns when the stream stops.
func (ws *writeStream) watchAuth(changed <-chan struct{}) {
	var files []*streamengine.File
	for {
		select {
		case <-changed:
			changed = ws.files.auth.Changed()
			if main := ws.engine.Main(); main != nil {
				if err := ws.files.auth.Authorize(ws.ctx, auth.AccessWrite, main.Path()); err != nil {
					ws.engine.Stop(err)
					return
				}
			}
			files = ws.engine.Declared(files[:0])
			for _, f := range files {
				if err := ws.files.auth.Authorize(ws.ctx, auth.AccessWrite, f.Path()); err != nil {
					ws.engine.Refuse(f, err)
				}
			}
			clear(files)
		case <-ws.engine.Stopped().Done():
			return
		}
	}
}

func deletedStatus(path string) error {
	return status.Refusal(filewritev1.ErrorReason_FILE_DELETED, nil, "%s was deleted or replaced while the stream wrote to it: writes read before are acked", path)
}

// release is called once by the handler and once by the reader; the
// last closes the files and gives back what is still held.
func (ws *writeStream) release() {
	if ws.users.Add(-1) > 0 {
		return
	}
	ws.engine.Close()
	ws.budget.Close()
	ws.files.streamMetrics.closed(context.Background())
}

// read is the reader: it reads messages while the stream is below its
// byte bound and not stopping, and hands their writes out.
func (ws *writeStream) read() {
	defer ws.release()
	defer ws.engine.ReaderDone()
	for ws.budget.Wait(ws.engine.Stopped()) {
		req := new(streamRequest)
		err := ws.ss.RecvMsg(req)
		if errors.Is(err, io.EOF) {
			ws.engine.Stop(nil) // half-closed: ack what was read, then OK
			return
		}
		if err == nil {
			ws.engine.Receiving()
			err = ws.accept(req)
			ws.engine.Handled()
		}
		if err != nil {
			ws.engine.Stop(err)
			return
		}
	}
}

// accept checks one message, opening the file on the first, takes its
// cost from the budgets, and hands its writes out. An error ends the
// stream; the message's writes are then refused, all of them, and the
// writes of earlier messages are still applied and acked.
//
// While the daemon's budget is short, accept waits for it before the
// message's writes are handed out, and the reader reads no further. If the
// stream is told to stop meanwhile (shutdown, its file deleted, an ack it
// could not send), the message is dropped, as one read after the stop is:
// neither applied nor acked. If the stream's context ends, that is its end.
func (ws *writeStream) accept(req *streamRequest) error {
	if err := ws.check(req); err != nil {
		req.release()
		return err
	}
	if req.msg.Writes == 0 {
		if len(req.msg.Closes) > 0 {
			ws.engine.CloseFiles(req.msg.Closes)
		}
		return nil
	}
	// The cost counts a record per write: it is taken before they are
	// made.
	cost := req.cost()
	if err := ws.budget.Take(ws.engine.Stopped(), cost); err != nil {
		req.release()
		if ws.ctx.Err() != nil {
			// Take's error says the stream's deadline passed while it
			// waited for the budget (INFLIGHT_BUDGET), not a bare
			// DEADLINE_EXCEEDED.
			return status.Of(err)
		}
		return nil // stopped while waiting
	}
	req.decodeWrites()
	ws.queued = ws.queued[:0]
	for i := range req.writes {
		w := &req.writes[i]
		w.Cost = admit.WriteCost(len(w.Data))
		var err error
		if w.Sync, err = status.SyncModeFromProto(w.syncRaw); err == nil && w.hasCRC {
			err = status.CheckCRC32C(w.Data, w.crc, "writes.crc32c")
		}
		if err == nil && w.Append && w.Off != 0 {
			err = status.Refusal(filewritev1.ErrorReason_RANGE_INVALID, map[string]string{errorinfo.KeyField: "offset"},
				"a write with append takes no offset (it goes at the end of the file), this one has offset %d", w.Off)
		}
		if err == nil && !w.Append && len(w.AppendID) > 0 {
			err = status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: "append_id"},
				"append_id is for an append: a positional write (append not set) takes none")
		}
		w.Err = err
		ws.queued = append(ws.queued, &w.Write)
	}
	queued, err := ws.engine.Queue(ws.queued, req.msg.Closes)
	clear(ws.queued)
	if !queued {
		ws.budget.Give(cost)
		req.release()
	}
	return err
}

// check checks what a message says before any of its writes is looked
// at, opening the file of its path on the first, and the files it
// declares.
func (ws *writeStream) check(req *streamRequest) error {
	ws.files.streamMetrics.message(ws.ctx, req.msg.Writes, ws.budget.Held())
	if req.err != nil {
		var many *streamwire.TooManyWritesError
		if errors.As(req.err, &many) {
			return status.Refusal(filewritev1.ErrorReason_TOO_MANY_WRITES_IN_MESSAGE, map[string]string{errorinfo.KeyField: "writes", errorinfo.KeyLimit: strconv.Itoa(many.Limit)},
				"a message of more than %d writes: the limit is %d writes per message; send the rest in the next message", many.Limit, many.Limit)
		}
		return status.Malformed(req.err.Error())
	}
	if int64(req.size) > ws.files.maxMessageBytes {
		return status.MessageTooLarge(req.size, ws.files.maxMessageBytes)
	}
	first := !ws.engine.Opened()
	if first {
		// The channel is taken before the first check, so that a reload
		// after it is not missed.
		var authChanged <-chan struct{}
		if ws.files.auth != nil {
			authChanged = ws.files.auth.Changed()
		}
		// The routing header names the first file: the path's, or the
		// first declared (see pathheader.go).
		header := req.msg.Path
		if header == "" && len(req.msg.Files) > 0 {
			header = req.msg.Files[0].Path
		}
		if err := checkPathHeader(ws.ctx, header, false); err != nil {
			return err
		}
		if req.msg.Path != "" || len(req.msg.Files) == 0 {
			if err := ws.openMain(req); err != nil {
				return err
			}
		}
		if ws.files.auth != nil {
			go ws.watchAuth(authChanged)
		}
	} else if main := ws.engine.Main(); req.msg.Path != "" && (main == nil || req.msg.Path != main.Path()) {
		mainPath := ""
		if main != nil {
			mainPath = main.Path()
		}
		return status.Refusal(filewritev1.ErrorReason_STREAM_PATH_CHANGED, map[string]string{errorinfo.KeyField: "path"}, "the message names %q but the stream's path is %q: only the first message may name it; declare other files (files)", req.msg.Path, mainPath)
	}
	if err := ws.declare(req.msg.Files, req.msg.Closes); err != nil {
		return err
	}
	if first {
		ws.engine.MarkOpened()
	}
	return nil
}

// openMain opens the file of the first message's path, whose failure
// ends the stream, and gives it to the engine, which watches for its
// deletion.
func (ws *writeStream) openMain(req *streamRequest) error {
	h, err := ws.openFile(req.msg.Path, filewritev1.OpenMode(req.msg.OpenMode), req.msg.If)
	if err != nil {
		return err
	}
	ws.engine.SetMain(req.msg.Path, h)
	return nil
}

// declare opens the files a message declares, each checked as a unary
// Write of its path would be (the routing header aside: see
// pathheader.go), and queues its report. A file that cannot be opened
// takes its index all the same, its writes acked with the reason, until
// the client closes it; only an index that cannot be declared (0, or one
// in use) ends the stream.
func (ws *writeStream) declare(files []streamwire.File, closes []uint32) error {
	if len(files) == 0 {
		return nil
	}
	// The files the same message closes do not count against the bound:
	// a client at the bound closes an idle file and declares the next in
	// one message. (They are closed once the message's writes are handed
	// out, so that writes sent with the close still reach them.)
	closing := ws.engine.Closing(closes)
	for i := range files {
		d := &files[i]
		inUse, held := ws.engine.Slot(d.Index, closing)
		if d.Index == 0 || inUse {
			return status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: "files.index", "index": strconv.FormatUint(uint64(d.Index), 10)},
				"file index %d is 0 or already on the stream: declare an index of 1 or more, and close it before declaring it again", d.Index)
		}
		limit := ws.files.maxFilesPerStream
		if held >= 2*limit {
			// Declarations refused past the bound take an index too, for
			// the writes sent with them to be acked with the refusal; a
			// client that goes on declaring without closing any is not
			// reading the refusals.
			return status.TooManyFilesOnStream(limit)
		}
		var h *store.Handle
		var err error
		if held >= limit {
			err = status.TooManyFilesOnStream(limit)
		} else {
			h, err = ws.openFile(d.Path, filewritev1.OpenMode(d.OpenMode), d.If)
		}
		ws.engine.Declare(d.Index, d.Path, h, err)
	}
	return nil
}

// openFile checks a file's open mode and the caller's access to it, and
// opens it on the conditions on its generation: the path's file of the
// first message, or a declared one.
func (ws *writeStream) openFile(path string, mode filewritev1.OpenMode, cond streamwire.Conditions) (*store.Handle, error) {
	open, err := status.OpenModeFromProto(mode)
	if err != nil {
		return nil, status.Of(err)
	}
	if err := ws.files.auth.Authorize(ws.ctx, auth.AccessWrite, path); err != nil {
		return nil, err
	}
	h, err := ws.files.store.OpenHandleIf(ws.ctx, path, open, status.Precondition(cond.IfMatch, cond.IfNotMatch))
	if err != nil {
		return nil, status.Of(err)
	}
	return h, nil
}
