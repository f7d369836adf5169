package bytesize

import (
	"math"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int64
	}{
		{"0", 0},
		{"1536", 1536},
		{"4096", 4096},
		{"4k", 4 << 10},
		{"4K", 4 << 10},
		{"4KiB", 4 << 10},
		{"4kib", 4 << 10},
		{"64K", 64 << 10},
		{"1m", 1 << 20},
		{"64M", 64 << 20},
		{"64MiB", 64 << 20},
		{"2g", 2 << 30},
		{"3GiB", 3 << 30},
		{"1024GiB", 1 << 40},
		{"1t", 1 << 40},
		{"2TiB", 2 << 40},
		{"8388607TiB", 8388607 << 40}, // the largest whole number of TiB in an int64
		{"9223372036854775807", math.MaxInt64},
		{"007k", 7 << 10},
	} {
		got, err := Parse(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("Parse(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
}

func TestParseRejects(t *testing.T) {
	for _, in := range []string{
		"", "k", "KiB", "-1", "-4k", "+4k", " 4k", "4k ", "4 KiB", "4x", "1.5m", "0x10",
		"1PiB", "1p", // no unit past TiB
		// Decimal or ambiguous units: kB is 1000 bytes to some, 1024 to others.
		"16kb", "16kB", "64MB", "1GB", "4i", "4ib",
		// Overflow.
		"8388608TiB", "9223372036854775808", "9000000TiB",
	} {
		if got, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) = %d, want an error", in, got)
		}
	}
}

func TestFormat(t *testing.T) {
	for _, tt := range []struct {
		in   int64
		want string
	}{
		{0, "0"},
		{1, "1"},
		{1536, "1536"},
		{4096, "4KiB"},
		{1 << 10, "1KiB"},
		{64 << 20, "64MiB"},
		{3 << 30, "3GiB"},
		{1 << 40, "1TiB"},
		{1<<40 + 1<<30, "1025GiB"},
		{math.MaxInt64, "9223372036854775807"},
	} {
		got := Format(tt.in)
		if got != tt.want {
			t.Errorf("Format(%d) = %q, want %q", tt.in, got, tt.want)
		}
		if back, err := Parse(got); err != nil || back != tt.in {
			t.Errorf("Parse(Format(%d)) = %d, %v; want %d", tt.in, back, err, tt.in)
		}
	}
}

func TestHuman(t *testing.T) {
	for _, tt := range []struct {
		in   int64
		want string
	}{
		{0, "0 B"},
		{1023, "1023 B"},
		{1024, "1 KiB"},
		{1536, "1.5 KiB"},
		{4096 + 10, "4.01 KiB"},
		{64 << 20, "64 MiB"},
		{100<<20 - 1, "100 MiB"},
		{123456789, "118 MiB"},
		{3<<30 + 1<<29, "3.5 GiB"},
		{5 << 40, "5 TiB"},
		{math.MaxInt64, "8388608 TiB"},
	} {
		if got := Human(tt.in); got != tt.want {
			t.Errorf("Human(%d) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
