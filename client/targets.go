package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/filewrite/filewrite/internal/shard"
)

// WithTargets makes Dial connect to every daemon in addrs ("host:port")
// and send each call and stream to the daemon that owns its path, by
// grpc-go's ring hash of PathHeader (see docs/cluster.md). Dial's own
// target must then be "". A daemon that is down makes only its own paths
// fail, with UNAVAILABLE: they are never sent to
// another daemon, which would split a file in two. Every client of a set of
// daemons must be given the same addresses (the same membership), in any
// order, each spelled the same way: Dial refuses an address given twice, or
// two that reach one daemon (localhost:P beside 127.0.0.1:P), either of
// which would give that daemon two places on the ring. With one address,
// nothing changes: Dial connects to it alone.
func WithTargets(addrs ...string) Option {
	return func(o *options) { o.targets = append([]string(nil), addrs...) }
}

// WithRingHash routes by path, as WithTargets does, over every address
// Dial's target resolves to: a DNS name with one record per daemon
// ("dns:///filewrite.internal:50051"). Use it only for such a name: a name
// whose addresses are one daemon's (localhost's IPv4 and IPv6) would be
// taken as several daemons.
func WithRingHash() Option { return func(o *options) { o.ringHash = true } }

// ErrTargets is returned (wrapped, naming the addresses) by Dial when
// WithTargets names a daemon twice, by the same address or by two that
// reach it (localhost:P beside 127.0.0.1:P), or gives an address that is
// not host:port.
var ErrTargets = shard.ErrTargets

// targetLookupTimeout bounds the name lookups with which Dial checks that
// WithTargets names each daemon once.
const targetLookupTimeout = 5 * time.Second

// ringSchemes numbers the manual resolvers of WithTargets, one per Dial.
var ringSchemes atomic.Uint64

// routedTarget is the target, the dial options and the service config
// loadBalancingConfig (JSON) that route by path for o, or target
// unchanged, nothing and "" when o does not route.
func routedTarget(target string, o options) (string, []grpc.DialOption, string, error) {
	switch {
	case len(o.targets) > 0 && target != "":
		return "", nil, "", fmt.Errorf("filewrite client: Dial(%q) with WithTargets: give the daemons to WithTargets only, and \"\" to Dial", target)
	case len(o.targets) == 1:
		return o.targets[0], nil, "", nil
	case len(o.targets) > 1:
		ctx, cancel := context.WithTimeout(context.Background(), targetLookupTimeout)
		defer cancel()
		if err := shard.CheckTargets(ctx, o.targets, net.DefaultResolver.LookupHost); err != nil {
			return "", nil, "", fmt.Errorf("filewrite client: WithTargets: %w", err)
		}
		eps := make([]resolver.Endpoint, len(o.targets))
		for i, a := range o.targets {
			if a == "" {
				return "", nil, "", errors.New("filewrite client: WithTargets: an empty address")
			}
			eps[i] = resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}}
		}
		r := manual.NewBuilderWithScheme(fmt.Sprintf("filewrite-targets-%d", ringSchemes.Add(1)))
		r.InitialState(resolver.State{Endpoints: eps})
		return r.Scheme() + ":///targets", []grpc.DialOption{grpc.WithResolvers(r)}, shard.ServiceConfig, nil
	case o.ringHash:
		return target, nil, shard.ServiceConfig, nil
	}
	return target, nil, "", nil
}
