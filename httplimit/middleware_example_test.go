package httplimit_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

func ExampleNew() {
	// The same rules file sluice serve reads for Envoy: the middleware
	// sends the client address as remote_address by default.
	domain, err := rules.Parse("api.yaml", []byte(`
domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
`))
	if err != nil {
		panic(err)
	}
	cfg, err := rules.NewConfig(domain)
	if err != nil {
		panic(err)
	}
	// A stopped clock, 30 s into a minute, keeps this output stable; a
	// real store takes memstore.Config{}.
	now := time.Date(2026, 1, 1, 12, 0, 30, 0, time.UTC)
	store := memstore.New(memstore.Config{Now: func() time.Time { return now }})
	defer store.Close()

	decider, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(store), Rules: cfg})
	if err != nil {
		panic(err)
	}
	limit, err := httplimit.New(httplimit.Config{
		Decider: decider,
		Domain:  "api",
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello\n")
	})
	srv := httptest.NewServer(limit(mux))
	defer srv.Close()

	for range 3 {
		resp, err := http.Get(srv.URL)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.Status)
		for _, h := range []string{"X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit", "Retry-After", "Content-Type"} {
			if v := resp.Header.Get(h); v != "" {
				fmt.Printf("  %s: %s\n", h, v)
			}
		}
		fmt.Printf("  %s", body)
	}
	// Output:
	// 200 OK
	//   X-RateLimit-Remaining: 1
	//   X-RateLimit-Reset: 30
	//   RateLimit-Policy: "api.remote_address";q=2;w=60
	//   RateLimit: "api.remote_address";r=1;t=30
	//   Content-Type: text/plain; charset=utf-8
	//   hello
	// 200 OK
	//   X-RateLimit-Remaining: 0
	//   X-RateLimit-Reset: 30
	//   RateLimit-Policy: "api.remote_address";q=2;w=60
	//   RateLimit: "api.remote_address";r=0;t=30
	//   Content-Type: text/plain; charset=utf-8
	//   hello
	// 429 Too Many Requests
	//   X-RateLimit-Remaining: 0
	//   X-RateLimit-Reset: 30
	//   RateLimit-Policy: "api.remote_address";q=2;w=60
	//   RateLimit: "api.remote_address";r=0;t=30
	//   Retry-After: 30
	//   Content-Type: application/problem+json
	//   {"type":"https://pkg.go.dev/github.com/sluicehq/sluice/httplimit#ProblemRateLimited","title":"Too many requests","status":429,"detail":"Rate limit exceeded; retry in 30 seconds.","retry-after":30,"violated-policies":[{"name":"api.remote_address","quota":2,"window":60}]}
}
