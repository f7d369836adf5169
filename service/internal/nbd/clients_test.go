//go:build linux

package nbd

// Real NBD clients against the server: libnbd's nbdinfo, nbdcopy and
// Python binding (nbdsh's), qemu-img and qemu-io, and fio's nbd engine.
// Each test skips, saying what to install, when its tool is missing;
// .ci/run installs them all.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store"
	"github.com/filewrite/filewrite/store/crashfs"
)

// randomBytes returns n bytes of a seeded random stream.
func randomBytes(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16), byte(seed >> 24)})
	r.Read(b)
	return b
}

// mapEntry is a line of `nbdinfo --map`: offset, length, type and its
// description.
type mapEntry struct {
	off, n int64
	typ    int
	desc   string
}

func parseMap(t *testing.T, out string) []mapEntry {
	t.Helper()
	var m []mapEntry
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			t.Fatalf("nbdinfo --map line %q", line)
		}
		var e mapEntry
		var err error
		if e.off, err = strconv.ParseInt(f[0], 10, 64); err == nil {
			if e.n, err = strconv.ParseInt(f[1], 10, 64); err == nil {
				e.typ, err = strconv.Atoi(f[2])
			}
		}
		if err != nil {
			t.Fatalf("nbdinfo --map line %q: %v", line, err)
		}
		e.desc = f[3]
		m = append(m, e)
	}
	return m
}

// TestNbdinfo: nbdinfo sees the file's size and flags, lists the files,
// and after a TRIM its map shows the hole where the trim was and data
// around it.
func TestNbdinfo(t *testing.T) {
	testutil.NeedTool(t, "nbdinfo", "qemu-io")
	ts := startServer(t)
	const size = 4 << 20
	ts.file(t, "disk.img", randomBytes(1, size))
	ts.file(t, "dir/other.img", []byte("x"))
	uri := ts.uri("disk.img")

	if got := strings.TrimSpace(testutil.Run(t, "nbdinfo", "--size", uri)); got != strconv.Itoa(size) {
		t.Errorf("nbdinfo --size: %s, want %d", got, size)
	}
	for _, flag := range []string{"multi-conn", "flush", "fua", "trim", "zero", "fast-zero", "df", "cache"} {
		if _, err := testutil.RunErr("nbdinfo", "--can", flag, uri); err != nil {
			t.Errorf("nbdinfo --can %s: %v", flag, err)
		}
	}
	if _, err := testutil.RunErr("nbdinfo", "--is", "read-only", uri); err == nil {
		t.Errorf("nbdinfo --is read-only: the export is read-only, want read-write")
	}
	list := testutil.Run(t, "nbdinfo", "--list", "--json", "nbd+unix://?socket="+ts.sock)
	for _, name := range []string{`"disk.img"`, `"dir/other.img"`} {
		if !strings.Contains(list, name) {
			t.Errorf("nbdinfo --list does not name %s:\n%s", name, list)
		}
	}

	// TRIM [1 MiB, 2 MiB) through qemu-io's discard.
	testutil.Run(t, "qemu-io", "-f", "raw", "-c", "discard 1M 1M", uri)
	got := parseMap(t, testutil.Run(t, "nbdinfo", "--map", uri))
	want := []mapEntry{
		{0, 1 << 20, 0, "data"},
		{1 << 20, 1 << 20, 3, "hole,zero"},
		{2 << 20, 2 << 20, 0, "data"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("nbdinfo --map after TRIM [1M,2M):\n got %v\nwant %v", got, want)
	}
}

// TestNbdcopy: a 256 MiB random image copied into an export with nbdcopy
// and copied back out is the same image, and so is the file under the
// root. Under the race detector the image is 64 MiB: the same requests
// from the same connections, a quarter as many.
func TestNbdcopy(t *testing.T) {
	testutil.NeedTool(t, "nbdcopy")
	ts := startServer(t)
	size := int64(256 << 20)
	if raceEnabled {
		size = 64 << 20
	}
	dir := testutil.Dir(t)
	src := filepath.Join(dir, "src.img")
	writeRandomFile(t, src, 2, size)
	// The export is an empty (sparse) file of the image's size.
	exported := ts.file(t, "vm/disk.img", nil)
	if err := os.Truncate(exported, size); err != nil {
		t.Fatal(err)
	}
	uri := ts.uri("vm/disk.img")
	testutil.Run(t, "nbdcopy", "--flush", src, uri)
	out := filepath.Join(dir, "out.img")
	if err := os.WriteFile(out, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	testutil.Run(t, "nbdcopy", uri, out)
	sameFiles(t, out, src)
	sameFiles(t, exported, src)
}

// writeRandomFile writes n bytes of a seeded random stream to name, a MiB
// at a time.
func writeRandomFile(t *testing.T, name string, seed uint64, n int64) {
	t.Helper()
	f, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := rand.NewChaCha8([32]byte{byte(seed)})
	buf := make([]byte, 1<<20)
	for n > 0 {
		b := buf[:min(n, int64(len(buf)))]
		r.Read(b)
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
		n -= int64(len(b))
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// sameFiles fails t unless the files hold the same bytes, comparing a MiB
// at a time.
func sameFiles(t *testing.T, got, want string) {
	t.Helper()
	g, err := os.Open(got)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	w, err := os.Open(want)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	gb, wb := make([]byte, 1<<20), make([]byte, 1<<20)
	for off := int64(0); ; off += int64(len(wb)) {
		gn, gerr := io.ReadFull(g, gb)
		wn, werr := io.ReadFull(w, wb)
		if gn != wn || !bytes.Equal(gb[:gn], wb[:wn]) {
			testutil.SameBytes(t, fmt.Sprintf("%s at %d", got, off), gb[:gn], wb[:wn])
			return
		}
		if gerr != nil || werr != nil {
			return
		}
	}
}

// TestQemuImgConvert: qemu-img convert -n writes a qcow2 image into an
// export, and qemu-img compare finds the export equal to the image.
func TestQemuImgConvert(t *testing.T) {
	testutil.NeedTool(t, "qemu-img", "qemu-io")
	ts := startServer(t)
	const size = 64 << 20
	dir := testutil.Dir(t)
	qcow := filepath.Join(dir, "src.qcow2")
	testutil.Run(t, "qemu-img", "create", "-q", "-f", "qcow2", qcow, strconv.Itoa(size))
	testutil.Run(t, "qemu-io", "-f", "qcow2",
		"-c", "write -P 0x5a 0 1M", "-c", "write -P 0xa5 10M 3M", "-c", "write -z 20M 1M", "-c", "write -P 0x01 63M 1M", qcow)
	exported := ts.file(t, "disk.img", nil)
	if err := os.Truncate(exported, size); err != nil {
		t.Fatal(err)
	}
	// What the export held before must not survive where the image has
	// zeros: fill it with a pattern first.
	testutil.Run(t, "qemu-io", "-f", "raw", "-c", "write -P 0xee 0 64M", ts.uri("disk.img"))
	testutil.Run(t, "qemu-img", "convert", "-n", "-f", "qcow2", "-O", "raw", qcow, ts.uri("disk.img"))
	if out, err := testutil.RunErr("qemu-img", "compare", "-f", "qcow2", "-F", "raw", qcow, ts.uri("disk.img")); err != nil {
		t.Fatalf("qemu-img compare: %v\n%s", err, out)
	}
}

// TestQemuIo: qemu-io's writes, zeroes, discards and asynchronous writes
// read back as written, through the export and in the file.
func TestQemuIo(t *testing.T) {
	testutil.NeedTool(t, "qemu-io")
	ts := startServer(t)
	const size = 8 << 20
	file := ts.file(t, "disk.img", bytes.Repeat([]byte{0x11}, size))
	uri := ts.uri("disk.img")
	out := testutil.Run(t, "qemu-io", "-f", "raw",
		"-c", "write -P 0xab 0 64k",
		"-c", "write -P 0xcd -f 1M 4k", // FUA
		"-c", "write -z 2M 128k",
		"-c", "write -z -u 3M 128k", // may unmap: a hole
		"-c", "write -z -n 6M 64k", // NBD_CMD_FLAG_FAST_ZERO
		"-c", "discard 4M 64k",
		"-c", "aio_write -P 0x21 5M 4k",
		"-c", "aio_write -P 0x22 5244k 4k",
		"-c", "aio_write -P 0x23 5248k 4k",
		"-c", "aio_flush",
		"-c", "flush",
		"-c", "read -P 0xab 0 64k",
		"-c", "read -P 0x11 64k 64k",
		"-c", "read -P 0xcd 1M 4k",
		"-c", "read -P 0 2M 128k",
		"-c", "read -P 0 3M 128k",
		"-c", "read -P 0x21 5M 4k",
		"-c", "read -P 0x22 5244k 4k",
		"-c", "read -P 0x23 5248k 4k",
		"-c", "read -P 0 6M 64k",
		"-c", "read -P 0x11 7M 1M",
		uri)
	if strings.Contains(out, "Pattern verification failed") || strings.Contains(out, "error") {
		t.Fatalf("qemu-io:\n%s", out)
	}
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{0x11}, size)
	fill := func(off, n int, b byte) { copy(want[off:off+n], bytes.Repeat([]byte{b}, n)) }
	fill(0, 64<<10, 0xab)
	fill(1<<20, 4<<10, 0xcd)
	fill(2<<20, 128<<10, 0)
	fill(3<<20, 128<<10, 0)
	fill(4<<20, 64<<10, 0) // a trimmed range reads as zeros here
	fill(5<<20, 4<<10, 0x21)
	fill(5244<<10, 4<<10, 0x22)
	fill(5248<<10, 4<<10, 0x23)
	fill(6<<20, 64<<10, 0)
	testutil.SameBytes(t, "the file", got, want)
}

// TestFio: fio's nbd engine writes random 4 KiB blocks at queue depth 32
// and verifies each with its CRC-32C.
func TestFio(t *testing.T) {
	testutil.NeedTool(t, "fio")
	ts := startServer(t)
	const size = 16 << 20
	exported := ts.file(t, "disk.img", nil)
	if err := os.Truncate(exported, size); err != nil {
		t.Fatal(err)
	}
	out := testutil.Run(t, "fio", "--name=verify", "--ioengine=nbd", "--uri="+ts.uri("disk.img"),
		"--rw=randwrite", "--bs=4k", "--iodepth=32", "--size="+strconv.Itoa(size),
		"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--verify_state_save=0", "--output-format=terse")
	// Terse output: field 5 is the job's error.
	if f := strings.Split(strings.TrimSpace(out), ";"); len(f) < 5 || f[4] != "0" {
		t.Fatalf("fio: %s", out)
	}
}

// TestMultiConnFlushSurvivesPowerCut: a write acknowledged on one
// connection is made durable by a FLUSH on another (what
// NBD_FLAG_CAN_MULTI_CONN promises): the power cut right after keeps it,
// and loses a later write that no flush covered, but not a write with
// NBD_CMD_FLAG_FUA.
func TestMultiConnFlushSurvivesPowerCut(t *testing.T) {
	testutil.NBDPython(t)
	ctx := context.Background()
	dir := testutil.Dir(t)
	base, err := store.OpenOSFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	fsys := crashfs.New(base)
	st, err := store.Open(fsys, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const size = 1 << 20
	if _, err := st.Write(ctx, "disk.img", 0, make([]byte, size), store.SyncFull); err != nil {
		t.Fatal(err)
	}
	ts := serveStore(t, dir, st)
	ts.crashed = true
	testutil.NBDScript(t, ts.uri("disk.img"), `
a, b = connect(), connect()
assert a.can_multi_conn()
a.pwrite(b'\xab' * 65536, 4096)
b.flush()
a.pwrite(b'\xef' * 4096, 786432, nbd.CMD_FLAG_FUA)
a.pwrite(b'\xcd' * 65536, 524288)
a.shutdown()
b.shutdown()
`)
	img := testutil.Dir(t)
	if _, err := fsys.Crash().Write(img, crashfs.KeepNone); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(img, "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, size)
	copy(want[4096:], bytes.Repeat([]byte{0xab}, 65536))
	copy(want[786432:], bytes.Repeat([]byte{0xef}, 4096))
	testutil.SameBytes(t, "the file after the power cut", got, want)
}

// TestReadOnlyExport: a client whose scope is read-only gets a read-only
// export; a write, a trim and a zero sent anyway (libnbd's strict mode
// off) fail with EPERM, and the file is unchanged.
func TestReadOnlyExport(t *testing.T) {
	testutil.NeedTool(t, "nbdinfo")
	ts := startServer(t, func(_ *Config, b *StoreBackend) {
		b.Authorize = func(context.Context, *Peer, string) (bool, error) { return true, nil }
	})
	content := randomBytes(3, 1<<20)
	file := ts.file(t, "disk.img", content)
	if _, err := testutil.RunErr("nbdinfo", "--is", "read-only", ts.uri("disk.img")); err != nil {
		t.Errorf("nbdinfo --is read-only: %v", err)
	}
	testutil.NBDScript(t, ts.uri("disk.img"), `
h = connect(strict=False)
assert h.is_read_only()
for what, call in [("pwrite", lambda: h.pwrite(b'x' * 4096, 0)),
                   ("pwrite FUA", lambda: h.pwrite(b'x' * 4096, 0, nbd.CMD_FLAG_FUA)),
                   ("trim", lambda: h.trim(65536, 0)),
                   ("zero", lambda: h.zero(65536, 0))]:
    try:
        call()
    except nbd.Error as e:
        assert e.errnum == errno.EPERM, (what, e)
    else:
        raise AssertionError(what + " succeeded on a read-only export")
assert h.pread(4096, 0) == open(`+fmt.Sprintf("%q", file)+`, 'rb').read(4096)
h.shutdown()
`)
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	testutil.SameBytes(t, "the file", got, content)
}

// TestTLSClientCertificate: libnbd upgrades with NBD_OPT_STARTTLS on a
// server that requires TLS, and the backend sees its client certificate;
// without a certificate it cannot connect.
func TestTLSClientCertificate(t *testing.T) {
	testutil.NeedTool(t, "nbdinfo")
	dir := testutil.Dir(t)
	pki := newTestPKI(t, dir)
	var seen atomic.Value
	ts := startServer(t, func(c *Config, b *StoreBackend) {
		c.TLS, c.RequireTLS = pki.conf, true
		b.Authorize = func(_ context.Context, p *Peer, _ string) (bool, error) {
			seen.Store(certURI(p))
			return false, nil
		}
	})
	ts.file(t, "a.img", make([]byte, 1<<20))

	certs := testutil.LibnbdCerts(t, dir, "libnbd", pki.server.CertFile, pki.ca.Issue(t, "spiffe://test/tenant-a"))
	uri := "nbds+unix:///a.img?socket=" + ts.sock + "&tls-certificates=" + certs + "&tls-hostname=localhost"
	if got := strings.TrimSpace(testutil.Run(t, "nbdinfo", "--size", uri)); got != "1048576" {
		t.Errorf("nbdinfo --size over TLS: %s", got)
	}
	if got, _ := seen.Load().(string); got != "spiffe://test/tenant-a" {
		t.Errorf("the backend saw the certificate %q", got)
	}
	if _, err := testutil.RunErr("nbdinfo", "--size", ts.uri("a.img")); err == nil {
		t.Errorf("nbdinfo without TLS connected to a server that requires it")
	}
}

// TestSimpleReplies: a client that does not negotiate structured replies
// (as the kernel's does not) reads, writes, zeroes and trims through
// simple replies.
func TestSimpleReplies(t *testing.T) {
	ts := startServer(t)
	ts.file(t, "a.img", bytes.Repeat([]byte{0x11}, 1<<20))
	testutil.NBDScript(t, ts.uri("a.img"), `
h = nbd.NBD()
h.set_request_structured_replies(False)
h.set_strict_mode(0)  # the read past the end below goes to the server
h.connect_uri(uri)
assert not h.get_structured_replies_negotiated()
h.pwrite(b'\xab' * 8192, 4096, nbd.CMD_FLAG_FUA)
h.zero(4096, 65536)
h.trim(65536, 131072)
h.flush()
assert h.pread(8192, 4096) == b'\xab' * 8192
assert h.pread(4096, 65536) == bytes(4096)
assert h.pread(65536, 131072) == bytes(65536)
assert h.pread(4096, 1048576 - 4096) == b'\x11' * 4096
try:
    h.pread(4096, 1048576 - 100)
except nbd.Error as e:
    assert e.errnum == errno.EINVAL, e
else:
    raise AssertionError("a read past the end succeeded")
h.shutdown()
`)
}
