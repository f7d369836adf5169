package deploy

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// routedNames are file names that routers are tempted to read otherwise
// than the gateway: reserved and encoded characters, names that end in a
// verb, names not in ASCII.
var routedNames = []string{
	"plain/a.bin",
	"sp ace/b c",
	"pct%41/x%2Fy",
	"colon:in/the:name",
	"plus+sign",
	"ünïcode/ファイル",
	"q:write",
	"p5:read",
	"d7:digest",
	"tilde~/dot.",
	"semi;colon,comma",
	"hash#tag",
	"quest?ion&amp=1",
}

// endsInVerb reports whether name's last segment ends in one of the
// gateway's verbs, which REST then reads as that verb's route.
func endsInVerb(name string) bool {
	for _, v := range []string{"write", "append", "fsync", "truncate", "fallocate", "rename", "read", "extents", "digest"} {
		if strings.HasSuffix(name, ":"+v) {
			return true
		}
	}
	return false
}

// escapePath percent-encodes each segment of a file path for a URL.
func escapePath(name string) string {
	segs := strings.Split(name, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return strings.Join(segs, "/")
}

// TestHAProxyOneCanonicalPath: through deploy/haproxy.cfg, in front of
// daemons that refuse calls without the routing header, every name is one
// file on one daemon whichever way it is reached: a raw PUT, a JSON
// :write, a REST :read, and gRPC through the proxy with the client's
// routing key. A name that ends in a verb ("q:write") is reached over REST
// as "q:write:write" (its raw PUT would name the verb route: 405). A
// router that read a name otherwise than the gateway would put its parts
// on two daemons, or be refused.
func TestHAProxyOneCanonicalPath(t *testing.T) {
	ds := startDaemons(t, 3, "--require-path-header")
	restAddr, grpcAddr := startHAProxy(t, ds)
	base := "http://" + restAddr
	fc := routedClient(t, grpcAddr)
	hc := &http.Client{}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	for i, name := range routedNames {
		want := content(i, 2*halfSize)
		u := base + "/v1/files/" + escapePath(name)
		type step struct {
			method, url, ctype string
			body               []byte
			code               int
		}
		first := step{"PUT", u + "?offset=0", "application/octet-stream", want[:halfSize], http.StatusCreated}
		if endsInVerb(name) {
			first = step{"POST", u + ":write", "application/json", fmt.Appendf(nil, `{"offset":"0","data":%q}`, base64.StdEncoding.EncodeToString(want[:halfSize])), http.StatusOK}
		}
		steps := []step{
			first,
			{"POST", u + ":write", "application/json", fmt.Appendf(nil, `{"offset":"%d","data":%q}`, halfSize, base64.StdEncoding.EncodeToString(want[halfSize:])), http.StatusOK},
			{"GET", fmt.Sprintf("%s:read?offset=0&length=%d", u, 2*halfSize), "", nil, http.StatusOK},
			{"GET", u + ":digest", "", nil, http.StatusOK},
		}
		for _, s := range steps {
			code, body, err := restCall(hc, s.method, s.url, s.ctype, s.body)
			if err != nil || code != s.code {
				t.Fatalf("%q: %s %s: %d %s %v, want %d", name, s.method, s.url, code, body, err, s.code)
			}
		}
		r, err := fc.Read(ctx, &filewritev1.ReadRequest{Path: name, Length: 2 * halfSize})
		if err != nil {
			t.Fatalf("%q: gRPC Read through the proxy: %v", name, err)
		}
		if !bytes.Equal(r.GetData(), want) {
			t.Errorf("%q: gRPC Read through the proxy: %d bytes, not the %d written over REST", name, len(r.GetData()), len(want))
		}
		if got := owners(ds, name); len(got) != 1 {
			t.Errorf("%q is on daemons %v, want exactly one", name, got)
		}
	}

	// An encoded colon: the gateway reads "p6%3Awrite" as the file "p6"
	// and the verb write, and so must the proxy.
	code, body, err := restCall(hc, "POST", base+"/v1/files/p6%3Awrite", "application/json", []byte(`{"data":"eA=="}`))
	if err != nil || code != http.StatusOK {
		t.Fatalf("POST p6%%3Awrite: %d %s %v", code, body, err)
	}
	if _, err := fc.Stat(ctx, &filewritev1.StatRequest{Path: "p6"}); err != nil {
		t.Errorf("gRPC Stat of p6 through the proxy, after POST p6%%3Awrite: %v", err)
	}
	if got := owners(ds, "p6"); len(got) != 1 {
		t.Errorf("p6 is on daemons %v, want exactly one", got)
	}
}
