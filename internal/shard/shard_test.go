package shard

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	xxhash "github.com/cespare/xxhash/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
)

// routedPaths are the paths whose owners the tests compare: short and
// long, nested, with the characters that URLs and HAProxy treat specially
// (':', '%', ' ', '?'). The path is hashed as the header carries it,
// byte for byte.
var routedPaths = func() []string {
	paths := []string{"a", "b", "x:write", "p5:write", "q%3Awrite", "dir/sub/file.bin", "with space", "what?", strings.Repeat("long/", 200) + "end"}
	for i := range 40 {
		paths = append(paths, fmt.Sprintf("ckpt/rank-%03d.bin", i))
	}
	return paths
}()

// startServers starts n gRPC servers on loopback, each serving health, and
// returns their addresses and the servers, which stop when the test ends.
func startServers(t *testing.T, n int) ([]string, []*grpc.Server) {
	t.Helper()
	var addrs []string
	var srvs []*grpc.Server
	for range n {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer()
		healthpb.RegisterHealthServer(srv, health.NewServer())
		go srv.Serve(lis)
		t.Cleanup(srv.Stop)
		addrs, srvs = append(addrs, lis.Addr().String()), append(srvs, srv)
	}
	return addrs, srvs
}

// dialRing dials endpoints (one per address, in the order given, repeats
// kept) through a manual resolver with serviceConfig.
func dialRing(t *testing.T, endpoints []string, serviceConfig string) *grpc.ClientConn {
	t.Helper()
	var eps []resolver.Endpoint
	for _, a := range endpoints {
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}})
	}
	r := manual.NewBuilderWithScheme("shardtest")
	r.InitialState(resolver.State{Endpoints: eps})
	conn, err := grpc.NewClient(r.Scheme()+":///servers", grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultServiceConfig(serviceConfig))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// servedBy makes a health Check routed by path and returns the address of
// the server that answered it.
func servedBy(t *testing.T, ctx context.Context, conn *grpc.ClientConn, path string) string {
	t.Helper()
	var p peer.Peer
	ctx = metadata.AppendToOutgoingContext(ctx, Header, path)
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p), grpc.WaitForReady(true)); err != nil {
		t.Fatalf("Check routed by %q: %v", path, err)
	}
	return p.Addr.String()
}

// TestOwnerMatchesGRPCRingHash runs grpc-go's own ring_hash over real
// loopback servers and checks that, for every path and every set of
// endpoints, the server it sends a call to is the owner this package
// computes, and that filewrite_ring_hash serves every call where ring_hash
// does. A grpc upgrade that changes the ring fails here, not in a deploy
// test. The endpoint lists are given shuffled and with repeats: the ring
// depends on neither.
func TestOwnerMatchesGRPCRingHash(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	servers, _ := startServers(t, 5)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tt := range []struct {
		name      string
		endpoints []string
	}{
		{"one", servers[:1]},
		{"two", servers[:2]},
		{"three", servers[:3]},
		{"five, shuffled", func() []string {
			s := slices.Clone(servers)
			rng.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
			return s
		}()},
		{"three, one given twice", []string{servers[0], servers[1], servers[2], servers[1]}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ring := newRing(tt.endpoints, 1024, 4096)
			owners := map[string]bool{}
			for _, config := range []struct{ name, serviceConfig string }{
				{"ring_hash_experimental", RingHashServiceConfig},
				{PolicyName, ServiceConfig},
			} {
				conn := dialRing(t, tt.endpoints, config.serviceConfig)
				for _, path := range routedPaths {
					want := ring.pick(xxhash.Sum64String(path))
					if got := servedBy(t, ctx, conn, path); got != want {
						t.Errorf("%s sent %q to %s; this package computes the owner %s", config.name, path, got, want)
					}
					owners[want] = true
				}
			}
			if distinct := len(slices.Compact(slices.Sorted(slices.Values(tt.endpoints)))); len(owners) < min(distinct, 2) {
				t.Errorf("%d paths all owned by %v: the table does not tell owners apart", len(routedPaths), owners)
			}
		})
	}
}

// TestRingOwners pins the owners of a few paths on a fixed membership, so
// that a change of this package's ring shows in review as a change of
// this table, whatever grpc does.
func TestRingOwners(t *testing.T) {
	members := []string{"10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"}
	ring := newRing(members, 1024, 4096)
	for _, tt := range []struct{ path, want string }{
		{"a", "10.0.0.1:50051"},
		{"b", "10.0.0.2:50051"},
		{"dir/sub/file.bin", "10.0.0.2:50051"},
		{"ckpt/rank-000.bin", "10.0.0.1:50051"},
		{"ckpt/rank-001.bin", "10.0.0.1:50051"},
		{"ckpt/rank-006.bin", "10.0.0.3:50051"},
	} {
		if got := ring.pick(xxhash.Sum64String(tt.path)); got != tt.want {
			t.Errorf("owner of %q = %s, want %s", tt.path, got, tt.want)
		}
	}
	// The order of the members and repeats do not matter.
	if got, want := newRing([]string{members[2], members[0], members[1], members[0]}, 1024, 4096), ring; !slices.Equal(got.keys, want.keys) || !slices.Equal(got.hashes, want.hashes) {
		t.Error("a reordered membership with a repeat built another ring")
	}
}

// TestOwnerDownIsNotRerouted stops a path's owner: filewrite_ring_hash
// fails the call with UNAVAILABLE instead of sending it on to the next
// endpoint of the ring, as ring_hash alone does.
func TestOwnerDownIsNotRerouted(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	addrs, srvs := startServers(t, 3)
	ring := newRing(addrs, 1024, 4096)
	conn := dialRing(t, addrs, ServiceConfig)
	for _, path := range routedPaths {
		servedBy(t, ctx, conn, path) // every connection up
	}
	down := addrs[0]
	srvs[0].Stop()
	var refused int
	for _, path := range routedPaths {
		callCtx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, Header, path), 10*time.Second)
		var p peer.Peer
		_, err := healthpb.NewHealthClient(conn).Check(callCtx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
		cancel()
		owner := ring.pick(xxhash.Sum64String(path))
		switch {
		case owner == down && status.Code(err) != codes.Unavailable:
			t.Errorf("%q, owned by the stopped %s: %v (served by %v), want UNAVAILABLE", path, down, err, p.Addr)
		case owner == down:
			refused++
		case err != nil:
			t.Errorf("%q, owned by %s which is up: %v", path, owner, err)
		}
	}
	if refused == 0 {
		t.Fatalf("no path of %d is owned by %s: the test shows nothing", len(routedPaths), down)
	}
}

// TestCheckTargets: a membership is one address per daemon, spelled once.
func TestCheckTargets(t *testing.T) {
	hosts := map[string][]string{
		"localhost":   {"127.0.0.1", "::1"},
		"db.internal": {"10.0.0.7"},
		"alias":       {"10.0.0.7"},
		"dup-records": {"10.0.0.9", "10.0.0.9"},
	}
	lookup := func(_ context.Context, host string) ([]string, error) {
		if ips, ok := hosts[host]; ok {
			return ips, nil
		}
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	for _, tt := range []struct {
		addrs []string
		ok    bool
	}{
		{[]string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}, true},
		{[]string{"db.internal:50051", "10.0.0.8:50051"}, true},
		{[]string{"db.internal:50051", "db.internal:50052"}, true},
		{[]string{"dup-records:50051", "10.0.0.1:50051"}, true},
		{[]string{"not-yet-in-dns:50051", "10.0.0.1:50051"}, true}, // compared by spelling alone
		{[]string{"127.0.0.1:1", "127.0.0.1:1"}, false},            // the same twice
		{[]string{"localhost:50051", "127.0.0.1:50051"}, false},    // one daemon, two spellings
		{[]string{"[::1]:50051", "localhost:50051"}, false},
		{[]string{"[::ffff:127.0.0.1]:50051", "127.0.0.1:50051"}, false},
		{[]string{"db.internal:50051", "alias:50051"}, false},
		{[]string{"127.0.0.1:1", ""}, false},
		{[]string{"127.0.0.1", "127.0.0.2:1"}, false}, // no port
		{[]string{":50051", "127.0.0.2:1"}, false},    // no host
	} {
		err := CheckTargets(t.Context(), tt.addrs, lookup)
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrTargets)) {
			t.Errorf("CheckTargets(%q) = %v, want ok %v", tt.addrs, err, tt.ok)
		}
	}
}
