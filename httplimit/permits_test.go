package httplimit_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
)

const permitRules = `
domain: api
descriptors:
  - key: remote_address
    concurrency: {max: 1, ttl: 3s}
    rate_limit: {unit: minute, requests_per_unit: 100}
`

// TestConcurrencyRulePermits: a request under a concurrency rule holds its
// slot while the handler runs and gives it back when the response ends,
// whether it completes or the client hangs up; meanwhile another request
// of the same client is refused (429).
func TestConcurrencyRulePermits(t *testing.T) {
	entered, release := make(chan struct{}, 4), make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.Write([]byte("ok"))
	})
	mw, err := httplimit.New(httplimit.Config{Decider: decider(t, permitRules), Domain: "api"})
	if err != nil {
		t.Fatal(err)
	}
	srv := server(t, mw(slow))

	// One in flight: the second is refused.
	first := make(chan reply, 1)
	go func() { first <- do(t, srv.Client(), "GET", srv.URL, nil) }()
	<-entered
	if r := do(t, srv.Client(), "GET", srv.URL, nil); r.status != http.StatusTooManyRequests {
		t.Fatalf("a second in flight: %d, want 429", r.status)
	}
	close(release)
	if r := <-first; r.status != http.StatusOK {
		t.Fatalf("the first: %d", r.status)
	}
	// Released: the next one runs.
	release = make(chan struct{})
	next := make(chan reply, 1)
	go func() { next <- do(t, srv.Client(), "GET", srv.URL, nil) }()
	<-entered
	close(release)
	if r := <-next; r.status != http.StatusOK {
		t.Fatalf("after the release: %d", r.status)
	}

	// A client that hangs up gives its slot back.
	release = make(chan struct{})
	defer close(release)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
	gone := make(chan error, 1)
	go func() {
		resp, err := srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		gone <- err
	}()
	<-entered
	cancel()
	<-gone
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := make(chan reply, 1)
		go func() { r <- do(t, srv.Client(), "GET", srv.URL, nil) }()
		select {
		case <-entered:
			// Admitted: the hung-up request's slot came back.
			release <- struct{}{}
			if got := <-r; got.status != http.StatusOK {
				t.Fatalf("after the hang-up: %d", got.status)
			}
			return
		case got := <-r:
			if got.status != http.StatusTooManyRequests || time.Now().After(deadline) {
				t.Fatalf("after the hang-up: %d, the slot never came back", got.status)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestConcurrencyRuleHeaders: RateLimit-Policy names a concurrency rule's
// cap with the quota unit concurrent-requests and no window, beside the
// rate's.
func TestConcurrencyRuleHeaders(t *testing.T) {
	srv := limited(t, httplimit.Config{Decider: decider(t, permitRules), Domain: "api", Headers: ratelimitheaders.HeadersAll})
	r := do(t, srv.Client(), "GET", srv.URL, nil)
	want := `"api.remote_address";q=100;w=60, "api.remote_address#concurrency";q=1;qu="concurrent-requests"`
	if got := r.header.Get("RateLimit-Policy"); r.status != http.StatusOK || got != want {
		t.Fatalf("%d RateLimit-Policy: %s\nwant %s", r.status, got, want)
	}
}
