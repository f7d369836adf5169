package service

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/admit"
	"github.com/filewrite/filewrite/store/faultfs"
)

// TestWriteStreamFlowControl: a client that sends and never reads its acks
// is stopped by the server, which holds no more than --max-stream-bytes
// plus one message (its held-bytes gauge says so) and stops reading: the
// client's Send blocks. Once the client reads, everything goes through.
func TestWriteStreamFlowControl(t *testing.T) {
	const limit = 64 << 10
	d := startDaemon(t, func(c *Config) { c.MaxStreamBytes = limit })
	ctx := testContext(t)
	stream := openStream(t, ctx, d.client, "flow/f")
	const perMessage, messages = 4, 4096 // 64 MiB: more than every buffer on the way
	msgCost := int64(perMessage) * admit.WriteCost(4096)
	var sent atomic.Int64
	sendDone := make(chan error, 1)
	go func() {
		data := testutil.AllBytes(4096)
		for m := range messages {
			req := &filewritev1.WriteStreamRequest{}
			for i := range perMessage {
				id := uint64(m*perMessage + i)
				req.Writes = append(req.Writes, streamWriteOf(id, int64(id%256)*4096, data, 0))
			}
			if err := stream.Send(req); err != nil {
				sendDone <- err
				return
			}
			sent.Add(1)
		}
		sendDone <- stream.CloseSend()
	}()

	held := func() int64 { return d.srv.files.StreamHeld() }
	var most int64
	testutil.WaitFor(t, "the stream to reach its bound", func() bool {
		most = max(most, held())
		return held() >= limit
	})
	// Wait for the sender to stall: its count stops moving for a while.
	// This is no timing assertion: a slow sender only makes the test look
	// longer at a stream that must stay at its bound all along.
	for last, still := sent.Load(), 0; still < 50; {
		time.Sleep(10 * time.Millisecond)
		most = max(most, held())
		if n := sent.Load(); n != last {
			last, still = n, 0
		} else {
			still++
		}
	}
	if n := sent.Load(); n >= messages {
		t.Fatalf("the client sent all %d messages without reading an ack: nothing stopped it", n)
	}
	if most > limit+msgCost {
		t.Errorf("the stream held %d bytes, want at most the bound %d plus one message (%d)", most, limit, msgCost)
	}
	gauge := series(d.scrape(t), "filewrite_streams_held_bytes", nil)
	if got := gauge.GetGauge().GetValue(); got < limit || got > limit+float64(msgCost) {
		t.Errorf("filewrite_streams_held_bytes = %v, want the bound %d (plus up to one message)", got, limit)
	}
	t.Logf("stalled after %d of %d messages, holding %d bytes", sent.Load(), messages, held())

	// Reading the acks lets everything through.
	e := recvAll(stream)
	if err := <-sendDone; err != nil {
		t.Fatalf("send: %v", err)
	}
	if e.err != nil {
		t.Fatalf("stream ended with %v, want OK", e.err)
	}
	if got := len(e.acks); got != perMessage*messages {
		t.Errorf("%d acks, want %d", got, perMessage*messages)
	}
	testutil.WaitFor(t, "the stream to hold nothing", func() bool { return held() == 0 })
}

// TestWriteStreamShutdown: on shutdown a stream stops reading, acks every
// write it read (synced ones once their sync is done), and ends with
// UNAVAILABLE, well before --drain-timeout (here longer than the test's
// context) would cancel it; the daemon then stops cleanly. A stream idle at
// that moment ends the same way.
func TestWriteStreamShutdown(t *testing.T) {
	var ffs **faultfs.FS
	d := startDaemon(t, func(c *Config) {
		ffs = withFaultFS(c)
		c.DrainTimeout = time.Hour
	})
	ctx := testContext(t)
	const path = "drain/f"
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: path, Data: make([]byte, 64<<10)}); err != nil {
		t.Fatal(err)
	}
	idle := openStream(t, ctx, d.client, "drain/idle")
	stream := openStream(t, ctx, d.client, path)
	gate, open := gateOf(t)
	heldSync := (*ffs).Inject(faultfs.Rule{Op: faultfs.OpSync, Hold: gate, Times: 1})
	req := &filewritev1.WriteStreamRequest{}
	for id := range uint64(8) {
		req.Writes = append(req.Writes, streamWriteOf(id, int64(id)*4096, []byte{byte(id + 1)}, filewritev1.SyncMode(id%2)))
	}
	if err := stream.Send(req); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "a sync to be held and every write to reach the file", func() bool {
		b := d.onDisk(t, path)
		for id := range 8 {
			if b[id*4096] != byte(id+1) {
				return false
			}
		}
		return heldSync.Hits() == 1
	})

	shutdown := make(chan error, 1)
	go func() { shutdown <- d.srv.Shutdown() }()
	testutil.WaitFor(t, "the daemon to drain", func() bool {
		select {
		case <-d.srv.files.Draining():
			return true
		default:
			return false
		}
	})
	// Sent after the drain began: never read, so never acked.
	late := &filewritev1.WriteStreamRequest{Writes: []*filewritev1.StreamWrite{streamWriteOf(100, 0, []byte("late"), 0)}}
	_ = stream.Send(late)
	open()

	e := recvAll(stream)
	if got := status.Code(e.err); got != codes.Unavailable {
		t.Errorf("stream ended with %v, want %v", e.err, codes.Unavailable)
	}
	acks := byID(t, e.acks)
	for id := range uint64(8) {
		if a := acks[id]; a == nil || a.GetStatus() != nil {
			t.Errorf("write %d, read before the shutdown: ack %v, want OK", id, a)
		}
	}
	if a := acks[100]; a != nil {
		t.Errorf("write sent after the drain began was acked: %v", a)
	}
	if e := recvAll(idle); status.Code(e.err) != codes.Unavailable || len(e.acks) != 0 {
		t.Errorf("idle stream: %d acks, end %v; want none and %v", len(e.acks), e.err, codes.Unavailable)
	}
	if err := <-shutdown; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if got := d.onDisk(t, path)[0]; got != 1 {
		t.Errorf("first byte %d, want 1: the late write must not land", got)
	}
}

// TestWriteStreamAuth: with tokens, a stream is checked when it opens:
// without a valid token it ends UNAUTHENTICATED and touches nothing; with
// one it writes.
func TestWriteStreamAuth(t *testing.T) {
	var tokens string
	d := startDaemon(t, func(c *Config) {
		tokens = testutil.WriteTokenFile(t, filepath.Dir(c.Root), "tokens", "s3cret")
		c.AuthTokenFile = tokens
	})
	ctx := testContext(t)
	first := &filewritev1.WriteStreamRequest{Path: "auth/f", Writes: []*filewritev1.StreamWrite{streamWriteOf(1, 0, []byte("x"), 0)}}
	for _, tt := range []struct {
		name string
		md   metadata.MD
		want codes.Code
	}{
		{"no token", nil, codes.Unauthenticated},
		{"wrong token", metadata.Pairs("authorization", "Bearer nope"), codes.Unauthenticated},
		{"valid token", metadata.Pairs("authorization", "Bearer s3cret"), codes.OK},
	} {
		stream, err := d.client.WriteStream(metadata.NewOutgoingContext(ctx, tt.md))
		if err != nil {
			t.Fatal(err)
		}
		_ = stream.Send(first) // may fail once the server refused: Recv says why
		_ = stream.CloseSend()
		e := recvAll(stream)
		if got := status.Code(e.err); got != tt.want {
			t.Errorf("%s: stream ended with %v, want %v", tt.name, e.err, tt.want)
		}
		_, err = os.Stat(filepath.Join(d.root, "auth/f"))
		if created := err == nil; created != (tt.want == codes.OK) {
			t.Errorf("%s: auth/f exists: %v", tt.name, created)
		}
		if tt.want == codes.OK && (len(e.acks) != 1 || e.acks[0].GetStatus() != nil) {
			t.Errorf("%s: acks %v, want write 1's, OK", tt.name, e.acks)
		}
	}
}

// TestWriteStreamMetrics: the open-streams gauge counts a stream while it
// is open, and each message read is recorded with its writes.
func TestWriteStreamMetrics(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	open := func() float64 {
		return series(d.scrape(t), "filewrite_streams_open", nil).GetGauge().GetValue()
	}
	stream := openStream(t, ctx, d.client, "metrics/f")
	if got := open(); got != 1 {
		t.Errorf("filewrite_streams_open = %v with a stream open, want 1", got)
	}
	req := &filewritev1.WriteStreamRequest{}
	for id := range uint64(5) {
		req.Writes = append(req.Writes, streamWriteOf(id, int64(id), []byte{1}, 0))
	}
	if err := stream.Send(req); err != nil {
		t.Fatal(err)
	}
	stream.CloseSend()
	if e := recvAll(stream); e.err != nil {
		t.Fatal(e.err)
	}
	testutil.WaitFor(t, "the stream to be counted closed", func() bool { return open() == 0 })
	fams := d.scrape(t)
	h := fams["filewrite_stream_message_writes"].GetMetric()[0].GetHistogram()
	if h.GetSampleCount() != 2 || h.GetSampleSum() != 5 {
		t.Errorf("writes per message: %d messages, %v writes; want 2 and 5", h.GetSampleCount(), h.GetSampleSum())
	}
	if fams["filewrite_stream_held_bytes"] == nil {
		t.Errorf("no filewrite_stream_held_bytes histogram in /metrics")
	}
}
