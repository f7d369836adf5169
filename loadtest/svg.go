package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// palette colours the columns in order: the "before" first.
var palette = []string{"#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"}

// svgDoc accumulates a hand-written SVG: the chart needs bars, lines, text
// and a log axis, nothing a plotting library would be worth a dependency
// for.
type svgDoc struct {
	b bytes.Buffer
}

func (d *svgDoc) f(format string, args ...any) {
	fmt.Fprintf(&d.b, format, args...)
	d.b.WriteByte('\n')
}

func (d *svgDoc) text(x, y float64, size int, anchor, fill, s string, extra ...string) {
	var esc bytes.Buffer
	xml.EscapeText(&esc, []byte(s))
	d.f(`<text x="%.1f" y="%.1f" font-size="%d" text-anchor="%s" fill="%s" %s>%s</text>`,
		x, y, size, anchor, fill, strings.Join(extra, " "), esc.String())
}

// niceStep is a round step (1, 2 or 5 times a power of ten) that cuts
// [0, top] into about n intervals.
func niceStep(top float64, n int) float64 {
	if top <= 0 {
		return 1
	}
	raw := top / float64(n)
	pow := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*pow >= raw {
			return m * pow
		}
	}
	return 10 * pow
}

// formatCount prints a count compactly: 950, 12.3k, 1.2M.
func formatCount(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

// comparisonChart draws a comparison: IOPS bars on the left (the median,
// each round a dot), the fio percentiles of completion latency on the
// right (one curve per configuration, log scale), and the ratios below.
func comparisonChart(res *comparisonResult) []byte {
	var footer []string
	for _, r := range res.Ratios {
		line := fmt.Sprintf("%s: IOPS %.2fx", r.Name, r.IOPS)
		for _, p := range r.Clat {
			if p.Percentile == 50 || p.Percentile == 99 || p.Percentile == 99.99 {
				line += fmt.Sprintf(", p%g latency %.2fx", p.Percentile, p.Usec)
			}
		}
		footer = append(footer, line)
	}
	subtitle := fmt.Sprintf("%d clients, %s per run, %d rounds alternating; figures are medians over rounds", res.Clients, res.Duration, res.Rounds)
	return chart(res.Name+": "+res.Title, subtitle, "IOPS (bar: median, dots: rounds)", res.Columns, footer, res.Failed)
}

// chart draws bars of each column's IOPS and its latency percentile curve,
// with footer lines of text below.
func chart(title, subtitle, barsTitle string, columns []columnSummary, footer []string, failed bool) []byte {
	const width, height = 980.0, 470.0
	d := &svgDoc{}
	d.f(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="DejaVu Sans, Arial, sans-serif">`, width, height, width, height)
	d.f(`<rect width="100%%" height="100%%" fill="white"/>`)
	d.text(20, 28, 16, "start", "#000", title, `font-weight="bold"`)
	d.text(20, 48, 12, "start", "#444", subtitle)

	// Left panel: IOPS.
	const lx0, lx1, ly0, ly1 = 80.0, 380.0, 90.0, 380.0
	top := 0.0
	for _, c := range columns {
		top = math.Max(top, c.IOPS)
		for _, r := range c.Rounds {
			top = math.Max(top, r.IOPS)
		}
	}
	step := niceStep(top*1.1, 5)
	ymax := math.Ceil(top*1.1/step) * step
	if ymax <= 0 {
		ymax = 1
	}
	yOf := func(v float64) float64 { return ly1 - v/ymax*(ly1-ly0) }
	d.text((lx0+lx1)/2, ly0-18, 13, "middle", "#000", barsTitle)
	for v := 0.0; v <= ymax+step/2; v += step {
		y := yOf(v)
		d.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`, lx0, y, lx1, y)
		d.text(lx0-6, y+4, 11, "end", "#444", formatCount(v))
	}
	slot := (lx1 - lx0) / float64(len(columns))
	for i, c := range columns {
		color := palette[i%len(palette)]
		cx := lx0 + slot*(float64(i)+0.5)
		bw := slot * 0.55
		d.f(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" fill-opacity="0.8"/>`,
			cx-bw/2, yOf(c.IOPS), bw, ly1-yOf(c.IOPS), color)
		labelAt := c.IOPS
		for j, r := range c.Rounds {
			dx := (float64(j) - float64(len(c.Rounds)-1)/2) * 8
			d.f(`<circle cx="%.1f" cy="%.1f" r="3" fill="white" stroke="#000"/>`, cx+dx, yOf(r.IOPS))
			labelAt = math.Max(labelAt, r.IOPS)
		}
		d.text(cx, yOf(labelAt)-8, 12, "middle", "#000", formatCount(c.IOPS), `font-weight="bold"`)
		if len(columns) > 3 { // narrow slots: slant the names
			d.text(cx+4, ly1+14, 11, "end", "#000", c.Name, fmt.Sprintf(`transform="rotate(-30 %.1f %.1f)"`, cx+4, ly1+14))
		} else {
			d.text(cx, ly1+18, 12, "middle", "#000", c.Name)
		}
	}
	d.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000"/>`, lx0, ly1, lx1, ly1)
	d.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000"/>`, lx0, ly0, lx0, ly1)

	// Right panel: latency percentiles, log scale.
	const rx0, rx1, ry0, ry1 = 500.0, 950.0, 90.0, 380.0
	lo, hi := math.Inf(1), 0.0
	for _, c := range columns {
		for _, p := range c.Clat {
			if p.Usec > 0 {
				lo, hi = math.Min(lo, p.Usec), math.Max(hi, p.Usec)
			}
		}
	}
	if hi == 0 {
		lo, hi = 1, 10
	}
	dlo, dhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if dhi <= dlo {
		dhi = dlo + 1
	}
	ly := func(us float64) float64 {
		return ry1 - (math.Log10(math.Max(us, math.Pow(10, dlo)))-dlo)/(dhi-dlo)*(ry1-ry0)
	}
	d.text((rx0+rx1)/2, ry0-18, 13, "middle", "#000", "completion latency percentiles (usec, log scale)")
	for dec := dlo; dec <= dhi; dec++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, dec)
			if v > math.Pow(10, dhi) {
				break
			}
			y := ly(v)
			stroke := "#eee"
			if m == 1 {
				stroke = "#ccc"
			}
			d.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`, rx0, y, rx1, y, stroke)
			d.text(rx0-6, y+4, 11, "end", "#444", formatCount(v))
		}
	}
	xOf := func(i int) float64 { return rx0 + 10 + float64(i)*(rx1-rx0-20)/float64(len(fioPercentiles)-1) }
	for i, p := range fioPercentiles {
		x := xOf(i)
		d.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#f4f4f4"/>`, x, ry0, x, ry1)
		label := fmt.Sprintf("%g", p)
		d.text(x, ry1+14, 10, "end", "#444", label, fmt.Sprintf(`transform="rotate(-45 %.1f %.1f)"`, x, ry1+14))
	}
	d.text((rx0+rx1)/2, ry1+44, 11, "middle", "#444", "percentile")
	d.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000"/>`, rx0, ry1, rx1, ry1)
	d.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000"/>`, rx0, ry0, rx0, ry1)
	for i, c := range columns {
		color := palette[i%len(palette)]
		var pts []string
		for j, p := range c.Clat {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(j), ly(p.Usec)))
		}
		d.f(`<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`, strings.Join(pts, " "), color)
		for j, p := range c.Clat {
			d.f(`<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>`, xOf(j), ly(p.Usec), color)
		}
		// Legend, top left of the panel where the curves are lowest.
		y := ry0 + 14 + float64(i)*16
		d.f(`<rect x="%.1f" y="%.1f" width="14" height="4" fill="%s"/>`, rx0+12, y-5, color)
		d.text(rx0+32, y, 12, "start", "#000", c.Name)
	}

	y := height - 12 - 18*float64(len(footer)-1)
	for _, line := range footer {
		d.text(20, y, 13, "start", "#000", line)
		y += 18
	}
	if failed {
		d.text(width-20, 28, 14, "end", "#d62728", "RUNS HAD ERRORS: see summary.json", `font-weight="bold"`)
	}
	d.f(`</svg>`)
	return d.b.Bytes()
}

// writeChart writes the comparison's chart to -out as NAME.svg and returns
// its path relative to -out.
func (e *env) writeChart(res *comparisonResult) (string, error) {
	name := res.Name + ".svg"
	return name, os.WriteFile(filepath.Join(e.opts.out, name), comparisonChart(res), 0o644)
}

// soakChart draws the soak: each operation's rate and latency percentiles,
// and the daemon's memory and the verdict below.
func soakChart(r *soakResult) []byte {
	elapsed := float64(r.Total) / max(r.OpsPerSec, 1e-9)
	var cols []columnSummary
	for _, op := range r.Ops {
		if op.Op == "final-check" {
			continue
		}
		cols = append(cols, columnSummary{Name: op.Op, IOPS: float64(op.Count) / elapsed, Clat: op.Clat})
	}
	var footer []string
	if r.MemoryStart != nil && r.MemoryEnd != nil {
		footer = append(footer, fmt.Sprintf("daemon memory: start VmHWM %s, VmRSS %s; end VmHWM %s, VmRSS %s",
			mib(r.MemoryStart.PeakRSS), mib(r.MemoryStart.RSS), mib(r.MemoryEnd.PeakRSS), mib(r.MemoryEnd.RSS)))
	}
	verdict := "PASS"
	if !r.Passed {
		verdict = "FAIL"
	}
	footer = append(footer, fmt.Sprintf("%s: %d ops, %d expected errors, %d unexpected; %d/%d files equal to the model (%s); daemon %s",
		verdict, r.Total, r.ExpectedErrors, r.Unexpected, r.VerifiedFiles, r.Files, mib(r.VerifiedBytes), r.DaemonExit))
	title := fmt.Sprintf("soak: %d clients, mixed operations on %d files", r.Clients, r.Files)
	subtitle := fmt.Sprintf("%s; every client owns its bytes, so every read and the final content are checked against a model", r.Duration)
	return chart(title, subtitle, "operations per second", cols, footer, !r.Passed)
}
