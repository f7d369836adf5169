package client_test

import (
	"errors"
	"testing"

	"github.com/filewrite/filewrite/client"
	"github.com/filewrite/filewrite/service"
)

// TestDialRefusesAliasedTargets: a membership that names one daemon twice,
// or one daemon by two spellings, would give it two places on the ring;
// Dial refuses it, naming both, before anything is routed.
func TestDialRefusesAliasedTargets(t *testing.T) {
	for _, targets := range [][]string{
		{"127.0.0.1:50051", "127.0.0.1:50052", "127.0.0.1:50051"},
		{"localhost:50051", "127.0.0.1:50051"},
		{"127.0.0.1:50051", ""},
	} {
		c, err := client.Dial("", client.WithTargets(targets...))
		if err == nil {
			c.Close()
			t.Errorf("Dial with targets %q succeeded", targets)
			continue
		}
		if !errors.Is(err, client.ErrTargets) {
			t.Errorf("Dial with targets %q: %v, want ErrTargets", targets, err)
		}
	}
	c, err := client.Dial("", client.WithTargets("127.0.0.1:50051", "127.0.0.1:50052"))
	if err != nil {
		t.Fatalf("Dial with two daemons: %v", err)
	}
	c.Close()
}

// TestRoutingKeyAnyName: every call carries the path's routing key, which
// fits in a header whatever the name (a raw name outside printable ASCII
// fails every call in gRPC's own header check), and a daemon that requires
// the header serves every call of a File, its stream included.
func TestRoutingKeyAnyName(t *testing.T) {
	d := startDaemon(t, func(c *service.Config) { c.RequirePathHeader = true })
	c := dial(t, d.addr)
	ctx := testContext(t)
	for _, name := range []string{"ünïcode/ファイル", "a b/c:d%41+e", "tab\there"} {
		f, err := c.Open(ctx, name)
		if err != nil {
			t.Fatalf("Open(%q): %v", name, err)
		}
		if _, err := f.WriteAt([]byte("streamed"), 0); err != nil {
			t.Errorf("%q: WriteAt: %v", name, err)
		}
		if err := f.Truncate(ctx, 4); err != nil {
			t.Errorf("%q: Truncate: %v", name, err)
		}
		if err := f.Close(); err != nil {
			t.Errorf("%q: Close: %v", name, err)
		}
		if got := string(d.onDisk(t, name)); got != "stre" {
			t.Errorf("%q holds %q, want %q", name, got, "stre")
		}
	}
}
