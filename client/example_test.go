package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/filewrite/filewrite/client"
	"github.com/filewrite/filewrite/service"
)

// exampleDaemon starts a daemon to talk to, serving a fresh directory on
// addr ("127.0.0.1:0" for a free loopback port); yours runs as the
// filewrite command. stop shuts it down and removes the directory.
func exampleDaemon(addr string) (srv *service.Server, root string, stop func()) {
	dir, err := os.MkdirTemp(".", "testdata-example-")
	if err != nil {
		log.Fatal(err)
	}
	srv = startExampleServer(dir, addr)
	return srv, dir, func() {
		srv.Shutdown()
		os.RemoveAll(dir)
	}
}

func startExampleServer(root, addr string) *service.Server {
	cfg := service.DefaultConfig()
	cfg.Root, cfg.GRPCAddr, cfg.HTTPAddr = root, addr, ""
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := service.Start(cfg)
	if err != nil {
		log.Fatal(err)
	}
	return srv
}

// Eight writers fill one file, each its own 4 KiB block, durably: their
// writes share stream messages, and each WriteAt returns once its own
// block is on disk.
func Example() {
	srv, _, stop := exampleDaemon("127.0.0.1:0")
	defer stop()

	c, err := client.Dial(srv.GRPCAddr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	f, err := c.Open(ctx, "ckpt/rank-0.bin", client.WithSync(client.SyncData))
	if err != nil {
		log.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			block := bytes.Repeat([]byte{byte('a' + i)}, 4096)
			if _, err := f.WriteAt(block, int64(i)*4096); err != nil {
				log.Print(err)
			}
		})
	}
	wg.Wait()
	fi, err := f.Stat(ctx)
	if err != nil {
		log.Fatal(err)
	}
	head := make([]byte, 3)
	if _, err := f.ReadAt(head, 4095); err != nil {
		log.Fatal(err)
	}
	if err := f.Close(); err != nil {
		log.Fatal(err)
	}
	fmt.Println(fi.Size, string(head))
	// Output: 32768 abb
}

// The atomic publish of a file: write it under a temporary name, make it
// durable, then rename it over the target with the directory synced.
// Readers of the target see the old file or the whole new one, never a
// part, also after a crash.
func Example_atomicPublish() {
	srv, _, stop := exampleDaemon("127.0.0.1:0")
	defer stop()
	c, err := client.Dial(srv.GRPCAddr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	f, err := c.Open(ctx, "ckpt/.step-7.tmp", client.WithOpenMode(client.OpenExclusive))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("step 7 weights"), 0); err != nil {
		log.Fatal(err)
	}
	if err := f.Sync(ctx); err != nil {
		log.Fatal(err)
	}
	if err := f.Close(); err != nil {
		log.Fatal(err)
	}
	if err := c.Rename(ctx, "ckpt/.step-7.tmp", "ckpt/step-7", client.WithSyncDirs()); err != nil {
		log.Fatal(err)
	}
	for e, err := range c.List(ctx, "ckpt") {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(e.Name, e.Size)
	}
	// Output: step-7 14
}

// Opening an existing file only: a missing one is fs.ErrNotExist, and
// nothing is created.
func ExampleWithOpenMode() {
	srv, _, stop := exampleDaemon("127.0.0.1:0")
	defer stop()
	c, err := client.Dial(srv.GRPCAddr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	_, err = c.Open(ctx, "config/current", client.WithOpenMode(client.OpenMustExist))
	fmt.Println("missing:", errors.Is(err, fs.ErrNotExist))
	_, err = c.Stat(ctx, "config/current")
	fmt.Println("created:", !errors.Is(err, fs.ErrNotExist))

	f, err := c.Open(ctx, "config/current") // creates it
	if err != nil {
		log.Fatal(err)
	}
	f.Close()
	f, err = c.Open(ctx, "config/current", client.WithOpenMode(client.OpenMustExist))
	fmt.Println("existing:", err == nil)
	f.Close()
	// Output:
	// missing: true
	// created: false
	// existing: true
}

// io.Copy into and out of a File, pipelined: many pieces on their way at
// once instead of one call's round trip per 32 KiB.
func ExampleFile_NewWriter() {
	srv, _, stop := exampleDaemon("127.0.0.1:0")
	defer stop()
	c, err := client.Dial(srv.GRPCAddr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	f, err := c.Open(context.Background(), "images/disk.raw")
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()

	src := strings.NewReader(strings.Repeat("0123456789abcdef", 1<<16)) // 1 MiB
	w := f.NewWriter(0)
	in, err := io.Copy(w, src)
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Close(); err != nil { // waits for every ack
		log.Fatal(err)
	}
	var dst bytes.Buffer
	out, err := io.Copy(&dst, f.NewReader(0))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(in, out, dst.String()[:16])
	// Output: 1048576 1048576 0123456789abcdef
}

// With WithRetry, a daemon that stops and comes back costs the writers a
// pause, not an error: the write waits for the daemon, goes on a new
// stream, and returns nil.
func ExampleWithRetry() {
	sockDir, err := os.MkdirTemp("", "fw")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	addr := "unix:" + filepath.Join(sockDir, "s")
	srv, root, stop := exampleDaemon(addr)
	defer func() { stop() }()

	c, err := client.Dial(addr, client.WithRetry(5))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	f, err := c.Open(context.Background(), "log/app", client.WithTimeout(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte("before "), 0); err != nil {
		log.Fatal(err)
	}

	srv.Shutdown() // the daemon goes away...
	done := make(chan error)
	go func() {
		_, err := f.WriteAt([]byte("after"), 7)
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	srv = startExampleServer(root, addr) // ...and comes back
	stop = func() { srv.Shutdown(); os.RemoveAll(root) }

	fmt.Println("write:", <-done)
	got := make([]byte, 12)
	if _, err := f.ReadAt(got, 0); err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(got))
	// Output:
	// write: <nil>
	// before after
}
