package main

import (
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// printTable prints a comparison in fio's terms: iops, bw and the "clat
// percentiles (usec)" block, one column per configuration and one per
// ratio. Figures are medians over the rounds; an IOPS ratio is the median
// of the per-round ratios, a latency ratio the ratio of the median
// percentiles (below 1 means the numerator is faster).
func printTable(w io.Writer, res *comparisonResult, columns []string) {
	rows, row := tableRows(res, columns)
	row("iops", func(c *columnSummary) string { return strconv.FormatFloat(c.IOPS, 'f', 0, 64) },
		func(r *ratioSummary) string { return fmt.Sprintf("%.2fx", r.IOPS) })
	if res.BS > 0 {
		row("bw (KiB/s)", func(c *columnSummary) string { return strconv.FormatFloat(c.Bandwidth/1024, 'f', 0, 64) },
			func(r *ratioSummary) string { return fmt.Sprintf("%.2fx", r.IOPS) })
	}
	row("iops by round", roundCells(func(iops float64) string { return strconv.FormatFloat(iops, 'f', 0, 64) }), roundRatios)
	row("errors", errorCells, nil)
	usec := func(v float64) string { return dashIfZero(v, 1) }
	for _, c := range res.Columns {
		if c.SyncsPerOp > 0 {
			row("syncs/op (daemon's count)", func(c *columnSummary) string { return strconv.FormatFloat(c.SyncsPerOp, 'f', 3, 64) }, nil)
			break
		}
	}
	if slices.ContainsFunc(res.Columns, func(c columnSummary) bool { return c.SpansPerOp > 0 }) {
		row("spans/op exported (sink's count)", func(c *columnSummary) string { return strconv.FormatFloat(c.SpansPerOp, 'f', 3, 64) }, nil)
	}
	row("cpu/op daemon (usec)", func(c *columnSummary) string { return usec(c.CPU.ServerUS) }, nil)
	if slices.ContainsFunc(res.Columns, func(c columnSummary) bool { return c.CPU.ServerAllocs > 0 }) {
		row("allocs/op daemon", func(c *columnSummary) string { return usec(c.CPU.ServerAllocs) }, nil)
	}
	if slices.ContainsFunc(res.Columns, func(c columnSummary) bool { return c.CPU.ServerSwitches > 0 }) {
		row("ctx switches/op daemon", func(c *columnSummary) string {
			if c.CPU.ServerSwitches == 0 {
				return "-"
			}
			return strconv.FormatFloat(c.CPU.ServerSwitches, 'f', 2, 64)
		}, nil)
	}
	row("cpu/op harness (usec)", func(c *columnSummary) string { return usec(c.CPU.ClientUS) }, nil)
	loadRows(res, row)
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

	conns := "one connection each"
	switch {
	case res.Connections == 1:
		conns = "one connection"
	case res.Connections > 0 && res.Connections < res.Clients:
		conns = fmt.Sprintf("%d connections", res.Connections)
	}
	fmt.Fprintf(w, "   %d clients (%s), %s per run, %d rounds alternating; medians over rounds\n",
		res.Clients, conns, res.Duration, res.Rounds)
	printRows(w, *rows)
	printErrors(w, res)
}

// roundRatios is a ratio's value in each round.
func roundRatios(r *ratioSummary) string {
	var s []string
	for _, x := range r.IOPSPerRound {
		s = append(s, fmt.Sprintf("%.2f", x))
	}
	return strings.Join(s, " ")
}

// tableRows starts a comparison's table, a column per configuration
// (named columns) and one per ratio, and returns its rows and the function
// that adds one: a label, a cell per column, and a cell per ratio (empty
// where perRatio is nil).
func tableRows(res *comparisonResult, columns []string) (*[][]string, tableRow) {
	header := append([]string{""}, columns...)
	for _, r := range res.Ratios {
		header = append(header, r.Name)
	}
	rows := [][]string{header}
	return &rows, func(label string, perColumn func(c *columnSummary) string, perRatio func(r *ratioSummary) string) {
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
}

// tableRow adds a row to a table (tableRows).
type tableRow = func(label string, perColumn func(c *columnSummary) string, perRatio func(r *ratioSummary) string)

// roundCells is a column's cell of each round's figure, format(the
// round's IOPS), for a row "… by round".
func roundCells(format func(iops float64) string) func(*columnSummary) string {
	return func(c *columnSummary) string {
		var s []string
		for _, r := range c.Rounds {
			s = append(s, format(r.IOPS))
		}
		return strings.Join(s, " ")
	}
}

// errorCells is a column's cell of the row "errors".
func errorCells(c *columnSummary) string { return strconv.Itoa(c.Errors) }

// dashIfZero is v with prec decimals, or "-" where nothing was measured.
func dashIfZero(v float64, prec int) string {
	if v == 0 {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}

// loadRows adds the rows of what else the machine did during the runs:
// the other load beside each ratio, and how busy all of it was.
func loadRows(res *comparisonResult, row tableRow) {
	row("other load (cpus)", func(c *columnSummary) string { return strconv.FormatFloat(c.CPU.OtherCores, 'f', 2, 64) },
		func(r *ratioSummary) string { return ratioOtherLoad(res, r) })
	row(fmt.Sprintf("busy, all (cpus of %d)", runtime.NumCPU()), func(c *columnSummary) string {
		return strconv.FormatFloat(c.CPU.BusyCores, 'f', 2, 64)
	}, nil)
}

// ratioOtherLoad is the other load of a ratio's two columns, numerator
// first ("0.05 / 0.12"), printed beside the ratio: a ratio taken while one
// side shared the machine with more than the other is not the same
// ratio.
func ratioOtherLoad(res *comparisonResult, r *ratioSummary) string {
	num, den, _ := strings.Cut(r.Name, "/")
	load := map[string]string{}
	for _, c := range res.Columns {
		load[c.Name] = strconv.FormatFloat(c.CPU.OtherCores, 'f', 2, 64)
	}
	if load[num] == "" || load[den] == "" {
		return ""
	}
	return load[num] + " / " + load[den]
}

// printFilesTable prints the files comparison one row per configuration:
// throughput and p99 (medians over rounds), the ratio to the one-file row
// of the same transport (median of the per-round ratios, each to a
// one-file run made just before the row's: comparison.paired), and what the
// daemon held when the runs ended (the largest over rounds): resident
// memory, the memory per file above the one-file row's, descriptors, open
// files and extent-cache entries; then reopens per second and the share of
// them that took their extent map from the cache. The memory per file
// leaves out file pages (RssFile): the page cache of files written through
// a mapping counts in the resident set, but is the files' cache, which the
// kernel reclaims, not the daemon's memory; it has its own column.
func printFilesTable(w io.Writer, res *comparisonResult) {
	ratios := map[string]float64{}
	for _, r := range res.Ratios {
		ratios[r.Name] = r.IOPS
	}
	type stats struct {
		rss, peak     int64
		filePages     int64
		fds           int
		open, entries int64
		opens, hits   int64
		elapsed       float64
	}
	collect := func(c *columnSummary) stats {
		var st stats
		for _, r := range c.Rounds {
			d := r.Daemon
			if d == nil {
				continue
			}
			st.rss, st.peak, st.fds = max(st.rss, d.RSS), max(st.peak, d.PeakRSS), max(st.fds, d.FDs)
			st.filePages = max(st.filePages, d.RSSFile)
			st.open, st.entries = d.OpenFiles, d.CacheEntries
			st.opens += d.Opens
			st.hits += d.CacheHits
			st.elapsed += r.ElapsedSec
		}
		return st
	}
	base := map[string]int64{} // the one-file row's RSS without file pages, by transport
	for i := range res.Columns {
		if strings.TrimSuffix(res.Columns[i].Name, streamSuffix) == oneFileRow {
			st := collect(&res.Columns[i])
			base[res.Columns[i].Transport] = st.rss - st.filePages
		}
	}
	rows := [][]string{{"files", "iops", "vs 1-file", "p99 (usec)", "rss (MiB)", "peak (MiB)", "file pages (MiB)", "rss/file (B)",
		"fds", "open", "cached", "reopens/s", "cache hits", "errors", "other load"}}
	mib := func(b int64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) }
	for i := range res.Columns {
		c := &res.Columns[i]
		row, transport := strings.TrimSuffix(c.Name, streamSuffix), c.Transport
		st := collect(c)
		vs, perFile, reopens, hits := "1.00x", "-", "-", "-"
		if row != oneFileRow {
			one := oneFileRow
			if transport == transportStream {
				one += streamSuffix
			}
			vs = fmt.Sprintf("%.2fx", ratios[c.Name+"/"+one])
			if n := rowFiles(row); n > 1 && st.rss > 0 && base[transport] > 0 {
				perFile = strconv.FormatInt((st.rss-st.filePages-base[transport])/int64(n-1), 10)
			}
		}
		if st.elapsed > 0 {
			reopens = strconv.FormatFloat(float64(st.opens)/st.elapsed, 'f', 0, 64)
		}
		if st.opens > 0 {
			hits = fmt.Sprintf("%.0f%%", 100*float64(st.hits)/float64(st.opens))
		}
		p99 := "-"
		for _, p := range c.Clat {
			if p.Percentile == 99 {
				p99 = strconv.FormatFloat(p.Usec, 'f', 0, 64)
			}
		}
		rows = append(rows, []string{c.Name, strconv.FormatFloat(c.IOPS, 'f', 0, 64), vs, p99, mib(st.rss), mib(st.peak), mib(st.filePages), perFile,
			strconv.Itoa(st.fds), strconv.FormatInt(st.open, 10), strconv.FormatInt(st.entries, 10), reopens, hits,
			strconv.Itoa(c.Errors), strconv.FormatFloat(c.CPU.OtherCores, 'f', 2, 64)})
	}
	fmt.Fprintf(w, "   %d clients, %s per run, %d rounds alternating; iops and p99 are medians over rounds, memory and descriptors the most after any run;\n"+
		"   vs 1-file: the median over rounds of the ratio to a one-file run of the same transport made just before\n",
		res.Clients, res.Duration, res.Rounds)
	printRows(w, rows)
	printErrors(w, res)
}

// rowFiles is the file count a files row's name starts with (1k-open1024
// is 1000), 1 for the one-file row.
func rowFiles(row string) int {
	if row == oneFileRow {
		return 1
	}
	name, _, _ := strings.Cut(row, "-")
	mult := 1
	if strings.HasSuffix(name, "k") {
		name, mult = strings.TrimSuffix(name, "k"), 1000
	}
	n, _ := strconv.Atoi(name)
	return n * mult
}

// printCreateTable prints files-create: files made per second and p99
// (medians over rounds), the fsyncs of directories and of files per file
// made, and how many first syncs one fsync of a directory covered (each
// summed over rounds).
func printCreateTable(w io.Writer, res *comparisonResult) {
	ratios := map[string]float64{}
	for _, r := range res.Ratios {
		ratios[strings.SplitN(r.Name, "/", 2)[0]] = r.IOPS
	}
	rows := [][]string{{"fsync", "files/s", "p99 (usec)", "dir fsyncs/file", "callers/dir fsync", "file syncs/file", "vs per-call", "errors", "other load"}}
	for i := range res.Columns {
		c := &res.Columns[i]
		var made, dirSyncs, callers, fileSyncs int64
		for _, r := range c.Rounds {
			made += int64(r.Count)
			if d := r.Daemon; d != nil {
				dirSyncs += d.DirSyncs
				callers += d.DirSyncCallers
				fileSyncs += d.FileSyncs
			}
		}
		per := func(n, of int64) string {
			if of == 0 {
				return "-"
			}
			return strconv.FormatFloat(float64(n)/float64(of), 'f', 2, 64)
		}
		p99 := "-"
		for _, p := range c.Clat {
			if p.Percentile == 99 {
				p99 = strconv.FormatFloat(p.Usec, 'f', 0, 64)
			}
		}
		vs := "-"
		if r, ok := ratios[c.Name]; ok {
			vs = fmt.Sprintf("%.2fx", r)
		}
		rows = append(rows, []string{c.Name, strconv.FormatFloat(c.IOPS, 'f', 0, 64), p99, per(dirSyncs, made), per(callers, dirSyncs),
			per(fileSyncs, made), vs, strconv.Itoa(c.Errors), strconv.FormatFloat(c.CPU.OtherCores, 'f', 2, 64)})
	}
	fmt.Fprintf(w, "   %d clients, %d rounds alternating, each making its files in new directories; files/s and p99 are medians over rounds\n",
		res.Clients, res.Rounds)
	printRows(w, rows)
	printErrors(w, res)
}

// printRows prints rows as columns padded to their widest cell, the first
// left-aligned and the rest right-aligned.
func printRows(w io.Writer, rows [][]string) {
	var widths []int
	for _, cells := range rows {
		for i, c := range cells {
			if i == len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], len(c))
		}
	}
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
}

// printErrors lists the errors of every column, summed over rounds.
func printErrors(w io.Writer, res *comparisonResult) {
	for _, c := range res.Columns {
		for msg, n := range c.errorsByMsg {
			fmt.Fprintf(w, "   ERROR %s: %d× %s\n", c.Name, n, msg)
		}
	}
}
