package proxy_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/memstore"
)

// permitRoutes has a concurrency rule on its route: one request in flight
// per API key, its permit renewed every third of a second.
const permitRoutes = `domain: api
http:
  routes:
    - pattern: "/"
      name: api
      descriptors: [[{key: api_key, api_key: Authorization}]]
descriptors:
  - key: api_key
    concurrency: {max: 1, ttl: 1s}
`

// metric reads a counter, gauge or histogram (its count) now, requests
// in flight or not.
func (f *fixture) metric(name string, labels ...string) float64 {
	f.t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matches(m, labels) {
				switch {
				case m.GetHistogram() != nil:
					return float64(m.GetHistogram().GetSampleCount())
				case m.GetGauge() != nil:
					return m.GetGauge().GetValue()
				}
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// waitMetric waits until the metric reads want.
func (f *fixture) waitMetric(want float64, name string, labels ...string) {
	f.t.Helper()
	f.waitUntil(name, labels, func(v float64) bool { return v == want })
}

// waitUntil waits until the metric's value is ok.
func (f *fixture) waitUntil(name string, labels []string, ok func(float64) bool) {
	f.t.Helper()
	deadline := time.Now().Add(wait)
	for !ok(f.metric(name, labels...)) {
		if time.Now().After(deadline) {
			f.t.Fatalf("%s%v = %v after %v", name, labels, f.metric(name, labels...), wait)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPermitMetrics: the route's permits are counted as the requests of a
// concurrency rule take, renew and release them: acquired and held while
// a request runs, denied for a second one of its key, renewed every third
// of the TTL, released at its end; when the store's clock jumps past the
// TTL under a request, held again at the next renewal while the key has
// room; and when another request took the slot first, lost at the next
// renewal (the request is cancelled: answered 503, logged once and
// counted as an error, not an upstream error), no longer held, not
// released, and counted by the store as expired.
func TestPermitMetrics(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	store := memstore.New(memstore.Config{Now: func() time.Time { return time.Unix(0, now.Load()) }, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	// The upstream answers key a's request once released, and key b's
	// never: only its cancellation ends it.
	arrived := make(chan string, 4)
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Authorization")
		arrived <- key
		gate := release
		if key != "Bearer a" {
			gate = nil
		}
		select {
		case <-gate:
			w.Write([]byte("ok"))
		case <-r.Context().Done():
		}
	})
	f := startWith(t, permitRoutes, up, store, nil)
	route := []string{"route", "api"}

	done := make(chan int, 2)
	sendCtx := func(ctx context.Context, key string) {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.srv.URL+"/x", nil)
			req.Header.Set("Authorization", "Bearer "+key)
			resp, err := f.srv.Client().Do(req)
			if err != nil {
				done <- 0
				return
			}
			resp.Body.Close()
			done <- resp.StatusCode
		}()
	}
	send := func(key string) { sendCtx(context.Background(), key) }
	send("a")
	<-arrived
	if a, h := f.metric("sluice_permits_acquired_total", route...), f.metric("sluice_permits_held", route...); a != 1 || h != 1 {
		t.Fatalf("one request in flight: acquired %v, held %v", a, h)
	}
	if resp, _ := f.get("/x", "Authorization: Bearer a"); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a second request of key a: %d", resp.StatusCode)
	}
	if d := f.metric("sluice_permits_denied_total", route...); d != 1 {
		t.Fatalf("denied %v, want 1", d)
	}
	f.waitUntil("sluice_permits_renewed_total", route, func(v float64) bool { return v >= 2 }) // every 333 ms
	close(release)
	if code := <-done; code != http.StatusOK {
		t.Fatalf("the request in flight: %d", code)
	}
	f.waitMetric(1, "sluice_permits_released_total", route...)
	f.waitMetric(0, "sluice_permits_held", route...)

	// The store's clock jumps past the TTL under a request: its permit
	// has expired when its holder next renews it, and the key has room:
	// the renewal holds it again.
	send("b")
	<-arrived
	f.waitMetric(1, "sluice_permits_held", route...)
	renewed := f.metric("sluice_permits_renewed_total", route...)
	now.Add(int64(2 * time.Second))
	f.waitUntil("sluice_permits_renewed_total", route, func(v float64) bool { return v >= renewed+2 })
	if l, h := f.metric("sluice_permits_lost_total", route...), f.metric("sluice_permits_held", route...); l != 0 || h != 1 {
		t.Fatalf("after a renewal found the permit gone, with room: lost %v, held %v; want 0 and 1", l, h)
	}
	// Again, and another request of key b takes the slot before the
	// renewal (tried again if the renewal came first): the renewal finds
	// no room, the permit is lost and its request cancelled.
	other, cancelOther := context.WithCancel(context.Background())
	defer cancelOther()
	tries := 0 // the renewals that came first: each holds b's permit again
	for ; ; tries++ {
		now.Add(int64(2 * time.Second))
		sendCtx(other, "b")
		select {
		case <-arrived:
		case code := <-done:
			if code != http.StatusTooManyRequests || tries == 20 {
				t.Fatalf("another request of key b after the expiry: %d", code)
			}
			continue
		}
		break
	}
	f.waitMetric(1, "sluice_permits_lost_total", route...)
	if code := <-done; code != http.StatusServiceUnavailable {
		t.Fatalf("the request whose permit was lost: %d, want 503", code)
	}
	f.waitMetric(1, "sluice_proxy_requests_total", "route", "api", "result", "error")
	if n := f.metric("sluice_proxy_upstream_errors_total", route...); n != 0 {
		t.Errorf("upstream errors %v: the upstream did nothing wrong", n)
	}
	if n := strings.Count(f.logs.String(), "concurrency permit was lost"); n != 1 {
		t.Errorf("%d log lines of the lost permit, want 1:\n%s", n, f.logs.String())
	}
	f.waitMetric(1, "sluice_permits_held", route...) // the other's
	cancelOther()
	<-done
	f.waitMetric(0, "sluice_permits_held", route...)
	if r := f.metric("sluice_permits_released_total", route...); r != 2 {
		t.Fatalf("released %v, want 2 (a's and the other's): a lost permit is not released", r)
	}
	if r := f.metric("sluice_permits_renewed_total", route...); r < renewed {
		t.Fatalf("renewed went from %v to %v", renewed, r)
	}
	for _, name := range []string{"sluice_permits_acquired_total", "sluice_permits_denied_total", "sluice_permits_release_failures_total"} {
		want := map[string]float64{"sluice_permits_acquired_total": 3, "sluice_permits_denied_total": float64(1 + tries)}[name]
		if got := f.metric(name, route...); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if n := store.Stats().PermitsExpired; n != int64(2+tries) {
		t.Fatalf("the store counted %d permits expired, want %d (b's, at each jump)", n, 2+tries)
	}
}

// TestPermitLostMidStream: a request whose permit is lost after its
// answer began (a stream's first event) can no longer be answered 503: it
// is cut short, and logged and counted as an error all the same.
func TestPermitLostMidStream(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	store := memstore.New(memstore.Config{Now: func() time.Time { return time.Unix(0, now.Load()) }, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte("data: 1\n\n"))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	f := startWith(t, permitRoutes, up, store, nil)
	open := func(ctx context.Context) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.srv.URL+"/events", nil)
		req.Header.Set("Authorization", "Bearer s")
		resp, err := f.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	first := open(context.Background())
	defer first.Body.Close()
	if first.StatusCode != http.StatusOK {
		t.Fatalf("the stream: %d", first.StatusCode)
	}
	// Past the TTL, another request of the key takes the slot before the
	// stream's renewal (tried again if the renewal came first).
	other, cancelOther := context.WithCancel(context.Background())
	defer cancelOther()
	for tries := 0; ; tries++ {
		now.Add(int64(2 * time.Second))
		resp := open(other)
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			break
		}
		if resp.StatusCode != http.StatusTooManyRequests || tries == 20 {
			t.Fatalf("another request after the expiry: %d", resp.StatusCode)
		}
	}
	body, err := io.ReadAll(first.Body)
	if err == nil || string(body) != "data: 1\n\n" {
		t.Fatalf("the stream whose permit was lost: %q %v, want its first event and an error", body, err)
	}
	f.waitMetric(1, "sluice_proxy_requests_total", "route", "api", "result", "error")
	if n := strings.Count(f.logs.String(), "concurrency permit was lost"); n != 1 {
		t.Errorf("%d log lines of the lost permit, want 1:\n%s", n, f.logs.String())
	}
}

// failurePermitRoutes give the route's failure descriptor a rule with a
// concurrency limit: a file sluice proxy refuses at load
// (httpconf.LoadFile), taken here as the rules a Decider may still come
// to hold (a remote service's).
const failurePermitRoutes = `domain: api
http:
  routes:
    - pattern: "POST /login"
      name: login
      descriptors: [[{key: remote_address}]]
      failures:
        statuses: [401]
        descriptors: [[{key: failed_login, source: remote_address}]]
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: failed_login
    concurrency: {max: 10, ttl: 1h}
    rate_limit: {unit: minute, requests_per_unit: 3}
`

// TestFailurePermitsNotHeld: the permits the failures stage's decisions
// take are given back at once: once the failed logins have ended, the
// route holds none (each would stay held for the ttl, an hour), every
// one acquired was released, and the failures were counted: the fourth
// attempt is denied.
func TestFailurePermitsNotHeld(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusUnauthorized) })
	f := start(t, failurePermitRoutes, up)
	route := []string{"route", "login"}
	for i := range 3 {
		if resp, _ := f.do(f.srv.Client(), "POST", "/login"); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("attempt %d: %d, want 401", i, resp.StatusCode)
		}
	}
	if resp, _ := f.do(f.srv.Client(), "POST", "/login"); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the fourth attempt: %d, want 429 (3 failures counted)", resp.StatusCode)
	}
	if h := f.count("sluice_permits_held", route...); h != 0 { // once every handler has returned
		t.Errorf("%v permits held after every request ended, want 0", h)
	}
	if a, r := f.metric("sluice_permits_acquired_total", route...), f.metric("sluice_permits_released_total", route...); a != r {
		t.Errorf("acquired %v, released %v: a permit acquired was never released", a, r)
	}
	if up.hits.Load() != 3 {
		t.Errorf("the upstream saw %d attempts, want 3", up.hits.Load())
	}
}
