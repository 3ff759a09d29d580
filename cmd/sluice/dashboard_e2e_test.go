package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/internal/testsupport/testpart"
)

// chromium returns the path of Debian's Chromium (testpart: missing, it
// fails the test in CI and skips it elsewhere).
func chromium(t *testing.T) string {
	return testpart.Program(t, "apt-get install chromium", "chromium", "chromium-browser")
}

// TestServeE2EDashboard: the live dashboard, driven in a real headless
// Chromium. After known traffic (one user far over its limit, a few
// others within it), the page shows the rule's counts, mallory on top of
// the offenders, the askers near their limit and the store up; traffic
// sent while the page is open shows up without a reload. The page loads
// nothing from outside sluice. The screenshot goes to
// $SLUICE_DASHBOARD_SCREENSHOT when set (docs/images/dashboard.png is made
// so), else to the test's temporary directory.
func TestServeE2EDashboard(t *testing.T) {
	beside(t)
	browser := chromium(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, `domain: api
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 20}
  - key: path
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 5}
`)
	p := startSluice(t, nil, "--config", rules)
	send := func(key, value string, n int) {
		for range n {
			p.must("api", desc(key, value))
		}
	}
	send("user", "mallory", 120) // 20 allowed, 100 denied
	send("user", "alice", 18)    // near the limit: 2 of 20 left
	send("user", "bob", 3)
	send("path", "/v1/search", 9) // 5 allowed, 4 let through in shadow mode

	ctx, text := openPage(t, browser, "http://"+p.dbg+"/dashboard")
	// The first poll's answer rendered: both rules' sections are there.
	for start := time.Now(); text(`section.rule[data-rule="api.user"] table.offenders`) == "" || text(`section.rule[data-rule="api.path"] h2`) == ""; {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("the dashboard shows no rule after 20 s: %q", text(`main`))
		}
		time.Sleep(100 * time.Millisecond)
	}
	store := text(`#store`)
	heading := text(`section.rule[data-rule="api.user"] h2`)
	offenders := text(`section.rule[data-rule="api.user"] table.offenders`)
	near := text(`section.rule[data-rule="api.user"] table.near-limit`)
	shadowHeading := text(`section.rule[data-rule="api.path"] h2`)
	if store != "up" {
		t.Errorf("store: %q, want up", store)
	}
	if got := text(`#region-tier`); got != "" {
		t.Errorf("a Region panel without --region: %q", got)
	}
	if got := text(`#requests`); !strings.Contains(got, "over limit") || !strings.Contains(got, "4 let through in shadow mode") {
		t.Errorf("requests: %q", got)
	}
	if !strings.Contains(heading, "api.user: 41 allowed, 100 denied, 0 shadow-denied") {
		t.Errorf("api.user's heading: %q", heading)
	}
	if !strings.Contains(offenders, "user=mallory") || !strings.Contains(offenders, "100") {
		t.Errorf("top offenders: %q, want user=mallory with 100", offenders)
	}
	if !strings.Contains(near, "user=alice") || !strings.Contains(near, "2 of 20") || strings.Contains(near, "user=bob") {
		t.Errorf("near their limit: %q, want alice with 2 of 20 left, not bob", near)
	}
	if !strings.Contains(shadowHeading, "5 allowed, 0 denied, 4 shadow-denied") {
		t.Errorf("api.path's heading: %q", shadowHeading)
	}
	// A value with slashes is read back whole for its peek, and shown
	// as it was sent.
	if got := text(`section.rule[data-rule="api.path"] table.near-limit`); !strings.Contains(got, "path=/v1/search") || !strings.Contains(got, "0 of 5") {
		t.Errorf("api.path near its limit: %q, want path=/v1/search with 0 of 5 left", got)
	}

	// Live: traffic sent now shows up without a reload.
	send("user", "carol", 25) // 20 allowed, 5 denied
	deadline := time.Now().Add(15 * time.Second)
	for {
		heading = text(`section.rule[data-rule="api.user"] h2`)
		if strings.Contains(heading, "61 allowed, 105 denied") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page did not update: %q", heading)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Nothing comes from outside: every resource the page loaded is
	// sluice's own.
	origins, err := chromedp.Run(ctx, chromedp.Evaluate[string](`[...new Set(performance.getEntriesByType("resource").map(e => new URL(e.name).host))].join(",")`))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range strings.Split(origins, ",") {
		if o != "" && o != p.dbg {
			t.Errorf("the page loaded a resource from %s", o)
		}
	}
	screenshot(t, ctx, os.Getenv("SLUICE_DASHBOARD_SCREENSHOT"))
}

// openPage opens url in a headless Chromium and returns the browser's
// context (closed at the end of the test) and a function reading an
// element's text.
func openPage(t *testing.T, browser, url string) (context.Context, func(sel string) string) {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	ctx, cancelTimeout := context.WithTimeout(ctx, 60*time.Second)
	t.Cleanup(cancelTimeout)
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("%s in Chromium: %v", url, err)
	}
	// text reads an element's text in one evaluation in the page: the page
	// replaces its sections at every poll, and a node found by one
	// DevTools call may be gone by the next (a query waiting on it then
	// waits until the deadline). A missing element reads as "".
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%q) || {innerText: ""}).innerText`, sel)))
		if err != nil {
			t.Fatalf("%s: %v", sel, err)
		}
		return v
	}
	return ctx, text
}

// screenshot saves the page as PNG at path, or in the test's temporary
// directory when path is empty.
func screenshot(t *testing.T, ctx context.Context, path string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if path == "" {
		path = filepath.Join(t.TempDir(), "dashboard.png")
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	if len(png) < 10_000 {
		t.Errorf("a screenshot of %d bytes", len(png))
	}
	t.Logf("screenshot: %s (%d bytes)", path, len(png))
}

// TestProxyE2EDashboard: sluice proxy's dashboard on its admin listener,
// in a real headless Chromium. After known traffic through the proxy
// (one user far over its limit, one near it), the page shows the rule's
// counts, the offender, the user near the limit, the requests by the
// proxy's results and the store up; the top key share is on /metrics.
// With a concurrency rule's slots all held by slow streams and one more
// denied, its offender and its askers show the permits held, 3 of 3,
// and 0 of 3 once the streams end.
func TestProxyE2EDashboard(t *testing.T) {
	beside(t)
	browser := chromium(t)
	streams := newHeldUpstream()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			streams.ServeHTTP(w, r)
			return
		}
		io.WriteString(w, "ok")
	}))
	defer up.Close()
	defer streams.end()
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, file, `domain: shop
http:
  routes:
    - pattern: /stream
      descriptors:
        - [{key: api_key, header: X-Api-Key}]
    - pattern: /
      descriptors:
        - [{key: user, header: X-User}]
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: api_key
    concurrency: {max: 3}
`)
	p := startProxy(t, "--config", file, "--upstream", up.URL)
	front, admin := "http://"+p.addrs["proxy"], "http://"+p.addrs["admin"]
	send := func(user string, n int) {
		for range n {
			req, _ := http.NewRequest("GET", front+"/items", nil)
			req.Header.Set("X-User", user)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	send("mallory", 40) // 10 allowed, 30 denied
	send("alice", 9)    // 1 of 10 left
	send("bob", 2)

	ctx, text := openPage(t, browser, admin+"/dashboard")
	sec := `section.rule[data-rule="shop.user"] `
	for start := time.Now(); text(sec+"table.offenders") == ""; {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("the dashboard shows no rule after 20 s: %q", text(`body`))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := text(`#title`); got != "sluice proxy" {
		t.Errorf("title: %q", got)
	}
	if got := text(`#store`); got != "up" {
		t.Errorf("store: %q, want up", got)
	}
	if got := text(sec + "h2"); !strings.Contains(got, "shop.user: 21 allowed, 30 denied, 0 shadow-denied") {
		t.Errorf("heading: %q", got)
	}
	if got := text(sec + "table.offenders"); !strings.Contains(got, "user=mallory") || !strings.Contains(got, "30") {
		t.Errorf("top offenders: %q, want user=mallory with 30", got)
	}
	if got := text(sec + "table.near-limit"); !strings.Contains(got, "user=alice") || !strings.Contains(got, "1 of 10") || strings.Contains(got, "user=bob") {
		t.Errorf("near their limit: %q, want alice with 1 of 10 left, not bob", got)
	}
	// The proxy counts a request after answering it: wait for the counts.
	poll(t, "the requests line", func() bool {
		got := text(`#requests`)
		return strings.Contains(got, "21 allowed") && strings.Contains(got, "30 denied")
	})
	if _, _, metrics := fetch(t, "GET", admin+"/metrics"); !strings.Contains(metrics, `sluice_top_key_share{kind="denials",rule="shop.user"} 1`) {
		t.Errorf("no top key share of 1 for the denials in /metrics:\n%s", grepLines(metrics, "sluice_top_key"))
	}

	// A concurrency rule: three streams hold its three slots, a fourth
	// is denied.
	streams.hold(t, 3, front+"/stream", "acme")
	if code, _ := getWithKey(t, front+"/stream", "acme"); code != http.StatusTooManyRequests {
		t.Errorf("a fourth stream: %d, want 429", code)
	}
	conc := `section.rule[data-rule="shop.api_key"] `
	poll(t, "the permits held on the page", func() bool {
		return strings.Contains(text(conc+"table.in-flight"), "3 of 3") && strings.Contains(text(conc+"table.offenders"), "3 of 3")
	})
	if got := text(conc + "table.in-flight"); !strings.Contains(got, "api_key=acme\t4\t3 of 3") {
		t.Errorf("in flight: %q, want api_key=acme with 4 requests and 3 of 3 held", got)
	}
	if got := text(conc + "table.offenders"); !strings.Contains(got, "in flight") || !strings.Contains(got, "api_key=acme\t1\t3 of 3") {
		t.Errorf("the concurrency rule's offenders: %q, want api_key=acme denied once, 3 of 3 held", got)
	}
	if got := text(sec + "table.offenders"); strings.Contains(got, "in flight") {
		t.Errorf("a rate's offenders with an in-flight column: %q", got)
	}
	screenshot(t, ctx, os.Getenv("SLUICE_PROXY_DASHBOARD_SCREENSHOT"))
	streams.end()
	poll(t, "no permit held on the page once the streams ended", func() bool {
		return strings.Contains(text(conc+"table.in-flight"), "0 of 3")
	})
}

// TestServeE2ENearLimitDottedDomain: the dashboard lists a key near its
// limit in a domain whose name has a dot, which its rule's stats key
// ("edge.api.tenant") does not tell apart from a domain "edge".
func TestServeE2ENearLimitDottedDomain(t *testing.T) {
	beside(t)
	dir := t.TempDir()
	writeRules(t, filepath.Join(dir, "edge.yaml"), "domain: edge\ndescriptors:\n  - key: other\n    rate_limit: {unit: hour, requests_per_unit: 10}\n")
	writeRules(t, filepath.Join(dir, "edge-api.yaml"), "domain: edge.api\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 10}\n")
	p := startSluice(t, nil, "--config", dir)
	for range 9 {
		p.must("edge.api", desc("tenant", "acme"))
	}
	var body string
	poll(t, "tenant=acme near its limit on the dashboard", func() bool {
		var code int
		code, body, _ = httpDo(t, "GET", "http://"+p.dbg+"/dashboard/data", "")
		var d struct {
			Rules []struct {
				Rule      string
				NearLimit []struct {
					Key       string
					Remaining int64
				} `json:"near_limit"`
			}
		}
		if code != 200 || json.Unmarshal([]byte(body), &d) != nil {
			t.Fatalf("/dashboard/data: %d %s", code, body)
		}
		for _, r := range d.Rules {
			if r.Rule == "edge.api.tenant" && len(r.NearLimit) == 1 && r.NearLimit[0].Key == "tenant=acme" && r.NearLimit[0].Remaining == 1 {
				return true
			}
		}
		return false
	})
}
