//go:build linux

package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

func crc32cOf(b []byte) []byte {
	return binary.BigEndian.AppendUint32(nil, crc32.Checksum(b, castagnoli))
}

// TestDigest: Digest answers the checksum of the range asked for, cut at
// the end of the file, at the file's generation; a second ask at the same
// generation comes from memory, and a write makes it read again.
func TestDigest(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	ctx := context.Background()
	content := testutil.AllBytes(digestChunkBytes*2 + 333) // more than one read
	w, err := s.Write(ctx, "d", 0, content, SyncNone)
	if err != nil {
		t.Fatal(err)
	}
	sha := sha256.Sum256(content[10:5000])
	tests := []struct {
		name        string
		off, length int64
		alg         DigestAlgorithm
		want        []byte
		wantLength  int64
	}{
		{"whole, crc32c", 0, 0, DigestCRC32C, crc32cOf(content), int64(len(content))},
		{"a range, sha-256", 10, 4990, DigestSHA256, sha[:], 4990},
		{"past the end, cut", int64(len(content)) - 5, 100, DigestCRC32C, crc32cOf(content[len(content)-5:]), 5},
		{"from the end", int64(len(content)), 0, DigestCRC32C, crc32cOf(nil), 0},
		{"beyond the end", int64(len(content)) + 10, 0, DigestCRC32C, crc32cOf(nil), 0},
	}
	for _, tc := range tests {
		got, err := s.Digest(ctx, "d", tc.off, tc.length, tc.alg)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !bytes.Equal(got.Sum, tc.want) || got.Length != tc.wantLength || got.Generation != w.Generation || got.Cached {
			t.Errorf("%s: %x over %d at %d (cached %v), want %x over %d at %d, read", tc.name, got.Sum, got.Length, got.Generation, got.Cached, tc.want, tc.wantLength, w.Generation)
		}
		again, err := s.Digest(ctx, "d", tc.off, tc.length, tc.alg)
		if err != nil || !again.Cached || !bytes.Equal(again.Sum, tc.want) {
			t.Errorf("%s again: %+v, %v; want it from memory", tc.name, again, err)
		}
	}
	if sum, ok := s.CachedDigest(w.Generation, 0, int64(len(content)), DigestCRC32C); !ok || !bytes.Equal(sum, crc32cOf(content)) {
		t.Errorf("CachedDigest of the whole file: %x, %v", sum, ok)
	}
	w2, err := s.Write(ctx, "d", 0, []byte("X"), SyncNone)
	if err != nil {
		t.Fatal(err)
	}
	content[0] = 'X'
	got, err := s.Digest(ctx, "d", 0, 0, DigestCRC32C)
	if err != nil || got.Cached || got.Generation != w2.Generation || !bytes.Equal(got.Sum, crc32cOf(content)) {
		t.Errorf("after a write: %+v, %v; want the new content's, read at generation %d", got, err, w2.Generation)
	}
	for _, tc := range []struct {
		name string
		do   func() error
		want error
	}{
		{"no file", func() error { _, err := s.Digest(ctx, "none", 0, 0, DigestCRC32C); return err }, ErrNotFound},
		{"negative offset", func() error { _, err := s.Digest(ctx, "d", -1, 0, DigestCRC32C); return err }, ErrInvalidOffset},
		{"unknown algorithm", func() error { _, err := s.Digest(ctx, "d", 0, 0, 9); return err }, ErrInvalidMode},
		{"bad path", func() error { _, err := s.Digest(ctx, "../x", 0, 0, DigestCRC32C); return err }, ErrInvalidPath},
	} {
		if err := tc.do(); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

// TestDigestUnderWrites: checksums taken while writers overwrite the
// whole file are each of one content the file had: every write fills it
// with one byte, so a checksum of a mix of two writes matches none.
func TestDigestUnderWrites(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	ctx := context.Background()
	const size = 3*digestChunkBytes + 17
	fills := map[string]byte{}
	for b := range 8 {
		fills[string(crc32cOf(bytes.Repeat([]byte{byte(b)}, size)))] = byte(b)
	}
	if _, err := s.Write(ctx, "f", 0, make([]byte, size), SyncNone); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var writes atomic.Int64
	for w := range 2 {
		wg.Go(func() {
			buf := make([]byte, size)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				b := byte((i*2 + w) % 8)
				for j := range buf {
					buf[j] = b
				}
				if _, err := s.Write(ctx, "f", 0, buf, SyncNone); err != nil {
					t.Error(err)
					return
				}
				writes.Add(1)
			}
		})
	}
	raced := 0
	for range 40 {
		got, err := s.Digest(ctx, "f", 0, 0, DigestCRC32C)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := fills[string(got.Sum)]; !ok || got.Length != size {
			t.Fatalf("a checksum %x over %d bytes that no content of the file had", got.Sum, got.Length)
		}
		raced += got.Raced
	}
	close(stop)
	wg.Wait()
	t.Logf("40 checksums, %d writes meanwhile, %d reads made again", writes.Load(), raced)
}

// BenchmarkDigestCRC32C1GiB is the CRC-32C of a page-cached 1 GiB file,
// read again each time (the cache of checksums is emptied): the issue
// asks for 2 GB/s or more on one CPU (go test -bench DigestCRC32C -cpu 1).
func BenchmarkDigestCRC32C1GiB(b *testing.B) {
	s, dir := newTestStore(b, Options{})
	const size = 1 << 30
	f, err := os.Create(filepath.Join(dir, "big"))
	if err != nil {
		b.Fatal(err)
	}
	chunk := testutil.AllBytes(1 << 20)
	for off := 0; off < size; off += len(chunk) {
		if _, err := f.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
	f.Close()
	ctx := context.Background()
	if _, err := s.Digest(ctx, "big", 0, 0, DigestCRC32C); err != nil { // into the page cache
		b.Fatal(err)
	}
	b.SetBytes(size)
	b.ResetTimer()
	for b.Loop() {
		s.digests = digestCache{}
		if _, err := s.Digest(ctx, "big", 0, 0, DigestCRC32C); err != nil {
			b.Fatal(err)
		}
	}
}
