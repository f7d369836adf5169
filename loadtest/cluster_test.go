package main

import (
	"io"
	"slices"
	"testing"
)

// TestParseTargets: -targets takes a comma list for the cluster scenario
// only, and never with -target.
func TestParseTargets(t *testing.T) {
	tests := []struct {
		args    []string
		want    []string
		wantErr bool
	}{
		{[]string{"-scenario", "cluster"}, nil, false},
		{[]string{"-scenario", "cluster", "-targets", "a:1, b:2,,c:3"}, []string{"a:1", "b:2", "c:3"}, false},
		{[]string{"-scenario", "throughput", "-targets", "a:1,b:2"}, nil, true},
		{[]string{"-scenario", "cluster", "-targets", "a:1,b:2", "-target", "c:3"}, nil, true},
	}
	for _, tt := range tests {
		o, err := parseOptions(tt.args, io.Discard)
		if gotErr := err != nil; gotErr != tt.wantErr {
			t.Errorf("%q: error %v, want error %v", tt.args, err, tt.wantErr)
			continue
		}
		if err == nil && !slices.Equal(o.targets, tt.want) {
			t.Errorf("%q: targets %q, want %q", tt.args, o.targets, tt.want)
		}
	}
}
