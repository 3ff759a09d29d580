package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

// gate is an upstream that holds each request until the test lets it go
// (or its caller gives up), and counts the requests in flight: now, at
// their highest since the last mark, and by kind (X-Kind).
type gate struct {
	mu      sync.Mutex
	n, peak int
	kinds   map[string]int
	held    []*heldRequest // in arrival order
	arrived map[string]chan struct{}
}

type heldRequest struct {
	id   string
	done chan struct{}
}

func newGate() *gate {
	return &gate{kinds: map[string]int{}, arrived: map[string]chan struct{}{}}
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, kind := r.Header.Get("X-Id"), r.Header.Get("X-Kind")
	h := &heldRequest{id: id, done: make(chan struct{})}
	g.mu.Lock()
	g.n++
	g.peak = max(g.peak, g.n)
	g.kinds[kind]++
	g.held = append(g.held, h)
	if c := g.arrived[id]; c != nil {
		close(c)
	}
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.n--
		g.kinds[kind]--
		for i, x := range g.held {
			if x == h {
				g.held = append(g.held[:i], g.held[i+1:]...)
				break
			}
		}
		g.mu.Unlock()
	}()
	select {
	case <-h.done:
		io.WriteString(w, "done")
	case <-r.Context().Done():
	}
}

// let answers the k requests held longest.
func (g *gate) let(k int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, h := range g.held {
		if k == 0 {
			return
		}
		select {
		case <-h.done:
			continue
		default:
		}
		close(h.done)
		k--
	}
}

// letAll answers every request held.
func (g *gate) letAll() { g.let(1 << 30) }

// count returns the requests in flight, of kind if not "".
func (g *gate) count(kind string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if kind == "" {
		return g.n
	}
	return g.kinds[kind]
}

// mark returns the most requests in flight at once since the last mark,
// and starts a new span.
func (g *gate) mark() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.peak
	g.peak = g.n
	return p
}

// expect prepares the wait for request id's arrival.
func (g *gate) expect(id string) <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := make(chan struct{})
	g.arrived[id] = c
	return c
}

// holders sends requests through proxies and keeps the answers of those
// the gate holds.
type holders struct {
	t    *testing.T
	g    *gate
	key  string
	seq  atomic.Int64
	wg   sync.WaitGroup
	mu   sync.Mutex
	code map[string]int // id -> the status its caller got (0: waiting)
}

func newHolders(t *testing.T, g *gate, key string) *holders {
	return &holders{t: t, g: g, key: key, code: map[string]int{}}
}

// try sends one request of kind to url: it returns its id and true when
// the gate holds it (the caller keeps waiting in the background), or the
// status of an answer that came first (a denial).
func (hs *holders) try(url, kind string) (string, bool, int) {
	hs.t.Helper()
	id := fmt.Sprintf("%s-%d", kind, hs.seq.Add(1))
	arrived := hs.g.expect(id)
	answered := make(chan int, 1)
	hs.mu.Lock()
	hs.code[id] = 0
	hs.mu.Unlock()
	hs.wg.Go(func() {
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("X-Api-Key", hs.key)
		req.Header.Set("X-Id", id)
		req.Header.Set("X-Kind", kind)
		code := -1
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			code = resp.StatusCode
		}
		hs.mu.Lock()
		hs.code[id] = code
		hs.mu.Unlock()
		answered <- code
	})
	select {
	case <-arrived:
		return id, true, 0
	case code := <-answered:
		select {
		case <-arrived: // held, then answered at once: cancelled
			return id, true, code
		default:
		}
		return id, false, code
	case <-time.After(e2eWait):
		hs.t.Fatalf("request %s: neither held nor answered within %s", id, e2eWait)
		return id, false, 0
	}
}

// hold sends a request of kind to url and fails the test unless the gate
// holds it.
func (hs *holders) hold(url, kind string) string {
	hs.t.Helper()
	id, held, code := hs.try(url, kind)
	if !held {
		hs.t.Fatalf("request %s: answered %d, want it held", id, code)
	}
	return id
}

// refused fails the test unless a request to url is answered at once
// with a denial, 429.
func (hs *holders) refused(url, what string) {
	hs.t.Helper()
	if id, held, code := hs.try(url, "refused"); held || code != http.StatusTooManyRequests {
		hs.t.Fatalf("%s: request %s held %v, answered %d; want 429", what, id, held, code)
	}
}

// flood starts n clients that send requests of kind to urls in turn,
// each until one is held, 20 ms apart; stop ends those still trying and
// waits for them.
func (hs *holders) flood(urls []string, n int, kind string) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				if _, held, _ := hs.try(urls[i%len(urls)], kind); held {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	return func() {
		close(done)
		wg.Wait()
	}
}

// answers returns the statuses the callers of kind got, by status (0:
// still waiting).
func (hs *holders) answers(kind string) map[int]int {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	m := map[int]int{}
	for id, c := range hs.code {
		if strings.HasPrefix(id, kind+"-") {
			m[c]++
		}
	}
	return m
}

// proxyMetric sums the series of metric name with labels on proxy p's
// admin listener.
func proxyMetric(t *testing.T, p *proc, name string, labels ...string) float64 {
	t.Helper()
	code, _, body := fetch(t, "GET", "http://"+p.addr("admin")+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	return sumSeries(t, body, name, labels...)
}

// waitReloads waits until each proxy has loaded its rules n times.
func waitReloads(t *testing.T, n int, ps ...*proc) {
	t.Helper()
	for _, p := range ps {
		poll(t, fmt.Sprintf("rules loaded %d times", n), func() bool {
			return proxyMetric(t, p, "sluice_config_loads_total", `result="success"`) >= float64(n)
		})
	}
}

// sumMetric adds a metric up over proxies.
func sumMetric(t *testing.T, name string, ps ...*proc) float64 {
	t.Helper()
	s := 0.0
	for _, p := range ps {
		s += proxyMetric(t, p, name)
	}
	return s
}

const heldRules = `domain: llm
failure_policy: fail_closed
http:
  routes:
    - pattern: /
      descriptors: [[{key: api_key, header: X-Api-Key}]]
descriptors:
  - key: api_key
    concurrency: {max: MAX, ttl: TTL}
`

func heldRulesWith(maxHeld int, ttl string) string {
	return strings.NewReplacer("MAX", fmt.Sprint(maxHeld), "TTL", ttl).Replace(heldRules)
}

// heldSetup is two proxies on one Redis in front of a gate, their rules
// in file, and the holders of api key acme's requests.
type heldSetup struct {
	srv  *redistest.Server
	g    *gate
	file string
	a, b *proc
	urls []string // a's and b's
	hs   *holders
}

// startHeld starts a heldSetup with heldRulesWith(maxHeld, ttl); the
// requests still held are answered when the test ends.
func startHeld(t *testing.T, maxHeld int, ttl string) *heldSetup {
	t.Helper()
	s := &heldSetup{srv: redistest.Standalone(t), g: newGate()}
	upstream := httptest.NewServer(s.g)
	t.Cleanup(upstream.Close)
	s.file = filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, s.file, heldRulesWith(maxHeld, ttl))
	args := []string{"--config", s.file, "--upstream", upstream.URL, "--store", "redis", "--redis-url", s.srv.URL(), "--redis-prefix", t.Name() + ":"}
	s.a, s.b = startProxy(t, args...), startProxy(t, args...)
	s.urls = []string{"http://" + s.a.addr("proxy") + "/v1", "http://" + s.b.addr("proxy") + "/v1"}
	s.hs = newHolders(t, s.g, "acme")
	t.Cleanup(func() {
		s.g.letAll()
		s.hs.wg.Wait()
	})
	return s
}

// TestProxyE2EPermitsReload: the rules file is rewritten while requests
// are held through two proxies on one Redis. Editing the ttl keeps the
// permits held counted (before, each edit started an empty set: N more
// in flight per edit); after max is lowered below the permits held, those
// stay held, renewed past their ttl and never cancelled, and new requests
// are refused until fewer than the new max are held; raised, it admits
// again. In flight never exceeds the permits held at the decrease, nor,
// for the requests admitted after it, the new max.
func TestProxyE2EPermitsReload(t *testing.T) {
	beside(t)
	s := startHeld(t, 4, "3s")
	g, file, a, b, urls, hs := s.g, s.file, s.a, s.b, s.urls, s.hs
	for i := range 4 {
		hs.hold(urls[i%2], "old")
	}
	hs.refused(urls[0], "a fifth of 4")

	for i, ttl := range []string{"4s", "5s"} {
		writeRules(t, file, heldRulesWith(4, ttl))
		waitReloads(t, 2+i, a, b)
		hs.refused(urls[1], "after the ttl became "+ttl)
	}
	if n := g.count(""); n != 4 {
		t.Fatalf("%d in flight after the ttl edits, want 4", n)
	}

	// max 4 -> 2: the four stay held, through renewals past their ttl.
	writeRules(t, file, heldRulesWith(2, "5s"))
	waitReloads(t, 4, a, b)
	g.mark()
	hs.refused(urls[0], "max lowered to 2 with 4 held")
	time.Sleep(4 * time.Second) // past their ttl (3s): the renewals kept them
	if n, lost := g.count("old"), sumMetric(t, "sluice_permits_lost_total", a, b); n != 4 || lost != 0 {
		t.Fatalf("after max was lowered: %d of the 4 held still in flight, %v lost; want 4 and 0", n, lost)
	}
	hs.refused(urls[1], "max 2, 4 held, after their renewals")
	g.let(2)
	poll(t, "two held requests answered", func() bool { return g.count("") == 2 })
	hs.refused(urls[0], "max 2, 2 held")
	g.let(1)
	poll(t, "a third held request answered", func() bool { return g.count("") == 1 })
	hs.hold(urls[1], "new") // 1 held of 2: room
	hs.refused(urls[0], "max 2, 2 held again")

	// max 2 -> 3: one more.
	writeRules(t, file, heldRulesWith(3, "5s"))
	waitReloads(t, 5, a, b)
	hs.hold(urls[0], "new")
	hs.refused(urls[1], "max 3, 3 held")
	if p := g.mark(); p > 4 {
		t.Errorf("%d in flight after max was lowered from 4", p)
	}
	g.letAll()
	hs.wg.Wait()
	for kind, want := range map[string]int{"old": 4, "new": 2} {
		if got := hs.answers(kind); got[200] != want {
			t.Errorf("%s requests answered %v, want %d answered 200", kind, got, want)
		}
	}
}

// TestProxyE2EPermitsRedisRestart: requests hold permits through two
// proxies on a Redis that is killed and restarted empty. With room (3
// held of 4), each holder's next renewal holds its permit again: none is
// cancelled, the store counts 3 again, and one more request is admitted,
// not four. Full (4 of 4) with newcomers pressing: at most 2N in flight
// (no node decides locally: fail_closed) until the old holders' renewals
// (ttl/3), which hold their permits again while there is room and find
// them lost once the newcomers took it: those are answered 503, logged and
// counted as errors; then at most N.
func TestProxyE2EPermitsRedisRestart(t *testing.T) {
	beside(t)
	const capacity, ttl = 4, 3 * time.Second
	s := startHeld(t, capacity, ttl.String())
	srv, g, a, b, urls, hs := s.srv, s.g, s.a, s.b, s.urls, s.hs
	ps := []*proc{a, b}

	// With room: 3 of 4 held.
	for i := range 3 {
		hs.hold(urls[i%2], "roomy")
	}
	renewed := sumMetric(t, "sluice_permits_renewed_total", a, b)
	srv.Kill()
	srv.Restart()
	restarted := time.Now()
	// Every holder renews every ttl/3 once the store answers again:
	// three rounds of renewals, none lost.
	poll(t, "the holders' renewals after the restart", func() bool {
		return sumMetric(t, "sluice_permits_renewed_total", a, b) >= renewed+9 || sumMetric(t, "sluice_permits_lost_total", a, b) > 0
	})
	if lost := sumMetric(t, "sluice_permits_lost_total", a, b); lost != 0 {
		t.Fatalf("%v permits lost though the key had room", lost)
	}
	if n := g.count("roomy"); n != 3 {
		t.Fatalf("%d of the 3 held requests in flight after the restart, want 3: cancelled while there was room (%v)", n, hs.answers("roomy"))
	}
	t.Logf("3 of 4 held, Redis restarted empty: three rounds of renewals within %s, none lost or cancelled", time.Since(restarted).Round(10*time.Millisecond))
	hs.hold(urls[0], "old") // the one slot left in the store
	hs.refused(urls[1], "4 held again in the restarted store")
	if p := g.mark(); p != capacity {
		t.Fatalf("%d in flight, want %d", p, capacity)
	}

	// Full, with newcomers pressing on the restarted store.
	srv.Kill()
	srv.Restart()
	restarted = time.Now()
	g.mark()
	stopFlood := hs.flood(urls, 2*capacity, "new")
	// By ttl/3 after the store answers again, every old holder has
	// renewed: held again, or lost and cancelled. (Newcomers are in
	// first but for a very slow machine, where the old holders may take
	// every slot back: then wait out the window.)
	poll(t, "at most N in flight after the old holders' renewals", func() bool {
		return g.count("") <= capacity && (g.count("new") > 0 || time.Since(restarted) > 3*ttl)
	})
	window := g.mark()
	stopFlood()
	time.Sleep(ttl) // every holder renews at least twice more: nothing changes
	after := g.mark()
	old, cancelled := g.count("roomy")+g.count("old"), 0
	for _, kind := range []string{"roomy", "old"} {
		cancelled += hs.answers(kind)[http.StatusServiceUnavailable]
	}
	lost := sumMetric(t, "sluice_permits_lost_total", a, b)
	errs := 0.0
	for _, p := range ps {
		errs += proxyMetric(t, p, "sluice_proxy_requests_total", `result="error"`)
	}
	t.Logf("4 of 4 held, Redis restarted empty, %d newcomers pressing: at most %d in flight until the old holders renewed (bound 2N = %d), then at most %d; %d old holders kept, %d cancelled (503), %v lost, %v counted as errors",
		2*capacity, window, 2*capacity, after, old, cancelled, lost, errs)
	if window > 2*capacity {
		t.Errorf("%d in flight after the restart, beyond 2N = %d", window, 2*capacity)
	}
	if after > capacity {
		t.Errorf("%d in flight after the renewals, beyond N = %d", after, capacity)
	}
	if old+cancelled != capacity || float64(cancelled) != lost || float64(cancelled) != errs {
		t.Errorf("old holders: %d kept, %d answered 503 (of %d), %v lost, %v counted as errors: want them to agree", old, cancelled, capacity, lost, errs)
	}
	if cancelled > 0 && !strings.Contains(a.log()+b.log(), "concurrency permit was lost") {
		t.Errorf("no log line of the lost permits")
	}
	g.letAll()
	hs.wg.Wait()
}
