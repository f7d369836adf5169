package deploy

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
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
