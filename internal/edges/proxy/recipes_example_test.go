package proxy_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/edges/httpconf"
	"github.com/sluicehq/sluice/internal/edges/proxy"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

// Example_perKeyAndAddress is the per-user plus per-IP recipe of
// docs/recipes.md: every request is limited by its API key and by its
// client address, all-or-nothing.
func Example_perKeyAndAddress() {
	src := []byte(`domain: api
http:
  client_ip:
    trusted_proxies: [10.0.0.0/8]   # the load balancers in front
  routes:
    - pattern: "/"
      descriptors:
        - [{key: api_key, api_key: X-API-Key}]
        - [{key: remote_address}]
descriptors:
  - key: api_key
    rate_limit: {algorithm: sliding_window, unit: minute, requests_per_unit: 100}
  - key: remote_address
    rate_limit: {algorithm: sliding_window, unit: minute, requests_per_unit: 250}
`)
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	front, stop := exampleProxy("api.yaml", src, func() time.Time { return now })
	defer stop()

	// send sends n requests with key from client, and tells how many were
	// allowed and which limits denied the others.
	send := func(key, client string, n int) {
		allowed, denied := 0, map[string]int{}
		for range n {
			req, _ := http.NewRequest("GET", front+"/v1/things", nil)
			req.Header.Set("X-API-Key", key)
			req.Header.Set("X-Forwarded-For", client)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				panic(err)
			}
			var problem struct {
				Violated []struct{ Name string } `json:"violated-policies"`
			}
			if resp.StatusCode == http.StatusTooManyRequests {
				json.NewDecoder(resp.Body).Decode(&problem)
			} else {
				allowed++
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			for _, v := range problem.Violated {
				denied[v.Name]++
			}
		}
		fmt.Printf("%s from %s: %d allowed, denied by %v\n", key, client, allowed, denied)
	}
	send("key-a", "192.0.2.1", 120)   // 100, then its key's limit
	send("key-b", "192.0.2.1", 100)   // the 20 denials above cost the address nothing
	send("key-c", "192.0.2.1", 60)    // the address has 50 left
	send("key-c", "198.51.100.7", 60) // key-c's 10 denials above cost it nothing
	// IPv6 clients are grouped by /64: these three are one address.
	send("key-d", "2001:db8:1:2::1", 100)
	send("key-e", "2001:db8:1:2::ffff", 100)
	send("key-f", "2001:db8:1:2:abcd::", 60)
	// Output:
	// key-a from 192.0.2.1: 100 allowed, denied by map[api.api_key:20]
	// key-b from 192.0.2.1: 100 allowed, denied by map[]
	// key-c from 192.0.2.1: 50 allowed, denied by map[api.remote_address:10]
	// key-c from 198.51.100.7: 50 allowed, denied by map[api.api_key:10]
	// key-d from 2001:db8:1:2::1: 100 allowed, denied by map[]
	// key-e from 2001:db8:1:2::ffff: 100 allowed, denied by map[]
	// key-f from 2001:db8:1:2:abcd::: 50 allowed, denied by map[api.remote_address:10]
}

// exampleProxy runs the proxy of the rules file src (named name) in front
// of an upstream answering "ok", deciding with a memstore whose clock is
// now (nil: the time), trusting this process (loopback) as the load
// balancer in front. It returns the proxy's URL and what stops it all.
func exampleProxy(name string, src []byte, now func() time.Time) (front string, stop func()) {
	d, err := rules.Parse(name, src)
	if err != nil {
		panic(err)
	}
	cfg, err := rules.NewConfig(d)
	if err != nil {
		panic(err)
	}
	section, err := httpconf.Parse(name, src)
	if err != nil {
		panic(err)
	}
	section.ClientIP.TrustedProxies = append(section.ClientIP.TrustedProxies, netip.MustParsePrefix("127.0.0.1/32"))

	store := memstore.New(memstore.Config{Now: now})
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok\n")
	}))
	upstream, _ := url.Parse(api.URL)
	decider, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(store), Rules: cfg})
	if err != nil {
		panic(err)
	}
	p, err := proxy.New(proxy.Config{Upstream: upstream, Decider: decider, Domain: d.Name, HTTP: section})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(p)
	return srv.URL, func() {
		srv.Close()
		api.Close()
		store.Close()
	}
}
