package client_test

import (
	"context"
	"hash/crc32"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/filewrite/filewrite/client"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service"
	"github.com/filewrite/filewrite/store"
	"github.com/filewrite/filewrite/store/faultfs"
)

// daemon is a real filewrite daemon in this process, on a loopback port,
// with a faultfs under its store.
type daemon struct {
	srv  *service.Server
	root string
	addr string
	ffs  *faultfs.FS
}

func startDaemon(t testing.TB, configure func(*service.Config)) *daemon {
	t.Helper()
	dir := testutil.Dir(t)
	d := &daemon{root: filepath.Join(dir, "root")}
	cfg := service.DefaultConfig()
	cfg.Root = d.root
	cfg.GRPCAddr = "127.0.0.1:0"
	cfg.HTTPAddr = ""
	cfg.DrainTimeout = 10 * time.Second
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.WrapFS = func(base store.FS) store.FS {
		d.ffs = faultfs.New(base)
		return d.ffs
	}
	if configure != nil {
		configure(&cfg)
	}
	srv, err := service.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown() })
	d.srv, d.addr = srv, srv.GRPCAddr().String()
	return d
}

func (d *daemon) onDisk(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(d.root, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// proxy forwards TCP connections to a daemon and can cut them all, as a
// network failure would.
type proxy struct {
	lis    net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{lis: lis, target: target}
	t.Cleanup(func() { lis.Close(); p.cut() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { io.Copy(u, c); u.Close() }()
			go func() { io.Copy(c, u); c.Close() }()
		}
	}()
	return p
}

func (p *proxy) addr() string { return p.lis.Addr().String() }

// openBehindProxy opens path on a new daemon with a Client of opts dialed
// through a proxy, so that the test can cut the connection under it.
func openBehindProxy(t *testing.T, path string, opts ...client.Option) (*daemon, *proxy, *client.File) {
	t.Helper()
	d := startDaemon(t, nil)
	p := newProxy(t, d.addr)
	f, err := dial(t, p.addr(), opts...).Open(testContext(t), path)
	if err != nil {
		t.Fatal(err)
	}
	return d, p, f
}

// cut closes every connection through the proxy; new ones still work.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func writeFile(name, content string) error { return os.WriteFile(name, []byte(content), 0o600) }

func crc32c(b []byte) uint32 { return crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)) }
