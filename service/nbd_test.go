package service

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/nbd"
	"github.com/filewrite/filewrite/store"
)

// nbdSocket is a unix socket path for a daemon's --nbd-addr: short, as a
// socket's path must fit in 108 bytes, so not under the test's directory.
func nbdSocket(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "nbd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "nbd.sock")
}

// nbdURI is the NBD URI of the export name on the unix socket sock.
func nbdURI(sock, name string) string {
	return "nbd+unix:///" + name + "?socket=" + sock
}

// nbdConn is a client in the transmission phase, speaking the protocol
// byte by byte with simple replies: for what no client tool lets a test
// hold still (a connection open, a request in flight).
type nbdConn struct {
	nc net.Conn
	br *bufio.Reader
}

// dialNBD connects to sock and enters the transmission phase on name
// (fixed newstyle, NBD_OPT_GO).
func dialNBD(t *testing.T, sock, name string) *nbdConn {
	t.Helper()
	nc, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(time.Minute))
	c := &nbdConn{nc: nc, br: bufio.NewReader(nc)}
	if _, err := io.ReadFull(c.br, make([]byte, 18)); err != nil { // NBDMAGIC, IHAVEOPT, flags
		t.Fatal(err)
	}
	b := binary.BigEndian.AppendUint32(nil, 3)               // FIXED_NEWSTYLE | NO_ZEROES
	b = binary.BigEndian.AppendUint64(b, 0x49484156454F5054) // IHAVEOPT
	b = binary.BigEndian.AppendUint32(b, 7)                  // NBD_OPT_GO
	b = binary.BigEndian.AppendUint32(b, uint32(4+len(name)+2))
	b = binary.BigEndian.AppendUint32(b, uint32(len(name)))
	b = append(append(b, name...), 0, 0)
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
	for {
		var h [20]byte
		if _, err := io.ReadFull(c.br, h[:]); err != nil {
			t.Fatal(err)
		}
		data := make([]byte, binary.BigEndian.Uint32(h[16:]))
		if _, err := io.ReadFull(c.br, data); err != nil {
			t.Fatal(err)
		}
		switch typ := binary.BigEndian.Uint32(h[12:]); {
		case typ == 1: // NBD_REP_ACK
			return c
		case typ&(1<<31) != 0:
			t.Fatalf("NBD_OPT_GO %q: error %#x: %s", name, typ, data)
		}
	}
}

// send sends a request.
func (c *nbdConn) send(t *testing.T, typ uint16, cookie, off uint64, length uint32, payload []byte) {
	t.Helper()
	b := binary.BigEndian.AppendUint32(nil, 0x25609513)
	b = binary.BigEndian.AppendUint16(b, 0)
	b = binary.BigEndian.AppendUint16(b, typ)
	b = binary.BigEndian.AppendUint64(b, cookie)
	b = binary.BigEndian.AppendUint64(b, off)
	b = binary.BigEndian.AppendUint32(b, length)
	if _, err := c.nc.Write(append(b, payload...)); err != nil {
		t.Fatal(err)
	}
}

// reply reads a simple reply that carries no data: its cookie and error.
func (c *nbdConn) reply(t *testing.T) (cookie uint64, errno uint32) {
	t.Helper()
	var b [16]byte
	if _, err := io.ReadFull(c.br, b[:]); err != nil {
		t.Fatal(err)
	}
	return binary.BigEndian.Uint64(b[8:]), binary.BigEndian.Uint32(b[4:])
}

// NBD's commands and error values, as the tests send and see them.
const (
	nbdWrite    = 1
	nbdFlush    = 3
	nbdTrim     = 4
	nbdShutdown = 108 // NBD_ESHUTDOWN
)

// getNBDConns is GET /debug/nbd.
func (d *daemon) getNBDConns(t *testing.T) []nbd.ConnInfo {
	t.Helper()
	resp, err := http.Get(d.url + "/debug/nbd")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rep struct {
		Open        int            `json:"open"`
		Connections []nbd.ConnInfo `json:"connections"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&rep) != nil {
		t.Fatalf("GET /debug/nbd: %s", resp.Status)
	}
	return rep.Connections
}

// TestNBD: with --nbd-addr on a unix socket, the socket has mode 0660,
// nbdinfo sees a file, qemu-io's writes land in it, the requests show in
// the RPC metrics under their own method names, and /debug/nbd lists an
// open connection with its export.
func TestNBD(t *testing.T) {
	testutil.NeedTool(t, "nbdinfo", "qemu-io")
	sock := nbdSocket(t)
	d := startDaemon(t, func(c *Config) { c.NBDAddr = "unix:" + sock })
	if got := d.srv.NBDAddr().String(); got != sock {
		t.Errorf("NBDAddr %s, want %s", got, sock)
	}
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
		t.Errorf("the NBD socket: %v (%v), want a socket of mode 0660", fi.Mode(), err)
	}
	ctx := testContext(t)
	if _, err := d.client.Truncate(ctx, &filewritev1.TruncateRequest{Path: "vm/disk.img", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	uri := nbdURI(sock, "vm/disk.img")
	if got := strings.TrimSpace(testutil.Run(t, "nbdinfo", "--size", uri)); got != "1048576" {
		t.Errorf("nbdinfo --size: %s", got)
	}
	testutil.Run(t, "qemu-io", "-f", "raw", "-c", "write -P 0xab 4k 4k", "-c", "flush", uri)
	if got := d.onDisk(t, "vm/disk.img")[4096:8192]; !bytes.Equal(got, bytes.Repeat([]byte{0xab}, 4096)) {
		t.Errorf("the file after qemu-io's write holds %x...", got[:8])
	}
	if _, err := testutil.RunErr("nbdinfo", "--size", nbdURI(sock, "missing.img")); err == nil {
		t.Errorf("nbdinfo of a missing file succeeded: NBD creates nothing")
	}
	if _, err := os.Stat(filepath.Join(d.root, "missing.img")); !os.IsNotExist(err) {
		t.Errorf("missing.img after nbdinfo: %v, want it not to exist", err)
	}

	fams := d.scrape(t)
	for _, method := range []string{"nbd/NBD_CMD_WRITE", "nbd/NBD_CMD_FLUSH"} {
		m := series(fams, "rpc_server_call_duration_seconds",
			map[string]string{"rpc_method": method, "rpc_system_name": "nbd", "rpc_response_status_code": "OK"})
		if m.GetHistogram().GetSampleCount() == 0 {
			t.Errorf("rpc_server_call_duration_seconds{rpc_method=%q}: %v, want a count", method, m)
		}
	}

	if cs := d.getNBDConns(t); len(cs) != 0 {
		t.Errorf("/debug/nbd with no client: %+v", cs)
	}
	c := dialNBD(t, sock, "vm/disk.img")
	testutil.WaitFor(t, "/debug/nbd to list the connection", func() bool {
		cs := d.getNBDConns(t)
		return len(cs) == 1 && cs[0].Export == "vm/disk.img"
	})
	c.nc.Close()
	testutil.WaitFor(t, "/debug/nbd to list none", func() bool { return len(d.getNBDConns(t)) == 0 })
}

// TestNBDLockWaitTrace: an NBD request that waits for a file's lock has
// the store's wait span under its own server span, as a gRPC call does,
// linked to the holder's.
func TestNBDLockWaitTrace(t *testing.T) {
	g := newHoldGate(t, "f")
	sock := nbdSocket(t)
	d := startTracedDaemon(t, func(c *Config) {
		c.Store.Hooks = g.hooks()
		c.NBDAddr = "unix:" + sock
	})
	ctx := testContext(t)
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "f", Data: make([]byte, 8192)}); err != nil {
		t.Fatal(err)
	}
	c := dialNBD(t, sock, "f")
	g.arm()
	errs := make(chan error, 1)
	go func() {
		_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "f", Offset: 8192, Data: make([]byte, 4096)})
		errs <- err
	}()
	holder := <-g.arrived               // extending: exclusive
	c.send(t, nbdTrim, 1, 0, 4096, nil) // takes the lock exclusively
	d.starts.AwaitStart(t, store.SpanLockWait)
	g.open()
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if cookie, errno := c.reply(t); cookie != 1 || errno != 0 {
		t.Fatalf("TRIM: cookie %d error %d", cookie, errno)
	}
	d.checkWait(t, store.SpanLockWait, "nbd/NBD_CMD_TRIM", map[attribute.Key]string{
		store.AttrLockMode: "exclusive",
		store.AttrPath:     "f",
	}, holder.span)
}

// TestNBDClientCertificates: with --auth-token-file, NBD takes only TLS
// with a client certificate, mapped to its cert= line's scope as on gRPC:
// inside a read-write scope the export is writable, in a read-only one it
// is read-only and writes answer EPERM and change nothing, and outside
// the scope, unmapped, or without a certificate nothing opens. A reload
// that narrows the scope narrows the export in use.
func TestNBDClientCertificates(t *testing.T) {
	testutil.NeedTool(t, "nbdinfo")
	testutil.NBDPython(t)
	dir := testutil.Dir(t)
	server := testutil.NewCert(t, dir, "server")
	ca := testutil.NewCA(t, dir)
	tokens := testutil.WriteTokenFile(t, dir, "tokens", tokenAdmin,
		"cert=spiffe://example.org/job-a name=job-a prefix=tenants/a/",
		"cert=spiffe://example.org/audit name=audit prefix=tenants/a/ mode=ro")
	sock := nbdSocket(t)
	d := startDaemon(t, func(c *Config) {
		c.TLSCert, c.TLSKey, c.TLSClientCA = server.CertFile, server.KeyFile, ca.File
		c.AuthTokenFile = tokens
		c.NBDAddr = "unix:" + sock
	})
	for _, p := range []string{"tenants/a/disk.img", "tenants/b/disk.img"} {
		if err := os.MkdirAll(filepath.Join(d.root, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d.root, p), bytes.Repeat([]byte{1}, 1<<16), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	certs := func(name, identity string) string {
		return testutil.LibnbdCerts(t, dir, name, server.CertFile, ca.Issue(t, identity))
	}
	jobA, audit, stranger := certs("job-a", "spiffe://example.org/job-a"), certs("audit", "spiffe://example.org/audit"), certs("stranger", "spiffe://example.org/stranger")
	uri := func(name, certDir string) string {
		return "nbds+unix:///" + name + "?socket=" + sock + "&tls-certificates=" + certDir + "&tls-hostname=localhost"
	}

	for _, tt := range []struct {
		name, export, certs string
		ok, readOnly        bool
	}{
		{"read-write scope", "tenants/a/disk.img", jobA, true, false},
		{"read-only scope", "tenants/a/disk.img", audit, true, true},
		{"outside the scope", "tenants/b/disk.img", jobA, false, false},
		{"unmapped certificate", "tenants/a/disk.img", stranger, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := testutil.RunErr("nbdinfo", "--size", uri(tt.export, tt.certs))
			if (err == nil) != tt.ok {
				t.Fatalf("nbdinfo: %v, want success %v", err, tt.ok)
			}
			if !tt.ok {
				return
			}
			_, err = testutil.RunErr("nbdinfo", "--is", "read-only", uri(tt.export, tt.certs))
			if (err == nil) != tt.readOnly {
				t.Errorf("nbdinfo --is read-only: %v, want read-only %v", err, tt.readOnly)
			}
		})
	}
	t.Run("without TLS", func(t *testing.T) {
		if _, err := testutil.RunErr("nbdinfo", "--size", nbdURI(sock, "tenants/a/disk.img")); err == nil {
			t.Errorf("nbdinfo without TLS connected")
		}
	})

	// The read-only scope's writes, sent anyway, change nothing.
	before := testutil.Snapshot(t, d.root)
	testutil.NBDScript(t, uri("tenants/a/disk.img", audit), `
h = connect(strict=False)
for call in (lambda: h.pwrite(b'x' * 4096, 0), lambda: h.trim(4096, 0), lambda: h.zero(4096, 0)):
    try:
        call()
    except nbd.Error as e:
        assert e.errnum == errno.EPERM, e
    else:
        raise AssertionError("a write succeeded in a read-only scope")
h.shutdown()
`)
	testutil.CheckUnchanged(t, d.root, before)

	// A reload that makes job-a read-only narrows its export in use: one
	// write before, EPERM after.
	out := testutil.NBDScriptPaused(t, uri("tenants/a/disk.img", jobA), `
h = connect(strict=False)
h.pwrite(b'y' * 4096, 0)
pause()
try:
    h.pwrite(b'z' * 4096, 0)
except nbd.Error as e:
    print("refused", e.errnum == errno.EPERM)
h.shutdown()
`, func() {
		testutil.WriteTokenFile(t, dir, "tokens", tokenAdmin,
			"cert=spiffe://example.org/job-a name=job-a prefix=tenants/a/ mode=ro")
		if err := d.srv.ReloadAuth(); err != nil {
			t.Fatal(err)
		}
	})
	if !strings.Contains(out, "refused True") {
		t.Errorf("a write after the reload made the scope read-only: %q, want EPERM", out)
	}
	if got := d.onDisk(t, "tenants/a/disk.img")[:4096]; !bytes.Equal(got, bytes.Repeat([]byte{'y'}, 4096)) {
		t.Errorf("the file holds %q..., want the write before the reload alone", got[:8])
	}
}

// TestNBDStartRefusals: the daemon refuses to start with --nbd-addr where
// NBD would have no credential, would be open beyond loopback, or could
// not advertise its block sizes, and says why.
func TestNBDStartRefusals(t *testing.T) {
	dir := testutil.Dir(t)
	tokens := testutil.WriteTokenFile(t, dir, "tokens", tokenAdmin)
	for _, tt := range []struct {
		name      string
		configure func(*Config)
		want      string
	}{
		{"tokens without client certificates", func(c *Config) {
			c.AuthTokenFile, c.NBDAddr = tokens, "127.0.0.1:0"
		}, "--nbd-addr with --auth-token-file needs --tls-client-ca"},
		{"beyond loopback without tokens", func(c *Config) { c.NBDAddr = "0.0.0.0:0" }, "0.0.0.0:0 (NBD)"},
		{"requests below the preferred block", func(c *Config) {
			c.NBDAddr, c.Store.MaxRequestBytes = "127.0.0.1:0", 1024
		}, "Store.MaxRequestBytes is 1024: serving NBD needs at least 4096"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Root = filepath.Join(dir, "root")
			cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
			tt.configure(&cfg)
			srv, err := Start(cfg)
			if err == nil {
				srv.Shutdown()
				t.Fatal("Start succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Start: %v, want it to say %q", err, tt.want)
			}
		})
	}
}

// TestNBDShutdown: a shutdown drains NBD as the other listeners: a write
// in flight finishes and is answered, a request that arrives meanwhile
// answers NBD_ESHUTDOWN, then the connection and the socket go, and the
// store closes after the write.
func TestNBDShutdown(t *testing.T) {
	g := newWriteGate("f")
	sock := nbdSocket(t)
	d := startDaemon(t, func(c *Config) {
		c.Store.Hooks = g.hooks()
		c.NBDAddr = "unix:" + sock
	})
	// Made behind the store's back: the gate would hold a Write of it.
	if err := os.WriteFile(filepath.Join(d.root, "f"), make([]byte, 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	c := dialNBD(t, sock, "f")
	c.send(t, nbdWrite, 1, 4096, 4, []byte("abcd"))
	<-g.entered
	done := make(chan error, 1)
	go func() { done <- d.srv.Shutdown() }()
	testutil.WaitFor(t, "the socket to go", func() bool {
		_, err := os.Stat(sock)
		return os.IsNotExist(err)
	})
	c.send(t, nbdFlush, 2, 0, 0, nil)
	if cookie, errno := c.reply(t); cookie != 2 || errno != nbdShutdown {
		t.Errorf("a request during the drain: cookie %d error %d, want 2, NBD_ESHUTDOWN", cookie, errno)
	}
	g.open()
	if cookie, errno := c.reply(t); cookie != 1 || errno != 0 {
		t.Errorf("the write in flight: cookie %d error %d, want 1, success", cookie, errno)
	}
	if _, err := c.br.ReadByte(); err == nil {
		t.Errorf("the connection is still open after its last request")
	}
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if got := string(d.onDisk(t, "f")[4096:4100]); got != "abcd" {
		t.Errorf("the file holds %q, want the write made during the drain", got)
	}
}
