package service

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
)

// recvAcks reads responses until it has the acks of want, failing on a
// failed ack or the stream's end.
func recvAcks(t *testing.T, stream filewritev1.FileService_WriteStreamClient, want ...uint64) {
	t.Helper()
	missing := map[uint64]bool{}
	for _, id := range want {
		missing[id] = true
	}
	for len(missing) > 0 {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("stream ended with %v, still owing the acks of %v", err, missing)
		}
		for _, a := range resp.GetAcks() {
			if a.GetStatus().GetCode() != 0 {
				t.Fatalf("ack of %d: %v", a.GetId(), a.GetStatus())
			}
			delete(missing, a.GetId())
		}
	}
}

// wantIdleEnd reads the stream to its end, which must be STREAM_IDLE,
// with no ack on the way.
func wantIdleEnd(t *testing.T, stream filewritev1.FileService_WriteStreamClient) {
	t.Helper()
	for {
		resp, err := stream.Recv()
		if err != nil {
			if status.Code(err) != codes.Unavailable || errorinfo.Reason(err) != filewritev1.ErrorReason_STREAM_IDLE.String() {
				t.Fatalf("stream ended with %v (reason %q), want UNAVAILABLE with STREAM_IDLE", err, errorinfo.Reason(err))
			}
			return
		}
		if len(resp.GetAcks()) > 0 {
			t.Fatalf("acks %v after every write was acked", resp.GetAcks())
		}
	}
}

// TestStreamIdleTimeout: a stream that goes --stream-idle-timeout without
// a message and without a write in flight ends with STREAM_IDLE, after
// acking what it read, and gives back its file: with --max-open-files 1,
// another file can then be written.
func TestStreamIdleTimeout(t *testing.T) {
	d := startDaemon(t, func(c *Config) {
		c.Store.MaxOpenFiles = 1
		c.StreamIdleTimeout = 50 * time.Millisecond
	})
	ctx := testContext(t)
	stream, err := d.client.WriteStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&filewritev1.WriteStreamRequest{Path: "idle", Writes: []*filewritev1.StreamWrite{{Id: 1, Data: []byte("kept")}}}); err != nil {
		t.Fatal(err)
	}
	recvAcks(t, stream, 1)
	wantIdleEnd(t, stream)
	if got := string(d.onDisk(t, "idle")); got != "kept" {
		t.Errorf("idle holds %q, want %q", got, "kept")
	}
	// The handle goes back once the stream's reader sees the end too,
	// just after the client does.
	for {
		_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "other", Data: []byte("x")})
		if err == nil {
			break
		}
		if errorinfo.Reason(err) != filewritev1.ErrorReason_TOO_MANY_OPEN_FILES.String() || ctx.Err() != nil {
			t.Fatalf("Write of another file: %v, want OK once the idle stream gave its file back", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStreamIdleNotWhileWriting: a stream whose write is held in the
// store for several timeouts is not idle: a write sent after the hold is
// read and acked (a stream stopped for idleness would have dropped it),
// and only then, with nothing in flight, does the stream end.
func TestStreamIdleNotWhileWriting(t *testing.T) {
	const timeout = 50 * time.Millisecond
	gate := newWriteGate("held")
	d := startDaemon(t, func(c *Config) {
		c.StreamIdleTimeout = timeout
		c.Store.Hooks = gate.hooks()
	})
	t.Cleanup(gate.open)
	ctx := testContext(t)
	stream, err := d.client.WriteStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&filewritev1.WriteStreamRequest{Path: "held", Writes: []*filewritev1.StreamWrite{{Id: 1, Data: []byte("ab")}}}); err != nil {
		t.Fatal(err)
	}
	gate.waitEntered(t, ctx)
	time.Sleep(10 * timeout)
	if err := stream.Send(&filewritev1.WriteStreamRequest{Writes: []*filewritev1.StreamWrite{{Id: 2, Offset: 2, Data: []byte("cd")}}}); err != nil {
		t.Fatalf("Send after the hold: %v", err)
	}
	gate.open()
	recvAcks(t, stream, 1, 2)
	wantIdleEnd(t, stream)
	if got := string(d.onDisk(t, "held")); got != "abcd" {
		t.Errorf("held holds %q, want %q", got, "abcd")
	}
}

// TestStreamIdleTimeoutRefused: the daemon does not start with a timeout
// that would close every stream at once.
func TestStreamIdleTimeoutRefused(t *testing.T) {
	for _, timeout := range []time.Duration{0, -time.Second} {
		cfg := DefaultConfig()
		cfg.Root = t.TempDir()
		cfg.StreamIdleTimeout = timeout
		if err := cfg.Validate(); err == nil {
			t.Errorf("validate with --stream-idle-timeout %v: nil, want an error", timeout)
		}
	}
}
