// Package bytesize reads and prints sizes in bytes as the command lines of
// the daemon and the load harness write them: "4096", "4k" or "4KiB", "64m"
// or "64MiB", up to "t"/"TiB". Every unit is a power of 1024, in either
// spelling and any case. "kB", "MB" and the like are refused, since half
// the world reads them as powers of 1000.
package bytesize

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// units from the largest, each with its shift and its IEC spelling.
var units = []struct {
	letter byte // the short spelling, lower case
	shift  uint
	iec    string
}{{'t', 40, "TiB"}, {'g', 30, "GiB"}, {'m', 20, "MiB"}, {'k', 10, "KiB"}}

// Parse reads a non-negative decimal integer with an optional unit: k, m,
// g or t (any case), or KiB, MiB, GiB or TiB (any case), all powers of 1024.
func Parse(s string) (int64, error) {
	num, shift := s, uint(0)
	lower := strings.ToLower(s)
	for _, u := range units {
		if suffix, ok := unitSuffix(lower, u.letter); ok {
			num, shift = s[:len(s)-len(suffix)], u.shift
			break
		}
	}
	// ParseInt would take a sign: only digits are a size.
	if num == "" || strings.TrimLeft(num, "0123456789") != "" {
		return 0, fmt.Errorf("size %q: want a non-negative integer, optionally followed by k, m, g or t (or KiB, MiB, GiB, TiB: powers of 1024)", s)
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n > math.MaxInt64>>shift {
		return 0, fmt.Errorf("size %q overflows int64", s)
	}
	return n << shift, nil
}

// unitSuffix reports which spelling of the unit with this letter s ends
// with: "k" or "kib" (s is lower case).
func unitSuffix(s string, letter byte) (string, bool) {
	for _, suffix := range []string{string(letter) + "ib", string(letter)} {
		if strings.HasSuffix(s, suffix) {
			return suffix, true
		}
	}
	return "", false
}

// Format is the inverse of Parse: n in the largest unit that divides it,
// spelled KiB, MiB, GiB or TiB, or plain bytes.
func Format(n int64) string {
	for _, u := range units {
		if n != 0 && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.iec
		}
	}
	return strconv.FormatInt(n, 10)
}

// Human is n for a person to read at a glance: plain bytes below 1 KiB,
// else in the largest unit it reaches (up to TiB) with three significant
// digits, trailing zeros dropped: "512 B", "1.5 KiB", "64 MiB", "123 GiB".
// Unlike Format, it rounds, and Parse does not read it back.
func Human(n int64) string {
	for _, u := range units {
		if n >= 1<<u.shift {
			v := float64(n) / float64(int64(1)<<u.shift)
			decimals := 0
			switch {
			case v < 10:
				decimals = 2
			case v < 100:
				decimals = 1
			}
			s := strconv.FormatFloat(v, 'f', decimals, 64)
			if decimals > 0 {
				s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
			}
			return s + " " + u.iec
		}
	}
	return strconv.FormatInt(n, 10) + " B"
}
