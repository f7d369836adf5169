package client_test

import (
	"bytes"
	"crypto/sha256"
	"strconv"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/filewrite/filewrite/client"
	"github.com/filewrite/filewrite/internal/errorinfo"
)

// TestGenerations: WithIfGeneration opens a file only at the generation
// it names (0: only a new file), File.Generation follows the File's
// synced writes, Truncate and Stat, and File.Digest answers the checksum
// at a generation; over a stream of its own and over a shared one.
func TestGenerations(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []client.Option
	}{
		{"stream per path", []client.Option{client.WithSharedStreams(0)}},
		{"shared streams", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := startDaemon(t, nil)
			ctx := testContext(t)
			c := dial(t, d.addr, tc.opts...)
			f, err := c.Open(ctx, "g", client.WithIfGeneration(0), client.WithSync(client.SyncData))
			if err != nil {
				t.Fatalf("Open of a new file if its generation is 0: %v", err)
			}
			opened := f.Generation()
			if opened == 0 {
				t.Fatal("Generation 0 after Open")
			}
			if _, err := f.WriteAt([]byte("hello"), 0); err != nil {
				t.Fatal(err)
			}
			fi, err := c.Stat(ctx, "g")
			if err != nil {
				t.Fatal(err)
			}
			if f.Generation() == opened || f.Generation() != fi.Generation || fi.ETag != `"`+strconv.FormatInt(fi.Generation, 10)+`"` {
				t.Errorf("after a synced write: File.Generation %d (opened at %d), Stat %d %s", f.Generation(), opened, fi.Generation, fi.ETag)
			}
			for _, cond := range []int64{0, opened} { // exists; stale
				_, err := c.Open(ctx, "g", client.WithIfGeneration(cond))
				if status.Code(err) != codes.FailedPrecondition {
					t.Errorf("Open if generation %d: %v, want FAILED_PRECONDITION", cond, err)
					continue
				}
				if got := errorinfo.From(err).GetMetadata()["generation"]; got != strconv.FormatInt(fi.Generation, 10) {
					t.Errorf("Open if generation %d: metadata generation %s, want %d", cond, got, fi.Generation)
				}
			}
			g, err := c.Open(ctx, "g", client.WithIfGeneration(fi.Generation))
			if err != nil {
				t.Fatalf("Open at the current generation: %v", err)
			}
			if g.Generation() != fi.Generation {
				t.Errorf("opened at %d, Stat said %d", g.Generation(), fi.Generation)
			}
			if err := g.Truncate(ctx, 4); err != nil {
				t.Fatal(err)
			}
			if g.Generation() == fi.Generation {
				t.Error("Truncate did not move File.Generation")
			}
			dg, err := g.Digest(ctx, 0, 0, "sha-256")
			want := sha256.Sum256([]byte("hell"))
			if err != nil || !bytes.Equal(dg.Sum, want[:]) || dg.Length != 4 || dg.Generation != g.Generation() || dg.Algorithm != "sha-256" {
				t.Errorf("Digest: %+v, %v; want sha-256 of hell at %d", dg, err, g.Generation())
			}
			f.Close()
			g.Close()
		})
	}
}
