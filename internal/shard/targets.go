package shard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
)

// ErrTargets is returned (wrapped, naming the addresses) by CheckTargets
// when a list of daemons is not one address per daemon: an empty or
// malformed address, one given twice, or two that reach the same daemon.
var ErrTargets = errors.New("each daemon must be given once, as host:port")

// CheckTargets refuses a list of daemon addresses on which owners would
// not be what every router computes. The ring is built from the addresses
// as given, so every client of a cluster must give the same strings:
// spelling one daemon twice (the same string twice, or localhost:P beside
// 127.0.0.1:P) would give it two places on the ring, route its paths to it
// under two owners, and put files where other clients do not look.
//
// lookup resolves a host name to its addresses (net.Resolver.LookupHost);
// an address whose host does not resolve now is compared by its spelling
// alone, so that a daemon whose name is not yet in DNS does not stop a
// client from starting.
func CheckTargets(ctx context.Context, addrs []string, lookup func(ctx context.Context, host string) ([]string, error)) error {
	seen := map[string]string{} // canonical ip:port -> the address that named it
	given := map[string]bool{}
	for _, a := range addrs {
		if given[a] {
			return fmt.Errorf("%w: %q is given twice", ErrTargets, a)
		}
		given[a] = true
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" || port == "" {
			return fmt.Errorf("%w: %q is not host:port", ErrTargets, a)
		}
		ips := []string{host}
		if net.ParseIP(host) == nil {
			if resolved, err := lookup(ctx, host); err == nil {
				ips = resolved
			}
		}
		for _, ip := range ips {
			if p := net.ParseIP(strings.TrimSuffix(strings.TrimPrefix(ip, "["), "]")); p != nil {
				ip = p.String() // one spelling per address: ::ffff:127.0.0.1 is 127.0.0.1
			}
			key := net.JoinHostPort(ip, port)
			if other, ok := seen[key]; ok && other != a {
				return fmt.Errorf("%w: %q and %q both reach %s: give each daemon once, spelled the same way by every client", ErrTargets, other, a, key)
			}
			seen[key] = a
		}
	}
	return nil
}
