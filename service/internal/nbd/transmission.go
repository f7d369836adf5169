package nbd

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"time"

	"github.com/filewrite/filewrite/internal/bufpool"
)

// The transmission phase ("Transmission"): the serve goroutine reads
// requests one after another; each one the export works on runs on a
// goroutine of its own, at most Config.MaxRequestsPerConn at once, so
// that the requests of one connection run concurrently under the store's
// lock policy and are answered in whatever order they finish ("Replies
// need not be sent in the same order as requests"). A WRITE's payload is
// read by the serve goroutine (the next request starts after it), into a
// buffer the budget has granted first.

// transmit serves requests until the client disconnects, breaks the
// protocol, or the server stops; it returns once every request it
// started has ended, with the export closed.
func (c *conn) transmit() error {
	defer func() {
		// NBD_CMD_DISC: "The server MUST handle all outstanding
		// requests"; the same for a client that went away, whose writes
		// are made although nobody is told.
		c.handlers.Wait()
		c.cancel()
		c.exp.Close()
	}()
	lim := limits{size: c.size, readOnly: c.readOnly, structured: c.structured, meta: c.meta,
		maxPayload: uint32(c.srv.cfg.MaxPayload)}
	var hdr [requestHeaderLen]byte
	for {
		if err := c.flushHeld(requestHeaderLen); err != nil {
			return err
		}
		if _, err := io.ReadFull(c.br, hdr[:]); err != nil {
			return err
		}
		r, err := decodeRequest(&hdr)
		if err != nil {
			return fmt.Errorf("%w %#x", err, binary.BigEndian.Uint32(hdr[:]))
		}
		c.requests.Add(1)
		if r.typ == cmdDisc {
			return nil
		}
		ref := lim.check(r)
		if ref.errno == 0 {
			ref = c.refusedNow(r)
		}
		if ref.errno != 0 {
			if r.typ == cmdWrite {
				if err := refusedPayload(r); err != nil {
					return err
				}
				if err := discard(c.br, int64(r.length)); err != nil {
					return err
				}
			}
			_, end := c.begin(r)
			err := c.replyErr(r, ref.errno, ref.msg)
			end.done(ref)
			if err != nil {
				return err
			}
			continue
		}
		if err := c.dispatch(r); err != nil {
			return err
		}
	}
}

// refusedNow refuses r for what changed since the export opened: the
// server is shutting down, or a Recheck narrowed what the client may do.
func (c *conn) refusedNow(r request) refusal {
	if c.draining.Load() {
		return refusal{errnoSHUTDOWN, "the server is shutting down"}
	}
	switch c.narrowed.Load() {
	case narrowedAll:
		return refusal{errnoPERM, "the client's credential no longer allows this export"}
	case narrowedToRead:
		if r.typ == cmdWrite || r.typ == cmdTrim || r.typ == cmdWriteZeroes {
			return refusal{errnoPERM, "the client's credential now allows only reads of this export"}
		}
	}
	return refusal{}
}

// endFunc is an Observer's end, or nil.
type endFunc func(error)

func (e endFunc) done(err error) {
	if e != nil {
		e(err)
	}
}

// begin starts r for the observer, if any: the context r runs under and
// the function to call once it is answered.
func (c *conn) begin(r request) (context.Context, endFunc) {
	if o := c.srv.cfg.Observer; o != nil {
		ctx, end := o.Begin(c.ctx, Command(r.typ), int64(r.offset), r.length)
		return ctx, end
	}
	return c.ctx, nil
}

// dispatch starts the checked request r: a WRITE's payload is read
// first, and made at once if the export can without blocking; anything
// else runs on a goroutine of its own.
func (c *conn) dispatch(r request) error {
	select {
	case c.slots <- struct{}{}:
	default:
		// Every slot is taken: the requests in them must end first, and
		// the client may be waiting for the replies held back.
		if err := c.flushHeld(0); err != nil {
			return err
		}
		select {
		case c.slots <- struct{}{}:
		case <-c.ctx.Done():
			return c.ctx.Err()
		}
	}
	var buf *[]byte
	var ctx context.Context
	var end endFunc
	if r.typ == cmdWrite && r.length > 0 {
		n := int64(r.length)
		if err := c.srv.cfg.Budget.Acquire(c.ctx, n); err != nil {
			<-c.slots
			return err
		}
		buf = bufpool.Shared.Get(int(n))
		if err := c.readPayload(*buf); err != nil {
			bufpool.Shared.Put(buf)
			c.srv.cfg.Budget.Release(n)
			<-c.slots
			return err
		}
		if c.tw != nil && r.flags&cmdFlagFUA == 0 {
			ctx, end = c.begin(r)
			if c.tw.TryWriteAt(ctx, *buf, int64(r.offset)) {
				bufpool.Shared.Put(buf)
				c.srv.cfg.Budget.Release(n)
				<-c.slots
				err := c.replyMade(r)
				end.done(err)
				return err
			}
		}
	}
	c.running.Add(1)
	c.handlers.Add(1)
	go c.run(r, buf, ctx, end)
	return nil
}

// readPayload reads a WRITE's payload into p. Once the header has come,
// each 64 KiB of payload must come within Config.PayloadTimeout: the
// budget granted for it is held meanwhile.
func (c *conn) readPayload(p []byte) error {
	armed := false
	for len(p) > 0 {
		k := min(len(p), 64<<10)
		if err := c.flushHeld(k); err != nil {
			return err
		}
		if c.br.Buffered() < k {
			c.nc.SetReadDeadline(time.Now().Add(c.srv.cfg.PayloadTimeout))
			armed = true
		}
		if _, err := io.ReadFull(c.br, p[:k]); err != nil {
			return err
		}
		p = p[k:]
	}
	if armed {
		c.nc.SetReadDeadline(time.Time{})
	}
	return nil
}

// run runs request r and answers it. buf is a WRITE's payload, held from
// the pool and the budget until the write is made; ctx and end are the
// observer's, if dispatch began r already.
func (c *conn) run(r request, buf *[]byte, ctx context.Context, end endFunc) {
	defer func() {
		<-c.slots
		if c.running.Add(-1) == 0 && c.draining.Load() {
			c.closeConn()
		}
		// Last: transmit's wait for the handlers then sees none running.
		c.handlers.Done()
	}()
	if ctx == nil {
		ctx, end = c.begin(r)
	}
	off, n := int64(r.offset), int64(r.length)
	fua := r.flags&cmdFlagFUA != 0
	var err error
	switch r.typ {
	case cmdRead:
		err = c.read(ctx, r)
		end.done(err)
		return
	case cmdBlockStatus:
		err = c.blockStatus(ctx, r)
		end.done(err)
		return
	case cmdWrite:
		if buf != nil {
			err = c.exp.WriteAt(ctx, *buf, off, fua)
			bufpool.Shared.Put(buf)
			c.srv.cfg.Budget.Release(n)
		}
	case cmdFlush:
		err = c.exp.Flush(ctx)
	case cmdTrim:
		if n > 0 {
			err = c.exp.Trim(ctx, off, n, fua)
		}
	case cmdWriteZeroes:
		if n > 0 {
			err = c.exp.Zero(ctx, off, n, ZeroFlags{
				NoHole: r.flags&cmdFlagNoHole != 0, Fast: r.flags&cmdFlagFastZero != 0, FUA: fua})
		}
	case cmdCache:
		// A hint: "the server MAY use this information". The page cache
		// does the caching; the request is answered and nothing more.
	}
	if err != nil {
		if werr := c.replyErr(r, errnoOf(err), err.Error()); werr != nil {
			err = werr
		}
	} else {
		err = c.replyOK(r)
	}
	end.done(err)
}

// read serves NBD_CMD_READ. With simple replies the data follows the
// reply header; with structured replies the ranges that read as zeros are
// sent as NBD_REPLY_TYPE_OFFSET_HOLE chunks and the rest as
// NBD_REPLY_TYPE_OFFSET_DATA, or as one chunk of either with
// NBD_CMD_FLAG_DF. The data is read whole before the first byte of the
// reply is sent, so an error is told as an error ("If an error occurs
// while reading after the server has already sent out the reply header
// ... hard disconnect": never needed).
func (c *conn) read(ctx context.Context, r request) error {
	off, n := int64(r.offset), int(r.length)
	if n == 0 {
		// "SHOULD NOT request a read length of 0; the behavior of a
		// server on such a request is unspecified": nothing read,
		// success.
		return c.replyNoData(r)
	}
	if err := c.srv.cfg.Budget.Acquire(ctx, int64(n)); err != nil {
		return c.replyFailed(r, err)
	}
	defer c.srv.cfg.Budget.Release(int64(n))
	bp := bufpool.Shared.Get(n)
	defer bufpool.Shared.Put(bp)
	buf := *bp
	if !c.structured {
		if err := c.readData(ctx, buf, off); err != nil {
			return c.replyFailed(r, err)
		}
		if err := c.out.lock(); err != nil {
			return err
		}
		h := simpleReply(r.cookie, 0)
		c.out.write(h[:], buf)
		return c.out.unlock()
	}
	var plan [maxReadChunks + 1]span
	spans := c.planRead(ctx, plan[:0], off, int64(n), r.flags&cmdFlagDF != 0)
	for _, s := range spans {
		if !s.zero {
			if err := c.readData(ctx, buf[s.off-off:s.off-off+s.n], s.off); err != nil {
				return c.replyFailed(r, err)
			}
		}
	}
	if err := c.out.lock(); err != nil {
		return err
	}
	for i, s := range spans {
		flags := uint16(0)
		if i == len(spans)-1 {
			flags = replyFlagDone
		}
		var b [chunkHeaderLen + 12]byte
		binary.BigEndian.PutUint64(b[chunkHeaderLen:], uint64(s.off))
		if s.zero {
			putChunkHeader(b[:], flags, replyTypeOffsetHole, r.cookie, 12)
			binary.BigEndian.PutUint32(b[chunkHeaderLen+8:], uint32(s.n))
			c.out.write(b[:chunkHeaderLen+12])
		} else {
			putChunkHeader(b[:], flags, replyTypeOffsetData, r.cookie, uint32(8+s.n))
			c.out.write(b[:chunkHeaderLen+8], buf[s.off-off:s.off-off+s.n])
		}
	}
	return c.out.unlock()
}

// span is a range of a READ's reply: data, or zeros sent as a hole.
type span struct {
	off, n int64
	zero   bool
}

// planRead cuts [off, off+n) into spans, appended to spans, after the
// export's extents: the ranges that read as zeros and the others, at most
// maxReadChunks of them and the rest as data. With df (NBD_CMD_FLAG_DF)
// it is one span, a hole only if the whole range reads as zeros. Where
// the extents cannot be had, the range is data: the read will say why.
func (c *conn) planRead(ctx context.Context, spans []span, off, n int64, df bool) []span {
	limit := maxReadChunks
	if df {
		limit = 1
	}
	exts, err := c.exp.Extents(ctx, off, n, limit)
	if err != nil {
		exts = nil
	}
	end, pos := off+n, off
	for _, e := range exts {
		lo, hi := max(e.Offset, pos), min(e.Offset+e.Length, end)
		if lo != pos || hi <= lo {
			break // not contiguous from pos: the rest is data
		}
		if df && (hi != end || !e.Zero) {
			break
		}
		if k := len(spans); k > 0 && spans[k-1].zero == e.Zero {
			spans[k-1].n += hi - lo
		} else {
			spans = append(spans, span{off: lo, n: hi - lo, zero: e.Zero})
		}
		pos = hi
	}
	if pos < end {
		if k := len(spans); k > 0 && !spans[k-1].zero {
			spans[k-1].n += end - pos
		} else {
			spans = append(spans, span{off: pos, n: end - pos})
		}
	}
	if df && len(spans) > 1 {
		spans = append(spans[:0], span{off: off, n: n})
	}
	return spans
}

// readData reads len(p) bytes at off, as zeros past the file's end.
func (c *conn) readData(ctx context.Context, p []byte, off int64) error {
	k, err := c.exp.ReadAt(ctx, p, off)
	if err != nil {
		return err
	}
	clear(p[k:])
	return nil
}

// blockStatus serves NBD_CMD_BLOCK_STATUS for base:allocation: one
// NBD_REPLY_TYPE_BLOCK_STATUS chunk of descriptors from the export's
// extents, consecutive from the request's offset and merged where their
// status is the same; at most maxStatusExtents, or one with
// NBD_CMD_FLAG_REQ_ONE. A range the extents do not describe is reported
// as status 0 ("a server MAY always safely report a status of 0").
func (c *conn) blockStatus(ctx context.Context, r request) error {
	off, n := int64(r.offset), int64(r.length)
	limit := maxStatusExtents
	if r.flags&cmdFlagReqOne != 0 {
		limit = 1
	}
	exts, err := c.exp.Extents(ctx, off, n, limit)
	if err != nil {
		return c.replyFailed(r, err)
	}
	cost := int64(chunkHeaderLen + 4 + 8*(min(len(exts), limit)+1))
	if err := c.srv.cfg.Budget.Acquire(ctx, cost); err != nil {
		return c.replyFailed(r, err)
	}
	defer c.srv.cfg.Budget.Release(cost)
	b := make([]byte, chunkHeaderLen+4, cost)
	binary.BigEndian.PutUint32(b[chunkHeaderLen:], metaBaseAllocationID)
	end, pos := off+n, off
	var last uint32
	add := func(length int64, status uint32) {
		if len(b) > chunkHeaderLen+4 && status == last {
			i := len(b) - 8
			binary.BigEndian.PutUint32(b[i:], binary.BigEndian.Uint32(b[i:])+uint32(length))
			return
		}
		b = binary.BigEndian.AppendUint32(b, uint32(length))
		b = binary.BigEndian.AppendUint32(b, status)
		last = status
	}
	for _, e := range exts[:min(len(exts), limit)] {
		lo, hi := max(e.Offset, pos), min(e.Offset+e.Length, end)
		if lo != pos || hi <= lo {
			break
		}
		var status uint32
		if e.Hole {
			status |= stateHole
		}
		if e.Zero {
			status |= stateZero
		}
		add(hi-lo, status)
		pos = hi
	}
	if len(b) == chunkHeaderLen+4 {
		add(end-pos, 0)
	}
	putChunkHeader(b, replyFlagDone, replyTypeBlockStatus, r.cookie, uint32(len(b)-chunkHeaderLen))
	if err := c.out.lock(); err != nil {
		return err
	}
	c.out.write(b)
	return c.out.unlock()
}

// simpleReply is a simple reply's header ("Simple reply message").
func simpleReply(cookie uint64, errno uint32) [simpleReplyLen]byte {
	var b [simpleReplyLen]byte
	binary.BigEndian.PutUint32(b[0:], magicSimpleReply)
	binary.BigEndian.PutUint32(b[4:], errno)
	binary.BigEndian.PutUint64(b[8:], cookie)
	return b
}

// putChunkHeader writes a structured reply chunk's header into
// b[:chunkHeaderLen] ("Structured reply chunk message").
func putChunkHeader(b []byte, flags, typ uint16, cookie uint64, length uint32) {
	binary.BigEndian.PutUint32(b[0:], magicStructuredRply)
	binary.BigEndian.PutUint16(b[4:], flags)
	binary.BigEndian.PutUint16(b[6:], typ)
	binary.BigEndian.PutUint64(b[8:], cookie)
	binary.BigEndian.PutUint32(b[16:], length)
}

// replyMade answers the success of r, made by the serve goroutine: held
// back if the next request's header has come already, to leave with the
// replies after it.
func (c *conn) replyMade(r request) error {
	if c.br.Buffered() < requestHeaderLen {
		return c.replyOK(r)
	}
	if err := c.out.lock(); err != nil {
		return err
	}
	b := simpleReply(r.cookie, 0)
	c.out.write(b[:])
	c.held = true
	return c.out.unlockHeld()
}

// flushHeld flushes the replies the serve goroutine held back, unless
// the next n bytes it reads have come already: it is about to wait, for
// the client who may be waiting for them, or (n 0) for the requests in
// flight.
func (c *conn) flushHeld(n int) error {
	if !c.held || n > 0 && c.br.Buffered() >= n {
		return nil
	}
	c.held = false
	return c.out.flush()
}

// replyOK answers r's success where no data is due: a simple reply, which
// structured replies allow for any request but a READ.
func (c *conn) replyOK(r request) error {
	if err := c.out.lock(); err != nil {
		return err
	}
	b := simpleReply(r.cookie, 0)
	c.out.write(b[:])
	return c.out.unlock()
}

// replyNoData answers a READ of length 0: success, with no data.
func (c *conn) replyNoData(r request) error {
	if !c.structured {
		return c.replyOK(r)
	}
	if err := c.out.lock(); err != nil {
		return err
	}
	var b [chunkHeaderLen]byte
	putChunkHeader(b[:], replyFlagDone, replyTypeNone, r.cookie, 0)
	c.out.write(b[:])
	return c.out.unlock()
}

// replyFailed answers r with err's error value, and returns err unless
// the reply could not be sent.
func (c *conn) replyFailed(r request, err error) error {
	if werr := c.replyErr(r, errnoOf(err), err.Error()); werr != nil {
		return werr
	}
	return err
}

// replyErr answers r with the error errno: with structured replies an
// NBD_REPLY_TYPE_ERROR chunk that carries msg ("The server SHOULD prefer
// sending errors via a structured reply, as the error can then be
// accompanied by a string"), else a simple reply (and for a READ no
// data).
func (c *conn) replyErr(r request, errno uint32, msg string) error {
	if err := c.out.lock(); err != nil {
		return err
	}
	if !c.structured {
		b := simpleReply(r.cookie, errno)
		c.out.write(b[:])
		return c.out.unlock()
	}
	msg = truncate(msg, maxString)
	var b [chunkHeaderLen + 6]byte
	putChunkHeader(b[:], replyFlagDone, replyTypeError, r.cookie, uint32(6+len(msg)))
	binary.BigEndian.PutUint32(b[chunkHeaderLen:], errno)
	binary.BigEndian.PutUint16(b[chunkHeaderLen+4:], uint16(len(msg)))
	c.out.write(b[:], []byte(msg))
	return c.out.unlock()
}
