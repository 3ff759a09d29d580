package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memstore"
)

// The common case in one line: 3 requests a minute per client address.
func ExampleNewLimit() {
	store := memstore.New(memstore.Config{})
	defer store.Close()
	limit, err := httplimit.NewLimit(sluice.NewLimiter(store),
		&sluice.Limit{Name: "per_client", Rate: 3, Period: time.Minute}, httplimit.RemoteAddress())
	if err != nil {
		panic(err)
	}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })
	srv := httptest.NewServer(limit(api))
	defer srv.Close()

	for range 4 {
		resp, err := srv.Client().Get(srv.URL)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("RateLimit-Policy"), resp.Header.Get("Retry-After") != "")
	}
	// Output:
	// 200 "per_client";q=3;w=60 false
	// 200 "per_client";q=3;w=60 false
	// 200 "per_client";q=3;w=60 false
	// 429 "per_client";q=3;w=60 true
}
