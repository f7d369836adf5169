package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/daemonproc"
	"github.com/filewrite/filewrite/internal/shard"
)

// The cluster scenario: the same write workload over many files against
// one daemon, against three daemons that the client routes to by grpc-go's
// ring hash of the file path, and against the same three through HAProxy
// with deploy/haproxy.cfg, all on this machine. On one machine three
// daemons cannot be faster than one (they share its CPUs and disk); the
// figure is whether routing loses anything, and what the proxy costs.

// ringScheme is the resolver of -targets: "filewrite-ring:///a,b,c" gives
// the addresses a, b and c, and shard.ServiceConfig as their service config:
// grpc-go's ring hash of the filewrite-path header (shard.Header), never
// rerouted away from a path's owner.
const ringScheme = "filewrite-ring"

func init() { resolver.Register(ringResolverBuilder{}) }

type ringResolverBuilder struct{}

func (ringResolverBuilder) Scheme() string { return ringScheme }

func (ringResolverBuilder) Build(t resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	var st resolver.State
	for _, a := range strings.Split(strings.TrimPrefix(t.URL.Path, "/"), ",") {
		if a != "" {
			st.Endpoints = append(st.Endpoints, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}})
		}
	}
	if len(st.Endpoints) == 0 {
		return nil, fmt.Errorf("%s: no addresses in %q", ringScheme, t.URL.String())
	}
	st.ServiceConfig = cc.ParseServiceConfig(shard.ServiceConfig)
	if st.ServiceConfig.Err != nil {
		return nil, st.ServiceConfig.Err
	}
	if err := cc.UpdateState(st); err != nil {
		return nil, err
	}
	return nopResolver{}, nil
}

type nopResolver struct{}

func (nopResolver) ResolveNow(resolver.ResolveNowOptions) {}
func (nopResolver) Close()                                {}

// ringTarget is the gRPC target that routes over addrs by ring hash.
func ringTarget(addrs []string) string { return ringScheme + ":///" + strings.Join(addrs, ",") }

// dialRouted is dial for a target that may route by path: plain host:port,
// or a ringTarget. Every unary call carries its request's path as
// filewrite-path.
func dialRouted(target, token string) (*grpc.ClientConn, error) {
	if !strings.HasPrefix(target, ringScheme+":") {
		target = "passthrough:///" + target
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if p, ok := req.(interface{ GetPath() string }); ok {
				ctx = metadata.AppendToOutgoingContext(ctx, shard.Header, shard.RoutingKey(p.GetPath()))
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
	}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearerToken(token)))
	}
	return grpc.NewClient(target, opts...)
}

// clusterFiles is how many files the cluster workload spreads over: enough
// that each of three daemons gets a share near a third.
const clusterFiles = 96

func clusterPath(i int64) string { return fmt.Sprintf("loadtest/cluster/f%03d.dat", i) }

// clusterSetup fills every file of the workload through s's target.
func clusterSetup(fileSize int64) func(context.Context, *session) error {
	return func(ctx context.Context, s *session) error {
		cc, err := dialRouted(s.addr, s.token)
		if err != nil {
			return err
		}
		defer cc.Close()
		c := filewritev1.NewFileServiceClient(cc)
		for i := range int64(clusterFiles) {
			if err := writeFile(ctx, c, clusterPath(i), fileSize); err != nil {
				return fmt.Errorf("%s: %w", clusterPath(i), err)
			}
		}
		return nil
	}
}

// clusterWrites is a run of bs-byte buffered Writes, each to a random one
// of the files at a random block below its EOF, one connection per client.
func clusterWrites(fileSize int64) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		var ccs []*grpc.ClientConn
		defer func() {
			for _, cc := range ccs {
				cc.Close()
			}
		}()
		conns := s.connections
		if conns <= 0 || conns > s.clients {
			conns = s.clients
		}
		for range conns {
			cc, err := dialRouted(s.addr, s.token)
			if err != nil {
				return nil, err
			}
			ccs = append(ccs, cc)
		}
		data := patternBytes(s.bs)
		blocks, bs, seed := fileSize/int64(s.bs), int64(s.bs), uint64(s.round)
		r := loop(ctx, s, callWrite, func(ctx context.Context, client int, n int64) error {
			c := filewritev1.NewFileServiceClient(ccs[client%conns])
			_, err := c.Write(ctx, &filewritev1.WriteRequest{
				Path:   clusterPath(randomBlock(seed^0x5eed, n, clusterFiles)),
				Offset: randomBlock(seed, n, blocks) * bs,
				Data:   data,
			})
			return err
		})
		return r, nil
	}
}

// cluster compares one daemon with three on this machine. With -targets,
// it drives the given cluster alone.
func (e *env) cluster() *comparison {
	bs := e.bs(4 << 10)
	size := e.fileSize(4<<20, bs)
	setup, run := clusterSetup(size), clusterWrites(size)
	c := &comparison{
		name: "cluster",
		title: fmt.Sprintf("buffered %s writes below EOF, each to one of %d %s files: one daemon, three routed by the client's ring hash, three behind HAProxy",
			sizeName(bs), clusterFiles, sizeName(size)),
		clients: e.clients(32), bs: bs,
	}
	if len(e.opts.targets) > 0 {
		c.title = fmt.Sprintf("buffered %s writes below EOF, each to one of %d %s files, ring hash over %s",
			sizeName(bs), clusterFiles, sizeName(size), strings.Join(e.opts.targets, ","))
		addr := ringTarget(e.opts.targets)
		c.columns = []column{{name: "targets", setup: func(ctx context.Context, s *session) error {
			s.addr, s.token = addr, e.opts.token
			return setup(ctx, s)
		}, run: run}}
		return c
	}
	three := &threeDaemons{e: e}
	c.columns = []column{
		{name: "one", daemon: []string{}, setup: setup, run: run},
		{name: "ring-hash-3", setup: func(ctx context.Context, s *session) error {
			addrs, err := three.start(ctx)
			if err != nil {
				return err
			}
			s.addr = ringTarget(addrs)
			return setup(ctx, s)
		}, run: run},
	}
	c.ratios = [][2]string{{"ring-hash-3", "one"}}
	if _, err := exec.LookPath("haproxy"); err != nil {
		fmt.Fprintln(e.log, "   haproxy is not installed: the cluster scenario runs without its HAProxy column")
	} else {
		c.columns = append(c.columns, column{name: "haproxy-3", setup: func(ctx context.Context, s *session) error {
			addr, pid, err := three.proxy(ctx)
			if err != nil {
				return err
			}
			// The proxy's CPU is what the table's server column shows
			// for this column: its cost per request.
			s.addr, s.pid = addr, pid
			return setup(ctx, s)
		}, run: run})
		c.ratios = append(c.ratios, [2]string{"haproxy-3", "one"}, [2]string{"haproxy-3", "ring-hash-3"})
	}
	c.cleanup = three.stop
	return c
}

// threeDaemons are the cluster scenario's three daemons and its HAProxy,
// started on first use and shared by the columns.
type threeDaemons struct {
	e       *env
	daemons []*daemon
	addrs   []string
	haproxy *exec.Cmd
	exited  chan struct{}
	addr    string // HAProxy's gRPC address
}

func (t *threeDaemons) start(ctx context.Context) ([]string, error) {
	if t.daemons != nil {
		return t.addrs, nil
	}
	for i := range 3 {
		dir := filepath.Join(t.e.work, "cluster", fmt.Sprintf("daemon-%d", i+1))
		d, err := startDaemon(ctx, fmt.Sprintf("cluster/daemon-%d", i+1), t.e.bin, filepath.Join(dir, "data"), filepath.Join(dir, "daemon.log"), nil)
		if err != nil {
			return nil, err
		}
		t.daemons = append(t.daemons, d)
		t.addrs = append(t.addrs, d.addr)
		fmt.Fprintf(t.e.log, "   daemon %-20s (default flags) at %s\n", fmt.Sprintf("cluster-%d", i+1), d.addr)
	}
	return t.addrs, nil
}

// proxy starts HAProxy with the checkout's deploy/haproxy.cfg in front of
// the three daemons and returns its gRPC address and pid.
func (t *threeDaemons) proxy(ctx context.Context) (string, int, error) {
	if t.haproxy != nil {
		return t.addr, t.haproxy.Process.Pid, nil
	}
	addrs, err := t.start(ctx)
	if err != nil {
		return "", 0, err
	}
	root, err := daemonproc.ModuleRoot(ctx)
	if err != nil {
		return "", 0, err
	}
	grpcAddr, err := freeLoopbackAddr()
	if err != nil {
		return "", 0, err
	}
	restAddr, err := freeLoopbackAddr()
	if err != nil {
		return "", 0, err
	}
	logPath := filepath.Join(t.e.work, "cluster", "haproxy.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return "", 0, err
	}
	cmd := exec.Command("haproxy", "-f", filepath.Join(root, "deploy", "haproxy.cfg"), "-db")
	cmd.Stdout, cmd.Stderr = logf, logf
	// The daemons serve gRPC only here; the REST servers are never used.
	cmd.Env = append(os.Environ(), "FILEWRITE_GRPC_BIND="+grpcAddr, "FILEWRITE_REST_BIND="+restAddr)
	for i, a := range addrs {
		cmd.Env = append(cmd.Env, fmt.Sprintf("FILEWRITE_%d_GRPC=%s", i+1, a), fmt.Sprintf("FILEWRITE_%d_HTTP=127.0.0.1:9", i+1))
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return "", 0, fmt.Errorf("haproxy: %w", err)
	}
	t.haproxy, t.exited, t.addr = cmd, make(chan struct{}), grpcAddr
	go func() { cmd.Wait(); logf.Close(); close(t.exited) }()
	for deadline := time.Now().Add(20 * time.Second); ; {
		c, err := net.Dial("tcp", grpcAddr)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-t.exited:
			return "", 0, fmt.Errorf("haproxy exited before it listened; its log is %s", logPath)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return "", 0, fmt.Errorf("haproxy did not listen on %s within 20s; its log is %s", grpcAddr, logPath)
		}
	}
	fmt.Fprintf(t.e.log, "   haproxy  deploy/haproxy.cfg in front of them at %s\n", grpcAddr)
	return grpcAddr, cmd.Process.Pid, nil
}

func (t *threeDaemons) stop() error {
	var errs []error
	if t.haproxy != nil {
		t.haproxy.Process.Signal(syscall.SIGTERM)
		<-t.exited
		t.haproxy = nil
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, d := range t.daemons {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := d.stop(); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	t.daemons, t.addrs = nil, nil
	return errors.Join(errs...)
}

// freeLoopbackAddr is a loopback address whose port nobody listened on a
// moment ago, for HAProxy, which cannot pick its own and say which.
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
