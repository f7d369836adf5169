// Package streamwire is the wire form of WriteStream's messages, written
// and read by hand on both sides: the client encodes WriteStreamRequests
// and decodes WriteStreamResponses, the daemon the other way round. The
// generic protobuf code would build a message per write, and copy every
// write's data once more; the hand-coded form aliases the bytes gRPC
// received and encodes straight into a pooled buffer.
//
// The field numbers are filewrite.proto's, and are written here once; the
// tests hold encoder and decoder to the generated code in api/.
//
// A decoded request is checked before anything is allocated per write:
// ScanRequest walks the whole message once, counting its writes and their
// bytes without keeping anything, and refuses a message of more than
// MaxWritesPerMessage writes. Its caller can then take what the message
// will cost from its budgets before it builds a record per write.
package streamwire

import (
	"errors"
	"fmt"
	"slices"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers (filewrite.proto).
const (
	FieldRequestPath   = 1 // WriteStreamRequest.path
	FieldRequestWrites = 2 // WriteStreamRequest.writes
	FieldRequestOpen   = 3 // WriteStreamRequest.open_mode
	FieldRequestFiles  = 4 // WriteStreamRequest.files
	FieldRequestClose  = 5 // WriteStreamRequest.close
	FieldRequestIf     = 6 // WriteStreamRequest.if_generation_match
	FieldRequestIfNot  = 7 // WriteStreamRequest.if_generation_not_match
	FieldFileIndex     = 1 // StreamFile.index
	FieldFilePath      = 2 // StreamFile.path
	FieldFileOpen      = 3 // StreamFile.open_mode
	FieldFileIf        = 4 // StreamFile.if_generation_match
	FieldFileIfNot     = 5 // StreamFile.if_generation_not_match
	FieldWriteID       = 1 // StreamWrite.id
	FieldWriteOffset   = 2 // StreamWrite.offset
	FieldWriteData     = 3 // StreamWrite.data
	FieldWriteSync     = 4 // StreamWrite.sync
	FieldWriteCRC      = 5 // StreamWrite.crc32c
	FieldWriteAppend   = 6 // StreamWrite.append
	FieldWriteFile     = 7 // StreamWrite.file
	FieldWriteAppendID = 8 // StreamWrite.append_id
	FieldResponseAcks  = 1 // WriteStreamResponse.acks
	FieldResponseFiles = 2 // WriteStreamResponse.files
	FieldStatusIndex   = 1 // StreamFileStatus.index
	FieldStatusStatus  = 2 // StreamFileStatus.status
	FieldStatusGen     = 3 // StreamFileStatus.generation
	FieldAckID         = 1 // StreamAck.id
	FieldAckWritten    = 2 // StreamAck.bytes_written
	FieldAckSize       = 3 // StreamAck.size
	FieldAckStatus     = 4 // StreamAck.status
	FieldAckOffset     = 5 // StreamAck.offset
	FieldAckGen        = 6 // StreamAck.generation
)

// MaxWritesPerMessage bounds the writes of one WriteStreamRequest: the
// client sends at most this many per message, and the daemon refuses a
// message with more (INVALID_ARGUMENT), before it has allocated anything
// for them. An empty write is 2 bytes on the wire and costs the daemon a
// record of a few hundred bytes from read to ack: the bound is what keeps
// a message's cost a bounded multiple of its size plus a fixed allowance.
const MaxWritesPerMessage = 4096

// MaxFilesPerMessage bounds the files one WriteStreamRequest declares plus
// those it closes, for the same reason: each costs the daemon an open (or
// a close) and a record, and the client sends at most this many.
const MaxFilesPerMessage = 4096

// ErrMalformed is returned when a message is not valid protobuf wire data
// (truncated, or a tag or length that does not parse).
var ErrMalformed = errors.New("truncated or malformed wire data")

// ErrPathNotUTF8 is returned when a request's path is not valid UTF-8, as
// proto3 requires of a string.
var ErrPathNotUTF8 = errors.New("path: invalid UTF-8")

// ErrAppendIDNotUTF8 is returned when a write's append_id is not valid
// UTF-8, as proto3 requires of a string.
var ErrAppendIDNotUTF8 = errors.New("append_id: invalid UTF-8")

// TooManyWritesError is returned when a request carries more than
// MaxWritesPerMessage writes. It names the limit, never the message's
// bytes.
type TooManyWritesError struct{ Limit int }

func (e *TooManyWritesError) Error() string {
	return fmt.Sprintf("a message of more than %d writes: the limit is %d writes per message", e.Limit, e.Limit)
}

// TooManyFilesError is returned when a request declares and closes more
// than MaxFilesPerMessage files in all.
type TooManyFilesError struct{ Limit int }

func (e *TooManyFilesError) Error() string {
	return fmt.Sprintf("a message declaring or closing more than %d files: the limit is %d files per message", e.Limit, e.Limit)
}

// File is one StreamFile as it is on the wire.
type File struct {
	Index    uint32
	Path     string
	OpenMode int32 // a filewritev1.OpenMode, unchecked
	If       Conditions
}

// Conditions are the conditions on a file's generation that a stream
// opens it under (if_generation_match, if_generation_not_match), each nil
// when absent: proto3 optional fields, present even when 0.
type Conditions struct {
	IfMatch, IfNotMatch *int64
}

// decode sets c's field num from the varint of b, and returns how much of
// b it took (negative if malformed), or 0 if num is none of ifMatch and
// ifNotMatch.
func (c *Conditions) decode(num, ifMatch, ifNotMatch protowire.Number, b []byte) int {
	if num != ifMatch && num != ifNotMatch {
		return 0
	}
	v, l := protowire.ConsumeVarint(b)
	if l < 0 {
		return l
	}
	// A field repeated takes its last value, as in the generated code,
	// into the int64 the first one allocated: a message that repeats it
	// costs no allocation per repeat.
	p := &c.IfMatch
	if num == ifNotMatch {
		p = &c.IfNotMatch
	}
	if *p == nil {
		*p = new(int64)
	}
	**p = int64(v)
	return l
}

// size is the size of c's fields numbered ifMatch and ifNotMatch.
func (c *Conditions) size(ifMatch, ifNotMatch protowire.Number) int {
	n := 0
	if c.IfMatch != nil {
		n += protowire.SizeTag(ifMatch) + protowire.SizeVarint(uint64(*c.IfMatch))
	}
	if c.IfNotMatch != nil {
		n += protowire.SizeTag(ifNotMatch) + protowire.SizeVarint(uint64(*c.IfNotMatch))
	}
	return n
}

// append appends c's fields numbered ifMatch and ifNotMatch to b.
func (c *Conditions) append(b []byte, ifMatch, ifNotMatch protowire.Number) []byte {
	if c.IfMatch != nil {
		b = protowire.AppendTag(b, ifMatch, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(*c.IfMatch))
	}
	if c.IfNotMatch != nil {
		b = protowire.AppendTag(b, ifNotMatch, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(*c.IfNotMatch))
	}
	return b
}

// Write is one StreamWrite as it is on the wire. On decoding, Data and
// AppendID alias the message's bytes.
type Write struct {
	ID     uint64
	Offset int64
	Data   []byte
	Sync   int32 // a filewritev1.SyncMode, unchecked
	CRC    uint32
	HasCRC bool
	Append bool
	// File is the declared file's index, 0 for the stream's path.
	File uint32
	// AppendID is the append's id, empty for none; valid UTF-8 (unchecked
	// on encoding), its length unchecked.
	AppendID []byte
}

// Request is a WriteStreamRequest that ScanRequest found well formed.
type Request struct {
	Path string
	// OpenMode is the raw open_mode (a filewritev1.OpenMode, unchecked).
	OpenMode int32
	// If holds the conditions on the path's file.
	If Conditions
	// Writes is how many writes it carries, DataBytes the sum of their
	// data's lengths.
	Writes    int
	DataBytes int64
	// Files holds the files the message declares, in order; Closes the
	// indexes it closes. Both are nil in a one-file stream's messages.
	Files  []File
	Closes []uint32
	// raw is the message: its writes are decoded again, one by one, by
	// Each.
	raw []byte
}

// ScanRequest checks that b is a well-formed WriteStreamRequest of at most
// maxWrites writes, and returns what it says. It allocates nothing but the
// path, and stops at the first write past maxWrites. Fields it does not
// know are skipped, as the generated code keeps them as unknown fields,
// and so is a known field sent with another wire type. On error, the
// Request holds what was read before the error, so that a caller can
// account for what the scan allocated; it is not a request to act on.
func ScanRequest(b []byte, maxWrites int) (Request, error) {
	r := Request{raw: b}
	// The last path wins, as in the generated code; it is made a string
	// once, however many the message repeats.
	var path []byte
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return r, ErrMalformed
		}
		b = b[l:]
		switch {
		case num == FieldRequestPath && typ == protowire.BytesType:
			v, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return r, ErrMalformed
			}
			if !utf8.Valid(v) {
				return r, ErrPathNotUTF8
			}
			path = v
			b = b[l:]
		case num == FieldRequestOpen && typ == protowire.VarintType:
			v, l := protowire.ConsumeVarint(b)
			if l < 0 {
				return r, ErrMalformed
			}
			r.OpenMode = int32(v)
			b = b[l:]
		case (num == FieldRequestIf || num == FieldRequestIfNot) && typ == protowire.VarintType:
			l := r.If.decode(num, FieldRequestIf, FieldRequestIfNot, b)
			if l < 0 {
				return r, ErrMalformed
			}
			b = b[l:]
		case num == FieldRequestFiles && typ == protowire.BytesType:
			v, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return r, ErrMalformed
			}
			if len(r.Files)+len(r.Closes) == MaxFilesPerMessage {
				return r, &TooManyFilesError{Limit: MaxFilesPerMessage}
			}
			f, err := decodeFile(v)
			if err != nil {
				return r, err
			}
			r.Files = append(r.Files, f)
			b = b[l:]
		case num == FieldRequestClose && typ == protowire.VarintType:
			v, l := protowire.ConsumeVarint(b)
			if l < 0 {
				return r, ErrMalformed
			}
			if len(r.Files)+len(r.Closes) == MaxFilesPerMessage {
				return r, &TooManyFilesError{Limit: MaxFilesPerMessage}
			}
			r.Closes = append(r.Closes, uint32(v))
			b = b[l:]
		case num == FieldRequestClose && typ == protowire.BytesType:
			// Packed, as proto3 encodes a repeated scalar.
			v, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return r, ErrMalformed
			}
			// Counted and checked whole first, so that a malformed or
			// oversized packed field costs no allocation and a good one
			// costs one.
			count := 0
			for rest := v; len(rest) > 0; count++ {
				_, n := protowire.ConsumeVarint(rest)
				if n < 0 {
					return r, ErrMalformed
				}
				rest = rest[n:]
			}
			if len(r.Files)+len(r.Closes)+count > MaxFilesPerMessage {
				return r, &TooManyFilesError{Limit: MaxFilesPerMessage}
			}
			r.Closes = slices.Grow(r.Closes, count)
			for len(v) > 0 {
				x, n := protowire.ConsumeVarint(v)
				r.Closes = append(r.Closes, uint32(x))
				v = v[n:]
			}
			b = b[l:]
		case num == FieldRequestWrites && typ == protowire.BytesType:
			v, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return r, ErrMalformed
			}
			if r.Writes == maxWrites {
				return r, &TooManyWritesError{Limit: maxWrites}
			}
			var w Write
			if err := decodeWrite(v, &w); err != nil {
				return r, err
			}
			r.Writes++
			r.DataBytes += int64(len(w.Data))
			b = b[l:]
		default:
			if l = protowire.ConsumeFieldValue(num, typ, b); l < 0 {
				return r, ErrMalformed
			}
			b = b[l:]
		}
	}
	r.Path = string(path)
	return r, nil
}

// Each calls fn for each write of r, in order, with i counting from 0.
// The Write passed is fn's only for the call; its Data aliases the
// message.
func (r *Request) Each(fn func(i int, w *Write)) {
	b := r.raw
	var w Write
	for i := 0; len(b) > 0; {
		// ScanRequest has checked every tag and length.
		num, typ, l := protowire.ConsumeTag(b)
		b = b[l:]
		if num == FieldRequestWrites && typ == protowire.BytesType {
			v, l := protowire.ConsumeBytes(b)
			w = Write{}
			decodeWrite(v, &w)
			fn(i, &w)
			i++
			b = b[l:]
			continue
		}
		b = b[protowire.ConsumeFieldValue(num, typ, b):]
	}
}

// decodeFile decodes one StreamFile.
func decodeFile(b []byte) (File, error) {
	var f File
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return File{}, ErrMalformed
		}
		b = b[l:]
		var v uint64
		switch {
		case num == FieldFileIndex && typ == protowire.VarintType:
			v, l = protowire.ConsumeVarint(b)
			f.Index = uint32(v)
		case num == FieldFileOpen && typ == protowire.VarintType:
			v, l = protowire.ConsumeVarint(b)
			f.OpenMode = int32(v)
		case (num == FieldFileIf || num == FieldFileIfNot) && typ == protowire.VarintType:
			l = f.If.decode(num, FieldFileIf, FieldFileIfNot, b)
		case num == FieldFilePath && typ == protowire.BytesType:
			var p []byte
			p, l = protowire.ConsumeBytes(b)
			if l >= 0 && !utf8.Valid(p) {
				return File{}, ErrPathNotUTF8
			}
			f.Path = string(p)
		default:
			l = protowire.ConsumeFieldValue(num, typ, b)
		}
		if l < 0 {
			return File{}, ErrMalformed
		}
		b = b[l:]
	}
	return f, nil
}

// decodeWrite decodes one StreamWrite into w: ErrMalformed or
// ErrAppendIDNotUTF8 if it is not well formed.
func decodeWrite(b []byte, w *Write) error {
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return ErrMalformed
		}
		b = b[l:]
		var v uint64
		switch {
		case num == FieldWriteID && typ == protowire.VarintType:
			w.ID, l = protowire.ConsumeVarint(b)
		case num == FieldWriteOffset && typ == protowire.VarintType:
			v, l = protowire.ConsumeVarint(b)
			w.Offset = int64(v)
		case num == FieldWriteData && typ == protowire.BytesType:
			w.Data, l = protowire.ConsumeBytes(b)
		case num == FieldWriteSync && typ == protowire.VarintType:
			v, l = protowire.ConsumeVarint(b)
			w.Sync = int32(v)
		case num == FieldWriteCRC && typ == protowire.Fixed32Type:
			w.CRC, l = protowire.ConsumeFixed32(b)
			w.HasCRC = true
		case num == FieldWriteAppend && typ == protowire.VarintType:
			v, l = protowire.ConsumeVarint(b)
			w.Append = v != 0
		case num == FieldWriteFile && typ == protowire.VarintType:
			v, l = protowire.ConsumeVarint(b)
			w.File = uint32(v)
		case num == FieldWriteAppendID && typ == protowire.BytesType:
			w.AppendID, l = protowire.ConsumeBytes(b)
			if l >= 0 && !utf8.Valid(w.AppendID) {
				return ErrAppendIDNotUTF8
			}
		default:
			l = protowire.ConsumeFieldValue(num, typ, b)
		}
		if l < 0 {
			return ErrMalformed
		}
		b = b[l:]
	}
	return nil
}

// WriteSize is the size of w as a StreamWrite without its own tag and
// length. Data is encoded even when empty.
func WriteSize(w *Write) int {
	n := sizeBytes(FieldWriteData, len(w.Data)) +
		sizeVarint(FieldWriteFile, uint64(w.File)) +
		sizeVarint(FieldWriteID, w.ID) +
		sizeVarint(FieldWriteOffset, uint64(w.Offset)) +
		sizeVarint(FieldWriteSync, uint64(w.Sync)) +
		sizeVarint(FieldWriteAppend, varintBool(w.Append))
	if w.HasCRC {
		n += protowire.SizeTag(FieldWriteCRC) + protowire.SizeFixed32()
	}
	if len(w.AppendID) > 0 {
		n += sizeBytes(FieldWriteAppendID, len(w.AppendID))
	}
	return n
}

// RequestWriteSize is what w adds to a WriteStreamRequest: the
// StreamWrite with its tag and length.
func RequestWriteSize(w *Write) int {
	return sizeBytes(FieldRequestWrites, WriteSize(w))
}

// AppendWrite appends w as one write of a WriteStreamRequest (the writes
// field, its tag and length included) to b; RequestWriteSize says how
// long it is.
func AppendWrite(b []byte, w *Write) []byte {
	b = AppendWriteHead(b, w)
	b = append(b, w.Data...)
	return AppendWriteTail(b, w)
}

// AppendWriteHead appends what AppendWrite puts before w's data: the
// write's tag and length, the fields before its data, and the data
// field's tag and length. A sender that sends the data from its own
// buffer, without copying it into the message, sends the head, then the
// data, then the tail (AppendWriteTail).
func AppendWriteHead(b []byte, w *Write) []byte {
	b = appendLength(b, FieldRequestWrites, WriteSize(w))
	b = appendVarint(b, FieldWriteID, w.ID)
	b = appendVarint(b, FieldWriteOffset, uint64(w.Offset))
	b = protowire.AppendTag(b, FieldWriteData, protowire.BytesType)
	return protowire.AppendVarint(b, uint64(len(w.Data)))
}

// AppendWriteTail appends what AppendWrite puts after w's data.
func AppendWriteTail(b []byte, w *Write) []byte {
	b = appendVarint(b, FieldWriteSync, uint64(w.Sync))
	if w.HasCRC {
		b = protowire.AppendTag(b, FieldWriteCRC, protowire.Fixed32Type)
		b = protowire.AppendFixed32(b, w.CRC)
	}
	b = appendVarint(b, FieldWriteAppend, varintBool(w.Append))
	b = appendVarint(b, FieldWriteFile, uint64(w.File))
	if len(w.AppendID) > 0 {
		b = appendBytes(b, FieldWriteAppendID, w.AppendID)
	}
	return b
}

func fileSize(f *File) int {
	return protowire.SizeTag(FieldFileIndex) + protowire.SizeVarint(uint64(f.Index)) +
		sizeBytes(FieldFilePath, len(f.Path)) +
		sizeVarint(FieldFileOpen, uint64(f.OpenMode)) +
		f.If.size(FieldFileIf, FieldFileIfNot)
}

// RequestFileSize is what declaring f adds to a WriteStreamRequest.
func RequestFileSize(f *File) int {
	return sizeBytes(FieldRequestFiles, fileSize(f))
}

// AppendFile appends the declaration of f to a WriteStreamRequest in b.
func AppendFile(b []byte, f *File) []byte {
	b = appendLength(b, FieldRequestFiles, fileSize(f))
	b = protowire.AppendTag(b, FieldFileIndex, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(f.Index))
	b = protowire.AppendTag(b, FieldFilePath, protowire.BytesType)
	b = protowire.AppendString(b, f.Path)
	b = appendVarint(b, FieldFileOpen, uint64(f.OpenMode))
	return f.If.append(b, FieldFileIf, FieldFileIfNot)
}

// RequestCloseSize is what closing index adds to a WriteStreamRequest.
func RequestCloseSize(index uint32) int {
	return protowire.SizeTag(FieldRequestClose) + protowire.SizeVarint(uint64(index))
}

// AppendClose appends the close of index to a WriteStreamRequest in b
// (unpacked, which a proto3 decoder accepts as well as packed).
func AppendClose(b []byte, index uint32) []byte {
	b = protowire.AppendTag(b, FieldRequestClose, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(index))
}

// FileStatus is one StreamFileStatus. Status is the encoded
// google.rpc.Status, nil when the file is open; on decoding it aliases
// the message. Generation is the file's when it was opened.
type FileStatus struct {
	Index      uint32
	Status     []byte
	Generation int64
}

func fileStatusSize(f *FileStatus) int {
	n := sizeVarint(FieldStatusIndex, uint64(f.Index)) + sizeVarint(FieldStatusGen, uint64(f.Generation))
	if f.Status != nil {
		n += sizeBytes(FieldStatusStatus, len(f.Status))
	}
	return n
}

// ResponseFileStatusSize is what f adds to a WriteStreamResponse.
func ResponseFileStatusSize(f *FileStatus) int {
	return sizeBytes(FieldResponseFiles, fileStatusSize(f))
}

// AppendFileStatus appends f to a WriteStreamResponse in b.
func AppendFileStatus(b []byte, f *FileStatus) []byte {
	b = appendLength(b, FieldResponseFiles, fileStatusSize(f))
	b = appendVarint(b, FieldStatusIndex, uint64(f.Index))
	if f.Status != nil {
		b = appendBytes(b, FieldStatusStatus, f.Status)
	}
	return appendVarint(b, FieldStatusGen, uint64(f.Generation))
}

// EachFileStatus calls fn for each file status of the WriteStreamResponse
// in b, in order, as EachAck does for acks.
func EachFileStatus(b []byte, fn func(f *FileStatus) error) error {
	return eachResponseField(b, FieldResponseFiles, func(v []byte) error {
		var f FileStatus
		if !decodeFileStatus(v, &f) {
			return ErrMalformed
		}
		return fn(&f)
	})
}

// decodeFileStatus decodes one StreamFileStatus, aliasing b.
func decodeFileStatus(v []byte, f *FileStatus) bool {
	for len(v) > 0 {
		num, typ, n := protowire.ConsumeTag(v)
		if n < 0 {
			return false
		}
		v = v[n:]
		switch {
		case num == FieldStatusIndex && typ == protowire.VarintType:
			var x uint64
			x, n = protowire.ConsumeVarint(v)
			f.Index = uint32(x)
		case num == FieldStatusStatus && typ == protowire.BytesType:
			f.Status, n = protowire.ConsumeBytes(v)
		case num == FieldStatusGen && typ == protowire.VarintType:
			var x uint64
			x, n = protowire.ConsumeVarint(v)
			f.Generation = int64(x)
		default:
			n = protowire.ConsumeFieldValue(num, typ, v)
		}
		if n < 0 {
			return false
		}
		v = v[n:]
	}
	return true
}

// eachResponseField calls fn with the bytes of each field numbered num (a
// message) of the WriteStreamResponse in b, in order, skipping the others,
// and returns ErrMalformed at the first thing that does not parse, or
// fn's first error.
func eachResponseField(b []byte, num protowire.Number, fn func(v []byte) error) error {
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return ErrMalformed
		}
		b = b[l:]
		if n != num || typ != protowire.BytesType {
			if l = protowire.ConsumeFieldValue(n, typ, b); l < 0 {
				return ErrMalformed
			}
			b = b[l:]
			continue
		}
		v, l := protowire.ConsumeBytes(b)
		if l < 0 {
			return ErrMalformed
		}
		b = b[l:]
		if err := fn(v); err != nil {
			return err
		}
	}
	return nil
}

// Ack is one StreamAck. Status is the encoded google.rpc.Status, nil when
// the write succeeded; on decoding it aliases the message.
type Ack struct {
	ID            uint64
	Written, Size int64
	Status        []byte
	// Offset is where the write's data begins (an append's, where it
	// landed).
	Offset int64
	// Generation is the file's generation after the write: set in the
	// acks of synced writes only (0 is not encoded).
	Generation int64
}

func ackSize(a *Ack) int {
	n := sizeVarint(FieldAckID, a.ID) +
		sizeVarint(FieldAckWritten, uint64(a.Written)) +
		sizeVarint(FieldAckSize, uint64(a.Size)) +
		sizeVarint(FieldAckOffset, uint64(a.Offset)) +
		sizeVarint(FieldAckGen, uint64(a.Generation))
	if a.Status != nil {
		n += sizeBytes(FieldAckStatus, len(a.Status))
	}
	return n
}

// ResponseAckSize is what a's ack adds to a WriteStreamResponse.
func ResponseAckSize(a *Ack) int {
	return sizeBytes(FieldResponseAcks, ackSize(a))
}

// AppendAck appends a's ack to a WriteStreamResponse in b.
func AppendAck(b []byte, a *Ack) []byte {
	b = appendLength(b, FieldResponseAcks, ackSize(a))
	b = appendVarint(b, FieldAckID, a.ID)
	b = appendVarint(b, FieldAckWritten, uint64(a.Written))
	b = appendVarint(b, FieldAckSize, uint64(a.Size))
	if a.Status != nil {
		b = appendBytes(b, FieldAckStatus, a.Status)
	}
	b = appendVarint(b, FieldAckOffset, uint64(a.Offset))
	return appendVarint(b, FieldAckGen, uint64(a.Generation))
}

// EachAck calls fn for each ack of the WriteStreamResponse in b, in order,
// and returns ErrMalformed (and calls fn no more) at the first thing that
// does not parse. The Ack passed is fn's only for the call.
func EachAck(b []byte, fn func(a *Ack) error) error {
	return eachResponseField(b, FieldResponseAcks, func(v []byte) error {
		var a Ack
		if !decodeAck(v, &a) {
			return ErrMalformed
		}
		return fn(&a)
	})
}

func decodeAck(b []byte, a *Ack) bool {
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return false
		}
		b = b[l:]
		var v uint64
		switch {
		case num == FieldAckID && typ == protowire.VarintType:
			a.ID, l = protowire.ConsumeVarint(b)
		case num == FieldAckWritten && typ == protowire.VarintType:
			v, l = protowire.ConsumeVarint(b)
			a.Written = int64(v)
		case num == FieldAckSize && typ == protowire.VarintType:
			v, l = protowire.ConsumeVarint(b)
			a.Size = int64(v)
		case num == FieldAckStatus && typ == protowire.BytesType:
			a.Status, l = protowire.ConsumeBytes(b)
		case num == FieldAckOffset && typ == protowire.VarintType:
			v, l = protowire.ConsumeVarint(b)
			a.Offset = int64(v)
		case num == FieldAckGen && typ == protowire.VarintType:
			v, l = protowire.ConsumeVarint(b)
			a.Generation = int64(v)
		default:
			l = protowire.ConsumeFieldValue(num, typ, b)
		}
		if l < 0 {
			return false
		}
		b = b[l:]
	}
	return true
}

// Proto3's scalars are encoded only when not zero (implicit presence):
// sizeVarint and appendVarint leave out a zero v. Bytes fields are
// encoded as asked: sizeBytes and appendBytes always write the field;
// appendLength writes the tag and length of a message field of n bytes,
// whose fields the caller appends next.

// sizeVarint is the size of the varint field num with value v, 0 if v is 0.
func sizeVarint(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

// sizeBytes is the size of the bytes field num of n bytes.
func sizeBytes(num protowire.Number, n int) int {
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}

// appendVarint appends the varint field num with value v to b, unless v
// is 0.
func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// appendBytes appends the bytes field num with value v to b.
func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

// appendLength appends the tag and length of the message field num of n
// bytes to b.
func appendLength(b []byte, num protowire.Number, n int) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendVarint(b, uint64(n))
}

// varintBool is a bool as a varint: 1 for true.
func varintBool(v bool) uint64 {
	if v {
		return 1
	}
	return 0
}
