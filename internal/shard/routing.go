package shard

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// The routing key. Every router of a cluster must hash the same string for
// the same file, and the string must travel in an HTTP/2 header, which
// takes printable ASCII only. So a path is routed by its percent-encoding
// (RoutingKey): every byte but the unreserved characters of RFC 3986
// (A-Z a-z 0-9 - . _ ~) and '/' is written %XX. The Go client sends it;
// HAProxy forwards the URL's own encoding of the path and hashes it
// decoded (deploy/haproxy.cfg); the daemon decodes whatever the header
// holds and refuses a call whose header names another file (CheckHeader),
// so a router that disagrees with the daemon about a path fails loudly
// instead of placing the file on another daemon.

// RoutingKey is the value of Header for a call on path.
func RoutingKey(path string) string {
	var b strings.Builder
	for i := 0; i < len(path); i++ {
		c := path[i]
		if unreserved(c) || c == '/' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

// ErrHeaderMismatch is returned (wrapped, naming both paths) by CheckHeader
// when a call's Header names another path than its request: the router
// that sent it there hashed another file.
var ErrHeaderMismatch = errors.New("the routing header names another path than the request")

// CheckHeader checks that values, a call's Header values, route the file
// path: their one value is any percent-encoding of path (RoutingKey's, or
// a URL's as HAProxy forwards it). It returns ErrHeaderMismatch otherwise,
// and nil when values is empty: a call without the header was not routed
// by path.
func CheckHeader(values []string, path string) error {
	if len(values) == 0 {
		return nil
	}
	if len(values) > 1 {
		return fmt.Errorf("%w: %d %s values, want one", ErrHeaderMismatch, len(values), Header)
	}
	decoded, err := url.PathUnescape(values[0])
	if err != nil {
		return fmt.Errorf("%w: %s %q is not percent-encoded: %v", ErrHeaderMismatch, Header, values[0], err)
	}
	if decoded != path {
		return fmt.Errorf("%w: %s names %q, the request %q", ErrHeaderMismatch, Header, decoded, path)
	}
	return nil
}
