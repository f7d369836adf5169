//go:build linux

package nbd

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/filewrite/filewrite/internal/testutil"
)

// replyTypes lists the types of replies, for messages.
func replyTypes(rs []optReply) string {
	var b strings.Builder
	for i, r := range rs {
		if i > 0 {
			b.WriteString(" ")
		}
		switch r.typ {
		case repAck:
			b.WriteString("ACK")
		case repServer:
			fmt.Fprintf(&b, "SERVER(%s)", r.data[4:])
		case repInfo:
			fmt.Fprintf(&b, "INFO(%d)", binary.BigEndian.Uint16(r.data))
		case repMetaContext:
			fmt.Fprintf(&b, "META(%d,%s)", binary.BigEndian.Uint32(r.data), r.data[4:])
		case repErrUnsup:
			b.WriteString("ERR_UNSUP")
		case repErrPolicy:
			b.WriteString("ERR_POLICY")
		case repErrInvalid:
			b.WriteString("ERR_INVALID")
		case repErrTLSReqd:
			b.WriteString("ERR_TLS_REQD")
		case repErrUnknown:
			b.WriteString("ERR_UNKNOWN")
		case repErrShutdwn:
			b.WriteString("ERR_SHUTDOWN")
		case repErrTooBig:
			b.WriteString("ERR_TOO_BIG")
		default:
			fmt.Fprintf(&b, "%#x", r.typ)
		}
	}
	return b.String()
}

// TestOptions: each option, well formed or not, gets the reply the
// protocol asks for, and the server goes on parsing options after it: an
// NBD_OPT_INFO of a file that exists succeeds on the same connection.
func TestOptions(t *testing.T) {
	ts := startServer(t)
	ts.file(t, "a.img", make([]byte, 8192))
	ts.file(t, "dir/b.img", []byte("b"))
	tooBig := make([]byte, maxOptionData+1)
	for _, tt := range []struct {
		name       string
		structured bool // negotiate structured replies first
		opt        uint32
		data       []byte
		want       string
	}{
		{"unknown option", false, 99, []byte("xyz"), "ERR_UNSUP"},
		{"option data past the limit", false, optInfo, tooBig, "ERR_TOO_BIG"},
		{"LIST", false, optList, nil, "SERVER(a.img) SERVER(dir/b.img) ACK"},
		{"LIST with data", false, optList, []byte{0}, "ERR_INVALID"},
		{"STARTTLS without a certificate", false, optStartTLS, nil, "ERR_POLICY"},
		{"STRUCTURED_REPLY", false, optStructuredReply, nil, "ACK"},
		{"STRUCTURED_REPLY with data", false, optStructuredReply, []byte{1}, "ERR_INVALID"},
		{"INFO", false, optInfo, infoData("a.img"), "INFO(0) INFO(3) ACK"},
		{"INFO asking for the name", false, optInfo, infoData("dir/b.img", infoName, 1234), "INFO(0) INFO(3) INFO(1) ACK"},
		{"INFO of a missing file", false, optInfo, infoData("nope.img"), "ERR_UNKNOWN"},
		{"INFO of a directory", false, optInfo, infoData("dir"), "ERR_UNKNOWN"},
		{"INFO out of the root", false, optInfo, infoData("../a.img"), "ERR_UNKNOWN"},
		{"INFO of an absolute path", false, optInfo, infoData("/etc/passwd"), "ERR_UNKNOWN"},
		{"INFO of the default export", false, optInfo, infoData(""), "ERR_UNKNOWN"},
		{"INFO of a name that is not UTF-8", false, optInfo, infoData("\xff"), "ERR_UNKNOWN"},
		{"INFO of a name with NUL", false, optInfo, infoData("a\x00"), "ERR_UNKNOWN"},
		{"INFO too short", false, optInfo, []byte{0, 0, 0, 0, 0}, "ERR_INVALID"},
		{"INFO name past the data", false, optInfo, []byte{0, 0, 0, 9, 'a', 0, 0}, "ERR_INVALID"},
		{"INFO requests past the data", false, optInfo, []byte{0, 0, 0, 1, 'a', 0, 2, 0, 0}, "ERR_INVALID"},
		{"INFO bytes after the requests", false, optInfo, append(infoData("a.img"), 0), "ERR_INVALID"},
		{"LIST_META_CONTEXT before STRUCTURED_REPLY", false, optListMetaContext, metaData("a.img"), "ERR_INVALID"},
		{"SET_META_CONTEXT before STRUCTURED_REPLY", false, optSetMetaContext, metaData("a.img", "base:allocation"), "ERR_INVALID"},
		{"LIST_META_CONTEXT of everything", true, optListMetaContext, metaData("a.img"), "META(0,base:allocation) ACK"},
		{"LIST_META_CONTEXT base:", true, optListMetaContext, metaData("a.img", "base:"), "META(0,base:allocation) ACK"},
		{"LIST_META_CONTEXT of another namespace", true, optListMetaContext, metaData("a.img", "qemu:dirty-bitmap:x"), "ACK"},
		{"SET_META_CONTEXT base:allocation", true, optSetMetaContext, metaData("a.img", "qemu:x", "base:allocation"), "META(1,base:allocation) ACK"},
		{"SET_META_CONTEXT base: selects nothing", true, optSetMetaContext, metaData("a.img", "base:"), "ACK"},
		{"SET_META_CONTEXT of nothing", true, optSetMetaContext, metaData("a.img"), "ACK"},
		{"SET_META_CONTEXT query without a namespace", true, optSetMetaContext, metaData("a.img", "allocation"), "ERR_INVALID"},
		{"SET_META_CONTEXT query past the data", true, optSetMetaContext, metaData("a.img", "base:allocation")[:20], "ERR_INVALID"},
		{"SET_META_CONTEXT more queries than data", true, optSetMetaContext, append(metaData("a.img")[:9], 0, 0, 0, 9), "ERR_INVALID"},
		{"SET_META_CONTEXT bytes after the queries", true, optSetMetaContext, append(metaData("a.img", "base:allocation"), 1), "ERR_INVALID"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rc := dialFixed(t, ts.sock)
			if tt.structured {
				rc.option(optStructuredReply, nil)
			}
			if got := replyTypes(rc.option(tt.opt, tt.data)); got != tt.want {
				t.Errorf("replies %s, want %s", got, tt.want)
			}
			if got := replyTypes(rc.option(optInfo, infoData("a.img"))); got != "INFO(0) INFO(3) ACK" {
				t.Errorf("then NBD_OPT_INFO: %s, want INFO(0) INFO(3) ACK", got)
			}
		})
	}
}

// TestInfoReplies: NBD_INFO_EXPORT carries the size and the flags,
// NBD_INFO_BLOCK_SIZE the constraints, NBD_INFO_NAME the name.
func TestInfoReplies(t *testing.T) {
	ts := startServer(t, func(c *Config, _ *StoreBackend) { c.MaxPayload = 1 << 20 })
	ts.file(t, "a.img", make([]byte, 12345))
	rc := dialFixed(t, ts.sock)
	rc.option(optStructuredReply, nil)
	rs := rc.option(optInfo, infoData("a.img", infoName))
	got := map[uint16][]byte{}
	for _, r := range rs[:len(rs)-1] {
		got[binary.BigEndian.Uint16(r.data)] = r.data[2:]
	}
	export := binary.BigEndian.AppendUint64(nil, 12345)
	export = binary.BigEndian.AppendUint16(export, transHasFlags|transSendFlush|transSendFUA|transSendTrim|transWriteZeroes|
		transSendDF|transCanMultiConn|transSendCache|transSendFastZero)
	blockSize := binary.BigEndian.AppendUint32(nil, 1)
	blockSize = binary.BigEndian.AppendUint32(blockSize, 4096)
	blockSize = binary.BigEndian.AppendUint32(blockSize, 1<<20)
	for _, tt := range []struct {
		info uint16
		want []byte
	}{{infoExport, export}, {infoBlockSize, blockSize}, {infoName, []byte("a.img")}} {
		if !bytes.Equal(got[tt.info], tt.want) {
			t.Errorf("NBD_REP_INFO %d: %x, want %x", tt.info, got[tt.info], tt.want)
		}
	}
}

// TestExportName: NBD_OPT_EXPORT_NAME enters transmission with the size
// and flags and no zeroes (NBD_FLAG_C_NO_ZEROES), or the 124 zeroes
// without it; an export it cannot open ends the session, as it cannot
// answer an error.
func TestExportName(t *testing.T) {
	ts := startServer(t)
	ts.file(t, "a.img", make([]byte, 4096))
	for _, noZeroes := range []bool{true, false} {
		t.Run(fmt.Sprintf("no zeroes %v", noZeroes), func(t *testing.T) {
			flags := uint32(clientFixedNewstyle)
			if noZeroes {
				flags |= clientNoZeroes
			}
			rc := dialRaw(t, ts.sock, &flags)
			rc.sendOpt(optExportName, []byte("a.img"))
			var b [10]byte
			rc.read(b[:])
			if size := binary.BigEndian.Uint64(b[:]); size != 4096 {
				t.Errorf("size %d, want 4096", size)
			}
			if !noZeroes {
				z := make([]byte, exportNameReserved)
				rc.read(z)
				if !bytes.Equal(z, make([]byte, exportNameReserved)) {
					t.Errorf("reserved bytes %x", z)
				}
			}
			// Transmission: a read answers.
			rc.sendReq(0, cmdRead, 7, 0, 16, nil)
			if c := rc.readReply(16); c.errno != 0 || c.cookie != 7 {
				t.Errorf("READ after NBD_OPT_EXPORT_NAME: errno %d cookie %d", c.errno, c.cookie)
			}
		})
	}
	t.Run("missing export", func(t *testing.T) {
		rc := dialFixed(t, ts.sock)
		rc.sendOpt(optExportName, []byte("nope.img"))
		rc.expectClosed()
	})
	t.Run("data past the limit", func(t *testing.T) {
		rc := dialFixed(t, ts.sock)
		rc.sendOpt(optExportName, make([]byte, maxOptionData+1))
		rc.expectClosed()
	})
}

// TestHandshakeDisconnects: what the protocol has the server end the
// session for ends it, and so does a handshake that takes too long.
func TestHandshakeDisconnects(t *testing.T) {
	ts := startServer(t, func(c *Config, _ *StoreBackend) { c.HandshakeTimeout = 200 * time.Millisecond })
	ts.file(t, "a.img", make([]byte, 4096))
	for _, tt := range []struct {
		name  string
		flags uint32
		send  func(rc *rawClient)
	}{
		{"unknown client flag", clientFixedNewstyle | 1<<5, nil},
		{"not fixed newstyle", 0, nil},
		{"bad option magic", clientFixedNewstyle, func(rc *rawClient) { rc.write(make([]byte, optionHeaderLen)) }},
		{"ABORT", clientFixedNewstyle, func(rc *rawClient) {
			if r := rc.option(optAbort, []byte("ignored")); r[0].typ != repAck {
				t.Errorf("NBD_OPT_ABORT: %s, want ACK", replyTypes(r))
			}
		}},
		{"handshake timeout", clientFixedNewstyle, func(rc *rawClient) {}},
		{"handshake timeout within an option", clientFixedNewstyle, func(rc *rawClient) {
			rc.write(binary.BigEndian.AppendUint64(nil, magicIHaveOpt))
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rc := dialRaw(t, ts.sock, &tt.flags)
			if tt.send != nil {
				tt.send(rc)
			}
			rc.expectClosed()
		})
	}
}

// TestForcedTLS: with RequireTLS, every option but STARTTLS and ABORT is
// refused with NBD_REP_ERR_TLS_REQD, and NBD_OPT_EXPORT_NAME ends the
// session; after STARTTLS the backend sees the client's certificate,
// options run over TLS, and a second STARTTLS is invalid. Nothing
// negotiated before TLS holds after it.
func TestForcedTLS(t *testing.T) {
	pki := newTestPKI(t, testutil.Dir(t))
	seen := make(chan string, 10)
	ts := startServer(t, func(c *Config, b *StoreBackend) {
		c.TLS, c.RequireTLS = pki.conf, true
		b.Authorize = func(_ context.Context, p *Peer, _ string) (bool, error) {
			seen <- certURI(p)
			return false, nil
		}
	})
	ts.file(t, "a.img", make([]byte, 4096))
	clientTLS := pki.server.ClientTLS()
	clientTLS.ServerName = "localhost"
	clientTLS.Certificates = []tls.Certificate{pki.ca.Issue(t, "spiffe://test/tenant-a")}

	rc := dialFixed(t, ts.sock)
	for _, opt := range []uint32{optList, optInfo, optGo, optStructuredReply, 99} {
		if got := replyTypes(rc.option(opt, infoData("a.img"))); got != "ERR_TLS_REQD" {
			t.Errorf("option %d before TLS: %s, want ERR_TLS_REQD", opt, got)
		}
	}
	rc.startTLS(clientTLS)
	if got := replyTypes(rc.option(optStartTLS, nil)); got != "ERR_INVALID" {
		t.Errorf("a second NBD_OPT_STARTTLS: %s, want ERR_INVALID", got)
	}
	s := rc.goExport("a.img", true)
	if s.size != 4096 {
		t.Errorf("size over TLS %d, want 4096", s.size)
	}
	if got := <-seen; got != "spiffe://test/tenant-a" {
		t.Errorf("the backend saw the client certificate %q", got)
	}
	rc.sendReq(0, cmdBlockStatus, 1, 0, 4096, nil)
	if cs := rc.readAll(1, 0); cs[0].typ != replyTypeBlockStatus {
		t.Errorf("BLOCK_STATUS over TLS: %+v", cs)
	}

	t.Run("EXPORT_NAME before TLS", func(t *testing.T) {
		rc := dialFixed(t, ts.sock)
		rc.sendOpt(optExportName, []byte("a.img"))
		rc.expectClosed()
	})
	t.Run("negotiation before TLS is forgotten", func(t *testing.T) {
		rc := dialFixed(t, ts.sock)
		rc.startTLS(clientTLS)
		if got := replyTypes(rc.option(optSetMetaContext, metaData("a.img", metaBaseAllocation))); got != "ERR_INVALID" {
			t.Errorf("NBD_OPT_SET_META_CONTEXT without structured replies negotiated over TLS: %s", got)
		}
	})
	t.Run("data sent after STARTTLS before TLS", func(t *testing.T) {
		rc := dialFixed(t, ts.sock)
		// STARTTLS and an option in one write: the option is not TLS's.
		b := binary.BigEndian.AppendUint64(nil, magicIHaveOpt)
		b = binary.BigEndian.AppendUint32(b, optStartTLS)
		b = binary.BigEndian.AppendUint32(b, 0)
		b = binary.BigEndian.AppendUint64(b, magicIHaveOpt)
		b = binary.BigEndian.AppendUint32(b, optList)
		b = binary.BigEndian.AppendUint32(b, 0)
		rc.write(b)
		rc.readOptReply(optStartTLS)
		rc.expectClosed()
	})
	t.Run("no client certificate", func(t *testing.T) {
		rc := dialFixed(t, ts.sock)
		rc.option(optStartTLS, nil)
		noCert := pki.server.ClientTLS()
		noCert.ServerName = "localhost"
		tc := tls.Client(rc.nc, noCert)
		tc.Handshake()
		// TLS 1.3 reports the refused certificate on the first read.
		tc.SetReadDeadline(time.Now().Add(time.Minute))
		if _, err := tc.Read(make([]byte, 1)); err == nil {
			t.Errorf("the server took a TLS session without a client certificate")
		}
	})
}

// TestListCut: NBD_OPT_LIST returns at most MaxListNames names, then
// NBD_REP_ACK.
func TestListCut(t *testing.T) {
	ts := startServer(t)
	for i := range MaxListNames + 5 {
		if err := os.WriteFile(filepath.Join(ts.root, fmt.Sprintf("f%04d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rc := dialFixed(t, ts.sock)
	rs := rc.option(optList, nil)
	if len(rs) != MaxListNames+1 || rs[len(rs)-1].typ != repAck {
		t.Fatalf("%d replies, the last %#x; want %d names and ACK", len(rs), rs[len(rs)-1].typ, MaxListNames)
	}
	if got := string(rs[0].data[4:]); got != "f0000" {
		t.Errorf("first name %q, want f0000", got)
	}
}

// TestListScope: NBD_OPT_LIST names only what Authorize lets the client
// open.
func TestListScope(t *testing.T) {
	ts := startServer(t, func(_ *Config, b *StoreBackend) {
		b.Authorize = func(_ context.Context, _ *Peer, name string) (bool, error) {
			if !strings.HasPrefix(name, "mine/") {
				return false, ErrPermission
			}
			return false, nil
		}
	})
	ts.file(t, "mine/a.img", nil)
	ts.file(t, "theirs/b.img", nil)
	rc := dialFixed(t, ts.sock)
	if got := replyTypes(rc.option(optList, nil)); got != "SERVER(mine/a.img) ACK" {
		t.Errorf("NBD_OPT_LIST: %s", got)
	}
	if got := replyTypes(rc.option(optGo, infoData("theirs/b.img"))); got != "ERR_POLICY" {
		t.Errorf("NBD_OPT_GO out of scope: %s, want ERR_POLICY", got)
	}
}
