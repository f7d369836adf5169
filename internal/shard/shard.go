// Package shard routes gRPC calls over several filewrite daemons by a hash
// of the file path, with grpc-go's ring_hash balancer, and makes sure a call
// is never rerouted from a path's owner to another daemon.
//
// grpc-go's ring_hash (gRFC A42, A61, A76) hashes the filewrite-path header
// (Header) of a call onto a ring of the resolver's endpoints. When the
// owner's connection is in TRANSIENT_FAILURE, the policy walks on to the
// next endpoint of the ring: right for caches, wrong for files, because a
// write would then create the file anew on another daemon and split it in
// two. This package registers "filewrite_ring_hash", a thin parent of
// ring_hash_experimental that takes the same config, lets ring_hash pick,
// and fails the call with UNAVAILABLE when the pick is not the path's owner
// (the first endpoint on the ring for the call's hash). The owner is
// computed with the ring construction of grpc-go's ring_hash (ring.go,
// grpc v1.85), for endpoints of equal weight; were the two ever to
// disagree, every call whose owner is up would fail, loudly, rather than
// land elsewhere.
package shard

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	xxhash "github.com/cespare/xxhash/v2"
	"google.golang.org/grpc/balancer"
	_ "google.golang.org/grpc/balancer/ringhash" // ring_hash_experimental, the policy this one wraps
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"
	"google.golang.org/grpc/status"
)

// Header is the metadata key that carries a call's file path, which the
// ring hashes. Every call and stream open on a file must set it.
const Header = "filewrite-path"

// PolicyName is the balancer this package registers.
const PolicyName = "filewrite_ring_hash"

// ServiceConfig routes each call by its Header over every address the
// resolver gives, never rerouting a path away from its owner.
const ServiceConfig = `{"loadBalancingConfig":[{"` + PolicyName + `":{"requestHashHeader":"` + Header + `"}}]}`

// RingHashServiceConfig is the same routing with grpc-go's ring_hash
// alone, as gRPC clients in other languages configure it: it reroutes a
// path whose owner is down (see the package comment).
const RingHashServiceConfig = `{"loadBalancingConfig":[{"ring_hash_experimental":{"requestHashHeader":"` + Header + `"}}]}`

const innerName = "ring_hash_experimental"

func init() { balancer.Register(builder{}) }

type builder struct{}

func (builder) Name() string { return PolicyName }

func (builder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	b := &pinned{ClientConn: cc, addrOf: map[balancer.SubConn]string{}}
	b.inner = balancer.Get(innerName).Build(b, opts)
	return b
}

// lbConfig is ring_hash's config, which this policy passes on whole, and
// the ring sizes it needs to compute owners.
type lbConfig struct {
	serviceconfig.LoadBalancingConfig
	inner   serviceconfig.LoadBalancingConfig
	minRing uint64
	maxRing uint64
	header  string
}

func (builder) ParseConfig(js json.RawMessage) (serviceconfig.LoadBalancingConfig, error) {
	inner, err := balancer.Get(innerName).(balancer.ConfigParser).ParseConfig(js)
	if err != nil {
		return nil, err
	}
	var raw struct {
		MinRingSize       uint64 `json:"minRingSize"`
		MaxRingSize       uint64 `json:"maxRingSize"`
		RequestHashHeader string `json:"requestHashHeader"`
	}
	if err := json.Unmarshal(js, &raw); err != nil {
		return nil, err
	}
	if raw.RequestHashHeader == "" {
		return nil, fmt.Errorf("%s: requestHashHeader is required (%q)", PolicyName, Header)
	}
	c := &lbConfig{inner: inner, minRing: cmpOr(raw.MinRingSize, defaultMinRing), maxRing: cmpOr(raw.MaxRingSize, defaultMaxRing), header: strings.ToLower(raw.RequestHashHeader)}
	c.minRing, c.maxRing = min(c.minRing, ringCap), min(c.maxRing, ringCap)
	return c, nil
}

func cmpOr(v, def uint64) uint64 {
	if v == 0 {
		return def
	}
	return v
}

// pinned is the balancer: ring_hash underneath, with its pickers wrapped.
// It is the ClientConn of the ring_hash it wraps, to learn each SubConn's
// address and to wrap the pickers ring_hash sends up.
type pinned struct {
	balancer.ClientConn
	inner balancer.Balancer

	mu sync.Mutex
	// addrOf is each SubConn's address, which is its endpoint's hash key.
	// Guarded by mu.
	addrOf map[balancer.SubConn]string
	// ring and header are the current ring of owners and the header it
	// hashes. Guarded by mu.
	ring   *ring
	header string
}

func (b *pinned) NewSubConn(addrs []resolver.Address, opts balancer.NewSubConnOptions) (balancer.SubConn, error) {
	sc, err := b.ClientConn.NewSubConn(addrs, opts)
	if err == nil && len(addrs) > 0 {
		b.mu.Lock()
		b.addrOf[sc] = addrs[0].Addr
		b.mu.Unlock()
	}
	return sc, err
}

func (b *pinned) UpdateState(s balancer.State) {
	b.mu.Lock()
	s.Picker = &picker{inner: s.Picker, b: b, ring: b.ring, header: b.header}
	b.mu.Unlock()
	b.ClientConn.UpdateState(s)
}

func (b *pinned) UpdateClientConnState(s balancer.ClientConnState) error {
	cfg, ok := s.BalancerConfig.(*lbConfig)
	if !ok {
		return fmt.Errorf("%s: config of type %T", PolicyName, s.BalancerConfig)
	}
	var keys []string
	for _, ep := range s.ResolverState.Endpoints {
		if len(ep.Addresses) > 0 {
			keys = append(keys, ep.Addresses[0].Addr)
		}
	}
	if len(keys) == 0 {
		for _, a := range s.ResolverState.Addresses {
			keys = append(keys, a.Addr)
		}
	}
	b.mu.Lock()
	b.ring, b.header = newRing(keys, cfg.minRing, cfg.maxRing), cfg.header
	b.mu.Unlock()
	s.BalancerConfig = cfg.inner
	return b.inner.UpdateClientConnState(s)
}

func (b *pinned) ResolverError(err error) { b.inner.ResolverError(err) }

func (b *pinned) UpdateSubConnState(sc balancer.SubConn, s balancer.SubConnState) {
	b.inner.UpdateSubConnState(sc, s)
}

func (b *pinned) Close() { b.inner.Close() }

func (b *pinned) ExitIdle() {
	if e, ok := b.inner.(interface{ ExitIdle() }); ok {
		e.ExitIdle()
	}
}

func (b *pinned) owner(sc balancer.SubConn) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.addrOf[sc]
}

// picker lets ring_hash pick, and refuses a pick that is not the path's
// owner: ring_hash walked past the owner because it is down.
type picker struct {
	inner  balancer.Picker
	b      *pinned
	ring   *ring
	header string
}

func (p *picker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	res, err := p.inner.Pick(info)
	if err != nil || p.ring == nil || res.SubConn == nil {
		return res, err
	}
	md, _ := metadata.FromOutgoingContext(info.Ctx)
	vals := md.Get(p.header)
	if len(vals) == 0 {
		// No path: a call that is not about one file (List, health);
		// ring_hash spreads it at random, any daemon will do.
		return res, nil
	}
	path := strings.Join(vals, ",")
	want := p.ring.pick(xxhash.Sum64String(path))
	if got := p.b.owner(res.SubConn); got != want {
		if res.Done != nil {
			res.Done(balancer.DoneInfo{Err: errOwnerDown})
		}
		return balancer.PickResult{}, status.Errorf(codes.Unavailable,
			"%s is owned by the daemon at %s, which is unavailable; it is not rerouted to %s", path, want, got)
	}
	return res, nil
}

var errOwnerDown = status.Error(codes.Unavailable, "the path's owner is unavailable")

// ring is grpc-go's ring_hash ring (balancer/ringhash/ring.go) for
// endpoints of equal weight, reduced to what picks an owner: the sorted
// hashes of each endpoint's entries.
type ring struct {
	hashes []uint64
	keys   []string
}

func newRing(keys []string, minRingSize, maxRingSize uint64) *ring {
	if len(keys) == 0 {
		return nil
	}
	// ring_hash keeps its endpoints in a resolver.EndpointMap, so an
	// address the resolver gives twice is one endpoint of the ring: count
	// it once here too, or every owner would be computed on another ring.
	keys = slices.Compact(slices.Sorted(slices.Values(keys)))
	weight := 1 / float64(len(keys)) // each endpoint's normalized weight
	scale := math.Min(math.Ceil(weight*float64(minRingSize))/weight, float64(maxRingSize))
	type entry struct {
		hash uint64
		key  string
	}
	var entries []entry
	var current, target float64
	for _, k := range keys {
		target += scale * weight
		for idx := 0; current < target; idx++ {
			entries = append(entries, entry{xxhash.Sum64String(k + "_" + strconv.Itoa(idx)), k})
			current++
		}
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].hash < entries[j].hash })
	r := &ring{}
	for _, e := range entries {
		r.hashes = append(r.hashes, e.hash)
		r.keys = append(r.keys, e.key)
	}
	return r
}

// pick is the owner of hash h: the first entry at or after h, wrapping.
func (r *ring) pick(h uint64) string {
	i := sort.Search(len(r.hashes), func(i int) bool { return r.hashes[i] >= h })
	if i == len(r.hashes) {
		i = 0
	}
	return r.keys[i]
}

// Owner is the address, of addrs, of the daemon that owns path: the one
// ServiceConfig's ring (at its default sizes) sends a call on path to.
// A client that puts several files on one WriteStream groups them by
// Owner, since a router places the stream once, by the routing key of
// its first file.
func Owner(addrs []string, path string) string {
	return NewOwners(addrs).Owner(path)
}

// ring_hash's default ring sizes, and its cap (GRPC_RING_HASH_CAP, 4096
// unless set; this package assumes it is not).
const (
	defaultMinRing = 1024
	defaultMaxRing = 4096
	ringCap        = 4096
)

// Owners answers Owner for one membership, its ring built once: a client
// that asks for every file it opens keeps one.
type Owners struct {
	r *ring // nil: no address
}

// NewOwners builds the ring of addrs at ServiceConfig's default sizes.
func NewOwners(addrs []string) *Owners {
	return &Owners{r: newRing(addrs, defaultMinRing, defaultMaxRing)}
}

// Owner is Owner(addrs, path) for o's addrs.
func (o *Owners) Owner(path string) string {
	if o.r == nil {
		return ""
	}
	return o.r.pick(xxhash.Sum64String(RoutingKey(path)))
}
