package client_test

import (
	"errors"
	"testing"

	"github.com/filewrite/filewrite/client"
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
