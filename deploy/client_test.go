package deploy

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/filewrite/filewrite/client"
)

// clientLifecycle writes file i through a client.File in two writes (over
// its WriteStream), reads it back, truncates, syncs and stats it.
func clientLifecycle(ctx context.Context, c *client.Client, path string, i int) error {
	want := content(i, 2*halfSize)
	f, err := c.Open(ctx, path)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	if _, err := f.WriteAt(want[:halfSize], 0); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.WriteAt(want[halfSize:], halfSize); err != nil {
		return fmt.Errorf("write %s at %d: %w", path, halfSize, err)
	}
	got := make([]byte, len(want))
	if _, err := f.ReadAt(got, 0); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("read %s: not the bytes written", path)
	}
	if err := f.Truncate(ctx, truncSize); err != nil {
		return fmt.Errorf("truncate %s: %w", path, err)
	}
	if err := f.Sync(ctx); err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	st, err := f.Stat(ctx)
	if err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Size != truncSize {
		return fmt.Errorf("stat %s: size %d, want %d", path, st.Size, truncSize)
	}
	return f.Close()
}

// TestClientWithTargetsShardsByPath: client.WithTargets over three daemons
// keeps every file, its stream and its calls, on one daemon; once a daemon
// is stopped, only its files fail, with UNAVAILABLE, and none is written
// anew on another daemon.
func TestClientWithTargetsShardsByPath(t *testing.T) {
	ds := startDaemons(t, 3)
	var addrs []string
	for _, d := range ds {
		addrs = append(addrs, d.GRPCAddr)
	}
	c, err := client.Dial("", client.WithTargets(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	checkSharding(t, ds,
		func(i int) error { return clientLifecycle(ctx, c, clusterPath(i), i) },
		func(i, owner, down int) error {
			path := clusterPath(i)
			f, err := c.Open(ctx, path)
			if err == nil {
				_, err = f.WriteAt([]byte("x"), 0)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
			switch {
			case owner == down && status.Code(err) != codes.Unavailable:
				return fmt.Errorf("open and write %s of the stopped daemon: %v, want UNAVAILABLE", path, err)
			case owner != down && err != nil:
				return fmt.Errorf("open and write %s of live daemon %d: %v", path, owner, err)
			}
			return nil
		})
}

// TestClientOneTargetUnchanged: with one address, WithTargets is a plain
// Dial of it; and a Dial target given with WithTargets is refused.
func TestClientOneTargetUnchanged(t *testing.T) {
	ds := startDaemons(t, 1)
	c, err := client.Dial("", client.WithTargets(ds[0].GRPCAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := clientLifecycle(ctx, c, "one/file.bin", 1); err != nil {
		t.Fatal(err)
	}
	if got := owners(ds, "one/file.bin"); len(got) != 1 {
		t.Fatalf("one/file.bin on daemons %v, want [0]", got)
	}
	if _, err := client.Dial(ds[0].GRPCAddr, client.WithTargets(ds[0].GRPCAddr, "127.0.0.1:1")); err == nil {
		t.Fatal("Dial(target) with WithTargets: no error, want one")
	}
}
