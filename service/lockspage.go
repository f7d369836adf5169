package service

import (
	"crypto/sha256"
	"encoding/base64"
	"html/template"
	"math"
	"strings"
	"time"

	"github.com/filewrite/filewrite/internal/bytesize"
	"github.com/filewrite/filewrite/store"
)

// The HTML face of /debug/locks: the report as a table that a browser
// keeps fresh. Its script fetches the same page (?format=html) every
// second and swaps the table for the new one, so that there is one
// renderer, this template, whether a script runs or not; without
// JavaScript the page is the same table, refreshed by reloading it.

// locksScript refreshes the page's #locks element in place, every second,
// from a fresh copy of the page; it says in #refresh that it does, or why
// a refresh failed (it keeps trying). The fetched page is parsed inert
// (DOMParser runs no script), and only its #locks element is taken.
const locksScript = `
"use strict";
(function () {
  var note = document.getElementById("refresh");
  var url = new URL(location.href);
  url.searchParams.set("format", "html");
  var pending = false;
  note.textContent = "Refreshes every second.";
  setInterval(function () {
    if (pending) {
      return;
    }
    pending = true;
    fetch(url, {cache: "no-store", credentials: "same-origin"})
      .then(function (r) {
        if (!r.ok) {
          throw new Error("HTTP " + r.status);
        }
        return r.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("locks");
        if (!fresh) {
          throw new Error("no table in the answer");
        }
        document.getElementById("locks").replaceWith(fresh);
        note.textContent = "Refreshes every second.";
      })
      .catch(function (e) {
        note.textContent = "Refresh failed (" + e.message + "); trying again every second.";
      })
      .finally(function () {
        pending = false;
      });
  }, 1000);
})();
`

const locksStyle = `
body { font-family: sans-serif; margin: 1em; }
table { border-collapse: collapse; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; vertical-align: top; }
td.n { text-align: right; }
td.waiting { background: #fff3cd; }
code { font-size: 90%; }
#refresh { color: #555; }
`

// locksPagePolicy is the page's Content-Security-Policy: its own script
// and style (by hash), fetches to its own origin, nothing else.
var locksPagePolicy = "default-src 'none'; script-src " + cspHash(locksScript) + "; style-src " + cspHash(locksStyle) +
	"; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// cspHash is the CSP source that allows an inline element whose text is s.
func cspHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
}

// locksPageData is what the page is made from: the report, and where a
// trace id links to.
type locksPageData struct {
	locksReport
	traceURL string // --trace-url-template; "" for no links
}

// lockerView is one holder or waiter as the page shows it.
type lockerView struct {
	store.HolderInfo
	// For is how long it has held the lock, or waited for it.
	For string
	// URL is its trace in the viewer --trace-url-template names; "" for
	// none.
	URL string
}

// Locker describes a holder or waiter for the page.
func (d locksPageData) Locker(h store.HolderInfo) lockerView {
	return lockerView{HolderInfo: h, For: humanDuration(d.Time.Sub(h.Since)), URL: traceURL(d.traceURL, h.TraceID, h.SpanID)}
}

// traceURL fills a --trace-url-template with a trace and span id; "" when
// there is no template or no trace.
func traceURL(template, traceID, spanID string) string {
	if template == "" || traceID == "" {
		return ""
	}
	return strings.NewReplacer("{trace_id}", traceID, "{span_id}", spanID).Replace(template)
}

// humanDuration is d for a person to read at a glance: three significant
// digits ("1.23ms", "45.6µs", "2.5s"), whole seconds from a minute on
// ("1m23s"), and "0s" for a time not yet reached (a clock step).
func humanDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d >= time.Minute:
		return d.Round(time.Second).String()
	}
	digits := int(math.Floor(math.Log10(float64(d)))) + 1
	if digits <= 3 {
		return d.String()
	}
	return d.Round(time.Duration(math.Pow10(digits - 3))).String()
}

var locksPage = template.Must(template.New("locks").Funcs(template.FuncMap{
	"size": bytesize.Human,
	"sub":  func(a, b int) int { return a - b },
}).Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>filewrite locks</title>
<style>` + locksStyle + `</style></head>
<body>
<h1>filewrite: inode locks</h1>
<p><span id="refresh">Reload to refresh.</span> <a href="?format=json">As JSON</a>.</p>
<div id="locks">
<p>{{.Time.Format "2006-01-02 15:04:05.000 MST"}}: {{.OpenFiles}} open files, {{.Shown}} listed{{if .Note}} ({{.Note}}){{end}}. Busy files first.</p>
<table>
<thead><tr><th>path</th><th>size</th><th>in flight</th><th>appending</th><th>holders: mode, operation (reason), held for, trace / span</th><th>waiting: how many; mode, operation (reason), waited for, trace / span</th></tr></thead>
<tbody>
{{- range .Files}}
<tr><td><code>{{.Path}}</code></td><td class="n" title="{{.Size}} bytes">{{size .Size}}</td><td class="n">{{.Inflight}}</td><td class="n">{{.Appending}}</td>
<td>{{range .Holders}}{{template "locker" $.Locker .}}<br>{{end}}</td>
{{- if .Waiting}}
<td class="waiting"><b>{{.Waiting}}</b>{{range .Waiters}}<br>{{template "locker" $.Locker .}}{{end}}{{if gt .Waiting (len .Waiters)}}<br>and {{sub .Waiting (len .Waiters)}} more{{end}}</td>
{{- else}}
<td></td>
{{- end}}</tr>
{{- end}}
</tbody>
</table>
</div>
<script>` + locksScript + `</script>
</body></html>
{{define "locker"}}{{.Mode}} {{.Op}} ({{.Reason}}) for {{.For}}{{if .TraceID}} {{if .URL}}<a href="{{.URL}}"><code>{{.TraceID}}</code></a>{{else}}<code>{{.TraceID}}</code>{{end}} / <code>{{.SpanID}}</code>{{end}}{{end}}
`))
