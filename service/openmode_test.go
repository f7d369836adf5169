package service

import (
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
)

// TestOpenModes: a unary Write and a WriteStream's first message carry the
// open mode to the store: must-exist of a missing file is NOT_FOUND,
// exclusive of an existing one ALREADY_EXISTS, an unknown mode
// INVALID_ARGUMENT, and each refusal leaves the root as it was.
func TestOpenModes(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "old", Data: []byte("old!")}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		path string
		open filewritev1.OpenMode
		want codes.Code
	}{
		{"create, missing", "c/new", filewritev1.OpenMode_OPEN_MODE_UNSPECIFIED, codes.OK},
		{"must-exist, exists", "old", filewritev1.OpenMode_OPEN_MODE_MUST_EXIST, codes.OK},
		{"must-exist, missing", "m/new", filewritev1.OpenMode_OPEN_MODE_MUST_EXIST, codes.NotFound},
		{"exclusive, exists", "old", filewritev1.OpenMode_OPEN_MODE_EXCLUSIVE, codes.AlreadyExists},
		{"exclusive, missing", "x/new", filewritev1.OpenMode_OPEN_MODE_EXCLUSIVE, codes.OK},
		{"unknown mode", "u/new", 7, codes.InvalidArgument},
	}
	for _, tt := range tests {
		for _, via := range []string{"Write", "WriteStream"} {
			t.Run(tt.name+"/"+via, func(t *testing.T) {
				path := tt.path
				if tt.path != "old" {
					path = via + "/" + tt.path // each run makes its own
				}
				before := testutil.Snapshot(t, d.root)
				var err error
				switch via {
				case "Write":
					_, err = d.client.Write(ctx, &filewritev1.WriteRequest{Path: path, Data: []byte("new!"), OpenMode: tt.open})
				case "WriteStream":
					err = streamOpenAndWrite(t, d, path, tt.open, []byte("new!"))
				}
				if got := status.Code(err); got != tt.want {
					t.Fatalf("got %v (%v), want %v", got, err, tt.want)
				}
				if tt.want != codes.OK {
					testutil.CheckUnchanged(t, d.root, before)
					return
				}
				if got := d.onDisk(t, path); string(got) != "new!" {
					t.Errorf("%s holds %q, want %q", path, got, "new!")
				}
			})
		}
	}
}

// streamOpenAndWrite opens a WriteStream on path with open, writes data at
// 0, and returns the error that ended the open, or the write's.
func streamOpenAndWrite(t *testing.T, d *daemon, path string, open filewritev1.OpenMode, data []byte) error {
	t.Helper()
	stream, err := d.client.WriteStream(testContext(t))
	if err != nil {
		return err
	}
	if err := stream.Send(&filewritev1.WriteStreamRequest{Path: path, OpenMode: open}); err != nil {
		return err
	}
	if _, err := stream.Recv(); err != nil {
		return err
	}
	if err := stream.Send(&filewritev1.WriteStreamRequest{Writes: []*filewritev1.StreamWrite{streamWriteOf(1, 0, data, 0)}}); err != nil {
		return err
	}
	for id, a := range closeAndAckAll(t, stream) {
		if a.GetStatus() != nil {
			return status.ErrorProto(a.GetStatus())
		}
		if id != 1 {
			t.Errorf("ack of write %d, want 1", id)
		}
	}
	return nil
}

// TestExclusiveStreamsRace: streams and unary writes racing to create one
// path exclusively: one wins, the others get ALREADY_EXISTS.
func TestExclusiveStreamsRace(t *testing.T) {
	d := startDaemon(t, nil)
	const rounds, racers = 10, 4
	for round := range rounds {
		path := "race/" + string(rune('a'+round))
		errs := make([]error, racers)
		var wg sync.WaitGroup
		for i := range racers {
			wg.Go(func() {
				data := []byte{byte('0' + i)}
				if i%2 == 0 {
					errs[i] = streamOpenAndWrite(t, d, path, filewritev1.OpenMode_OPEN_MODE_EXCLUSIVE, data)
					return
				}
				_, errs[i] = d.client.Write(testContext(t), &filewritev1.WriteRequest{Path: path, Data: data, OpenMode: filewritev1.OpenMode_OPEN_MODE_EXCLUSIVE})
			})
		}
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch code := status.Code(err); {
			case code == codes.OK && winner >= 0:
				t.Fatalf("round %d: racers %d and %d both created %s", round, winner, i, path)
			case code == codes.OK:
				winner = i
			case code != codes.AlreadyExists:
				t.Fatalf("round %d: racer %d: %v, want OK or ALREADY_EXISTS", round, i, err)
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: nobody created %s", round, path)
		}
		if got, want := string(d.onDisk(t, path)), string(rune('0'+winner)); got != want {
			t.Errorf("round %d: %s holds %q, want the winner's %q", round, path, got, want)
		}
	}
}
