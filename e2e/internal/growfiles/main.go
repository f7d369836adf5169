// Command growfiles is the load of e2e's TestGrowingFilesKeepDaemonServing,
// run as a process of its own so that it is built without the race
// detector whatever the test is (the detector makes a gRPC client several
// times slower, and this load is 200,000 calls): issue 36's reproduction,
// a tokenless client that writes, for each of -files files, one byte at 0,
// eight over it, then for L = 1, 2, 4 ... 64 MiB one byte at L and one over
// it (23 one-byte Writes a file), from -workers goroutines. It prints how
// many files it grew and exits 0, or the first error and exits 1.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

func main() {
	addr := flag.String("addr", "", "the daemon's gRPC address")
	files := flag.Int("files", 9000, "files to grow")
	workers := flag.Int("workers", 16, "goroutines writing")
	timeout := flag.Duration("timeout", 5*time.Minute, "for the whole load")
	flag.Parse()
	n, err := grow(*addr, *files, *workers, *timeout)
	fmt.Printf("grown %d files\n", n)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// grow grows files files over workers goroutines, and returns how many it
// grew before the first error.
func grow(addr string, files, workers int, timeout time.Duration) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	client := filewritev1.NewFileServiceClient(conn)
	var next, done atomic.Int64
	var first atomic.Pointer[error]
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for first.Load() == nil {
				i := next.Add(1) - 1
				if i >= int64(files) {
					return
				}
				if err := growFile(ctx, client, fmt.Sprintf("d%02d/f%04d", i%64, i)); err != nil {
					first.CompareAndSwap(nil, &err)
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	if err := first.Load(); err != nil {
		return done.Load(), *err
	}
	return done.Load(), nil
}

// growFile is the reproduction's 23 Writes to one file.
func growFile(ctx context.Context, c filewritev1.FileServiceClient, path string) error {
	write := func(off int64) error {
		_, err := c.Write(ctx, &filewritev1.WriteRequest{Path: path, Offset: off, Data: []byte{1}})
		return err
	}
	for range 9 {
		if err := write(0); err != nil {
			return err
		}
	}
	for l := int64(1 << 20); l <= 64<<20; l *= 2 {
		for range 2 {
			if err := write(l); err != nil {
				return err
			}
		}
	}
	return nil
}
