package main

import "testing"

// TestRedactPath: a record names no directory of the machine it ran on.
func TestRedactPath(t *testing.T) {
	tests := []struct{ in, dir, want string }{
		{"daemon at /srv/x/loadtest-out/work/peer.sock\n", "/srv/x/loadtest-out", "daemon at $OUT/work/peer.sock\n"},
		{"nothing here", "/srv/x/loadtest-out", "nothing here"},
		{"a . stays", ".", "a . stays"},
	}
	for _, tt := range tests {
		if got := string(redactPath([]byte(tt.in), tt.dir, "$OUT")); got != tt.want {
			t.Errorf("redactPath(%q, %q) = %q, want %q", tt.in, tt.dir, got, tt.want)
		}
	}
}
