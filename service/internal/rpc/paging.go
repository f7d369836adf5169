package rpc

import (
	"encoding/base64"
	"encoding/binary"
	"hash/fnv"
	"math"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/service/internal/status"
	"github.com/filewrite/filewrite/store"
)

// Extents and List replies are paged (AIP-158): a file cut into many small
// extents, or a directory of many files, would otherwise push one reply
// past the gRPC message limit. List's page sizes are the store's
// (store.DefaultListPageSize, store.MaxListPageSize), which checks them.
const (
	// DefaultExtentsPageSize is the page size of a request that gives none.
	DefaultExtentsPageSize = 1000
	// MaxExtentsPageSize is the largest page size a request may ask for.
	MaxExtentsPageSize = 10000
)

// pageSize is the size of the page that a request's page_size n asks for:
// def for 0, else n, and at most perReply, the most items that fit in one
// reply (0: no such bound). ok is false for n below 0 or above most; size
// is then n, for the caller to refuse.
func pageSize(n int32, def, most, perReply int) (size int, ok bool) {
	size = int(n)
	switch {
	case size < 0 || size > most:
		return size, false
	case size == 0:
		size = def
	}
	if perReply > 0 {
		size = min(size, perReply)
	}
	return size, true
}

// maxEncodedExtent is the most bytes one Extent takes in an
// ExtentsResponse: two 9-byte varints and an enum, their tags, and the
// tag and length that frame it.
var maxEncodedExtent = 2 + proto.Size(&filewritev1.Extent{
	Offset: math.MaxInt64, Length: math.MaxInt64, State: filewritev1.ExtentState_EXTENT_STATE_UNWRITTEN,
})

// extentsPerReply is the most extents that fit in one reply under the
// message limit (less room for the next page's token): a page never
// exceeds it, whatever page_size asks. Only a --max-request-bytes far
// below the default makes it smaller than MaxExtentsPageSize.
func extentsPerReply(maxMessageBytes int) int {
	const tokenRoom = 64
	return max(1, (maxMessageBytes-tokenRoom)/maxEncodedExtent)
}

// extentsPageSize is the number of extents to answer req with, at most
// perReply unless that is 0.
func extentsPageSize(req *filewritev1.ExtentsRequest, perReply int) (int, error) {
	n, ok := pageSize(req.GetPageSize(), DefaultExtentsPageSize, MaxExtentsPageSize, perReply)
	switch {
	case ok:
		return n, nil
	case n < 0:
		return 0, status.Refusal(filewritev1.ErrorReason_PAGE_INVALID, map[string]string{errorinfo.KeyField: "page_size"}, "page_size %d is negative", n)
	}
	return 0, status.Refusal(filewritev1.ErrorReason_PAGE_INVALID, map[string]string{errorinfo.KeyField: "page_size", errorinfo.KeyLimit: strconv.Itoa(MaxExtentsPageSize)}, "page_size %d: the maximum is %d", n, MaxExtentsPageSize)
}

// maxEncodedDirEntry is the most bytes one DirEntry takes in a
// ListResponse: a name of MaxNameLen bytes, a bool, a 10-byte varint, their
// tags and lengths, and the tag and length that frame it.
var maxEncodedDirEntry = 4 + proto.Size(&filewritev1.DirEntry{
	Name: strings.Repeat("n", store.MaxNameLen), IsDir: true, Size: math.MinInt64,
})

// EntriesPerReply is the most entries that fit in one List reply under the
// message limit, less room for the next page's token (which holds a name).
// Only a --max-request-bytes far below the default makes it smaller than
// store.MaxListPageSize.
func EntriesPerReply(maxMessageBytes int) int {
	tokenRoom := 64 + 2*store.MaxNameLen
	return max(1, (maxMessageBytes-tokenRoom)/maxEncodedDirEntry)
}

// ListPageSize is the page size to ask the store for: req's (0 meaning the
// default), at most perReply. A size the store refuses (negative, over its
// maximum) goes through unchanged, for the store to say why.
func ListPageSize(req *filewritev1.ListRequest, perReply int) int {
	n, _ := pageSize(req.GetPageSize(), store.DefaultListPageSize, store.MaxListPageSize, perReply)
	return n
}

// An extents page token is opaque to clients. Inside: a version byte, the
// offset the next page starts at, and a hash of the request's path, offset
// and length, so that a token is only taken back with the request whose
// first page led to it. It is not a secret: a client could forge one, but
// only to ask for a part of a range it may ask for whole.
const extentsTokenVersion = 1

// extentsRequestHash binds a token to the fields a next page must repeat.
func extentsRequestHash(req *filewritev1.ExtentsRequest) uint64 {
	h := fnv.New64a()
	h.Write([]byte(req.GetPath()))
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], uint64(req.GetOffset()))
	binary.LittleEndian.PutUint64(b[8:], uint64(req.GetLength()))
	h.Write(b[:])
	return h.Sum64()
}

// nextExtentsToken is the token of the page of req that starts at resume.
func nextExtentsToken(req *filewritev1.ExtentsRequest, resume int64) string {
	b := []byte{extentsTokenVersion}
	b = binary.AppendUvarint(b, uint64(resume))
	b = binary.LittleEndian.AppendUint64(b, extentsRequestHash(req))
	return base64.RawURLEncoding.EncodeToString(b)
}

// extentsPageStart is where the page req asks for starts: its offset, or
// where its page_token says.
func extentsPageStart(req *filewritev1.ExtentsRequest) (int64, error) {
	tok, off, length := req.GetPageToken(), req.GetOffset(), req.GetLength()
	if tok == "" || off < 0 || length < 0 || off > math.MaxInt64-length {
		// No token, or a range the store refuses, in its own words.
		return off, nil
	}
	bad := status.Refusal(filewritev1.ErrorReason_PAGE_INVALID, map[string]string{errorinfo.KeyField: "page_token"}, "page_token is not one that an Extents reply gave")
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) < 1 || b[0] != extentsTokenVersion {
		return 0, bad
	}
	resume, n := binary.Uvarint(b[1:])
	if n <= 0 || len(b) != 1+n+8 || resume > math.MaxInt64 {
		return 0, bad
	}
	if binary.LittleEndian.Uint64(b[1+n:]) != extentsRequestHash(req) {
		return 0, status.Refusal(filewritev1.ErrorReason_PAGE_INVALID, map[string]string{errorinfo.KeyField: "page_token"},
			"page_token belongs to another request: path, offset and length must be those of the first page")
	}
	start := int64(resume)
	if start < off || length > 0 && start-off > length {
		return 0, bad
	}
	return start, nil
}
