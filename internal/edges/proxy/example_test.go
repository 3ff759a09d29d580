package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/edges/httpconf"
	"github.com/sluicehq/sluice/internal/edges/proxy"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

func Example() {
	// The API behind the proxy.
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s", r.URL.Path)
	}))
	defer api.Close()

	// One file: the rules and the http section.
	src := []byte(`
domain: api
http:
  routes:
    - pattern: "POST /login"
      name: login
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: sliding_log}
`)
	d, err := rules.Parse("rules.yaml", src)
	if err != nil {
		panic(err)
	}
	cfg, _ := rules.NewConfig(d)
	section, err := httpconf.Parse("rules.yaml", src)
	if err != nil {
		panic(err)
	}
	store := memstore.New(memstore.Config{})
	defer store.Close()

	upstream, _ := url.Parse(api.URL)
	decider, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(store), Rules: cfg})
	if err != nil {
		panic(err)
	}
	p, err := proxy.New(proxy.Config{
		Upstream: upstream,
		Decider:  decider,
		Domain:   d.Name,
		HTTP:     section,
	})
	if err != nil {
		panic(err)
	}
	front := httptest.NewServer(p)
	defer front.Close()

	for range 3 {
		resp, err := http.Post(front.URL+"/login", "text/plain", nil)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"), len(body) > 0)
	}
	// No route but "POST /login": everything else is not limited.
	resp, err := http.Get(front.URL + "/docs")
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body))
	// Output:
	// 200 1 true
	// 200 0 true
	// 429 0 true
	// 200 hello from /docs
}
