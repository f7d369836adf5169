package gateway

import (
	"bytes"
	"crypto/md5"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"hash"
	"hash/crc32"
	"net/http"
	"strconv"
	"strings"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/service/internal/status"
)

// Checksums of a raw upload (a PUT, a raw append): the body's checksums as
// its headers announce them, computed as the body is read and compared
// before its last byte is written.
//
//   - Content-Digest (RFC 9530): a dictionary of algorithm=:base64:,
//     crc32c and sha-256 (md5, deprecated there, is checked too);
//   - x-goog-hash (GCS's XML API): crc32c=base64, md5=base64;
//   - Content-MD5 (RFC 1864): base64.
//
// Every checksum given is checked; one of an algorithm the daemon does not
// compute is refused (400), never passed over.

// wantContentDigest is the Want-Content-Digest (RFC 9530, section 4) of a
// refusal of a Content-Digest: the algorithms the daemon checks, crc32c
// preferred (cheapest).
const wantContentDigest = "crc32c=9, sha-256=5"

// digestCheck is one checksum a header announced.
type digestCheck struct {
	header string // the header that sent it
	alg    string // crc32c, sha-256, md5
	sent   []byte
	sum    hash.Hash
}

// uploadDigests are the checksums of one upload.
type uploadDigests []*digestCheck

// newDigest is the hash of alg, whose Sum is the digest as the headers
// carry it, or nil for an algorithm the daemon does not compute.
func newDigest(alg string) hash.Hash {
	switch alg {
	case "crc32c":
		return crc32.New(status.Castagnoli) // big-endian, as RFC 9530 and GCS send it
	case "sha-256":
		return sha256.New()
	case "md5":
		return md5.New()
	}
	return nil
}

// uploadDigestsOf reads the checksum headers of an upload's request; when
// they cannot be used it also tells the client, in w's headers, which it
// can send (Want-Content-Digest) before the refusal is written.
func uploadDigestsOf(w http.ResponseWriter, r *http.Request) (uploadDigests, error) {
	d, err := parseUploadDigests(r.Header)
	if err != nil {
		w.Header().Set("Want-Content-Digest", wantContentDigest)
	}
	return d, err
}

// parseUploadDigests reads the checksum headers of h: none is nil, nil.
func parseUploadDigests(h http.Header) (uploadDigests, error) {
	var d uploadDigests
	add := func(header, alg, value string) error {
		sum := newDigest(alg)
		if sum == nil {
			return digestHeaderRefusal(header, "algorithm %q: the daemon checks crc32c, sha-256 and md5", alg)
		}
		sent, err := base64.StdEncoding.DecodeString(value)
		if err != nil || len(sent) != sum.Size() {
			return digestHeaderRefusal(header, "%s %q: want the base64 of its %d bytes", alg, value, sum.Size())
		}
		d = append(d, &digestCheck{header: header, alg: alg, sent: sent, sum: sum})
		return nil
	}
	if vals := h.Values("Content-Digest"); len(vals) > 0 {
		for _, member := range strings.Split(strings.Join(vals, ","), ",") {
			member, _, _ = strings.Cut(member, ";") // parameters: none defined
			key, value, ok := strings.Cut(strings.TrimSpace(member), "=")
			if !ok || len(value) < 2 || value[0] != ':' || value[len(value)-1] != ':' {
				return nil, digestHeaderRefusal("Content-Digest", "%q: want algorithm=:base64:, such as crc32c=:AAAAAA==:", strings.TrimSpace(member))
			}
			if err := add("Content-Digest", key, value[1:len(value)-1]); err != nil {
				return nil, err
			}
		}
	}
	for _, v := range h.Values("X-Goog-Hash") {
		for _, member := range strings.Split(v, ",") {
			key, value, ok := strings.Cut(strings.TrimSpace(member), "=")
			if !ok || (key != "crc32c" && key != "md5") {
				return nil, digestHeaderRefusal("x-goog-hash", "%q: want crc32c=base64 or md5=base64", strings.TrimSpace(member))
			}
			if err := add("x-goog-hash", key, value); err != nil {
				return nil, err
			}
		}
	}
	if vals := h.Values("Content-MD5"); len(vals) > 0 {
		if len(vals) > 1 {
			return nil, digestHeaderRefusal("Content-MD5", "%d values: want one", len(vals))
		}
		if err := add("Content-MD5", "md5", strings.TrimSpace(vals[0])); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// digestHeaderRefusal is the refusal of a checksum header that does not
// parse, or names an algorithm the daemon does not compute.
func digestHeaderRefusal(header, format string, args ...any) error {
	return status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: header},
		header+": "+format, args...)
}

// write adds p, the next bytes of the body, to every checksum.
func (d uploadDigests) write(p []byte) {
	for _, c := range d {
		c.sum.Write(p)
	}
}

// verify compares every checksum of the body, whole now, with what its
// header sent: CRC_MISMATCH for the first that differs. written is how
// much of the body the upload wrote at offset before it (a PUT's pieces
// before the last), which the refusal names.
func (d uploadDigests) verify(offset, written int64) error {
	for _, c := range d {
		got := c.sum.Sum(nil)
		if bytes.Equal(got, c.sent) {
			continue
		}
		b64 := base64.StdEncoding.EncodeToString
		md := map[string]string{
			errorinfo.KeyField: c.header,
			"algorithm":        c.alg,
			"digest_data":      b64(got),
			"digest_sent":      b64(c.sent),
		}
		what := "nothing written"
		if written > 0 {
			md["offset"] = strconv.FormatInt(offset, 10)
			md["bytes_written"] = strconv.FormatInt(written, 10)
			what = fmt.Sprintf("the body's first %d bytes are written at offset %d (bytes %d-%d), the rest is not", written, offset, offset, offset+written-1)
		}
		return status.Refusal(filewritev1.ErrorReason_CRC_MISMATCH, md,
			"the %s of the body is %s, %s says %s: %s", c.alg, b64(got), c.header, b64(c.sent), what)
	}
	return nil
}
