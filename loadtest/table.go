package main

import (
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
)

// printTable prints a comparison in fio's terms: iops, bw and the "clat
// percentiles (usec)" block, one column per configuration and one per
// ratio. Figures are medians over the rounds; an IOPS ratio is the median
// of the per-round ratios, a latency ratio the ratio of the median
// percentiles (below 1 means the numerator is faster).
func printTable(w io.Writer, res *comparisonResult, columns []string) {
	header := []string{""}
	header = append(header, columns...)
	for _, r := range res.Ratios {
		header = append(header, r.Name)
	}
	rows := [][]string{header}
	row := func(label string, perColumn func(c *columnSummary) string, perRatio func(r *ratioSummary) string) {
		cells := []string{label}
		for i := range res.Columns {
			cells = append(cells, perColumn(&res.Columns[i]))
		}
		for i := range res.Ratios {
			cell := ""
			if perRatio != nil {
				cell = perRatio(&res.Ratios[i])
			}
			cells = append(cells, cell)
		}
		rows = append(rows, cells)
	}
	row("iops", func(c *columnSummary) string { return strconv.FormatFloat(c.IOPS, 'f', 0, 64) },
		func(r *ratioSummary) string { return fmt.Sprintf("%.2fx", r.IOPS) })
	if res.BS > 0 {
		row("bw (KiB/s)", func(c *columnSummary) string { return strconv.FormatFloat(c.Bandwidth/1024, 'f', 0, 64) },
			func(r *ratioSummary) string { return fmt.Sprintf("%.2fx", r.IOPS) })
	}
	row("iops by round", func(c *columnSummary) string {
		var s []string
		for _, r := range c.Rounds {
			s = append(s, strconv.FormatFloat(r.IOPS, 'f', 0, 64))
		}
		return strings.Join(s, " ")
	}, func(r *ratioSummary) string {
		var s []string
		for _, x := range r.IOPSPerRound {
			s = append(s, fmt.Sprintf("%.2f", x))
		}
		return strings.Join(s, " ")
	})
	row("errors", func(c *columnSummary) string { return strconv.Itoa(c.Errors) }, nil)
	usec := func(v float64) string {
		if v == 0 {
			return "-"
		}
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	for _, c := range res.Columns {
		if c.SyncsPerOp > 0 {
			row("syncs/op (daemon's count)", func(c *columnSummary) string { return strconv.FormatFloat(c.SyncsPerOp, 'f', 3, 64) }, nil)
			break
		}
	}
	row("cpu/op daemon (usec)", func(c *columnSummary) string { return usec(c.CPU.ServerUS) }, nil)
	row("cpu/op harness (usec)", func(c *columnSummary) string { return usec(c.CPU.ClientUS) }, nil)
	row("other load (cpus)", func(c *columnSummary) string { return strconv.FormatFloat(c.CPU.OtherCores, 'f', 2, 64) }, nil)
	row(fmt.Sprintf("busy, all (cpus of %d)", runtime.NumCPU()), func(c *columnSummary) string {
		return strconv.FormatFloat(c.CPU.BusyCores, 'f', 2, 64)
	}, nil)
	row("clat percentiles (usec):", func(*columnSummary) string { return "" }, nil)
	for i, p := range fioPercentiles {
		row(fmt.Sprintf(" | %5.2fth=", p),
			func(c *columnSummary) string { return fmt.Sprintf("[%6.0f]", c.Clat[i].Usec) },
			func(r *ratioSummary) string {
				if i < len(r.Clat) && r.Clat[i].Percentile == p {
					return fmt.Sprintf("%.2fx", r.Clat[i].Usec)
				}
				return "-"
			})
	}

	widths := make([]int, len(header))
	for _, cells := range rows {
		for i, c := range cells {
			widths[i] = max(widths[i], len(c))
		}
	}
	conns := "one connection each"
	if res.Connections > 0 && res.Connections < res.Clients {
		conns = fmt.Sprintf("%d connections", res.Connections)
	}
	fmt.Fprintf(w, "   %d clients (%s), %s per run, %d rounds alternating; medians over rounds\n",
		res.Clients, conns, res.Duration, res.Rounds)
	for _, cells := range rows {
		var b strings.Builder
		b.WriteString("   ")
		for i, c := range cells {
			if i == 0 {
				fmt.Fprintf(&b, "%-*s", widths[0], c)
			} else {
				fmt.Fprintf(&b, "   %*s", widths[i], c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	for _, c := range res.Columns {
		for msg, n := range c.errorsByMsg {
			fmt.Fprintf(w, "   ERROR %s: %d× %s\n", c.Name, n, msg)
		}
	}
}
