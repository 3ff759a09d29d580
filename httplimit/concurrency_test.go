package httplimit_test

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/httplimit"
)

// With a cap of 2 in flight per user, a third concurrent request of the
// same user is denied at once without being charged, another user's is
// not, and a slot frees when a request completes.
func TestConcurrencyCap(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan string, 10)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- r.Header.Get("X-User")
		<-release
		w.Write([]byte("done"))
	})
	mw, err := httplimit.New(httplimit.Config{
		Decider:     decider(t, userRules),
		Domain:      "api",
		Descriptors: []httplimit.Descriptor{{{Key: "user", Source: httplimit.Header("X-User")}}},
		Concurrency: &httplimit.Concurrency{
			Max:        2,
			Descriptor: httplimit.Descriptor{{Source: httplimit.Header("X-User")}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := server(t, mw(h))
	var wg sync.WaitGroup
	results := make(chan reply, 4)
	for _, user := range []string{"alice", "alice", "bob"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results <- do(t, http.DefaultClient, "GET", srv.URL, http.Header{"X-User": {user}})
		}()
		<-entered
	}
	// alice has 2 in flight: her third is denied at once.
	r := do(t, http.DefaultClient, "GET", srv.URL, http.Header{"X-User": {"alice"}})
	body := decodeProblem(t, r)
	if r.status != 429 || r.header.Get("Retry-After") != "1" || body.Type != httplimit.ProblemConcurrency {
		t.Errorf("third concurrent request: %d, Retry-After %q, type %q; want 429, 1, ProblemConcurrency", r.status, r.header.Get("Retry-After"), body.Type)
	}
	// A request without the header is not capped (nor limited).
	go func() { results <- do(t, http.DefaultClient, "GET", srv.URL, nil) }()
	<-entered
	close(release)
	wg.Wait()
	for range 4 {
		if r := <-results; r.status != 200 {
			t.Errorf("an admitted request answered %d", r.status)
		}
	}
	// The denied request consumed nothing: alice's 3rd admitted request
	// leaves 10-3 = 7.
	if r := do(t, http.DefaultClient, "GET", srv.URL, http.Header{"X-User": {"alice"}}); r.String() != "200 7" {
		t.Errorf("after the slots freed: %s, want 200 7", r)
	}
}

// Many concurrent requests of one key never run more than Max at once.
func TestConcurrencyNeverExceeded(t *testing.T) {
	const limit, clients = 3, 24
	var mu sync.Mutex
	running, peak := 0, 0
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		running++
		peak = max(peak, running)
		mu.Unlock()
		time.Sleep(time.Millisecond) // in flight for a while
		mu.Lock()
		running--
		mu.Unlock()
	})
	mw, err := httplimit.New(httplimit.Config{
		Decider:     decider(t, "domain: api\n"),
		Domain:      "api",
		Concurrency: &httplimit.Concurrency{Max: limit},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := server(t, mw(h))
	var wg sync.WaitGroup
	var ok, denied int
	var cmu sync.Mutex
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				r := do(t, srv.Client(), "GET", srv.URL, nil)
				cmu.Lock()
				if r.status == 200 {
					ok++
				} else if r.status == 429 {
					denied++
				}
				cmu.Unlock()
			}
		}()
	}
	wg.Wait()
	if peak > limit || peak == 0 || denied == 0 {
		t.Errorf("peak in flight %d (want 1..%d), %d denied (want some)", peak, limit, denied)
	}
	if ok+denied != clients*20 {
		t.Errorf("%d ok + %d denied, want %d answers", ok, denied, clients*20)
	}
	t.Logf("peak %d in flight, %d admitted, %d denied", peak, ok, denied)
}

func TestConcurrencyConfigErrors(t *testing.T) {
	d := decider(t, userRules)
	for name, c := range map[string]*httplimit.Concurrency{
		"zero":     {},
		"negative": {Max: -1},
		"huge":     {Max: 1 << 31},
		"bad key":  {Max: 1, Descriptor: httplimit.Descriptor{{Source: httplimit.Header("bad header")}}},
	} {
		if _, err := httplimit.New(httplimit.Config{Decider: d, Domain: "api", Concurrency: c}); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

const userRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
`
