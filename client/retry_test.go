package client

import (
	"encoding/json"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/filewrite/filewrite/internal/shard"
)

// TestWithRetryPolicy: the service config that WithRetry adds keeps the
// routing config it is merged into, and gRPC takes it.
func TestWithRetryPolicy(t *testing.T) {
	for _, tt := range []struct {
		name, config string
		retries      int
		wantLB       bool
		wantMethods  bool
	}{
		{"no retries, no routing", "", 0, false, false},
		{"no retries, routing", shard.ServiceConfig, 0, true, false},
		{"retries", "", 3, false, true},
		{"retries and routing", shard.ServiceConfig, 9, true, true},
	} {
		got, err := withRetryPolicy(tt.config, tt.retries)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		var sc map[string]any
		if got != "" {
			if err := json.Unmarshal([]byte(got), &sc); err != nil {
				t.Fatalf("%s: %v", tt.name, err)
			}
		}
		if _, ok := sc["loadBalancingConfig"]; ok != tt.wantLB {
			t.Errorf("%s: loadBalancingConfig present %v, want %v", tt.name, ok, tt.wantLB)
		}
		if _, ok := sc["methodConfig"]; ok != tt.wantMethods {
			t.Errorf("%s: methodConfig present %v, want %v", tt.name, ok, tt.wantMethods)
		}
		if got == "" {
			continue
		}
		cc, err := grpc.NewClient("passthrough:///unused", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultServiceConfig(got))
		if err != nil {
			t.Errorf("%s: gRPC refuses the service config %s: %v", tt.name, got, err)
			continue
		}
		cc.Close()
	}
}

// TestBackoff: each wait is between half and all of a bound that doubles
// from retryBaseDelay up to retryMaxDelay.
func TestBackoff(t *testing.T) {
	for n := 1; n <= 40; n++ {
		bound := min(retryBaseDelay<<min(n-1, 16), retryMaxDelay)
		for range 20 {
			if got := backoff(n); got < bound/2 || got > bound {
				t.Fatalf("backoff(%d) = %v, want within [%v, %v]", n, got, bound/2, bound)
			}
		}
	}
}
