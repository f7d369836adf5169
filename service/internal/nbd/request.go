package nbd

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// request is a request message ("Request message"):
//
//	C: 32 bits, 0x25609513, magic (NBD_REQUEST_MAGIC)
//	C: 16 bits, command flags
//	C: 16 bits, type
//	C: 64 bits, cookie
//	C: 64 bits, offset (unsigned)
//	C: 32 bits, length (unsigned)
//	C: (length bytes of data if the request is of type NBD_CMD_WRITE)
type request struct {
	flags  uint16
	typ    uint16
	cookie uint64
	offset uint64
	length uint32
}

// errBadMagic: a request header without NBD_REQUEST_MAGIC. Nothing after
// it can be trusted to start where a request starts, so the connection
// ends (a hard disconnect: "Either side MAY initiate a hard disconnect if
// it detects a violation by the other party of a mandatory condition").
var errBadMagic = errors.New("bad request magic")

// decodeRequest decodes a request header. It does not allocate.
func decodeRequest(b *[requestHeaderLen]byte) (request, error) {
	if binary.BigEndian.Uint32(b[0:]) != magicRequest {
		return request{}, errBadMagic
	}
	return request{
		flags:  binary.BigEndian.Uint16(b[4:]),
		typ:    binary.BigEndian.Uint16(b[6:]),
		cookie: binary.BigEndian.Uint64(b[8:]),
		offset: binary.BigEndian.Uint64(b[16:]),
		length: binary.BigEndian.Uint32(b[24:]),
	}, nil
}

// limits is what the handshake settled that a request is checked
// against.
type limits struct {
	size       uint64
	readOnly   bool
	structured bool
	// meta: base:allocation was selected (BLOCK_STATUS allowed).
	meta       bool
	maxPayload uint32
}

// refusal is why a request is refused before the export sees it: the
// error value the client is told and a message for a human; errno 0
// means the request may run.
type refusal struct {
	errno uint32
	msg   string
}

func (r refusal) Error() string { return r.msg }

// allowedFlags are the command flags each request type takes ("Command
// flags"): NBD_CMD_FLAG_FUA on any, as NBD_FLAG_SEND_FUA is always
// advertised, and the others where they are "valid". NBD_CMD_FLAG_DF
// also needs structured replies, as does NBD_FLAG_SEND_DF.
var allowedFlags = [...]uint16{
	cmdRead:        cmdFlagFUA | cmdFlagDF,
	cmdWrite:       cmdFlagFUA,
	cmdDisc:        0xffff, // no reply, whatever its flags
	cmdFlush:       cmdFlagFUA,
	cmdTrim:        cmdFlagFUA,
	cmdCache:       cmdFlagFUA,
	cmdWriteZeroes: cmdFlagFUA | cmdFlagNoHole | cmdFlagFastZero,
	cmdBlockStatus: cmdFlagFUA | cmdFlagReqOne,
}

// check decides whether r may run, with the error values of "Error
// values" and of each request type for the requests it refuses. It does
// not allocate.
func (l *limits) check(r request) refusal {
	if int(r.typ) >= len(allowedFlags) {
		// "The server SHOULD return NBD_EINVAL if it receives an unknown
		// command."
		return refusal{errnoINVAL, "unknown command"}
	}
	allowed := allowedFlags[r.typ]
	if !l.structured {
		allowed &^= cmdFlagDF
	}
	if r.flags&^allowed != 0 {
		return refusal{errnoINVAL, "command flag not valid for this command"}
	}
	writes := r.typ == cmdWrite || r.typ == cmdTrim || r.typ == cmdWriteZeroes
	if writes && l.readOnly {
		return refusal{errnoPERM, "the export is read-only"}
	}
	switch r.typ {
	case cmdFlush:
		if r.offset != 0 || r.length != 0 {
			return refusal{errnoINVAL, "NBD_CMD_FLUSH with a nonzero offset or length"}
		}
		return refusal{}
	case cmdDisc:
		return refusal{}
	case cmdBlockStatus:
		if !l.meta {
			return refusal{errnoINVAL, "no metadata context was selected for this export"}
		}
		if r.length == 0 {
			return refusal{errnoINVAL, "NBD_CMD_BLOCK_STATUS of length 0"}
		}
	case cmdRead:
		if r.length > l.maxPayload {
			if l.structured {
				return refusal{errnoOVERFLOW, "read longer than the maximum payload"}
			}
			return refusal{errnoINVAL, "read longer than the maximum payload"}
		}
	case cmdWrite:
		if r.length > l.maxPayload {
			return refusal{errnoINVAL, "write longer than the maximum payload"}
		}
	}
	if r.offset > l.size || uint64(r.length) > l.size-r.offset {
		// "The server SHOULD return NBD_ENOSPC if it receives a write
		// request including one or more sectors beyond the size of the
		// device ... NBD_EINVAL if it receives a read or trim request"
		// (Error values; the same for WRITE_ZEROES, and BLOCK_STATUS).
		if r.typ == cmdWrite || r.typ == cmdWriteZeroes {
			return refusal{errnoNOSPC, "request past the end of the export"}
		}
		return refusal{errnoINVAL, "request past the end of the export"}
	}
	return refusal{}
}

// maxDiscard is the largest WRITE payload read past when the write is
// refused: past it the connection ends instead ("any payload not
// exceeding 2^25 (33,554,432) bytes SHOULD NOT be considered a denial of
// service attack", Size constraints).
const maxDiscard = MaxPayload

// refusedPayload says what to do with the payload of a refused WRITE:
// read past it (nil), or end the connection (the error).
func refusedPayload(r request) error {
	if r.length > maxDiscard {
		return fmt.Errorf("%w: a refused write's payload of %d bytes", errHardDisconnect, r.length)
	}
	return nil
}
