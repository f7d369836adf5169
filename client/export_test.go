package client

import (
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// Queued is how many writes wait to be sent on f's stream, for tests that
// line callers up without timing.
func Queued(f *File) int {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	return len(f.s.queue)
}

// WritesIn is how many writes a message the client sends on a WriteStream
// carries, for tests that count them in an interceptor; ok is false for a
// message without writes.
func WritesIn(m any) (n int, ok bool) {
	switch m := m.(type) {
	case *encodedRequest:
		req := &filewritev1.WriteStreamRequest{}
		if err := proto.Unmarshal(m.data.Materialize(), req); err != nil {
			return 0, false
		}
		return len(req.Writes), len(req.Writes) > 0
	case *filewritev1.WriteStreamRequest:
		return len(m.Writes), len(m.Writes) > 0
	}
	return 0, false
}
