package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
)

// TestDaemonClosesUnauthenticatedConnections runs the binary with 128
// file descriptors and opens 280 connections that never authenticate:
// gRPC ones that send the HTTP/2 preface (with or without their settings)
// and nothing more, and REST ones whose request is refused with 401 and
// whose body then stalls. They exhaust the descriptors, but each is closed
// once it has gone --conn-auth-timeout without an authenticated request,
// so the descriptors come back and a client with a token gets its Write
// through.
func TestDaemonClosesUnauthenticatedConnections(t *testing.T) {
	dir := testutil.Dir(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	tokens := testutil.WriteTokenFile(t, dir, "tokens", tokenAlpha)
	proc, logs := testutil.StartDaemon(t, ctx, daemonBin, "--root", filepath.Join(dir, "root"),
		"--auth-token-file", tokens, "--conn-auth-timeout", "2s")
	grpcAddr, httpAddr := proc.GRPCAddr, proc.HTTPAddr
	var old unix.Rlimit
	if err := unix.Prlimit(proc.Pid(), unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: 128, Max: 128}, &old); err != nil {
		t.Skipf("cannot lower the daemon's RLIMIT_NOFILE: %v", err)
	}

	const preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	emptySettings := string([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0}) // length 0, type SETTINGS, stream 0
	stalledPut := "PUT /v1/files/stalled HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\n" +
		"Content-Length: 100\r\n\r\nx"
	kinds := []struct {
		name, addr, send string
		n                int
	}{
		{"gRPC, preface only", grpcAddr, preface, 70},
		{"gRPC, preface and settings", grpcAddr, preface + emptySettings, 70},
		{"REST, refused, body stalled", httpAddr, stalledPut, 140},
	}
	type stranger struct {
		kind string
		conn net.Conn
	}
	var strangers []stranger
	for _, k := range kinds {
		for range k.n {
			c, err := net.Dial("tcp", k.addr)
			if err != nil {
				t.Fatalf("%s: %v", k.name, err)
			}
			defer c.Close()
			if _, err := io.WriteString(c, k.send); err != nil {
				t.Fatalf("%s: %v", k.name, err)
			}
			strangers = append(strangers, stranger{k.name, c})
		}
	}

	// A client with a token, whose connection waits in the accept queue
	// behind the strangers'.
	conn := testutil.PlaintextConn(t, grpcAddr)
	c := filewritev1.NewFileServiceClient(conn)
	write := func() error {
		wctx, wcancel := context.WithTimeout(withAuth(ctx, "Bearer "+tokenAlpha), time.Minute)
		defer wcancel()
		_, err := c.Write(wctx, &filewritev1.WriteRequest{Path: "legit.bin", Data: []byte("legit")}, grpc.WaitForReady(true))
		return err
	}
	legit := make(chan error, 1)
	go func() { legit <- write() }()

	// Every stranger is shown the door by the daemon: each read ends with
	// the connection closed, not with the test's own deadline.
	for i, s := range strangers {
		s.conn.SetReadDeadline(time.Now().Add(time.Minute))
		_, err := io.Copy(io.Discard, s.conn)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("%s connection %d: still open after a minute\n%s", s.kind, i, logs)
		}
	}
	t.Logf("%d strangers' connections closed", len(strangers))

	// While strangers held the descriptors, the Write may have found none
	// left to open its file with; with them gone, it goes through.
	if err := <-legit; err != nil {
		if !strings.Contains(err.Error(), "too many open files") {
			t.Fatalf("a Write with a token among %d strangers' connections: %v\n%s", len(strangers), err, logs)
		}
		t.Logf("the Write failed while strangers held every descriptor (%v); again now", err)
		if err := write(); err != nil {
			t.Fatalf("a Write with a token once the strangers were gone: %v", err)
		}
	}
	if got, err := os.ReadFile(filepath.Join(dir, "root", "legit.bin")); err != nil || string(got) != "legit" {
		t.Errorf("legit.bin: %q, %v", got, err)
	}
}

// TestDaemonOutOfDescriptors runs the binary and, once a client is
// connected and a file open, lowers its RLIMIT_NOFILE to the descriptors
// it holds: a Write that must open a file is then RESOURCE_EXHAUSTED, with
// the limit in the message (the daemon is up, and the request changed
// nothing: no directory is left behind), while a Write to the file already
// open goes through. With the limit back, the refused Write goes through
// too, with no restart.
func TestDaemonOutOfDescriptors(t *testing.T) {
	ctx, root, proc, logs := startFresh(t, time.Minute)
	grpcAddr := proc.GRPCAddr
	conn := testutil.PlaintextConn(t, grpcAddr)
	c := filewritev1.NewFileServiceClient(conn)
	write := func(path string) error {
		_, err := c.Write(ctx, &filewritev1.WriteRequest{Path: path, Data: []byte("x")})
		return err
	}
	if err := write("open.bin"); err != nil {
		t.Fatal(err)
	}

	pid := proc.Pid()
	var old unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &old); err != nil {
		t.Skipf("cannot read the daemon's RLIMIT_NOFILE: %v", err)
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	limit := uint64(len(fds))
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: old.Max}, nil); err != nil {
		t.Skipf("cannot lower the daemon's RLIMIT_NOFILE: %v", err)
	}
	// Descriptors are numbered from the lowest free: if the daemon's have
	// gaps below the limit, the first new files fill them.
	refused := ""
	for i := range 16 {
		path := fmt.Sprintf("new%d/f.bin", i)
		err := write(path)
		if err == nil {
			continue
		}
		if got := status.Code(err); got != codes.ResourceExhausted {
			t.Fatalf("Write of %s with every descriptor in use: %v, want %v\n%s", path, err, codes.ResourceExhausted, logs)
		}
		for _, want := range []string{fmt.Sprintf("RLIMIT_NOFILE %d", limit), "too many open files", path} {
			if msg := status.Convert(err).Message(); !strings.Contains(msg, want) {
				t.Errorf("the message %q does not say %q", msg, want)
			}
		}
		refused = path
		break
	}
	if refused == "" {
		t.Fatalf("16 new files opened with RLIMIT_NOFILE at the %d descriptors the daemon held", limit)
	}
	if _, err := os.Stat(filepath.Join(root, filepath.Dir(refused))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused Write left %s/ behind: %v", filepath.Dir(refused), err)
	}
	if err := write("open.bin"); err != nil {
		t.Errorf("a Write to a file already open, out of descriptors: %v", err)
	}

	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &old, nil); err != nil {
		t.Fatal(err)
	}
	if err := write(refused); err != nil {
		t.Errorf("the refused Write again, with the limit back: %v", err)
	}
}
