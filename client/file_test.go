package client_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/filewrite/filewrite/client"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service"
	"github.com/filewrite/filewrite/store/faultfs"
)

// TestFileOutlivesOpenContext: the context given to Open bounds Open only;
// the File's calls work after it is cancelled.
func TestFileOutlivesOpenContext(t *testing.T) {
	d := startDaemon(t, nil)
	c := dial(t, d.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	f, err := c.Open(ctx, "life/f")
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("alive"), 0); err != nil {
		t.Errorf("WriteAt after Open's context ended: %v", err)
	}
	got := make([]byte, 5)
	if _, err := f.ReadAt(got, 0); err != nil || string(got) != "alive" {
		t.Errorf("ReadAt after Open's context ended: %q, %v", got, err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("Close after Open's context ended: %v", err)
	}
}

// TestWithTimeout: WriteAt and ReadAt are bounded by the File's timeout,
// and fail with an error that is both DEADLINE_EXCEEDED and
// context.DeadlineExceeded; the write, which the daemon held, then lands
// and Close reports nothing.
func TestWithTimeout(t *testing.T) {
	d := startDaemon(t, nil)
	c := dial(t, d.addr)
	f, err := c.Open(testContext(t), "timeout/f", client.WithTimeout(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	g := testutil.NewGate(t)
	held := d.ffs.Inject(faultfs.Rule{Op: faultfs.OpWrite, Path: "timeout/f", Hold: g.Opened(), Times: 1})
	_, err = f.WriteAt([]byte("late"), 0)
	if status.Code(err) != codes.DeadlineExceeded || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WriteAt held past its timeout: got %v, want DEADLINE_EXCEEDED wrapping context.DeadlineExceeded", err)
	}
	testutil.WaitFor(t, "the write to reach the daemon", func() bool { return held.Hits() == 1 })
	g.Open()
	if err := f.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if got := string(d.onDisk(t, "timeout/f")); got != "late" {
		t.Errorf("file: %q, want %q", got, "late")
	}
}

// TestClosed: after Close, every call of the File, a second Close too,
// fails with an error wrapping fs.ErrClosed; after the Client's Close,
// every call of the Client does.
func TestClosed(t *testing.T) {
	_, ctx, c := startAndDial(t)
	f := openFile(t, ctx, c, "closed/f")
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	firstErr := func(seq func(func(client.Extent, error) bool)) error {
		for _, err := range seq {
			return err
		}
		return nil
	}
	calls := map[string]func() error{
		"Close":            f.Close,
		"CloseContext":     func() error { return f.CloseContext(ctx) },
		"WriteAt":          func() error { _, err := f.WriteAt(buf, 0); return err },
		"Write":            func() error { _, _, err := f.Write(ctx, buf, 0, client.SyncNone); return err },
		"ReadAt":           func() error { _, err := f.ReadAt(buf, 0); return err },
		"Read":             func() error { _, err := f.Read(ctx, buf, 0); return err },
		"Sync":             func() error { return f.Sync(ctx) },
		"SyncData":         func() error { return f.SyncData(ctx) },
		"Truncate":         func() error { return f.Truncate(ctx, 0) },
		"Allocate":         func() error { return f.Allocate(ctx, 0, 4096) },
		"AllocateKeepSize": func() error { return f.AllocateKeepSize(ctx, 0, 4096) },
		"PunchHole":        func() error { return f.PunchHole(ctx, 0, 4096) },
		"ZeroRange":        func() error { return f.ZeroRange(ctx, 0, 4096) },
		"Stat":             func() error { _, err := f.Stat(ctx); return err },
		"Extents":          func() error { return firstErr(f.Extents(ctx, 0, 0)) },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, fs.ErrClosed) {
			t.Errorf("File.%s after Close: got %v, want an error wrapping fs.ErrClosed", name, err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	clientCalls := map[string]func() error{
		"Open":    func() error { _, err := c.Open(ctx, "closed/g"); return err },
		"Stat":    func() error { _, err := c.Stat(ctx, "closed/f"); return err },
		"Delete":  func() error { return c.Delete(ctx, "closed/f") },
		"Rename":  func() error { return c.Rename(ctx, "closed/f", "closed/g") },
		"SyncDir": func() error { return c.SyncDir(ctx, "closed") },
		"List":    func() error { return listErr(c.List(ctx, "closed")) },
	}
	for name, call := range clientCalls {
		if err := call(); !errors.Is(err, fs.ErrClosed) {
			t.Errorf("Client.%s after Close: got %v, want an error wrapping fs.ErrClosed", name, err)
		}
	}
}

// TestErrorsIs: the daemon's refusals and a caller's context, as errors.Is
// sees them, alongside their codes.
func TestErrorsIs(t *testing.T) {
	dir := testutil.Dir(t)
	tokens := dir + "/tokens"
	if err := writeFile(tokens, "t0ken\n"); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, func(c *service.Config) { c.AuthTokenFile = tokens })
	ctx := testContext(t)
	c := dial(t, d.addr, client.WithToken("t0ken"))
	f := openFile(t, ctx, c, "is/f")
	defer f.Close()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	expired, cancel2 := context.WithTimeout(ctx, -time.Second)
	defer cancel2()
	tests := []struct {
		name string
		call func() error
		code codes.Code
		is   error
	}{
		{"missing file", func() error { _, err := c.Stat(ctx, "is/missing"); return err }, codes.NotFound, fs.ErrNotExist},
		{"exclusive open of a file", func() error {
			_, err := c.Open(ctx, "is/f", client.WithOpenMode(client.OpenExclusive))
			return err
		}, codes.AlreadyExists, fs.ErrExist},
		{"no token", func() error { _, err := dial(t, d.addr).Stat(ctx, "is/f"); return err }, codes.Unauthenticated, fs.ErrPermission},
		{"cancelled context", func() error { _, err := f.Read(cancelled, make([]byte, 1), 0); return err }, codes.Canceled, context.Canceled},
		{"expired context", func() error { _, _, err := f.Write(expired, []byte("x"), 0, client.SyncNone); return err }, codes.DeadlineExceeded, context.DeadlineExceeded},
	}
	for _, tt := range tests {
		err := tt.call()
		if got := status.Code(err); got != tt.code {
			t.Errorf("%s: code %v (%v), want %v", tt.name, got, err, tt.code)
		}
		if tt.is != nil && !errors.Is(err, tt.is) {
			t.Errorf("%s: errors.Is(%v, %v) is false", tt.name, err, tt.is)
		}
	}
}

// TestOpenModes: must-exist opens only an existing file and creates
// nothing; exclusive creates only a missing one; of Clients racing to
// create one path exclusively, exactly one wins.
func TestOpenModes(t *testing.T) {
	d, ctx, c := startAndDial(t)
	if _, err := c.Open(ctx, "modes/missing", client.WithOpenMode(client.OpenMustExist)); !errors.Is(err, fs.ErrNotExist) || status.Code(err) != codes.NotFound {
		t.Errorf("must-exist Open of a missing file: got %v, want NOT_FOUND wrapping fs.ErrNotExist", err)
	}
	if _, err := c.Stat(ctx, "modes/missing"); status.Code(err) != codes.NotFound {
		t.Errorf("after the refused Open: Stat got %v, want NOT_FOUND (nothing created)", err)
	}
	if names := collect(t, c.List(ctx, "")); len(names) != 0 {
		t.Errorf("after the refused Open the root holds %v, want nothing", names)
	}
	const racers = 8
	clients := make([]*client.Client, racers)
	for i := range clients {
		clients[i] = dial(t, d.addr)
	}
	for round := range 5 {
		path := "modes/race-" + string(rune('a'+round))
		files := make([]*client.File, racers)
		errs := make([]error, racers)
		var wg sync.WaitGroup
		for i := range racers {
			wg.Go(func() {
				files[i], errs[i] = clients[i].Open(ctx, path, client.WithOpenMode(client.OpenExclusive))
			})
		}
		wg.Wait()
		winners := 0
		for i, err := range errs {
			switch {
			case err == nil:
				winners++
				if _, err := files[i].WriteAt([]byte("mine"), 0); err != nil {
					t.Errorf("round %d: the winner's write: %v", round, err)
				}
				if err := files[i].Close(); err != nil {
					t.Error(err)
				}
			case !errors.Is(err, fs.ErrExist):
				t.Errorf("round %d: racer %d: got %v, want nil or ALREADY_EXISTS", round, i, err)
			}
		}
		if winners != 1 {
			t.Errorf("round %d: %d racers created %s, want exactly 1", round, winners, path)
		}
	}
	f, err := c.Open(ctx, "modes/race-a", client.WithOpenMode(client.OpenMustExist))
	if err != nil {
		t.Fatalf("must-exist Open of an existing file: %v", err)
	}
	got := make([]byte, 4)
	if _, err := f.ReadAt(got, 0); err != nil || string(got) != "mine" {
		t.Errorf("ReadAt: %q, %v; want %q", got, err, "mine")
	}
	if err := f.Close(); err != nil {
		t.Error(err)
	}
}

// TestOpenAfterDelete: a File opened on a path whose file was deleted
// under an open File writes to the new file, while the old File keeps
// failing with NOT_FOUND, before and after it is closed.
func TestOpenAfterDelete(t *testing.T) {
	d, ctx, c := startAndDial(t)
	old := openFile(t, ctx, c, "again/f")
	if _, err := old.WriteAt([]byte("old"), 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, "again/f"); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the old File to see the Delete", func() bool {
		_, err := old.WriteAt([]byte("x"), 0)
		return errors.Is(err, fs.ErrNotExist)
	})
	f := openFile(t, ctx, c, "again/f")
	if _, err := f.WriteAt([]byte("new"), 0); err != nil {
		t.Errorf("write through the new File: %v", err)
	}
	if _, err := old.WriteAt([]byte("x"), 0); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("write through the old File: got %v, want NOT_FOUND", err)
	}
	if err := old.Close(); err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Close of the old File: %v", err)
	}
	if _, err := f.WriteAt([]byte("!"), 3); err != nil {
		t.Errorf("write through the new File after the old one closed: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Error(err)
	}
	if got := d.onDisk(t, "again/f"); !bytes.Equal(got, []byte("new!")) {
		t.Errorf("file: %q, want %q", got, "new!")
	}
}
