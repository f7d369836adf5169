package service

import (
	"bytes"
	"crypto/md5"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/gateway"
)

// Generations, preconditions and checksums, over the real gateway and
// real gRPC on loopback.

// restRefusal is the reason and metadata of a REST error body's ErrorInfo.
func restRefusal(t *testing.T, body []byte) (string, map[string]string) {
	t.Helper()
	var st struct {
		Details []struct {
			Type     string            `json:"@type"`
			Reason   string            `json:"reason"`
			Metadata map[string]string `json:"metadata"`
		} `json:"details"`
	}
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	for _, d := range st.Details {
		if strings.HasSuffix(d.Type, "ErrorInfo") {
			return d.Reason, d.Metadata
		}
	}
	t.Fatalf("error body %s carries no ErrorInfo", body)
	return "", nil
}

// generation is the file's generation by Stat, 0 if it does not exist.
func (d *daemon) generation(t *testing.T, path string) int64 {
	t.Helper()
	st, err := d.client.Stat(testContext(t), &filewritev1.StatRequest{Path: path})
	if grpcstatus.Code(err) == codes.NotFound {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf(`"%d"`, st.GetGeneration()); st.GetEtag() != want {
		t.Errorf("Stat(%s): etag %s, generation %d: want the etag %s", path, st.GetEtag(), st.GetGeneration(), want)
	}
	return st.GetGeneration()
}

// wantRefusal checks that err is FAILED_PRECONDITION with reason and the
// file's generation now in its metadata.
func wantRefusal(t *testing.T, what string, err error, reason filewritev1.ErrorReason, gen int64) {
	t.Helper()
	if grpcstatus.Code(err) != codes.FailedPrecondition || errorinfo.Reason(err) != reason.String() {
		t.Errorf("%s: %v, want FAILED_PRECONDITION %v", what, err, reason)
		return
	}
	if got := errorinfo.From(err).GetMetadata()[errorinfo.KeyGeneration]; got != strconv.FormatInt(gen, 10) {
		t.Errorf("%s: metadata generation %q, want %d", what, got, gen)
	}
}

// gen64 is a pointer to g, for a proto3 optional field.
func gen64(g int64) *int64 { return &g }

// TestGRPCPreconditionsEveryVerb: every mutation over gRPC takes
// if_generation_match and if_generation_not_match; a failed one is
// FAILED_PRECONDITION with the file's generation and changes nothing, a
// held one changes the file and answers its new generation.
func TestGRPCPreconditionsEveryVerb(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	c := d.client
	type call func(match, notMatch *int64) (gen int64, err error)
	verbs := []struct {
		name string
		do   call
		gone bool // the file is not there afterwards (Delete, Rename's source)
	}{
		{"Write", func(m, n *int64) (int64, error) {
			r, err := c.Write(ctx, &filewritev1.WriteRequest{Path: "f", Data: []byte("new"), IfGenerationMatch: m, IfGenerationNotMatch: n})
			return r.GetGeneration(), err
		}, false},
		{"Append", func(m, n *int64) (int64, error) {
			r, err := c.Append(ctx, &filewritev1.AppendRequest{Path: "f", Data: []byte("+"), IfGenerationMatch: m, IfGenerationNotMatch: n})
			return r.GetGeneration(), err
		}, false},
		{"Truncate", func(m, n *int64) (int64, error) {
			r, err := c.Truncate(ctx, &filewritev1.TruncateRequest{Path: "f", Size: 2, IfGenerationMatch: m, IfGenerationNotMatch: n})
			return r.GetGeneration(), err
		}, false},
		{"Fallocate", func(m, n *int64) (int64, error) {
			r, err := c.Fallocate(ctx, &filewritev1.FallocateRequest{Path: "f", Mode: filewritev1.FallocateMode_FALLOCATE_MODE_ALLOCATE, Length: 8192, IfGenerationMatch: m, IfGenerationNotMatch: n})
			return r.GetGeneration(), err
		}, false},
		{"Delete", func(m, n *int64) (int64, error) {
			_, err := c.Delete(ctx, &filewritev1.DeleteRequest{Path: "f", IfGenerationMatch: m, IfGenerationNotMatch: n})
			return 0, err
		}, true},
		{"Rename source", func(m, n *int64) (int64, error) {
			r, err := c.Rename(ctx, &filewritev1.RenameRequest{Path: "f", NewPath: "g", IfGenerationMatch: m, IfGenerationNotMatch: n})
			return r.GetGeneration(), err
		}, true},
	}
	setup := func(t *testing.T) int64 {
		t.Helper()
		c.Delete(ctx, &filewritev1.DeleteRequest{Path: "g"})
		c.Delete(ctx, &filewritev1.DeleteRequest{Path: "f"})
		r, err := c.Write(ctx, &filewritev1.WriteRequest{Path: "f", Data: []byte("content")})
		if err != nil {
			t.Fatal(err)
		}
		if r.GetGeneration() == 0 || r.GetGeneration() != d.generation(t, "f") {
			t.Fatalf("the Write's generation %d, Stat's %d", r.GetGeneration(), d.generation(t, "f"))
		}
		return r.GetGeneration()
	}
	for _, v := range verbs {
		t.Run(v.name, func(t *testing.T) {
			for _, tc := range []struct {
				name          string
				match, notOne *int64
				reason        filewritev1.ErrorReason
			}{
				{"match another", gen64(1 << 50), nil, filewritev1.ErrorReason_ETAG_MISMATCH},
				{"match 0 (no file)", gen64(0), nil, filewritev1.ErrorReason_PRECONDITION_FAILED},
				{"not match its own", nil, nil, filewritev1.ErrorReason_ETAG_MISMATCH}, // filled below
			} {
				gen := setup(t)
				if tc.name == "not match its own" {
					tc.notOne = gen64(gen)
				}
				_, err := v.do(tc.match, tc.notOne)
				wantRefusal(t, tc.name, err, tc.reason, gen)
				if got := d.generation(t, "f"); got != gen {
					t.Errorf("%s: the refused call moved the generation %d -> %d", tc.name, gen, got)
				}
				if got := d.onDisk(t, "f"); string(got) != "content" {
					t.Errorf("%s: the refused call left %d bytes, not the 7 of content", tc.name, len(got))
				}
			}
			gen := setup(t)
			got, err := v.do(gen64(gen), gen64(gen+1))
			if err != nil {
				t.Fatalf("match its own: %v", err)
			}
			now := d.generation(t, "f")
			switch {
			case v.gone && now != 0:
				t.Errorf("the file is still there at generation %d", now)
			case v.name == "Rename source":
				if got == gen || got != d.generation(t, "g") {
					t.Errorf("Rename answered generation %d, the file had %d and has %d", got, gen, d.generation(t, "g"))
				}
			case !v.gone && (got == gen || got != now):
				t.Errorf("answered generation %d; it was %d, is %d", got, gen, now)
			}
		})
	}
	t.Run("Rename destination", func(t *testing.T) {
		setup(t)
		dst, err := c.Write(ctx, &filewritev1.WriteRequest{Path: "g", Data: []byte("old")})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Rename(ctx, &filewritev1.RenameRequest{Path: "f", NewPath: "g", IfDestinationGenerationMatch: gen64(dst.GetGeneration() + 1)})
		wantRefusal(t, "destination mismatch", err, filewritev1.ErrorReason_ETAG_MISMATCH, dst.GetGeneration())
		_, err = c.Rename(ctx, &filewritev1.RenameRequest{Path: "f", NewPath: "g", IfDestinationGenerationMatch: gen64(0)})
		wantRefusal(t, "destination must not exist", err, filewritev1.ErrorReason_PRECONDITION_FAILED, dst.GetGeneration())
		if string(d.onDisk(t, "g")) != "old" || d.generation(t, "f") == 0 {
			t.Fatal("a refused Rename moved the file")
		}
		if _, err := c.Rename(ctx, &filewritev1.RenameRequest{Path: "f", NewPath: "g", IfDestinationGenerationMatch: gen64(dst.GetGeneration())}); err != nil {
			t.Fatalf("destination match: %v", err)
		}
		if string(d.onDisk(t, "g")) != "content" {
			t.Error("the Rename did not replace g")
		}
	})
	t.Run("create only", func(t *testing.T) {
		r, err := c.Write(ctx, &filewritev1.WriteRequest{Path: "new", Data: []byte("x"), IfGenerationMatch: gen64(0)})
		if err != nil || !r.GetCreated() {
			t.Fatalf("Write if_generation_match 0 of a new file: %v, %v", r, err)
		}
		_, err = c.Write(ctx, &filewritev1.WriteRequest{Path: "new", Data: []byte("y"), IfGenerationMatch: gen64(0)})
		wantRefusal(t, "again", err, filewritev1.ErrorReason_PRECONDITION_FAILED, r.GetGeneration())
	})
	t.Run("stream file", func(t *testing.T) {
		gen := setup(t)
		for _, cond := range []*filewritev1.WriteStreamRequest{
			{Path: "f", IfGenerationMatch: gen64(gen + 1)},
			{Path: "f", IfGenerationNotMatch: gen64(gen)},
		} {
			cond.Writes = []*filewritev1.StreamWrite{{Id: 1, Data: []byte("S")}}
			err := firstStreamError(ctx, c, nil, cond)
			wantRefusal(t, "WriteStream's path", err, filewritev1.ErrorReason_ETAG_MISMATCH, gen)
		}
		if d.generation(t, "f") != gen {
			t.Error("a refused stream moved the generation")
		}
		// Held: the first answer reports the file with its generation, a
		// synced write's ack the generation it left.
		s, err := c.WriteStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&filewritev1.WriteStreamRequest{Path: "f", IfGenerationMatch: gen64(gen),
			Writes: []*filewritev1.StreamWrite{{Id: 1, Data: []byte("S"), Sync: filewritev1.SyncMode_SYNC_MODE_DATA}}}); err != nil {
			t.Fatal(err)
		}
		s.CloseSend()
		var opened, acked int64
		for {
			resp, err := s.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range resp.GetFiles() {
				if f.GetIndex() == 0 {
					opened = f.GetGeneration()
				}
			}
			for _, a := range resp.GetAcks() {
				if a.GetStatus() != nil {
					t.Fatalf("ack %v", a)
				}
				acked = a.GetGeneration()
			}
		}
		if opened != gen || acked == gen || acked != d.generation(t, "f") {
			t.Errorf("the stream opened generation %d (want %d), its synced ack says %d, Stat %d", opened, gen, acked, d.generation(t, "f"))
		}
		// A declared file under a failed condition is reported, the
		// stream goes on.
		s, err = c.WriteStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&filewritev1.WriteStreamRequest{Path: "other", Files: []*filewritev1.StreamFile{
			{Index: 1, Path: "f", IfGenerationMatch: gen64(gen)}}}); err != nil { // gen is stale now
			t.Fatal(err)
		}
		s.CloseSend()
		var declared error
		for {
			resp, err := s.Recv()
			if err != nil {
				break
			}
			for _, f := range resp.GetFiles() {
				if f.GetIndex() == 1 {
					declared = grpcstatus.FromProto(f.GetStatus()).Err()
				}
			}
		}
		wantRefusal(t, "a declared file", declared, filewritev1.ErrorReason_ETAG_MISMATCH, d.generation(t, "f"))
	})
}

// TestRESTPreconditionsEveryVerb: If-Match, If-None-Match and
// If-Unmodified-Since hold on PUT, DELETE and every POST verb but
// :fsync: a failed one is 412 with nothing done, a held one answers the
// file's new ETag.
func TestRESTPreconditionsEveryVerb(t *testing.T) {
	d := startDaemon(t, withFreshValidators)
	ctx := testContext(t)
	jsonHdr := map[string]string{"Content-Type": "application/json"}
	verbs := []struct {
		name, method, path, body string
		hdr                      map[string]string
		gone                     bool
	}{
		{"PUT", "PUT", "/v1/files/f", "new", octetHeader, false},
		{"DELETE", "DELETE", "/v1/files/f", "", nil, true},
		{":write", "POST", "/v1/files/f:write", `{"data":"` + b64([]byte("new")) + `"}`, jsonHdr, false},
		{":append (JSON)", "POST", "/v1/files/f:append", `{"data":"` + b64([]byte("+")) + `"}`, jsonHdr, false},
		{":append (raw)", "POST", "/v1/files/f:append", "+", octetHeader, false},
		{":truncate", "POST", "/v1/files/f:truncate", `{"size":"2"}`, jsonHdr, false},
		{":fallocate", "POST", "/v1/files/f:fallocate", `{"mode":"FALLOCATE_MODE_ALLOCATE","length":"8192"}`, jsonHdr, false},
		{":rename", "POST", "/v1/files/f:rename", `{"newPath":"g"}`, jsonHdr, true},
	}
	setup := func(t *testing.T) (int64, string) {
		t.Helper()
		d.client.Delete(ctx, &filewritev1.DeleteRequest{Path: "g"})
		d.client.Delete(ctx, &filewritev1.DeleteRequest{Path: "f"})
		r, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "f", Data: []byte("content")})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetGeneration(), fmt.Sprintf(`"%d"`, r.GetGeneration())
	}
	with := func(h map[string]string, k, v string) map[string]string {
		m := map[string]string{k: v}
		for a, b := range h {
			m[a] = b
		}
		return m
	}
	past := time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)
	for _, v := range verbs {
		t.Run(v.name, func(t *testing.T) {
			for _, tc := range []struct {
				header, value string // value "" is the file's own tag
				reason        filewritev1.ErrorReason
			}{
				{"If-Match", `"1234567"`, filewritev1.ErrorReason_ETAG_MISMATCH},
				{"If-Match", `W/""`, filewritev1.ErrorReason_ETAG_MISMATCH}, // its own tag, weak: never strong
				{"If-None-Match", "*", filewritev1.ErrorReason_PRECONDITION_FAILED},
				{"If-None-Match", "", filewritev1.ErrorReason_ETAG_MISMATCH},
				{"If-Unmodified-Since", past, filewritev1.ErrorReason_PRECONDITION_FAILED},
			} {
				gen, etag := setup(t)
				value := tc.value
				switch value {
				case "":
					value = etag
				case `W/""`:
					value = "W/" + etag
				}
				r := d.rest(t, v.method, v.path, v.body, with(v.hdr, tc.header, value))
				if r.status != http.StatusPreconditionFailed {
					t.Errorf("%s: %s: %d %s, want 412", tc.header, value, r.status, r.body)
					continue
				}
				reason, md := restRefusal(t, r.body)
				if reason != tc.reason.String() || md[errorinfo.KeyGeneration] != strconv.FormatInt(gen, 10) {
					t.Errorf("%s: %s: %s %v, want %v with generation %d", tc.header, value, reason, md, tc.reason, gen)
				}
				if got := d.generation(t, "f"); got != gen || string(d.onDisk(t, "f")) != "content" {
					t.Errorf("%s: %s: the refused request changed the file (generation %d -> %d)", tc.header, value, gen, got)
				}
			}
			gen, etag := setup(t)
			res := testutil.DoHTTP(t, v.method, d.url+v.path, strings.NewReader(v.body), with(with(v.hdr, "If-Match", etag), "If-None-Match", `"1"`))
			if res.Status/100 != 2 {
				t.Fatalf("If-Match: its tag: %d %s", res.Status, res.Body)
			}
			tag := res.Header.Get("ETag")
			switch {
			case v.gone && d.generation(t, "f") != 0:
				t.Error("the file is still there")
			case v.name == ":rename":
				if tag != fmt.Sprintf(`"%d"`, d.generation(t, "g")) {
					t.Errorf("ETag %s after the rename, g's generation %d", tag, d.generation(t, "g"))
				}
			case !v.gone:
				if now := d.generation(t, "f"); now == gen || tag != fmt.Sprintf(`"%d"`, now) {
					t.Errorf("ETag %s; the generation was %d, is %d", tag, gen, now)
				}
			}
		})
	}
	t.Run(":fsync takes no conditions", func(t *testing.T) {
		setup(t)
		if r := d.rest(t, "POST", "/v1/files/f:fsync", `{}`, with(jsonHdr, "If-Match", `"1"`)); r.status != 200 {
			t.Errorf(":fsync with a stale If-Match: %d %s, want 200", r.status, r.body)
		}
	})
	t.Run("conditions in both the headers and the body", func(t *testing.T) {
		_, etag := setup(t)
		r := d.rest(t, "POST", "/v1/files/f:truncate", `{"size":"1","ifGenerationMatch":"5"}`, with(jsonHdr, "If-Match", etag))
		if reason, _ := restRefusal(t, r.body); r.status != 400 || reason != "REQUEST_MALFORMED" {
			t.Errorf("%d %s, want 400 REQUEST_MALFORMED", r.status, r.body)
		}
	})
	t.Run("JSON body conditions", func(t *testing.T) {
		gen, _ := setup(t)
		r := d.rest(t, "POST", "/v1/files/f:truncate", fmt.Sprintf(`{"size":"1","ifGenerationMatch":"%d"}`, gen+9), nil)
		if r.status != 412 {
			t.Errorf("ifGenerationMatch stale in the body: %d %s, want 412", r.status, r.body)
		}
	})
}

// TestPutPreconditionsReadNoBody: a PUT whose precondition fails is
// refused before the first byte of its body is read, so a client that
// waits for 100 Continue sends none of it (issue 36, item 4).
func TestPutPreconditionsReadNoBody(t *testing.T) {
	d := startDaemon(t, withFreshValidators)
	ctx := testContext(t)
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "exists", Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)
	client := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: time.Minute}}
	for _, tc := range []struct{ header, value, path string }{
		{"If-None-Match", "*", "exists"},
		{"If-Match", `"1"`, "exists"},
		{"If-Match", "*", "missing"},
		{"If-Unmodified-Since", past, "exists"},
	} {
		var read atomic.Int64
		const size = 60 << 20
		body := &bodyProbe{r: io.LimitReader(zeroReader{}, size), n: &read}
		req, err := http.NewRequestWithContext(ctx, "PUT", d.url+"/v1/files/"+tc.path, body)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = size
		req.Header.Set("Content-Type", gateway.MIMEOctetStream)
		req.Header.Set("Expect", "100-continue")
		req.Header.Set(tc.header, tc.value)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %s: %v", tc.header, tc.value, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 412 || read.Load() != 0 {
			t.Errorf("%s: %s on %s: %d after the client sent %d bytes of the body; want 412 and none", tc.header, tc.value, tc.path, resp.StatusCode, read.Load())
		}
	}
	if string(d.onDisk(t, "exists")) != "x" || d.generation(t, "missing") != 0 {
		t.Error("a refused PUT wrote")
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// bodyProbe counts what is read from r into n, and calls at, if
// set, once before the read that passes offset atOff.
type bodyProbe struct {
	r     io.Reader
	n     *atomic.Int64
	atOff int64
	at    func()
}

func (c *bodyProbe) Read(p []byte) (int, error) {
	if c.at != nil && c.n.Load()+int64(len(p)) > c.atOff {
		c.at()
		c.at = nil
	}
	m, err := c.r.Read(p)
	c.n.Add(int64(m))
	return m, err
}

// TestPutChainsGenerations: a conditional PUT of several pieces makes
// each piece conditional on the generation the one before left: a writer
// that lands between two pieces stops it with 412, naming what it wrote.
func TestPutChainsGenerations(t *testing.T) {
	d := startDaemon(t, withFreshValidators)
	ctx := testContext(t)
	w, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "big", Data: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	const piece = 8 << 20 // the gateway's putPieceBytes
	size := int64(2*piece + piece/2)
	var read atomic.Int64
	var other *filewritev1.WriteResponse
	body := &bodyProbe{r: io.LimitReader(zeroReader{}, size), n: &read, atOff: piece + piece/2, at: func() {
		// The client has sent more than the first piece (the transport
		// reads ahead of the daemon into the socket): wait until the
		// daemon has written it, then come between it and the next.
		for {
			st, serr := d.client.Stat(ctx, &filewritev1.StatRequest{Path: "big"})
			if serr != nil || st.GetSize() >= piece {
				break
			}
			time.Sleep(time.Millisecond)
		}
		other, err = d.client.Write(ctx, &filewritev1.WriteRequest{Path: "big", Offset: size + 10, Data: []byte("!")})
	}}
	req, _ := http.NewRequestWithContext(ctx, "PUT", d.url+"/v1/files/big", body)
	req.ContentLength = size
	req.Header.Set("Content-Type", gateway.MIMEOctetStream)
	req.Header.Set("If-Match", fmt.Sprintf(`"%d"`, w.GetGeneration()))
	resp, rerr := http.DefaultClient.Do(req)
	if rerr != nil {
		t.Fatal(rerr)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 412 {
		t.Fatalf("a PUT another writer came into: %d %s, want 412", resp.StatusCode, b)
	}
	reason, md := restRefusal(t, b)
	if reason != "ETAG_MISMATCH" || md["offset"] != "0" || md["bytes_written"] != strconv.Itoa(piece) || md[errorinfo.KeyGeneration] != strconv.FormatInt(other.GetGeneration(), 10) {
		t.Errorf("refusal %s %v: want ETAG_MISMATCH naming offset 0, %d bytes written, generation %d", reason, md, piece, other.GetGeneration())
	}
	// Without the other writer, the same PUT goes through, and its ETag
	// is the generation its last piece left.
	gen := d.generation(t, "big")
	res := testutil.DoHTTP(t, "PUT", d.url+"/v1/files/big", io.LimitReader(zeroReader{}, size), map[string]string{
		"Content-Type": gateway.MIMEOctetStream, "If-Match": fmt.Sprintf(`"%d"`, gen)})
	if res.Status != 200 || res.Header.Get("ETag") != fmt.Sprintf(`"%d"`, d.generation(t, "big")) {
		t.Errorf("an uncontended conditional PUT: %d, ETag %s, Stat %d", res.Status, res.Header.Get("ETag"), d.generation(t, "big"))
	}
}

// TestReadModifyWriteRace: 16 clients each make 200 read-modify-write
// increments of a counter, with If-Match over REST and with
// if_generation_match over gRPC: the count is the number of successes,
// and every failure is a failed precondition.
func TestReadModifyWriteRace(t *testing.T) {
	const clients, rounds = 16, 200
	d := startDaemon(t, nil)
	ctx := testContext(t)
	faces := map[string]func(path string) (ok bool, err error){
		"REST": func(path string) (bool, error) {
			r := testutil.DoHTTP(t, "GET", d.url+"/v1/files/"+path+"?alt=media", nil, nil)
			n, err := strconv.Atoi(string(r.Body))
			if r.Status != 200 || err != nil {
				return false, fmt.Errorf("GET: %d %q", r.Status, r.Body)
			}
			r = testutil.DoHTTP(t, "PUT", d.url+"/v1/files/"+path, strings.NewReader(fmt.Sprintf("%08d", n+1)),
				map[string]string{"Content-Type": gateway.MIMEOctetStream, "If-Match": r.Header.Get("ETag")})
			switch r.Status {
			case 200:
				return true, nil
			case 412:
				return false, nil
			}
			return false, fmt.Errorf("PUT: %d %s", r.Status, r.Body)
		},
		"gRPC": func(path string) (bool, error) {
			st, err := d.client.Stat(ctx, &filewritev1.StatRequest{Path: path})
			if err != nil {
				return false, err
			}
			rd, err := d.client.Read(ctx, &filewritev1.ReadRequest{Path: path, Length: 8})
			if err != nil {
				return false, err
			}
			n, err := strconv.Atoi(string(rd.GetData()))
			if err != nil {
				return false, err
			}
			_, err = d.client.Write(ctx, &filewritev1.WriteRequest{Path: path, Data: fmt.Appendf(nil, "%08d", n+1), IfGenerationMatch: gen64(st.GetGeneration())})
			if grpcstatus.Code(err) == codes.FailedPrecondition {
				return false, nil
			}
			return err == nil, err
		},
	}
	for name, rmw := range faces {
		t.Run(name, func(t *testing.T) {
			path := "counter-" + name
			if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: path, Data: []byte("00000000")}); err != nil {
				t.Fatal(err)
			}
			var wins, losses atomic.Int64
			var wg sync.WaitGroup
			for range clients {
				wg.Go(func() {
					for range rounds {
						ok, err := rmw(path)
						if err != nil {
							t.Error(err)
							return
						}
						if ok {
							wins.Add(1)
						} else {
							losses.Add(1)
						}
					}
				})
			}
			wg.Wait()
			got, _ := strconv.Atoi(string(d.onDisk(t, path)))
			t.Logf("%s: %d increments, %d refused", name, wins.Load(), losses.Load())
			if int64(got) != wins.Load() || wins.Load() == 0 {
				t.Errorf("the counter is %d after %d successful increments", got, wins.Load())
			}
		})
	}
}

// TestUploadChecksums: a raw PUT or append takes Content-Digest (crc32c,
// sha-256), x-goog-hash and Content-MD5; a mismatch is 400 CRC_MISMATCH
// and, for a body of one piece, writes nothing.
func TestUploadChecksums(t *testing.T) {
	d := startDaemon(t, nil)
	body := []byte("the bytes to check")
	crc := binary.BigEndian.AppendUint32(nil, crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)))
	sha := sha256.Sum256(body)
	sum5 := md5.Sum(body)
	bad := b64(make([]byte, 4))
	tests := []struct {
		name, header, value string
		want                int
		reason              string
	}{
		{"crc32c", "Content-Digest", "crc32c=:" + b64(crc) + ":", 201, ""},
		{"sha-256", "Content-Digest", "sha-256=:" + b64(sha[:]) + ":", 201, ""},
		{"both", "Content-Digest", "sha-256=:" + b64(sha[:]) + ":, crc32c=:" + b64(crc) + ":", 201, ""},
		{"x-goog-hash", "X-Goog-Hash", "crc32c=" + b64(crc), 201, ""},
		{"Content-MD5", "Content-MD5", b64(sum5[:]), 201, ""},
		{"crc32c wrong", "Content-Digest", "crc32c=:" + bad + ":", 400, "CRC_MISMATCH"},
		{"one of two wrong", "Content-Digest", "sha-256=:" + b64(sha[:]) + ":, crc32c=:" + bad + ":", 400, "CRC_MISMATCH"},
		{"sha-256 wrong", "Content-Digest", "sha-256=:" + b64(make([]byte, 32)) + ":", 400, "CRC_MISMATCH"},
		{"x-goog-hash wrong", "X-Goog-Hash", "crc32c=" + bad, 400, "CRC_MISMATCH"},
		{"Content-MD5 wrong", "Content-MD5", b64(make([]byte, 16)), 400, "CRC_MISMATCH"},
		{"unknown algorithm", "Content-Digest", "sha-512=:" + b64(make([]byte, 64)) + ":", 400, "REQUEST_MALFORMED"},
		{"not base64", "Content-Digest", "crc32c=:!!:", 400, "REQUEST_MALFORMED"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, route := range []string{"PUT", "append"} {
				path := fmt.Sprintf("sum%d-%s", i, route)
				method, url := "PUT", "/v1/files/"+path
				if route == "append" {
					method, url = "POST", url+":append"
				}
				r := d.rest(t, method, url, string(body), map[string]string{"Content-Type": gateway.MIMEOctetStream, tc.header: tc.value})
				want := tc.want
				if route == "append" && want == 201 {
					want = 200
				}
				if r.status != want {
					t.Fatalf("%s: %d %s, want %d", route, r.status, r.body, want)
				}
				if tc.reason == "" {
					if string(d.onDisk(t, path)) != string(body) {
						t.Errorf("%s: the file does not hold the body", route)
					}
					continue
				}
				if reason, _ := restRefusal(t, r.body); reason != tc.reason {
					t.Errorf("%s: reason %s, want %s", route, reason, tc.reason)
				}
				if d.generation(t, path) != 0 {
					t.Errorf("%s: a refused upload created its file", route)
				}
			}
		})
	}
	t.Run("a PUT of several pieces", func(t *testing.T) {
		const piece = 8 << 20
		big := testutil.AllBytes(2*piece + 100)
		r := d.rest(t, "PUT", "/v1/files/pieces", string(big), map[string]string{"Content-Type": gateway.MIMEOctetStream, "Content-Digest": "crc32c=:" + bad + ":"})
		if r.status != 400 {
			t.Fatalf("%d %s", r.status, r.body)
		}
		reason, md := restRefusal(t, r.body)
		if reason != "CRC_MISMATCH" || md["offset"] != "0" || md["bytes_written"] != strconv.Itoa(2*piece) {
			t.Errorf("%s %v: want CRC_MISMATCH naming offset 0 and %d bytes written", reason, md, 2*piece)
		}
		if got := d.onDisk(t, "pieces"); len(got) != 2*piece || string(got) != string(big[:2*piece]) {
			t.Errorf("on disk: %d bytes, want the first %d of the body", len(got), 2*piece)
		}
	})
}

// TestDigest: Digest over gRPC and GET :digest answer the checksum of a
// range or the whole file at one generation, and a download announces
// a whole file's as Repr-Digest once it was asked.
func TestDigest(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	content := testutil.AllBytes(3<<20 + 7)
	w, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "d.bin", Data: content})
	if err != nil {
		t.Fatal(err)
	}
	crcOf := func(b []byte) []byte {
		return binary.BigEndian.AppendUint32(nil, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
	}
	sha := sha256.Sum256(content[100:1100])
	for _, tc := range []struct {
		alg          string
		off, length  int64
		want         []byte
		wantLength   int64
		wantAlgoName string
	}{
		{"", 0, 0, crcOf(content), int64(len(content)), "crc32c"},
		{"crc32c", 5, 0, crcOf(content[5:]), int64(len(content) - 5), "crc32c"},
		{"sha-256", 100, 1000, sha[:], 1000, "sha-256"},
		{"crc32c", int64(len(content)) - 3, 100, crcOf(content[len(content)-3:]), 3, "crc32c"},
	} {
		r, err := d.client.Digest(ctx, &filewritev1.DigestRequest{Path: "d.bin", Offset: tc.off, Length: tc.length, Algorithm: tc.alg})
		if err != nil {
			t.Fatal(err)
		}
		if string(r.GetDigest()) != string(tc.want) || r.GetLength() != tc.wantLength || r.GetGeneration() != w.GetGeneration() || r.GetAlgorithm() != tc.wantAlgoName {
			t.Errorf("Digest(%q, %d, %d) = %v, want %x over %d bytes at generation %d", tc.alg, tc.off, tc.length, r, tc.want, tc.wantLength, w.GetGeneration())
		}
	}
	if _, err := d.client.Digest(ctx, &filewritev1.DigestRequest{Path: "d.bin", Algorithm: "md4"}); grpcstatus.Code(err) != codes.InvalidArgument {
		t.Errorf("Digest md4: %v, want INVALID_ARGUMENT", err)
	}
	if _, err := d.client.Digest(ctx, &filewritev1.DigestRequest{Path: "none"}); grpcstatus.Code(err) != codes.NotFound {
		t.Errorf("Digest of no file: %v, want NOT_FOUND", err)
	}
	r := testutil.DoHTTP(t, "GET", d.url+"/v1/files/d.bin:digest?algorithm=sha-256", nil, nil)
	whole := sha256.Sum256(content)
	if r.Status != 200 {
		t.Fatalf("GET :digest: %d %s", r.Status, r.Body)
	}
	if !strings.Contains(string(r.Body), b64(whole[:])) || r.Header.Get("ETag") != fmt.Sprintf(`"%d"`, w.GetGeneration()) {
		t.Errorf("GET :digest: %s, ETag %s; want the sha-256 %s and the file's ETag", r.Body, r.Header.Get("ETag"), b64(whole[:]))
	}
	dl := testutil.DoHTTP(t, "GET", d.url+"/v1/files/d.bin?alt=media", nil, nil)
	want := "crc32c=:" + b64(crcOf(content)) + ":, sha-256=:" + b64(whole[:]) + ":"
	if got := dl.Header.Get("Repr-Digest"); got != want {
		t.Errorf("Repr-Digest %q, want %q", got, want)
	}
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "d.bin", Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if got := testutil.DoHTTP(t, "HEAD", d.url+"/v1/files/d.bin?alt=media", nil, nil).Header.Get("Repr-Digest"); got != "" {
		t.Errorf("Repr-Digest after a write: %q, want none", got)
	}
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// TestGenerationThroughDoors: the doors call what the gRPC handlers
// call, so what they write moves the generation too: an NBD write, a
// WebDAV PUT and a finished tus upload each give the file a new ETag,
// the one REST and Stat answer, and WebDAV's getetag is REST's ETag.
func TestGenerationThroughDoors(t *testing.T) {
	sock := nbdSocket(t)
	d := startDaemon(t, func(c *Config) { c.NBDAddr = "unix:" + sock })
	ctx := testContext(t)
	restETag := func(path string) string {
		t.Helper()
		r := testutil.DoHTTP(t, "HEAD", d.url+"/v1/files/"+path+"?alt=media", nil, nil)
		if r.Status != 200 {
			t.Fatalf("HEAD %s: %d", path, r.Status)
		}
		if want := fmt.Sprintf(`"%d"`, d.generation(t, path)); r.Header.Get("ETag") != want {
			t.Errorf("HEAD %s: ETag %s, Stat's generation says %s", path, r.Header.Get("ETag"), want)
		}
		return r.Header.Get("ETag")
	}
	if _, err := d.client.Truncate(ctx, &filewritev1.TruncateRequest{Path: "disk.img", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}

	t.Run("NBD write", func(t *testing.T) {
		before := restETag("disk.img")
		c := dialNBD(t, sock, "disk.img")
		c.send(t, nbdWrite, 1, 4096, 4096, bytes4k(0xab))
		if _, errno := c.reply(t); errno != 0 {
			t.Fatalf("NBD_CMD_WRITE: errno %d", errno)
		}
		after := restETag("disk.img")
		if after == before {
			t.Errorf("ETag %s before and after an NBD write", after)
		}
		// A conditional Write on the tag REST gave before the NBD write
		// is refused: the tag is the generation every face moves.
		gen, _ := strconv.ParseInt(strings.Trim(before, `"`), 10, 64)
		_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "disk.img", Data: []byte("x"), IfGenerationMatch: &gen})
		wantRefusal(t, "a Write on the tag from before the NBD write", err, filewritev1.ErrorReason_ETAG_MISMATCH, d.generation(t, "disk.img"))
	})

	t.Run("WebDAV PUT", func(t *testing.T) {
		if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "dav.txt", Data: []byte("one")}); err != nil {
			t.Fatal(err)
		}
		before := restETag("dav.txt")
		r := testutil.DoHTTP(t, "PUT", d.url+"/dav/dav.txt", strings.NewReader("two"), nil)
		if r.Status/100 != 2 {
			t.Fatalf("WebDAV PUT: %d %s", r.Status, r.Body)
		}
		after := restETag("dav.txt")
		if after == before {
			t.Errorf("ETag %s before and after a WebDAV PUT", after)
		}
		if got := r.Header.Get("ETag"); got != "" && got != after {
			t.Errorf("the WebDAV PUT answered ETag %s, REST says %s", got, after)
		}
		if got := testutil.DoHTTP(t, "GET", d.url+"/dav/dav.txt", nil, nil).Header.Get("ETag"); got != after {
			t.Errorf("WebDAV GET's ETag %s, REST's %s", got, after)
		}
		pf := testutil.DoHTTP(t, "PROPFIND", d.url+"/dav/dav.txt", strings.NewReader(
			`<?xml version="1.0"?><D:propfind xmlns:D="DAV:"><D:prop><D:getetag/></D:prop></D:propfind>`),
			map[string]string{"Depth": "0", "Content-Type": "application/xml"})
		if pf.Status != 207 || !strings.Contains(string(pf.Body), "<D:getetag>"+after+"</D:getetag>") {
			t.Errorf("PROPFIND getetag: %d %s, want REST's ETag %s", pf.Status, pf.Body, after)
		}
	})

	t.Run("tus upload", func(t *testing.T) {
		if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "up.bin", Data: []byte("old")}); err != nil {
			t.Fatal(err)
		}
		before := restETag("up.bin")
		hdr := map[string]string{"Tus-Resumable": "1.0.0", "Upload-Length": "5", "Upload-Metadata": tusMeta("path", "up.bin")}
		r := testutil.DoHTTP(t, "POST", d.url+"/v1/uploads/", nil, hdr)
		if r.Status != 201 {
			t.Fatalf("tus POST: %d %s", r.Status, r.Body)
		}
		r = testutil.DoHTTP(t, "PATCH", r.Header.Get("Location"), strings.NewReader("hello"),
			map[string]string{"Tus-Resumable": "1.0.0", "Upload-Offset": "0", "Content-Type": "application/offset+octet-stream"})
		if r.Status != 204 {
			t.Fatalf("tus PATCH: %d %s", r.Status, r.Body)
		}
		if string(d.onDisk(t, "up.bin")) != "hello" {
			t.Fatal("the upload did not land at its path")
		}
		if after := restETag("up.bin"); after == before {
			t.Errorf("ETag %s before and after a tus upload", after)
		}
	})
}

func bytes4k(b byte) []byte { return bytes.Repeat([]byte{b}, 4096) }
