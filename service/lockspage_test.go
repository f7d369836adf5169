package service

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
)

func TestHumanDuration(t *testing.T) {
	for _, tt := range []struct {
		in   time.Duration
		want string
	}{
		{-time.Second, "0s"},
		{0, "0s"},
		{999, "999ns"},
		{1234, "1.23µs"},
		{45678, "45.7µs"},
		{1234567, "1.23ms"},
		{12345678, "12.3ms"},
		{999999999, "1s"},
		{2500 * time.Millisecond, "2.5s"},
		{59*time.Second + 940*time.Millisecond, "59.9s"},
		{83*time.Second + 600*time.Millisecond, "1m24s"},
		{2 * time.Hour, "2h0m0s"},
	} {
		if got := humanDuration(tt.in); got != tt.want {
			t.Errorf("humanDuration(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestCheckTraceURLTemplate(t *testing.T) {
	for _, tt := range []struct {
		template string
		ok       bool
	}{
		{"", true},
		{"http://jaeger:16686/trace/{trace_id}", true},
		{"https://grafana.example/explore?traceId={trace_id}&spanId={span_id}", true},
		{"http://jaeger:16686/trace/", false},          // no {trace_id}
		{"jaeger:16686/trace/{trace_id}", false},       // no scheme
		{"javascript:alert('{trace_id}')", false},      // not http
		{"http:///trace/{trace_id}", false},            // no host
		{"http://jaeger:port/trace/{trace_id}", false}, // not a URL
	} {
		if err := checkTraceURLTemplate(tt.template); (err == nil) != tt.ok {
			t.Errorf("checkTraceURLTemplate(%q) = %v, want ok %v", tt.template, err, tt.ok)
		}
	}
}

// contendedFile holds an extending write to path inside the store and
// queues waiters more writes behind it, and returns the gate that holds
// the first; open it to let them all go, then wait on done.
func contendedFile(t *testing.T, d *tracedDaemon, g *holdGate, path string, waiters int) (done func()) {
	t.Helper()
	ctx := testContext(t)
	errs := make(chan error, waiters+1)
	write := func(off int64) {
		_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: path, Offset: off, Data: make([]byte, 3<<19)})
		errs <- err
	}
	g.arm()
	// Before the daemon's shutdown (cleanups run last first), whatever
	// became of the test: a held write would hold it up.
	t.Cleanup(g.open)
	go write(0)
	<-g.arrived
	for i := range waiters {
		go write(int64(i+1) * 3 << 19)
	}
	testutil.WaitFor(t, "the writers to queue", func() bool { f, _ := d.getLocks(t).file(path); return f.Waiting == waiters })
	return func() {
		t.Helper()
		g.open()
		for range waiters + 1 {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
	}
}

// TestDebugLocksPage: the page shows a busy file's holder and each of its
// waiters with how long, links their trace ids to --trace-url-template,
// shows sizes for people, and allows nothing but its own script and style.
func TestDebugLocksPage(t *testing.T) {
	g := newHoldGate(t, "f")
	d := startTracedDaemon(t, func(c *Config) {
		c.Store.Hooks = g.hooks()
		c.TraceURLTemplate = "http://jaeger.test:16686/trace/{trace_id}?uiFind={span_id}"
	})
	ctx := testContext(t)
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "g", Data: make([]byte, 3<<19)}); err != nil {
		t.Fatal(err)
	}
	done := contendedFile(t, d, g, "f", 2)
	defer done()
	f, _ := d.getLocks(t).file("f")
	if len(f.Holders) != 1 || len(f.Waiters) != 2 {
		t.Fatalf("/debug/locks JSON: %d holders, %d waiters; want 1 and 2", len(f.Holders), len(f.Waiters))
	}
	r := testutil.DoHTTP(t, http.MethodGet, d.url+"/debug/locks", nil, map[string]string{"Accept": "text/html"})
	if r.Status != http.StatusOK || !strings.HasPrefix(r.ContentType, "text/html") {
		t.Fatalf("GET /debug/locks as a browser: %d %s", r.Status, r.ContentType)
	}
	page := string(r.Body)
	for _, who := range append(slices.Clone(f.Holders), f.Waiters...) {
		link := fmt.Sprintf(`<a href="http://jaeger.test:16686/trace/%s?uiFind=%s"><code>%s</code></a>`, who.TraceID, who.SpanID, who.TraceID)
		if !strings.Contains(page, link) {
			t.Errorf("the page lacks the link %s", link)
		}
	}
	for _, want := range []string{
		`<td class="waiting"><b>2</b><br>exclusive write (extending) for `,
		`<td class="n" title="1572864 bytes">1.5 MiB</td>`, // g
		"Reload to refresh.", // without a script
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q:\n%s", want, page)
		}
	}
	// The script and the style are allowed by their hashes, and only they.
	csp := r.Header.Get("Content-Security-Policy")
	for _, inline := range []struct{ tag, text string }{{"script", locksScript}, {"style", locksStyle}} {
		if !strings.Contains(page, "<"+inline.tag+">"+inline.text+"</"+inline.tag+">") || !strings.Contains(csp, inline.tag+"-src "+cspHash(inline.text)) {
			t.Errorf("the page's %s is not the one its policy allows: %s", inline.tag, csp)
		}
	}
	if !strings.HasPrefix(csp, "default-src 'none';") {
		t.Errorf("Content-Security-Policy %q, want default-src 'none' first", csp)
	}
}

// pageState is what TestDebugLocksLiveInChromium reads from the page.
type pageState struct {
	// Loaded is set on the window once, after the page loads: a reload
	// would clear it.
	Loaded bool `json:"loaded"`
	// Stamp is the report's time as the table shows it: a new one is a
	// refresh.
	Stamp   string   `json:"stamp"`
	Waiting string   `json:"waiting"` // the waiting cell of the busy file, "" for none
	Links   []string `json:"links"`
	Note    string   `json:"note"`
}

const readPageState = `(() => {
  const stamp = document.querySelector("#locks p");
  const waiting = document.querySelector("#locks td.waiting");
  return {
    loaded: window.loadedOnce === true,
    stamp: stamp ? stamp.textContent.split(": ")[0] : "",
    waiting: waiting ? waiting.textContent : "",
    links: Array.from(document.querySelectorAll("#locks a")).map(a => a.href),
    note: (document.getElementById("refresh") || {}).textContent || "",
  };
})()`

// TestDebugLocksLiveInChromium drives the page in headless Chromium,
// through the Chrome DevTools protocol (chromedp): once loaded, the page
// shows writers that start to contend on a file within two of its
// refreshes, each waiter with its trace linked, and shows them gone once
// they are done, without being reloaded. A DOM dumped by chromium
// --dump-dom is of a fresh load each time, so it could not tell a page
// that refreshes itself from one that is reloaded; over the protocol the
// test reads one page's DOM as it changes, and a mark left on its window
// shows that it was never reloaded.
func TestDebugLocksLiveInChromium(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed (apt-get install chromium; .ci/run installs it): the live /debug/locks page is not driven in a browser")
	}
	g := newHoldGate(t, "f")
	d := startTracedDaemon(t, func(c *Config) {
		c.Store.Hooks = g.hooks()
		c.TraceURLTemplate = "http://jaeger.test:16686/trace/{trace_id}"
	})
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium), chromedp.UserDataDir(t.TempDir()),
		chromedp.Headless, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		// The page's timer runs at its pace, not a background tab's.
		chromedp.Flag("disable-background-timer-throttling", true),
	}
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses root otherwise
	}
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	read := func() pageState {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[pageState](readPageState))
		if err != nil {
			t.Fatalf("read the page: %v", err)
		}
		return s
	}
	if _, err := chromedp.Run(ctx, chromedp.Navigate(d.url+"/debug/locks")); err != nil {
		t.Fatalf("open /debug/locks in chromium: %v", err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.loadedOnce = true`)); err != nil {
		t.Fatalf("open /debug/locks in chromium: %v", err)
	}
	testutil.WaitFor(t, "the page's script to start", func() bool { return read().Note == "Refreshes every second." })

	// awaitRefreshes polls the page until cond holds of it, and fails if
	// the page refreshed more than twice first, or was reloaded.
	awaitRefreshes := func(what string, cond func(pageState) bool) pageState {
		t.Helper()
		stamps := map[string]bool{read().Stamp: true}
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			s := read()
			if !s.Loaded {
				t.Fatalf("the page was reloaded (waiting for %s)", what)
			}
			stamps[s.Stamp] = true
			if cond(s) {
				if len(stamps)-1 > 2 {
					t.Errorf("the page showed %s after %d refreshes, want at most 2", what, len(stamps)-1)
				}
				return s
			}
			if len(stamps)-1 > 2 {
				t.Fatalf("the page refreshed %d times without showing %s: %+v", len(stamps)-1, what, s)
			}
		}
		t.Fatalf("the page did not refresh within a minute (waiting for %s): %+v", what, read())
		return pageState{}
	}

	done := contendedFile(t, d, g, "f", 2)
	f, _ := d.getLocks(t).file("f")
	s := awaitRefreshes("the waiters", func(s pageState) bool { return strings.HasPrefix(s.Waiting, "2") })
	for _, who := range append(slices.Clone(f.Holders), f.Waiters...) {
		link := "http://jaeger.test:16686/trace/" + who.TraceID
		if !slices.Contains(s.Links, link) {
			t.Errorf("the page links %v, want %s among them", s.Links, link)
		}
	}
	if !regexp.MustCompile(`^2exclusive write \(extending\) for [0-9.]+(ns|µs|ms|s) `).MatchString(s.Waiting) {
		t.Errorf("waiting cell %q, want 2 and the waiters", s.Waiting)
	}
	done()
	awaitRefreshes("no waiter", func(s pageState) bool { return s.Waiting == "" })
	if err := chromedp.Cancel(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("close chromium: %v", err)
	}
}
