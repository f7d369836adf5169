package nbd

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// The handshake ("Handshake", "Fixed newstyle negotiation"): the server's
// greeting, the client's flags, then options until one enters the
// transmission phase (NBD_OPT_GO, NBD_OPT_EXPORT_NAME) or ends the session
// (NBD_OPT_ABORT). Only fixed newstyle is spoken: a client that does not
// set NBD_FLAG_C_FIXED_NEWSTYLE is disconnected. Every length the client
// sends is checked before anything is allocated for it; option data is
// read into one buffer of at most maxOptionData bytes, and larger option
// data is read past without being kept.

// errHardDisconnect ends a session where the protocol has the server
// initiate a hard disconnect ("Termination of the session during option
// haggling"): a broken mandatory condition, or an NBD_OPT_EXPORT_NAME the
// server cannot satisfy.
var errHardDisconnect = errors.New("hard disconnect")

// errAborted ends a session the client ended with NBD_OPT_ABORT.
var errAborted = errors.New("client aborted the handshake")

// negotiation is what the options have settled so far.
type negotiation struct {
	noZeroes   bool
	structured bool
	// metaExport and metaAllocation: the last NBD_OPT_SET_META_CONTEXT
	// named metaExport and selected base:allocation.
	metaExport     string
	metaAllocation bool
}

// handshake runs the handshake and, on success, leaves c ready for the
// transmission phase (c.exp set). It returns errAborted for a client's
// NBD_OPT_ABORT, and another error when the session ends otherwise.
func (c *conn) handshake(ctx context.Context) error {
	var greet [18]byte
	binary.BigEndian.PutUint64(greet[0:], magicInitPasswd)
	binary.BigEndian.PutUint64(greet[8:], magicIHaveOpt)
	binary.BigEndian.PutUint16(greet[16:], flagFixedNewstyle|flagNoZeroes)
	c.bw.Write(greet[:])
	if err := c.bw.Flush(); err != nil {
		return err
	}
	var cf [4]byte
	if _, err := io.ReadFull(c.br, cf[:]); err != nil {
		return err
	}
	flags := binary.BigEndian.Uint32(cf[:])
	if flags&^clientKnownFlags != 0 {
		// "the server MUST drop the TCP connection if the client sets an
		// unknown flag" (Client flags).
		return fmt.Errorf("%w: unknown client flags %#x", errHardDisconnect, flags)
	}
	if flags&clientFixedNewstyle == 0 {
		return fmt.Errorf("%w: the client does not speak fixed newstyle negotiation", errHardDisconnect)
	}
	c.neg.noZeroes = flags&clientNoZeroes != 0
	for {
		done, err := c.option(ctx)
		if err != nil || done {
			return err
		}
	}
}

// option reads and answers one option; done is true once the transmission
// phase is entered.
func (c *conn) option(ctx context.Context) (done bool, err error) {
	var hdr [optionHeaderLen]byte
	if _, err := io.ReadFull(c.br, hdr[:]); err != nil {
		return false, err
	}
	if binary.BigEndian.Uint64(hdr[0:]) != magicIHaveOpt {
		return false, fmt.Errorf("%w: bad option magic %#x", errHardDisconnect, binary.BigEndian.Uint64(hdr[0:]))
	}
	opt := binary.BigEndian.Uint32(hdr[8:])
	n := binary.BigEndian.Uint32(hdr[12:])
	if n > maxOptionData {
		if err := discard(c.br, int64(n)); err != nil {
			return false, err
		}
		if opt == optExportName {
			return false, fmt.Errorf("%w: NBD_OPT_EXPORT_NAME of %d bytes", errHardDisconnect, n)
		}
		return false, c.optErr(opt, repErrTooBig, fmt.Sprintf("option data of %d bytes, the limit is %d", n, maxOptionData))
	}
	if cap(c.optBuf) < int(n) {
		c.optBuf = make([]byte, n)
	}
	data := c.optBuf[:n]
	if _, err := io.ReadFull(c.br, data); err != nil {
		return false, err
	}
	if c.srv.shuttingDown() && opt != optAbort {
		if opt == optExportName {
			return false, fmt.Errorf("%w: shutting down", errHardDisconnect)
		}
		// "SHOULD error further options ... with NBD_REP_ERR_SHUTDOWN".
		return false, c.optErr(opt, repErrShutdwn, "the server is shutting down")
	}
	if c.srv.cfg.RequireTLS && c.peer.TLS == nil && opt != optStartTLS && opt != optAbort {
		// FORCEDTLS mode.
		if opt == optExportName {
			return false, fmt.Errorf("%w: NBD_OPT_EXPORT_NAME before TLS", errHardDisconnect)
		}
		return false, c.optErr(opt, repErrTLSReqd, "this server requires TLS: send NBD_OPT_STARTTLS first")
	}
	switch opt {
	case optExportName:
		return c.optExportName(ctx, data)
	case optAbort:
		// "The server MUST reply with NBD_REP_ACK"; data is ignored.
		c.optReply(opt, repAck, nil)
		c.bw.Flush()
		return false, errAborted
	case optList:
		return false, c.optList(ctx, data)
	case optStartTLS:
		return false, c.optStartTLS(ctx, data)
	case optInfo, optGo:
		return c.optInfoGo(ctx, opt, data)
	case optStructuredReply:
		if len(data) != 0 {
			return false, c.optErr(opt, repErrInvalid, "NBD_OPT_STRUCTURED_REPLY takes no data")
		}
		c.neg.structured = true
		return false, c.optAck(opt)
	case optListMetaContext, optSetMetaContext:
		return false, c.optMetaContext(opt, data)
	}
	// "Servers that receive messages which they do not implement MUST
	// reply to them with NBD_REP_ERR_UNSUP" (Baseline).
	return false, c.optErr(opt, repErrUnsup, fmt.Sprintf("option %d is not supported", opt))
}

// discard reads n bytes and keeps none.
func discard(br *bufio.Reader, n int64) error {
	for n > 0 {
		k, err := br.Discard(int(min(n, 1<<20)))
		n -= int64(k)
		if err != nil {
			return err
		}
	}
	return nil
}

// optExportName is NBD_OPT_EXPORT_NAME: the data is the name; an export
// that cannot be opened ends the session, as the option has no error
// reply.
func (c *conn) optExportName(ctx context.Context, data []byte) (bool, error) {
	name := string(data)
	exp, err := c.open(ctx, name)
	if err != nil {
		return false, fmt.Errorf("%w: NBD_OPT_EXPORT_NAME %q: %w", errHardDisconnect, name, err)
	}
	var b [10 + exportNameReserved]byte
	binary.BigEndian.PutUint64(b[0:], uint64(exp.Size()))
	binary.BigEndian.PutUint16(b[8:], c.transmissionFlags(exp))
	n := len(b)
	if c.neg.noZeroes {
		n = 10
	}
	c.bw.Write(b[:n])
	c.enter(exp, name)
	return true, c.bw.Flush()
}

// open asks the backend for name, checking what the protocol asks of a
// name first ("Conventions": UTF-8, no NUL, at most 4096 bytes).
func (c *conn) open(ctx context.Context, name string) (Export, error) {
	if len(name) > maxString || !utf8.ValidString(name) {
		return nil, fmt.Errorf("%w: the name is not a string of at most %d bytes of UTF-8", ErrNotFound, maxString)
	}
	if name == "" {
		return nil, fmt.Errorf("%w: there is no default export; name a file", ErrNotFound)
	}
	exp, err := c.srv.cfg.Backend.Open(ctx, &c.peer, name)
	if err != nil {
		return nil, err
	}
	if exp.Size() < 0 {
		exp.Close()
		return nil, fmt.Errorf("export %q has a negative size", name)
	}
	return exp, nil
}

// transmissionFlags are the flags of exp as negotiated so far
// ("Transmission flags").
func (c *conn) transmissionFlags(exp Export) uint16 {
	f := uint16(transHasFlags | transSendFlush | transSendFUA | transCanMultiConn | transSendCache)
	if exp.ReadOnly() {
		f |= transReadOnly
	} else {
		f |= transSendTrim | transWriteZeroes | transSendFastZero
	}
	if c.neg.structured {
		f |= transSendDF
	}
	return f
}

// optInfoGo is NBD_OPT_INFO and NBD_OPT_GO: "32 bits, length of name; String:
// name of the export; 16 bits, number of information requests; 16 bits x
// n". The reply is NBD_INFO_EXPORT and NBD_INFO_BLOCK_SIZE, NBD_INFO_NAME
// when asked for, then NBD_REP_ACK; NBD_OPT_GO then enters transmission.
func (c *conn) optInfoGo(ctx context.Context, opt uint32, data []byte) (bool, error) {
	if len(data) < 6 {
		return false, c.optErr(opt, repErrInvalid, "option data too short")
	}
	nameLen := binary.BigEndian.Uint32(data)
	if uint64(nameLen) > uint64(len(data)-6) {
		return false, c.optErr(opt, repErrInvalid, "name length past the option data")
	}
	rest := data[4+nameLen:]
	nreq := int(binary.BigEndian.Uint16(rest))
	if len(rest) != 2+2*nreq {
		return false, c.optErr(opt, repErrInvalid, fmt.Sprintf("%d information requests do not fill the option data", nreq))
	}
	wantName := false
	for i := range nreq {
		if binary.BigEndian.Uint16(rest[2+2*i:]) == infoName {
			wantName = true
		}
	}
	name := string(data[4 : 4+nameLen])
	exp, err := c.open(ctx, name)
	if err != nil {
		return false, c.optOpenErr(opt, err)
	}
	var b [14]byte
	binary.BigEndian.PutUint16(b[0:], infoExport)
	binary.BigEndian.PutUint64(b[2:], uint64(exp.Size()))
	binary.BigEndian.PutUint16(b[10:], c.transmissionFlags(exp))
	c.optReply(opt, repInfo, b[:12])
	// Sent whether or not it was asked for ("The server MAY send
	// information requests back which are not explicitly requested"):
	// a client that did not ask gets the defaults it assumes anyway,
	// and one whose payloads pass the maximum gets EINVAL.
	binary.BigEndian.PutUint16(b[0:], infoBlockSize)
	binary.BigEndian.PutUint32(b[2:], 1)
	binary.BigEndian.PutUint32(b[6:], preferredBlock)
	binary.BigEndian.PutUint32(b[10:], uint32(c.srv.cfg.MaxPayload))
	c.optReply(opt, repInfo, b[:14])
	if wantName {
		c.optReply(opt, repInfo, []byte{0, infoName}, []byte(name))
	}
	if opt == optInfo {
		err := c.optAck(opt)
		exp.Close()
		return false, err
	}
	// In transmission before the client hears so: Server.Conns and
	// Recheck see the export from then on.
	c.enter(exp, name)
	return true, c.optAck(opt)
}

// optOpenErr answers an option whose export could not be opened.
func (c *conn) optOpenErr(opt uint32, err error) error {
	switch {
	case errors.Is(err, ErrPermission):
		return c.optErr(opt, repErrPolicy, err.Error())
	case errors.Is(err, ErrShutdown):
		return c.optErr(opt, repErrShutdwn, err.Error())
	}
	// Not found, and anything else that keeps the export from being
	// served: "The requested export is not available".
	return c.optErr(opt, repErrUnknown, err.Error())
}

// optList is NBD_OPT_LIST: an NBD_REP_SERVER per export the client may
// open, at most MaxListNames, then NBD_REP_ACK.
func (c *conn) optList(ctx context.Context, data []byte) error {
	if len(data) != 0 {
		return c.optErr(optList, repErrInvalid, "NBD_OPT_LIST takes no data")
	}
	names, err := c.srv.cfg.Backend.List(ctx, &c.peer, MaxListNames)
	if err != nil {
		if errors.Is(err, ErrShutdown) {
			return c.optErr(optList, repErrShutdwn, err.Error())
		}
		return c.optErr(optList, repErrPolicy, err.Error())
	}
	var b [4]byte
	for _, name := range names[:min(len(names), MaxListNames)] {
		if len(name) > maxString {
			continue
		}
		binary.BigEndian.PutUint32(b[:], uint32(len(name)))
		c.optReply(optList, repServer, b[:], []byte(name))
	}
	return c.optAck(optList)
}

// optStartTLS is NBD_OPT_STARTTLS: NBD_REP_ACK, then the TLS handshake
// over the same connection, after which nothing negotiated before it
// holds.
func (c *conn) optStartTLS(ctx context.Context, data []byte) error {
	switch {
	case c.srv.cfg.TLS == nil:
		// NOTLS mode.
		return c.optErr(optStartTLS, repErrPolicy, "TLS is not configured on this server")
	case len(data) != 0:
		return c.optErr(optStartTLS, repErrInvalid, "NBD_OPT_STARTTLS takes no data")
	case c.peer.TLS != nil:
		return c.optErr(optStartTLS, repErrInvalid, "TLS is already running")
	}
	if err := c.optAck(optStartTLS); err != nil {
		return err
	}
	if c.br.Buffered() > 0 {
		// The client sent more before TLS began: bytes that no TLS
		// protects, which must not be taken as if it did (the STARTTLS
		// injection of RFC 3207's section 6).
		return fmt.Errorf("%w: data sent after NBD_OPT_STARTTLS", errHardDisconnect)
	}
	tc := tls.Server(c.nc, c.srv.cfg.TLS)
	if err := tc.HandshakeContext(ctx); err != nil {
		// "If the handshake is unsuccessful ... the server MUST terminate
		// the session".
		return fmt.Errorf("%w: TLS handshake: %w", errHardDisconnect, err)
	}
	st := tc.ConnectionState()
	c.mu.Lock()
	c.nc = tc
	c.peer.TLS = &st
	c.mu.Unlock()
	c.br.Reset(tc)
	c.bw.Reset(tc)
	// "the server MUST NOT preserve any negotiation state".
	c.neg = negotiation{noZeroes: c.neg.noZeroes}
	return nil
}

// optMetaContext is NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT:
// "32 bits, length of export name; String; 32 bits, number of queries;
// queries, each 32 bits of length and a string". Only base:allocation is
// served; queries of other namespaces are ignored, as the protocol asks.
func (c *conn) optMetaContext(opt uint32, data []byte) error {
	if opt == optSetMetaContext {
		// "Issuing this command replaces all previously-set metadata
		// contexts (including when this command fails)".
		c.neg.metaExport, c.neg.metaAllocation = "", false
	}
	if !c.neg.structured {
		return c.optErr(opt, repErrInvalid, "negotiate NBD_OPT_STRUCTURED_REPLY first")
	}
	name, queries, err := parseMetaContext(data)
	if err != nil {
		return c.optErr(opt, repErrInvalid, err.Error())
	}
	match := queries.count == 0 && opt == optListMetaContext
	for q := range queries.each() {
		switch {
		case q == metaBaseAllocation:
			match = true
		case q == "base:" && opt == optListMetaContext:
			// The namespace's wildcard, for listing only ("The `base:`
			// metadata namespace").
			match = true
		}
	}
	if match {
		id := uint32(0) // "SHOULD be set to zero" when listing
		if opt == optSetMetaContext {
			id = metaBaseAllocationID
			c.neg.metaExport, c.neg.metaAllocation = name, true
		}
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], id)
		c.optReply(opt, repMetaContext, b[:], []byte(metaBaseAllocation))
	}
	return c.optAck(opt)
}

// metaQueries are the queries of a metadata context option, as slices of
// its data.
type metaQueries struct {
	count uint32
	data  []byte // count queries, each a 32-bit length and the string
}

// each yields the queries as strings; their syntax was checked by
// parseMetaContext.
func (q metaQueries) each() func(func(string) bool) {
	return func(yield func(string) bool) {
		d := q.data
		for range q.count {
			n := binary.BigEndian.Uint32(d)
			if !yield(string(d[4 : 4+n])) {
				return
			}
			d = d[4+n:]
		}
	}
}

// parseMetaContext checks the data of a metadata context option and
// returns its export name and queries. It allocates only the name.
func parseMetaContext(data []byte) (string, metaQueries, error) {
	if len(data) < 8 {
		return "", metaQueries{}, errors.New("option data too short")
	}
	nameLen := binary.BigEndian.Uint32(data)
	if uint64(nameLen) > uint64(len(data)-8) {
		return "", metaQueries{}, errors.New("export name length past the option data")
	}
	if nameLen > maxString {
		return "", metaQueries{}, fmt.Errorf("export name of %d bytes, the limit is %d", nameLen, maxString)
	}
	rest := data[4+nameLen:]
	count := binary.BigEndian.Uint32(rest)
	qs := rest[4:]
	d := qs
	for i := range count {
		if len(d) < 4 {
			return "", metaQueries{}, fmt.Errorf("query %d past the option data", i)
		}
		n := binary.BigEndian.Uint32(d)
		if uint64(n) > uint64(len(d)-4) {
			return "", metaQueries{}, fmt.Errorf("query %d's length past the option data", i)
		}
		q := d[4 : 4+n]
		if !validQuery(q) {
			return "", metaQueries{}, fmt.Errorf("query %d is not a namespace, a colon and a leaf name", i)
		}
		d = d[4+n:]
	}
	if len(d) != 0 {
		return "", metaQueries{}, fmt.Errorf("%d bytes after the last query", len(d))
	}
	return string(data[4 : 4+nameLen]), metaQueries{count: count, data: qs}, nil
}

// validQuery reports whether q is a string of the protocol that starts
// with a non-empty namespace and a colon ("Metadata querying").
func validQuery(q []byte) bool {
	if len(q) > maxString || !utf8.Valid(q) {
		return false
	}
	for i, b := range q {
		switch {
		case b == ':':
			return i > 0
		case b <= ' ' || b == 0x7f:
			return false
		}
	}
	return false
}

// optReply writes an option reply ("Fixed newstyle negotiation"): its data
// is the concatenation of parts. It is flushed by the option's final
// reply (optAck, replyErr).
func (c *conn) optReply(opt, typ uint32, parts ...[]byte) {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	var hdr [20]byte
	binary.BigEndian.PutUint64(hdr[0:], magicOptionReply)
	binary.BigEndian.PutUint32(hdr[8:], opt)
	binary.BigEndian.PutUint32(hdr[12:], typ)
	binary.BigEndian.PutUint32(hdr[16:], uint32(n))
	c.bw.Write(hdr[:])
	for _, p := range parts {
		c.bw.Write(p)
	}
}

// optAck ends an option with NBD_REP_ACK.
func (c *conn) optAck(opt uint32) error {
	c.optReply(opt, repAck)
	return c.bw.Flush()
}

// optErr ends an option with the error typ, msg its message for a
// human ("All error replies MAY have some data set ... an error message
// string").
func (c *conn) optErr(opt, typ uint32, msg string) error {
	c.optReply(opt, typ, []byte(truncate(msg, maxString)))
	return c.bw.Flush()
}

// truncate cuts s to at most n bytes, at a rune's start.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
