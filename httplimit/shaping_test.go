package httplimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
)

// leakyRules releases 10 requests a second, one at a time: the outflow of
// the queue is one request every 100 ms.
const leakyRules = `
domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: leaky_bucket, burst: 1}
`

// shapingRun is a synctest run of requests through a shaping middleware
// on a memstore on the bubble's clock.
type shapingRun struct {
	t       *testing.T
	h       http.Handler
	start   time.Time
	mu      sync.Mutex
	entered []string // "id@ms" in the order the handler saw them
	wg      sync.WaitGroup
	answers []*httptest.ResponseRecorder
	at      []time.Duration
	res     results // what OnResult was told
}

func newShapingRun(t *testing.T, sh httplimit.Shaping) *shapingRun {
	store := memstore.New(memstore.Config{})
	t.Cleanup(func() { store.Close() })
	run := &shapingRun{t: t, start: time.Now()}
	mw, err := httplimit.New(httplimit.Config{
		Decider:  mustDecider(sluice.NewLimiter(store), rulestest.Config(t, leakyRules)),
		Domain:   "api",
		Shaping:  &sh,
		OnResult: run.res.on,
	})
	if err != nil {
		t.Fatal(err)
	}
	run.h = mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		run.mu.Lock()
		run.entered = append(run.entered, fmt.Sprintf("%s@%d", r.Header.Get("X-Id"), time.Since(run.start).Milliseconds()))
		run.mu.Unlock()
	}))
	return run
}

// send starts request id from client 192.0.2.1 and waits until it is
// admitted, denied, or blocked in the queue.
func (run *shapingRun) send(ctx context.Context) {
	id := len(run.answers)
	rec := httptest.NewRecorder()
	run.answers = append(run.answers, rec)
	run.at = append(run.at, 0)
	r := httptest.NewRequestWithContext(ctx, "GET", "/", nil)
	r.RemoteAddr = "192.0.2.1:1234"
	r.Header.Set("X-Id", fmt.Sprint(id))
	run.wg.Add(1)
	go func() {
		defer run.wg.Done()
		run.h.ServeHTTP(rec, r)
		run.at[id] = time.Since(run.start)
	}()
	synctest.Wait()
}

// results waits for every request and returns "status@ms" of each, and
// the handler's log.
func (run *shapingRun) results() (answers, entered string) {
	run.wg.Wait()
	var a []string
	for i, rec := range run.answers {
		a = append(a, fmt.Sprintf("%d@%d", rec.Code, run.at[i].Milliseconds()))
	}
	return strings.Join(a, " "), strings.Join(run.entered, " ")
}

// A burst of 8 is released in arrival order at the outflow rate, one every
// 100 ms, never faster; each admitted response shows nothing remaining.
func TestShapingOrderAndRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		run := newShapingRun(t, httplimit.Shaping{MaxDelay: 2 * time.Second})
		for range 8 {
			run.send(t.Context())
		}
		answers, entered := run.results()
		if want := "0@0 1@100 2@200 3@300 4@400 5@500 6@600 7@700"; entered != want {
			t.Errorf("handler saw %s\nwant          %s", entered, want)
		}
		if want := "200@0 200@100 200@200 200@300 200@400 200@500 200@600 200@700"; answers != want {
			t.Errorf("answers %s\nwant    %s", answers, want)
		}
		for i, rec := range run.answers {
			if got := rec.Header().Get("X-RateLimit-Remaining"); got != "0" {
				t.Errorf("request %d: X-RateLimit-Remaining %q, want 0", i, got)
			}
		}
		if got, want := run.res.take(), "allowed"+strings.Repeat(",delayed", 7); got != want {
			t.Errorf("results %s, want %s", got, want)
		}
	})
}

// A request that finds MaxQueue requests of its key waiting is decided at
// once, and denied.
func TestShapingMaxQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		run := newShapingRun(t, httplimit.Shaping{MaxDelay: 2 * time.Second, MaxQueue: 3})
		for range 6 {
			run.send(t.Context())
		}
		answers, entered := run.results()
		if want := "200@0 200@100 200@200 200@300 429@0 429@0"; answers != want {
			t.Errorf("answers %s, want %s", answers, want)
		}
		if want := "0@0 1@100 2@200 3@300"; entered != want {
			t.Errorf("handler saw %s, want %s", entered, want)
		}
		if got := run.answers[4].Header().Get("Retry-After"); got != "1" {
			t.Errorf("Retry-After %q of a request denied by a full queue, want 1 (the 100 ms wait, rounded up)", got)
		}
	})
}

// Requests that waiting cannot admit within MaxDelay are denied: at once
// when the limits say so on arrival, or when their turn comes too late.
func TestShapingMaxDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		run := newShapingRun(t, httplimit.Shaping{MaxDelay: 250 * time.Millisecond})
		for range 5 {
			run.send(t.Context())
		}
		answers, _ := run.results()
		// 0 at once, 1 and 2 delayed; 3 and 4 would pass at 300 and 400
		// ms, past their 250 ms: denied at 200 ms, when each finds it out.
		if want := "200@0 200@100 200@200 429@200 429@200"; answers != want {
			t.Errorf("answers %s, want %s", answers, want)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		run := newShapingRun(t, httplimit.Shaping{MaxDelay: 50 * time.Millisecond})
		run.send(t.Context())
		run.send(t.Context())
		if answers, _ := run.results(); answers != "200@0 429@0" {
			t.Errorf("answers %s, want 200@0 429@0", answers)
		}
	})
}

// A request whose client goes away leaves the queue at once; the requests
// behind it move up.
func TestShapingCancelLeavesQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		run := newShapingRun(t, httplimit.Shaping{MaxDelay: 2 * time.Second})
		run.send(t.Context())
		ctx1, cancel1 := context.WithCancel(t.Context()) // the head, sleeping
		run.send(ctx1)
		ctx2, cancel2 := context.WithCancel(t.Context()) // waiting its turn
		run.send(ctx2)
		run.send(t.Context())
		run.send(t.Context())
		time.Sleep(50 * time.Millisecond)
		cancel2()
		cancel1()
		answers, entered := run.results()
		// 1 and 2 left at 50 ms unanswered; 3 and 4 take their places.
		if want := "0@0 3@100 4@200"; entered != want {
			t.Errorf("handler saw %s, want %s", entered, want)
		}
		if want := "200@0 200@50 200@50 200@100 200@200"; answers != want {
			t.Errorf("answers %s, want %s (the recorder's default 200 for the unanswered)", answers, want)
		}
		for _, i := range []int{1, 2} {
			if run.answers[i].Body.Len() != 0 || len(run.answers[i].Header()) != 0 {
				t.Errorf("request %d left the queue but was answered: %v", i, run.answers[i].Header())
			}
		}
		if got := run.res.take(); got != "allowed,canceled,canceled,delayed,delayed" {
			t.Errorf("results %s, want allowed,canceled,canceled,delayed,delayed", got)
		}
	})
}

// On a real listener, concurrent requests are all admitted, and no faster
// than the outflow rate allows.
func TestShapingRealListener(t *testing.T) {
	const n = 8
	store := memstore.New(memstore.Config{})
	t.Cleanup(func() { store.Close() })
	mw, err := httplimit.New(httplimit.Config{
		Decider: mustDecider(sluice.NewLimiter(store), rulestest.Config(t, strings.Replace(leakyRules, "10,", "20,", 1))),
		Domain:  "api",
		Shaping: &httplimit.Shaping{MaxDelay: 5 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var times []time.Time
	srv := server(t, mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
	})))
	var wg sync.WaitGroup
	codes := make(chan int, n)
	for range n {
		wg.Go(func() { codes <- do(t, srv.Client(), "GET", srv.URL, nil).status })
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != 200 {
			t.Errorf("status %d, want every request admitted", c)
		}
	}
	// 20 a second with a burst of 1: the last of 8 passes at least 7 ×
	// 50 ms after the first.
	if span := times[len(times)-1].Sub(times[0]); span < 7*50*time.Millisecond {
		t.Errorf("8 requests passed within %v: faster than 20 a second", span)
	}
}

func TestShapingConfigErrors(t *testing.T) {
	d := decider(t, leakyRules)
	for name, sh := range map[string]*httplimit.Shaping{
		"no delay":       {},
		"negative delay": {MaxDelay: -time.Second},
		"negative queue": {MaxDelay: time.Second, MaxQueue: -1},
		"huge queue":     {MaxDelay: time.Second, MaxQueue: 1 << 30},
	} {
		if _, err := httplimit.New(httplimit.Config{Decider: d, Domain: "api", Shaping: sh}); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// countingDecider counts the decisions of closedDecider.
type countingDecider struct {
	closedDecider
	calls atomic.Int64
}

func (d *countingDecider) Decide(ctx context.Context, r *decide.Request, o *decide.Outcome) error {
	d.calls.Add(1)
	if err := d.closedDecider.Decide(ctx, r, o); err != nil {
		return err
	}
	o.Degraded = 0 // a store's answer, naming no wait
	return nil
}

// A denial that names no wait is denied at once, not asked again in a loop.
func TestShapingDenialWithoutWait(t *testing.T) {
	d := &countingDecider{}
	srv := limited(t, httplimit.Config{Decider: d, Domain: "api", Shaping: &httplimit.Shaping{MaxDelay: 300 * time.Millisecond}})
	if r := do(t, srv.Client(), "GET", srv.URL, nil); r.status != 429 || r.header.Get("Retry-After") != "1" {
		t.Errorf("%d, Retry-After %q; want 429, 1", r.status, r.header.Get("Retry-After"))
	}
	if n := d.calls.Load(); n != 1 {
		t.Errorf("%d decisions for one request, want 1", n)
	}
}
