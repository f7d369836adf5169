package testutil

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// StalledCalls is a raw HTTP/2 connection carrying gRPC calls that send
// their headers, and the 5-byte prefix of a message of announced bytes,
// and nothing more: what a peer sends to make a daemon wait for a message
// that never comes. It answers the daemon's pings, so that keepalive
// does not close it.
type StalledCalls struct {
	conn net.Conn
	fr   *http2.Framer
	// wmu guards writes to fr.
	wmu    sync.Mutex
	pinged chan struct{}
}

// OpenStalledCalls opens such a connection to addr, closed when the test
// ends.
func OpenStalledCalls(t testing.TB, addr string) *StalledCalls {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s := &StalledCalls{conn: conn, fr: http2.NewFramer(conn, conn), pinged: make(chan struct{}, 1)}
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := s.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	go s.readLoop()
	return s
}

func (s *StalledCalls) readLoop() {
	for {
		f, err := s.fr.ReadFrame()
		if err != nil {
			return
		}
		s.wmu.Lock()
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				s.fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if f.IsAck() {
				select {
				case s.pinged <- struct{}{}:
				default:
				}
			} else {
				s.fr.WritePing(true, f.Data)
			}
		}
		s.wmu.Unlock()
	}
}

// Open starts n calls of method, each announcing a message of announced
// bytes, and returns once the daemon has read their frames (a ping sent
// after them has come back).
func (s *StalledCalls) Open(t testing.TB, first uint32, n int, method string, announced uint32) {
	t.Helper()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	s.wmu.Lock()
	for i := range n {
		hb.Reset()
		for _, f := range []hpack.HeaderField{
			{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
			{Name: ":path", Value: method}, {Name: ":authority", Value: "filewrite"},
			{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
		} {
			enc.WriteField(f)
		}
		id := first + 2*uint32(i)
		if err := s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		prefix := binary.BigEndian.AppendUint32([]byte{0}, announced)
		if err := s.fr.WriteData(id, false, prefix); err != nil {
			t.Fatal(err)
		}
	}
	err := s.fr.WritePing(false, [8]byte{1})
	s.wmu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.pinged:
	case <-t.Context().Done():
		t.Fatal("no ping ack")
	}
}
