package origin

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/service/internal/status"
)

// What a web page can make a browser send. Without tokens the daemon
// cannot tell its user's curl from a page that user has open: the page can
// POST cross-site without asking first (a "simple" request: form or
// text/plain body, or none), and through DNS rebinding it can even read,
// under a host name of its own that resolves to loopback. BrowserGuard
// refuses both: see docs/security.md. With tokens it is not needed, as a
// browser attaches no bearer token on its own; then the JSON rule of POST
// routes (checkContentType) is all that applies.
type BrowserGuard struct {
	// origins are the Origin values let through; "*" lets any through.
	// Empty: a request with an Origin is refused, as no page is ours.
	origins map[string]bool
	// hosts are the host names (lower case, without port) a request may
	// name besides IP literals, "localhost" and the listen address's own;
	// "*" lets any through.
	hosts map[string]bool
}

// NewBrowserGuard is the guard of a daemon listening on listenAddr that lets
// the given origins and host names through.
func NewBrowserGuard(listenAddr string, origins, hosts []string) (*BrowserGuard, error) {
	g := &BrowserGuard{origins: map[string]bool{}, hosts: map[string]bool{"localhost": true}}
	for _, o := range origins {
		if err := checkOrigin(o); err != nil {
			return nil, err
		}
		g.origins[strings.ToLower(o)] = true
	}
	for _, h := range hosts {
		if h == "" || strings.ContainsAny(h, "/:@ ") {
			return nil, fmt.Errorf("--http-allowed-hosts %q: want a host name without port, or *", h)
		}
		g.hosts[strings.ToLower(h)] = true
	}
	if host, _, err := net.SplitHostPort(listenAddr); err == nil && host != "" {
		g.hosts[strings.ToLower(host)] = true
	}
	return g, nil
}

// checkOrigin accepts "*" or an origin as browsers send it:
// scheme://host[:port], nothing after.
func checkOrigin(o string) error {
	if o == "*" {
		return nil
	}
	u, err := url.Parse(o)
	if err != nil || u.Scheme == "" || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return fmt.Errorf("--http-allowed-origins %q: want scheme://host[:port] as a browser sends it, or *", o)
	}
	return nil
}

// Check returns the 403 to answer r with, or nil.
func (g *BrowserGuard) Check(r *http.Request) error {
	if o := r.Header.Get("Origin"); o != "" && !g.origins["*"] && !g.origins[strings.ToLower(strings.TrimSuffix(o, "/"))] {
		return status.Refusal(filewritev1.ErrorReason_ORIGIN_NOT_ALLOWED, nil,
			"Origin %q is not allowed: a web page may not call this daemon unless --http-allowed-origins names its origin", o)
	}
	if !g.hostAllowed(r.Host) {
		return status.Refusal(filewritev1.ErrorReason_HOST_NOT_ALLOWED, nil,
			"Host %q is not allowed: name the daemon by IP address, localhost or its listen address, or list the name in --http-allowed-hosts", r.Host)
	}
	return nil
}

// hostAllowed: an IP literal cannot be a rebinding (the page would have to
// come from that very address and port), nor can an empty Host (HTTP/1.0;
// every browser sends one).
func (g *BrowserGuard) hostAllowed(host string) bool {
	if host == "" || g.hosts["*"] {
		return true
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSuffix(host, "]"), "["), ".")
	if net.ParseIP(host) != nil {
		return true
	}
	return g.hosts[strings.ToLower(host)]
}
