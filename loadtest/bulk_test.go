package main

import (
	"slices"
	"strings"
	"testing"
)

// TestBulkScenario runs every bulk row briefly, on 8 MiB files, against
// real daemons and real tools: every transfer and write must succeed, the
// writing rows must measure the daemon's memory, and each row must print
// its goals. It checks nothing about speed.
func TestBulkScenario(t *testing.T) {
	if tool := bulkMissing(); tool != "" {
		t.Skipf("%s is not installed", tool)
	}
	sum, _, text := shortRun(t, "bulk", func(o *options) { o.fileSize = 8 << 20 })
	want := map[string][]string{
		"bulk-put":        {"dd", "filewrite-put"},
		"bulk-writer":     {"dd", "filewrite-writer"},
		"bulk-checkpoint": {"fio", "filewrite-ranks"},
		"bulk-get":        {"filewrite-get", "filewrite-reader", "fileserver"},
		"bulk-durable":    {"fio-dsync", "filewrite-stream", "filewrite-per-call", "filewrite-direct"},
	}
	var names []string
	for _, c := range sum.Comparisons {
		names = append(names, c.Name)
		var cols []string
		for _, col := range c.Columns {
			cols = append(cols, col.Name)
			if len(col.Rounds) != 2 {
				t.Errorf("%s/%s: %d rounds, want 2", c.Name, col.Name, len(col.Rounds))
			}
			for _, r := range col.Rounds {
				if r.Count == 0 || len(r.Errors) != 0 {
					t.Errorf("%s/%s round %d: %d operations, errors %v", c.Name, col.Name, r.Round, r.Count, r.Errors)
				}
				if c.Name != "bulk-durable" && r.Count != 8 {
					t.Errorf("%s/%s round %d: %d MiB moved, want 8", c.Name, col.Name, r.Round, r.Count)
				}
			}
			wrote := strings.HasPrefix(col.Name, "filewrite-") && c.Name != "bulk-get" && c.Name != "bulk-durable"
			if got := col.RSSAboveIdle != 0; got != wrote {
				t.Errorf("%s/%s: RSS above idle %d; measured: %v, want %v", c.Name, col.Name, col.RSSAboveIdle, got, wrote)
			}
		}
		if !slices.Equal(cols, want[c.Name]) {
			t.Errorf("%s: columns %q, want %q", c.Name, cols, want[c.Name])
		}
		if c.Failed {
			t.Errorf("%s failed", c.Name)
		}
	}
	if !slices.Equal(names, bulkNames) {
		t.Fatalf("comparisons %q, want %q", names, bulkNames)
	}
	for _, line := range []string{
		"goal: filewrite-put/dd >= 0.80x", "goal: filewrite-writer/dd >= 0.80x", "goal: filewrite-ranks/fio >= 0.90x",
		"goal: filewrite-get/fileserver >= 0.90x", "goal: filewrite-reader/fileserver >= 0.90x",
		"goal: filewrite-stream/fio-dsync >= 0.80x", "goal: the daemon's RSS < 256 MiB above idle",
	} {
		if !strings.Contains(text, line) {
			t.Errorf("output lacks %q:\n%s", line, text)
		}
	}
}
