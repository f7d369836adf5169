package service

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// TestPingFloodIsRefused: a connection that pings more often than
// keepaliveMinTime, here four pings back to back with no call open, is
// told GOAWAY ENHANCE_YOUR_CALM ("too_many_pings") and closed, so a
// stranger cannot keep the daemon answering pings (docs/guarantees.md,
// "Connections"). grpc-go's default policy refuses such a flood too; what
// publicServerOptions adds is the 10 s floor, which lets a client's idle
// keepalive through instead of closing its connection after three pings
// (that part takes half a minute to show and is not tested here).
func TestPingFloodIsRefused(t *testing.T) {
	d := startDaemon(t, nil)
	conn, err := net.DialTimeout("tcp", d.srv.GRPCAddr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if err := fr.WritePing(false, [8]byte{byte(i)}); err != nil {
			t.Fatalf("ping %d: %v", i, err)
		}
	}
	acks := 0
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("connection ended without a GOAWAY (after %d ping acks): %v", acks, err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if err := fr.WriteSettingsAck(); err != nil && !errors.Is(err, net.ErrClosed) {
					t.Fatal(err)
				}
			}
		case *http2.PingFrame:
			if f.IsAck() {
				acks++
			}
		case *http2.GoAwayFrame:
			if f.ErrCode != http2.ErrCodeEnhanceYourCalm || !bytes.Equal(f.DebugData(), []byte("too_many_pings")) {
				t.Fatalf("GOAWAY %v %q, want ENHANCE_YOUR_CALM too_many_pings", f.ErrCode, f.DebugData())
			}
			// The connection closes after the GOAWAY.
			for {
				if _, err := fr.ReadFrame(); err != nil {
					if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err) {
						return
					}
					t.Fatalf("after the GOAWAY: %v, want the connection closed", err)
				}
			}
		}
	}
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}
