package rpc

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/service/internal/status"
	"github.com/filewrite/filewrite/store"
)

// statResponse is the StatResponse of st: its validators are its
// generation, as a number and as a strong ETag (status.ETag), there at
// once after any change.
func statResponse(st store.FileStat) *filewritev1.StatResponse {
	resp := &filewritev1.StatResponse{Size: st.Size, AllocatedBytes: st.AllocatedBytes, BlockSize: st.BlockSize,
		ContentType: st.ContentType, Etag: status.ETag(st.Generation), Generation: st.Generation}
	if st.ChangeTime != 0 {
		resp.ChangeTime = timestamppb.New(time.Unix(0, st.ChangeTime))
	}
	return resp
}
