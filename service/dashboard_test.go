package service

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
)

// dashboardPath is the Grafana dashboard docker-compose.yml provisions.
const dashboardPath = "../deploy/grafana/dashboards/filewrite.json"

// dashboard is the part of a Grafana dashboard's JSON the test reads.
type dashboard struct {
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr     string `json:"expr"`
			Exemplar bool   `json:"exemplar"`
		} `json:"targets"`
	} `json:"panels"`
}

// PromQL's words that are not metric names, besides function names (which
// a '(' follows) and Grafana's $variables.
var promqlKeywords = []string{"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset", "inf", "nan"}

var (
	promqlStrings   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promqlMatchers  = regexp.MustCompile(`\{[^}]*\}`)
	promqlRanges    = regexp.MustCompile(`\[[^\]]*\]`)
	promqlGroupings = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	// A number or duration (0.99, 1h) first, so that its letters are
	// not taken for a word.
	promqlWords = regexp.MustCompile(`[0-9][0-9a-zA-Z_.]*|\$?[a-zA-Z_:][a-zA-Z0-9_:]*\s*\(?`)
)

// metricNames returns the metric names a PromQL expression selects: its
// words once strings, label matchers, ranges and grouping labels are gone,
// but for functions, keywords and Grafana's variables.
func metricNames(expr string) []string {
	for _, re := range []*regexp.Regexp{promqlStrings, promqlMatchers, promqlRanges, promqlGroupings} {
		expr = re.ReplaceAllString(expr, " ")
	}
	var names []string
	for _, w := range promqlWords.FindAllString(expr, -1) {
		w = strings.TrimSpace(w)
		if w[0] == '$' || (w[0] >= '0' && w[0] <= '9') || strings.HasSuffix(w, "(") || slices.Contains(promqlKeywords, strings.ToLower(w)) {
			continue
		}
		names = append(names, w)
	}
	return names
}

func TestMetricNames(t *testing.T) {
	for _, tt := range []struct {
		expr string
		want []string
	}{
		{`filewrite_open_files`, []string{"filewrite_open_files"}},
		{`histogram_quantile(0.99, sum by (le, filewrite_wait) (rate(filewrite_lock_wait_duration_seconds_bucket{filewrite_wait="lock", x=~"a|b"}[$__rate_interval])))`,
			[]string{"filewrite_lock_wait_duration_seconds_bucket"}},
		{`sum without (instance) (rate(a_total[5m])) / on (job) group_left (version) b > bool 0 or c offset 1h`, []string{"a_total", "b", "c"}},
		{`label_replace(up, "dst", "$1", "src", "(.*)")`, []string{"up"}},
		{`count(nothing_here{}) by (le)`, []string{"nothing_here"}},
	} {
		if got := metricNames(tt.expr); !slices.Equal(got, tt.want) {
			t.Errorf("metricNames(%q) = %q, want %q", tt.expr, got, tt.want)
		}
	}
}

// exportedNames are the series names a daemon's /metrics can have: each
// family's name, and a histogram's _bucket, _count and _sum.
func exportedNames(fams map[string]*dto.MetricFamily) map[string]bool {
	names := map[string]bool{}
	for name, f := range fams {
		names[name] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, suffix := range []string{"_bucket", "_count", "_sum"} {
				names[name+suffix] = true
			}
		}
	}
	return names
}

// TestDashboardQueriesExportedMetrics: every query of the Grafana
// dashboard names metrics that a daemon exports (one that has served a
// Write, so that the RPC metrics exist), every panel queries something,
// and the lock-wait and RPC-duration panels ask for exemplars. With
// promtool at hand, every query also parses as PromQL.
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var dash dashboard
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	if len(dash.Panels) == 0 {
		t.Fatalf("%s has no panels", dashboardPath)
	}
	d := startDaemon(t, nil)
	if _, err := d.client.Write(testContext(t), &filewritev1.WriteRequest{Path: "f", Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	// The server records an RPC's duration at its end, which may come
	// just after the client has the reply: wait for the Write's record.
	var exported map[string]bool
	testutil.WaitFor(t, "the Write's rpc_server_call_duration_seconds on /metrics", func() bool {
		exported = exportedNames(d.scrape(t))
		return exported["rpc_server_call_duration_seconds_count"]
	})
	var exprs []string
	exemplars := map[string]bool{}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			names := metricNames(q.Expr)
			if len(names) == 0 {
				t.Errorf("panel %q: query %q names no metric", p.Title, q.Expr)
			}
			for _, n := range names {
				if !exported[n] {
					t.Errorf("panel %q: query %q names %s, which the daemon does not export", p.Title, q.Expr, n)
				}
				exemplars[n] = exemplars[n] || q.Exemplar
			}
			exprs = append(exprs, q.Expr)
		}
	}
	for _, n := range []string{"filewrite_lock_wait_duration_seconds_bucket", "rpc_server_call_duration_seconds_bucket"} {
		if !exemplars[n] {
			t.Errorf("no panel shows the exemplars of %s", n)
		}
	}
	checkPromQL(t, exprs)
}

// checkPromQL has promtool parse each expression, as the expression of a
// recording rule, with Grafana's interval variables filled in; without
// promtool it checks nothing.
func checkPromQL(t *testing.T, exprs []string) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool is not installed (apt-get install prometheus): the queries' syntax is not checked")
		return
	}
	grafanaVars := strings.NewReplacer("$__rate_interval", "1m", "$__interval", "1m", "$__range", "1h")
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range exprs {
		q, _ := json.Marshal(grafanaVars.Replace(e)) // a JSON string is a YAML string
		fmt.Fprintf(&rules, "      - record: dashboard:query%d\n        expr: %s\n", i, q)
	}
	path := filepath.Join(t.TempDir(), "rules.yml")
	if err := os.WriteFile(path, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules of the dashboard's queries: %v\n%s\n%s", err, out, rules.String())
	}
}
