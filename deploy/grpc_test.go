package deploy

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/shard"
)

// pathHeader sets filewrite-path to the routing key of the request's path
// on every unary call, as the client package does.
func pathHeader(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if p, ok := req.(interface{ GetPath() string }); ok {
		ctx = metadata.AppendToOutgoingContext(ctx, shard.Header, shard.RoutingKey(p.GetPath()))
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// routedClient dials target in cleartext with pathHeader on every call,
// and opts, and closes the connection when the test ends.
func routedClient(t *testing.T, target string, opts ...grpc.DialOption) filewritev1.FileServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(target, append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(pathHeader)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return filewritev1.NewFileServiceClient(cc)
}

// grpcLifecycle writes file i in two writes, reads it back, truncates,
// syncs and stats it. On a daemon that does not hold the file, the read,
// truncate, sync and Stat find none.
func grpcLifecycle(ctx context.Context, fc filewritev1.FileServiceClient, path string, i int) error {
	want := content(i, 2*halfSize)
	if _, err := fc.Write(ctx, &filewritev1.WriteRequest{Path: path, Data: want[:halfSize]}); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := fc.Write(ctx, &filewritev1.WriteRequest{Path: path, Offset: halfSize, Data: want[halfSize:]}); err != nil {
		return fmt.Errorf("write %s at %d: %w", path, halfSize, err)
	}
	r, err := fc.Read(ctx, &filewritev1.ReadRequest{Path: path, Length: 2 * halfSize})
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	if !bytes.Equal(r.GetData(), want) {
		return fmt.Errorf("read %s: got %d bytes, not the %d written", path, len(r.GetData()), len(want))
	}
	if _, err := fc.Truncate(ctx, &filewritev1.TruncateRequest{Path: path, Size: truncSize}); err != nil {
		return fmt.Errorf("truncate %s: %w", path, err)
	}
	if _, err := fc.Fsync(ctx, &filewritev1.FsyncRequest{Path: path}); err != nil {
		return fmt.Errorf("fsync %s: %w", path, err)
	}
	st, err := fc.Stat(ctx, &filewritev1.StatRequest{Path: path})
	if err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if st.GetSize() != truncSize {
		return fmt.Errorf("stat %s: size %d, want %d", path, st.GetSize(), truncSize)
	}
	return nil
}

// checkGRPCSharding runs every file's lifecycle through fc, checks that
// each file is whole on exactly one daemon, then stops one daemon and
// checks that only its files fail, with UNAVAILABLE, and that none of them
// is recreated elsewhere.
func checkGRPCSharding(t *testing.T, ds []*clusterDaemon, fc filewritev1.FileServiceClient) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	checkSharding(t, ds,
		func(i int) error { return grpcLifecycle(ctx, fc, clusterPath(i), i) },
		func(i, owner, down int) error {
			path := clusterPath(i)
			_, err := fc.Read(ctx, &filewritev1.ReadRequest{Path: path, Length: truncSize})
			switch {
			case owner == down && status.Code(err) != codes.Unavailable:
				err = fmt.Errorf("read %s of the stopped daemon: %v, want UNAVAILABLE", path, err)
			case owner != down && err != nil:
				err = fmt.Errorf("read %s of live daemon %d: %v", path, owner, err)
			default:
				err = nil
			}
			if owner == down {
				_, werr := fc.Write(ctx, &filewritev1.WriteRequest{Path: path, Data: []byte("x")})
				if status.Code(werr) != codes.Unavailable {
					err = fmt.Errorf("write %s of the stopped daemon: %v, want UNAVAILABLE", path, werr)
				}
			}
			return err
		})
}

// TestHAProxyGRPCShardsByPath: gRPC through deploy/haproxy.cfg, hashing
// the filewrite-path header.
func TestHAProxyGRPCShardsByPath(t *testing.T) {
	ds := startDaemons(t, 3)
	_, grpcAddr := startHAProxy(t, ds)
	checkGRPCSharding(t, ds, routedClient(t, grpcAddr))
}

// TestRingHashShardsByPath: grpc-go's ring_hash over the three daemons'
// addresses, from a manual resolver, hashing the filewrite-path header, under
// shard's policy, which refuses what ring_hash alone would do once a daemon
// is down: send its paths to the next daemon on the ring.
func TestRingHashShardsByPath(t *testing.T) {
	ds := startDaemons(t, 3)
	r := manual.NewBuilderWithScheme("filewrite-cluster")
	var addrs []resolver.Address
	for _, d := range ds {
		addrs = append(addrs, resolver.Address{Addr: d.GRPCAddr})
	}
	r.InitialState(resolver.State{Addresses: addrs})
	checkGRPCSharding(t, ds, routedClient(t, r.Scheme()+":///cluster",
		grpc.WithResolvers(r), grpc.WithDefaultServiceConfig(shard.ServiceConfig)))
}
