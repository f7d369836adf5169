package rpc

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/store"
)

// DefaultValidatorDelay is how long after its last change a file goes
// without an ETag (StatResponse.etag). Two changes within one tick of the
// kernel's coarse clock (a few milliseconds; kernels before 6.13 use it for
// every ctime) leave the same ctime, so a validator taken during that tick
// could stay the same across a change. Git's index calls such entries
// "racily clean" and rechecks them; here they get no validator at all.
const DefaultValidatorDelay = time.Second

// statResponse is the StatResponse of st, read at now: its validator is
// left empty while st changed less than delay before now.
func statResponse(st store.FileStat, now time.Time, delay time.Duration) *filewritev1.StatResponse {
	resp := &filewritev1.StatResponse{Size: st.Size, AllocatedBytes: st.AllocatedBytes, BlockSize: st.BlockSize, ContentType: st.ContentType}
	if st.ChangeTime == 0 {
		return resp // without a change time nothing tells two states apart
	}
	changed := time.Unix(0, st.ChangeTime)
	resp.ChangeTime = timestamppb.New(changed)
	if now.Sub(changed) >= delay {
		resp.Etag = weakETag(st)
	}
	return resp
}

// weakETag is W/"<16 hex digits>": a digest of the file's identity, size
// and ctime, so that it names no inode number to a stranger. It is weak
// (RFC 9110, section 8.8.1) because it is not computed from the bytes: two
// files with the same content have different tags, and a download that
// runs while the file is written is no one state of it.
func weakETag(st store.FileStat) string {
	var b [32]byte
	binary.LittleEndian.PutUint64(b[0:], st.Dev)
	binary.LittleEndian.PutUint64(b[8:], st.Ino)
	binary.LittleEndian.PutUint64(b[16:], uint64(st.Size))
	binary.LittleEndian.PutUint64(b[24:], uint64(st.ChangeTime))
	sum := sha256.Sum256(b[:])
	return `W/"` + hex.EncodeToString(sum[:8]) + `"`
}
