package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// reloadConcRules is a proxy's file whose route /local/ lets MAX requests
// per user in flight in the process.
const reloadConcRules = `domain: api
http:
  routes:
    - pattern: "/local/"
      name: local
      descriptors: [[{key: plain, value: x}]]
      concurrency: {max: MAX, descriptor: [{key: user, header: X-User}]}
descriptors:
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 100000}
`

// TestProxyE2EConcurrencyAcrossReloads: a route's cap on the requests in
// flight in the process holds across reloads of the real binary's file.
// With 3 of 3 in flight, the file is changed four times (a comment
// appended): no reload admits one more (each admitted 3 more: 15 in
// flight for a max of 3). The max lowered to 2 admits no one until fewer
// than 2 are in flight, raised to 4 admits up to 4; when every request
// has ended, exactly 4 are admitted: the requests admitted under the old
// files were counted out where they were counted in, none twice and none
// lost. The route renamed counts afresh, as documented; renamed back, it
// counts its own requests again.
func TestProxyE2EConcurrencyAcrossReloads(t *testing.T) {
	beside(t)
	entered := make(chan struct{}, 64)
	finish := make(chan struct{})
	up := newBlockingUpstream(t, entered, finish)
	file := filepath.Join(t.TempDir(), "proxy.yaml")
	content := strings.Replace(reloadConcRules, "MAX", "3", 1)
	writeRules(t, file, content)
	p := startProxy(t, "--config", file, "--upstream", up)
	front, admin := "http://"+p.addrs["proxy"], "http://"+p.addrs["admin"]

	done := make(chan int, 64)
	inFlight, ended := 0, 0
	// fill sends requests of alice until one is refused, and returns how
	// many reached the upstream.
	fill := func() int {
		t.Helper()
		for n := 0; ; n++ {
			go func() {
				req, _ := http.NewRequest("GET", front+"/local/x", nil)
				req.Header.Set("X-User", "alice")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					done <- 0
					return
				}
				resp.Body.Close()
				done <- resp.StatusCode
			}()
			select {
			case <-entered:
				inFlight++
			case code := <-done:
				if code != http.StatusTooManyRequests {
					t.Fatalf("refused with %d", code)
				}
				return n
			case <-time.After(e2eWait):
				t.Fatal("a request neither reached the upstream nor was refused")
			}
		}
	}
	// let lets n requests held at the upstream finish.
	let := func(n int) {
		t.Helper()
		for range n {
			select {
			case finish <- struct{}{}:
			case <-time.After(e2eWait):
				t.Fatal("no request held at the upstream")
			}
			if code := <-done; code != 200 {
				t.Fatalf("an admitted request answered %d", code)
			}
			inFlight--
			ended++
		}
	}
	defer func() { let(inFlight) }()
	// end lets n finish, and waits until the proxy has counted them: its
	// handler has returned, and given their slots back.
	end := func(n int) {
		t.Helper()
		let(n)
		poll(t, "the proxy counting the ended requests", func() bool {
			_, _, body := fetch(t, "GET", admin+"/metrics")
			return sumSeries(t, body, "sluice_proxy_requests_total", `route="local"`, `result="allowed"`) == float64(ended)
		})
	}
	reloads := 0
	reload := func(src string) {
		t.Helper()
		content = src
		writeRules(t, file, content)
		reloads++
		poll(t, "the reload", func() bool { return strings.Count(p.log(), "configuration loaded") == reloads })
	}

	if n := fill(); n != 3 {
		t.Fatalf("admitted %d, want 3", n)
	}
	for i := range 4 {
		reload(content + fmt.Sprintf("# edit %d\n", i))
		if n := fill(); n != 0 {
			t.Fatalf("reload %d, 3 in flight: %d more admitted, want 0", i+1, n)
		}
	}
	reload(strings.Replace(reloadConcRules, "MAX", "2", 1))
	end(1)
	if n := fill(); n != 0 {
		t.Fatalf("max lowered to 2, 2 in flight: %d admitted, want 0", n)
	}
	end(1)
	if n := fill(); n != 1 {
		t.Fatalf("max lowered to 2, 1 in flight: %d admitted, want 1", n)
	}
	reload(strings.Replace(reloadConcRules, "MAX", "4", 1))
	if n := fill(); n != 2 {
		t.Fatalf("max raised to 4, 2 in flight: %d admitted, want 2", n)
	}
	end(inFlight)
	if n := fill(); n != 4 {
		t.Fatalf("every request ended: %d admitted, want 4", n)
	}

	// Renamed, the route counts afresh (as documented): the 4 requests in
	// flight under its old name count apart until they end.
	reload(strings.NewReplacer("MAX", "2", "name: local", "name: renamed").Replace(reloadConcRules))
	if n := fill(); n != 2 {
		t.Fatalf("route renamed, 4 in flight under its old name: %d admitted, want 2", n)
	}
	// Renamed back, it counts its 4 again (before, afresh: 4 more).
	reload(strings.Replace(reloadConcRules, "MAX", "4", 1))
	if n := fill(); n != 0 {
		t.Fatalf("route renamed back, 4 in flight under its name: %d admitted, want 0", n)
	}
}

// newBlockingUpstream starts an upstream that tells entered of each
// request and holds it until finish lets it answer; it returns its URL.
func newBlockingUpstream(t *testing.T, entered, finish chan struct{}) string {
	t.Helper()
	stop := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		select {
		case <-finish:
		case <-stop:
		}
	}))
	t.Cleanup(func() { close(stop); up.Close() })
	return up.URL
}
