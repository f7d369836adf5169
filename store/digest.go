//go:build linux

package store

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"math"
	"sync"
)

// Checksums of what is stored.
//
// Digest reads a range of a file and returns its checksum as of one
// generation: no mutation lands in the file between the first byte read
// and the last. It reads without holding the inode lock, so writers are
// not held back by a long read, and then checks, with the lock held
// exclusively after the writes in flight (as a conditional mutation does),
// that the generation has not moved since it began: every mutation moves
// it after its bytes are in, while it still holds its lock mode or is
// counted in flight, so one that landed during the read has moved it by
// the time the check holds the lock. If it moved, the read raced a
// mutation (anywhere in the file: the generation is the file's), and is
// made again; after digestAttempts such races the last read is made with
// the lock held, writers waiting for it.
//
// The answer is kept by generation (digestCache): a generation names one
// content of one file, for every span belongs to one file, so a second
// ask of the same range at the same generation is answered from memory
// without touching the file, and a download can announce the checksum
// of the whole file when it is known (CachedDigest).

// DigestAlgorithm is a checksum Digest computes.
type DigestAlgorithm uint8

const (
	// DigestCRC32C is CRC-32C (Castagnoli), 4 bytes, big-endian.
	DigestCRC32C DigestAlgorithm = iota + 1
	// DigestSHA256 is SHA-256, 32 bytes.
	DigestSHA256
)

func (a DigestAlgorithm) String() string {
	switch a {
	case DigestCRC32C:
		return "crc32c"
	case DigestSHA256:
		return "sha-256"
	}
	return fmt.Sprintf("DigestAlgorithm(%d)", uint8(a))
}

// newHash is a hash of a's kind, whose Sum is the checksum as
// DigestResult.Sum has it.
func (a DigestAlgorithm) newHash() hash.Hash {
	if a == DigestSHA256 {
		return sha256.New()
	}
	return crc32.New(castagnoli)
}

// ReasonDigest is recorded with the lock Digest takes to check that its
// read raced no mutation.
const ReasonDigest = "digest"

// DigestResult is the checksum of a range of a file at one generation.
type DigestResult struct {
	// Sum is the checksum: 4 bytes big-endian for DigestCRC32C, 32 for
	// DigestSHA256.
	Sum []byte
	// Offset and Length are the range it covers: the range asked for, cut
	// at the end of the file.
	Offset, Length int64
	// Generation is the file's generation the checksum is of (see
	// FileStat.Generation).
	Generation int64
	// Cached says that it came from memory, without a read.
	Cached bool
	// Raced counts the reads that found the file changed meanwhile and
	// were made again.
	Raced int
}

// digestAttempts is how many reads Digest makes without the lock before
// it makes one holding it.
const digestAttempts = 3

// digestChunkBytes is how much Digest reads at a time: large enough that
// a read's system call costs little next to the copy, small enough that
// the buffer stays in the CPU's cache between the copy and the checksum.
const digestChunkBytes = 1 << 20

// digestChunks recycles Digest's read buffers.
var digestChunks = sync.Pool{New: func() any { b := make([]byte, digestChunkBytes); return &b }}

// errInvalidDigestAlgorithm is the refusal (ErrInvalidMode) of an unknown
// DigestAlgorithm.
var errInvalidDigestAlgorithm = errors.New("unknown checksum algorithm")

// Digest returns the checksum alg of [off, off+length) of path (length 0:
// to the end of the file; a range past the end is cut there), as of one
// generation (see above). ErrNotFound if path names no file; ErrInvalidOffset
// for a negative or overflowing range.
func (s *Store) Digest(ctx context.Context, path string, off, length int64, alg DigestAlgorithm) (DigestResult, error) {
	if err := validatePath(path); err != nil {
		return DigestResult{}, err
	}
	if err := validateRange(off, length, math.MaxInt64); err != nil {
		return DigestResult{}, err
	}
	if alg != DigestCRC32C && alg != DigestSHA256 {
		return DigestResult{}, refuse(ErrInvalidMode, "algorithm", "%v: %v", errInvalidDigestAlgorithm, alg)
	}
	h, err := s.OpenHandle(ctx, path, OpenMustExist)
	if err != nil {
		return DigestResult{}, err
	}
	defer h.Close()
	return h.digest(ctx, off, length, alg)
}

// digest is Digest of the Handle's file.
func (h *Handle) digest(ctx context.Context, off, length int64, alg DigestAlgorithm) (DigestResult, error) {
	ino := h.ino
	for attempt := 1; ; attempt++ {
		gen := ino.gen.Load() // before the size and the bytes it vouches for
		res := DigestResult{Offset: off, Length: digestLength(off, length, ino.size.Load()), Generation: gen, Raced: attempt - 1}
		if sum, ok := h.s.digests.get(digestKey{gen, off, res.Length, alg}); ok {
			res.Sum, res.Cached = sum, true
			return res, nil
		}
		if attempt == digestAttempts {
			return h.digestLocked(ctx, off, length, alg, res.Raced)
		}
		sum, err := h.digestRange(ctx, res.Offset, res.Length, alg, false)
		if err != nil {
			return DigestResult{}, err
		}
		held, err := lockInode(ctx, ino, lockExclusive, "digest", ReasonDigest)
		if err != nil {
			return DigestResult{}, err
		}
		err = waitInflight(ctx, ino, ReasonDigest)
		moved := ino.gen.Load() != gen
		ino.lock.release(held)
		putHolder(held)
		if err != nil {
			return DigestResult{}, err
		}
		if !moved {
			res.Sum = sum
			h.s.digests.put(digestKey{gen, off, res.Length, alg}, sum)
			return res, nil
		}
	}
}

// digestLocked is digest's last attempt: the read made with the file's
// lock held exclusively, after the writes in flight.
func (h *Handle) digestLocked(ctx context.Context, off, length int64, alg DigestAlgorithm, raced int) (DigestResult, error) {
	ino := h.ino
	held, err := lockInode(ctx, ino, lockExclusive, "digest", ReasonDigest)
	if err != nil {
		return DigestResult{}, err
	}
	defer putHolder(held)
	defer ino.lock.release(held)
	if err := waitInflight(ctx, ino, ReasonDigest); err != nil {
		return DigestResult{}, err
	}
	res := DigestResult{Offset: off, Length: digestLength(off, length, ino.size.Load()), Generation: ino.gen.Load(), Raced: raced}
	if res.Sum, err = h.digestRange(ctx, res.Offset, res.Length, alg, true); err != nil {
		return DigestResult{}, err
	}
	h.s.digests.put(digestKey{res.Generation, off, res.Length, alg}, res.Sum)
	return res, nil
}

// digestLength is the length of [off, off+length) cut at size (length 0:
// to size).
func digestLength(off, length, size int64) int64 {
	end := size
	if length > 0 && length < size-off {
		end = off + length
	}
	return max(end-off, 0)
}

// digestRange computes alg over n bytes of the Handle's file at off. A
// file that ends before them was cut short from outside: checkCut says so
// (held is its). ctx's end is returned as it is.
func (h *Handle) digestRange(ctx context.Context, off, n int64, alg DigestAlgorithm, held bool) ([]byte, error) {
	sum, err := digestFile(ctx, h.ino.file, off, n, alg)
	switch {
	case err == nil, ctx.Err() != nil:
		return sum, err
	case errors.Is(err, io.ErrUnexpectedEOF):
		if cut := h.s.checkCut(ctx, h.ino, held); cut != nil {
			return nil, cut
		}
	}
	return nil, ioError("digest", h.ino.path(), err, 0)
}

// digestFile computes alg over n bytes of f at off, reading in chunks.
func digestFile(ctx context.Context, f File, off, n int64, alg DigestAlgorithm) ([]byte, error) {
	bp := digestChunks.Get().(*[]byte)
	defer digestChunks.Put(bp)
	buf := *bp
	sum := alg.newHash()
	for done := int64(0); done < n; {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		chunk := buf[:min(int64(len(buf)), n-done)]
		m, err := f.ReadAt(chunk, off+done)
		if m < len(chunk) && err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF // the file ended before the size the store knows
		}
		if err != nil {
			return nil, err
		}
		sum.Write(chunk)
		done += int64(m)
	}
	return sum.Sum(nil), nil
}

// CachedDigest returns the checksum alg of [off, off+length) of the file
// whose generation is gen, if Digest computed it: a generation names one
// content of one file, so no path is needed. Nothing is read.
func (s *Store) CachedDigest(gen, off, length int64, alg DigestAlgorithm) ([]byte, bool) {
	return s.digests.get(digestKey{gen, off, length, alg})
}

// digestKey names a checksum: a range of one generation of a file.
type digestKey struct {
	gen, off, length int64
	alg              DigestAlgorithm
}

// maxDigests bounds the checksums kept (some 100 bytes each).
const maxDigests = 4096

// digestCache keeps the last maxDigests checksums Digest computed.
type digestCache struct {
	// mu guards the fields below; a leaf, taken alone.
	mu sync.Mutex
	m  map[digestKey][]byte
	// order holds the keys in the order they were added, a ring whose
	// next slot to fill (and evict) is at next.
	order []digestKey
	next  int
}

func (c *digestCache) get(k digestKey) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sum, ok := c.m[k]
	return sum, ok
}

func (c *digestCache) put(k digestKey, sum []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; ok {
		return
	}
	if c.m == nil {
		c.m = make(map[digestKey][]byte)
		c.order = make([]digestKey, maxDigests)
	}
	if len(c.m) == maxDigests {
		delete(c.m, c.order[c.next])
	}
	c.m[k] = sum
	c.order[c.next] = k
	c.next = (c.next + 1) % maxDigests
}
