package httplimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
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

// Requests of many clients, keyed by the client address (which lives in
// pooled per-request storage), started and finished in a random
// interleaving, so that a finished request's storage serves the next while
// others of the same client are still in flight: the counts always match
// the requests in flight, and nothing is left when all are done.
func TestConcurrencyKeysOutliveRequests(t *testing.T) {
	store := memstore.New(memstore.Config{})
	t.Cleanup(func() { store.Close() })
	dec, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(store), Rules: rulestest.Config(t, "domain: api\n")})
	if err != nil {
		t.Fatal(err)
	}
	m, err := newMiddleware(Config{
		Domain:      "api",
		Concurrency: &Concurrency{Max: 2},
	}, dec.Decide, nil)
	if err != nil {
		t.Fatal(err)
	}
	type req struct {
		ip     string
		finish chan struct{}
		done   chan int
	}
	entered := make(chan struct{})
	h := &handler{m: m, next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		finish := r.Context().Value(finishKey{}).(chan struct{})
		entered <- struct{}{}
		<-finish
	})}
	start := func(ip string) *req {
		q := &req{ip: ip, finish: make(chan struct{}), done: make(chan int, 1)}
		r := httptest.NewRequest("GET", "/", nil)
		r = r.WithContext(context.WithValue(r.Context(), finishKey{}, q.finish))
		r.RemoteAddr = ip + ":1234"
		go func() {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			q.done <- w.Code
		}()
		select {
		case <-entered: // in flight
		case code := <-q.done: // refused at once
			if code != http.StatusTooManyRequests {
				t.Fatalf("%s: answered %d", ip, code)
			}
			return nil
		}
		return q
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	var flight []*req
	perIP := map[string]int{}
	for step := range 4000 {
		if len(flight) > 0 && rnd.IntN(2) == 0 {
			i := rnd.IntN(len(flight))
			q := flight[i]
			flight = append(flight[:i], flight[i+1:]...)
			close(q.finish)
			if code := <-q.done; code != 200 {
				t.Fatalf("step %d: %s answered %d", step, q.ip, code)
			}
			perIP[q.ip]--
		} else {
			ip := fmt.Sprintf("192.0.2.%d", rnd.IntN(8)+1)
			q := start(ip)
			if (q != nil) != (perIP[ip] < 2) {
				t.Fatalf("step %d: %s with %d in flight: admitted %v", step, ip, perIP[ip], q != nil)
			}
			if q != nil {
				flight = append(flight, q)
				perIP[ip]++
			}
		}
		if n, _ := m.conc.inFlight(); n != len(flight) {
			t.Fatalf("step %d: the map counts %d in flight, %d are", step, n, len(flight))
		}
	}
	for _, q := range flight {
		close(q.finish)
		<-q.done
	}
	if n, entries := m.conc.inFlight(); n != 0 || entries != 0 {
		t.Fatalf("%d requests in flight and %d entries left after every request returned", n, entries)
	}
}

type finishKey struct{}

// A middleware made for a reloaded configuration inherits the counts of
// the one it replaces (Concurrency.Inherit): the requests the old one
// runs count against the new Max, and their end is counted where their
// start was, through four reloads, a Max lowered and a Max raised; when
// every request has ended, nothing is left and the last middleware admits
// exactly its Max.
func TestConcurrencyInherited(t *testing.T) {
	store := memstore.New(memstore.Config{})
	t.Cleanup(func() { store.Close() })
	dec, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(store), Rules: rulestest.Config(t, "domain: api\n")})
	if err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-r.Context().Value(finishKey{}).(chan struct{})
	})
	// made makes the middleware of a configuration of max, inheriting from
	// the one before it.
	var last *Concurrency
	made := func(max int) *handler {
		t.Helper()
		c := &Concurrency{Max: max, Inherit: last}
		m, err := newMiddleware(Config{Domain: "api", Concurrency: c}, dec.Decide, nil)
		if err != nil {
			t.Fatal(err)
		}
		last = c
		return &handler{m: m, next: next}
	}
	type req struct {
		finish chan struct{}
		done   chan int
	}
	var flight []*req
	// fill sends requests of one client through h until one is refused,
	// and returns how many it admitted.
	fill := func(h *handler) int {
		t.Helper()
		for n := 0; ; n++ {
			q := &req{finish: make(chan struct{}), done: make(chan int, 1)}
			r := httptest.NewRequest("GET", "/", nil)
			r = r.WithContext(context.WithValue(r.Context(), finishKey{}, q.finish))
			r.RemoteAddr = "192.0.2.1:1234"
			go func() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				q.done <- w.Code
			}()
			select {
			case <-entered:
				flight = append(flight, q)
			case code := <-q.done:
				if code != http.StatusTooManyRequests {
					t.Fatalf("refused with %d", code)
				}
				return n
			case <-time.After(10 * time.Second):
				t.Fatal("a request neither admitted nor refused")
			}
		}
	}
	end := func(n int) {
		t.Helper()
		for _, q := range flight[:n] {
			close(q.finish)
			if code := <-q.done; code != 200 {
				t.Fatalf("an admitted request answered %d", code)
			}
		}
		flight = flight[n:]
	}
	first := made(3)
	if n := fill(first); n != 3 {
		t.Fatalf("the first configuration admitted %d, want 3", n)
	}
	for reload := range 4 {
		h := made(3)
		if n := fill(h); n != 0 {
			t.Fatalf("reload %d: %d more admitted with 3 in flight, want 0", reload+1, n)
		}
	}
	lowered := made(2)
	end(1) // 2 in flight: the old ones' ends counted in the new counts
	if n := fill(lowered); n != 0 {
		t.Fatalf("max lowered to 2, 2 in flight: %d admitted, want 0", n)
	}
	end(1)
	if n := fill(lowered); n != 1 {
		t.Fatalf("max lowered to 2, 1 in flight: %d admitted, want 1", n)
	}
	if n := fill(first); n != 1 { // the oldest middleware, max 3, counts them too
		t.Fatalf("the first middleware, 2 in flight: %d admitted, want 1", n)
	}
	raised := made(5)
	if n := fill(raised); n != 2 {
		t.Fatalf("max raised to 5, 3 in flight: %d admitted, want 2", n)
	}
	end(len(flight))
	if n, entries := raised.m.conc.inFlight(); n != 0 || entries != 0 {
		t.Fatalf("%d in flight and %d entries left after every request ended", n, entries)
	}
	if n := fill(raised); n != 5 {
		t.Fatalf("every request ended: %d admitted, want 5", n)
	}
	end(len(flight))
}
