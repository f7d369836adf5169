package client_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"sync"

	"github.com/filewrite/filewrite/client"
	"github.com/filewrite/filewrite/service"
)

// Eight writers fill one file, each its own 4 KiB block, durably: their
// writes share stream messages, and each WriteAt returns once its own
// block is on disk.
func Example() {
	// A daemon to talk to, on a free loopback port; yours runs as the
	// filewrite command.
	dir, err := os.MkdirTemp(".", "testdata-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cfg := service.DefaultConfig()
	cfg.Root, cfg.GRPCAddr, cfg.HTTPAddr = dir, "127.0.0.1:0", ""
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := service.Start(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()

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
			block := make([]byte, 4096)
			for j := range block {
				block[j] = byte('a' + i)
			}
			if _, err := f.WriteAt(block, int64(i)*4096); err != nil {
				log.Print(err)
			}
		})
	}
	wg.Wait()
	st, err := f.Stat(ctx)
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
	fmt.Println(st.Size, string(head))
	// Output: 32768 abb
}
