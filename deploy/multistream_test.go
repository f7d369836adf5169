package deploy

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/client"
	"github.com/filewrite/filewrite/internal/shard"
)

// TestRingHashMultiFileStreams: files grouped by their owner
// (shard.Owner), one WriteStream of declared files per owner, routed by
// ring_hash on the routing key of the stream's first file: every file is
// whole on its owner and on no other daemon.
func TestRingHashMultiFileStreams(t *testing.T) {
	ds := startDaemons(t, 3, "--require-path-header")
	r := manual.NewBuilderWithScheme("filewrite-multi")
	var addrs []resolver.Address
	var names []string
	for _, d := range ds {
		addrs = append(addrs, resolver.Address{Addr: d.GRPCAddr})
		names = append(names, d.GRPCAddr)
	}
	r.InitialState(resolver.State{Addresses: addrs})
	fc := routedClient(t, r.Scheme()+":///cluster", grpc.WithResolvers(r), grpc.WithDefaultServiceConfig(shard.ServiceConfig))

	const files = 60
	groups := map[string][]int{}
	for i := range files {
		o := shard.Owner(names, clusterPath(i))
		groups[o] = append(groups[o], i)
	}
	if len(groups) != len(ds) {
		t.Fatalf("%d files fall to %d owners, want all %d", files, len(groups), len(ds))
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for _, group := range groups {
		streamCtx := metadata.AppendToOutgoingContext(ctx, shard.Header, shard.RoutingKey(clusterPath(group[0])))
		stream, err := fc.WriteStream(streamCtx)
		if err != nil {
			t.Fatal(err)
		}
		first := &filewritev1.WriteStreamRequest{}
		for _, i := range group {
			first.Files = append(first.Files, &filewritev1.StreamFile{Index: uint32(i + 1), Path: clusterPath(i)})
		}
		if err := stream.Send(first); err != nil {
			t.Fatal(err)
		}
		// Each file in two halves, the halves of all the group's files
		// interleaved over two messages.
		id := uint64(0)
		for half := range 2 {
			m := &filewritev1.WriteStreamRequest{}
			for _, i := range group {
				want := content(i, 2*halfSize)
				m.Writes = append(m.Writes, &filewritev1.StreamWrite{Id: id, File: uint32(i + 1),
					Offset: int64(half * halfSize), Data: want[half*halfSize : (half+1)*halfSize]})
				id++
			}
			if err := stream.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		if err := stream.CloseSend(); err != nil {
			t.Fatal(err)
		}
		acked := 0
		for {
			resp, err := stream.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("the stream of %d files: %v", len(group), err)
			}
			for _, f := range resp.GetFiles() {
				if f.GetStatus() != nil {
					t.Errorf("file %d: %v", f.GetIndex(), f.GetStatus())
				}
			}
			for _, a := range resp.GetAcks() {
				if a.GetStatus() != nil {
					t.Errorf("write %d: %v", a.GetId(), a.GetStatus())
				}
				acked++
			}
		}
		if acked != 2*len(group) {
			t.Errorf("%d acks, want %d", acked, 2*len(group))
		}
	}
	for i := range files {
		owner := slices.Index(names, shard.Owner(names, clusterPath(i)))
		if got := owners(ds, clusterPath(i)); !slices.Equal(got, []int{owner}) {
			t.Errorf("%s is on daemons %v, want only its owner %d", clusterPath(i), got, owner)
			continue
		}
		b, err := os.ReadFile(filepath.Join(ds[owner].root, clusterPath(i)))
		if err != nil || string(b) != string(content(i, 2*halfSize)) {
			t.Errorf("%s on its owner: %d bytes, %v; want it whole", clusterPath(i), len(b), err)
		}
	}
}

// TestClientSharedStreamsByOwner: one Client over the three daemons
// (WithTargets) holds 90 Files open at once over one shared stream per
// owner daemon, writes each from its own goroutine, and every file ends
// whole on its owner and on no other daemon.
func TestClientSharedStreamsByOwner(t *testing.T) {
	ds := startDaemons(t, 3, "--require-path-header")
	var names []string
	for _, d := range ds {
		names = append(names, d.GRPCAddr)
	}
	var streams atomic.Int64
	count := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		streams.Add(1)
		return streamer(ctx, desc, cc, method, opts...)
	}
	c, err := client.Dial("", client.WithTargets(names...), client.WithDialOptions(grpc.WithStreamInterceptor(count)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const files = 90
	open := make([]*client.File, files)
	for i := range open {
		if open[i], err = c.Open(ctx, clusterPath(i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := streams.Load(); got != int64(len(ds)) {
		t.Errorf("%d Files over %d daemons opened %d streams, want one per daemon", files, len(ds), got)
	}
	var wg sync.WaitGroup
	for i, f := range open {
		wg.Go(func() {
			want := content(i, 2*halfSize)
			if _, err := f.WriteAt(want[halfSize:], halfSize); err != nil {
				t.Errorf("write %s: %v", clusterPath(i), err)
			}
			if _, err := f.WriteAt(want[:halfSize], 0); err != nil {
				t.Errorf("write %s: %v", clusterPath(i), err)
			}
		})
	}
	wg.Wait()
	for _, f := range open {
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	}
	for i := range files {
		owner := slices.Index(names, shard.Owner(names, clusterPath(i)))
		if got := owners(ds, clusterPath(i)); !slices.Equal(got, []int{owner}) {
			t.Errorf("%s is on daemons %v, want only its owner %d", clusterPath(i), got, owner)
			continue
		}
		b, err := os.ReadFile(filepath.Join(ds[owner].root, clusterPath(i)))
		if err != nil || string(b) != string(content(i, 2*halfSize)) {
			t.Errorf("%s on its owner: %d bytes, %v; want it whole", clusterPath(i), len(b), err)
		}
	}
}
