package httplimit

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/rulestest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rls"
)

// inFlight sums the counts of every shard, and counts the entries.
func (c *concurrency) inFlight() (requests, entries int) {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		for _, n := range sh.n {
			requests += int(*n)
			entries++
		}
		sh.mu.Unlock()
	}
	return requests, entries
}

// Overlapping requests of many clients, keyed by the client address (which
// lives in pooled per-request storage): when they are done, nothing is in
// flight and no entry is left, and every client gets its Max again.
func TestConcurrencyKeysOutliveRequests(t *testing.T) {
	store := memstore.New(memstore.Config{})
	t.Cleanup(func() { store.Close() })
	m, err := newMiddleware(Config{
		Decider:     rls.NewDecider(sluice.NewLimiter(store), rulestest.Config(t, "domain: api\n")),
		Domain:      "api",
		Concurrency: &Concurrency{Max: 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	const clients = 8
	var wg sync.WaitGroup
	gate := make(chan struct{})
	h := &handler{m: m, next: http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-gate })}
	serve := func(ip string) int {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = ip + ":1234"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	for round := range 50 {
		gate = make(chan struct{})
		for c := range clients {
			for range 3 { // one more than Max: one of the three is refused
				wg.Go(func() { serve(fmt.Sprintf("192.0.2.%d", c+1)) })
			}
		}
		for { // until every client has its two in flight
			if n, _ := m.conc.inFlight(); n == 2*clients {
				break
			}
			runtime.Gosched()
		}
		close(gate)
		wg.Wait()
		if n, entries := m.conc.inFlight(); n != 0 || entries != 0 {
			t.Fatalf("round %d: %d requests in flight and %d entries left after every request returned", round, n, entries)
		}
	}
	// Every client may have its two in flight again.
	gate = make(chan struct{})
	codes := make(chan int, 2*clients)
	for c := range clients {
		for range 2 {
			wg.Go(func() { codes <- serve(fmt.Sprintf("192.0.2.%d", c+1)) })
		}
	}
	for {
		if n, _ := m.conc.inFlight(); n == 2*clients {
			break
		}
		runtime.Gosched()
	}
	close(gate)
	wg.Wait()
	close(codes)
	for code := range codes {
		if code != 200 {
			t.Errorf("an idle client's request was answered %d", code)
		}
	}
}
