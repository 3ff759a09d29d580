package httpretry_test

import (
	"context"
	"errors"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/httpretry"
)

// seeded returns a deterministic Rand, safe for concurrent use.
func seeded(seed uint64) func(int64) int64 {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return func(n int64) int64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Int64N(n)
	}
}

// retryArrivals has 100 clients (each its own Transport) call a server
// at the same instant; the server refuses each client's first request with
// a bare 503 and accepts the second. It returns when the retries arrived.
func retryArrivals(t *testing.T, rnd func(int64) int64) []time.Duration {
	return arrivalsAfter(t, httpretry.Config{BaseDelay: time.Second, Rand: rnd}, nil)
}

// arrivalsAfter is retryArrivals with clients of cfg and refusals that
// carry the header refusal.
func arrivalsAfter(t *testing.T, cfg httpretry.Config, refusal http.Header) []time.Duration {
	var arrivals []time.Duration
	synctest.Test(t, func(t *testing.T) {
		n := newPipeNet()
		start := time.Now()
		var mu sync.Mutex
		seen := make(map[string]bool)
		n.serve(t, "api.test:80", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			id := r.Header.Get("Client")
			mu.Lock()
			retry := seen[id]
			seen[id] = true
			if retry {
				arrivals = append(arrivals, time.Since(start))
			}
			mu.Unlock()
			if !retry {
				maps.Copy(w.Header(), refusal)
				w.WriteHeader(http.StatusServiceUnavailable)
			}
		}))
		base := n.transport(t)
		var wg sync.WaitGroup
		for i := range 100 {
			c := cfg
			c.Base = base
			client := httpretry.NewClient(c)
			wg.Go(func() {
				req := newReq(t, t.Context(), "GET", apiURL, nil)
				req.Header.Set("Client", strconv.Itoa(i))
				resp, err := client.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Errorf("client %d: status %d", i, resp.StatusCode)
				}
			})
		}
		wg.Wait()
	})
	if len(arrivals) != 100 {
		t.Fatalf("%d retries, want 100", len(arrivals))
	}
	return arrivals
}

// spreadOf returns the standard deviation of ds and the largest number of
// them in one 100ms bucket.
func spreadOf(ds []time.Duration) (std time.Duration, busiest int) {
	var sum float64
	for _, d := range ds {
		sum += float64(d)
	}
	mean := sum / float64(len(ds))
	var sq float64
	buckets := make(map[time.Duration]int)
	for _, d := range ds {
		sq += (float64(d) - mean) * (float64(d) - mean)
		buckets[d/(100*time.Millisecond)]++
	}
	for _, n := range buckets {
		busiest = max(busiest, n)
	}
	return time.Duration(math.Sqrt(sq / float64(len(ds)))), busiest
}

// TestRetriesSpread checks that clients refused together retry apart with
// full jitter, where plain exponential backoff brings them back together.
func TestRetriesSpread(t *testing.T) {
	plainStd, plainBusiest := spreadOf(retryArrivals(t, maxRand))
	jitter := retryArrivals(t, seeded(1))
	std, busiest := spreadOf(jitter)
	t.Logf("100 retries: no jitter std %v, %d in the busiest 100ms; full jitter std %v, %d in the busiest 100ms, from %v to %v",
		plainStd, plainBusiest, std, busiest, slices.Min(jitter), slices.Max(jitter))
	if plainStd != 0 || plainBusiest != 100 {
		t.Errorf("no-jitter baseline: std %v, busiest bucket %d; want all together", plainStd, plainBusiest)
	}
	// Uniform over [0, 1s]: a standard deviation near 289ms, about 10 in
	// each 100ms.
	if std < 200*time.Millisecond || busiest > 25 {
		t.Errorf("full jitter: std %v, busiest bucket %d; want std >= 200ms and at most 25 in any 100ms", std, busiest)
	}
	for _, d := range jitter {
		if d < 0 || d > time.Second {
			t.Errorf("a retry at %v, outside [0, 1s]", d)
		}
	}
}

// TestDefaultRandSpreads checks the default random source the same way:
// the spread must not depend on a test's seed.
func TestDefaultRandSpreads(t *testing.T) {
	std, busiest := spreadOf(retryArrivals(t, nil))
	if std < 200*time.Millisecond || busiest > 30 {
		t.Errorf("default Rand: std %v, busiest bucket %d", std, busiest)
	}
}

// TestSelfThrottle checks that a host's announced spent quota holds later
// requests to it until the reset, bounded by MaxWait and the deadline, and
// leaves other hosts alone.
func TestSelfThrottle(t *testing.T) {
	spent := map[string]map[string]string{
		"RateLimit":             {"RateLimit": `"hour";r=0;t=20`, "RateLimit-Policy": `"hour";q=100;w=3600`},
		"RateLimit policy":      {"RateLimit": `"hour";r=0`, "RateLimit-Policy": `"hour";q=100;w=20`},
		"X-RateLimit-Remaining": {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "20"},
		"429 Retry-After":       {"Retry-After": "20"},
	}
	for name, h := range spent {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				status := 200
				if h["Retry-After"] != "" {
					status = 429
				}
				e := newEnv(t, httpretry.Config{MaxAttempts: 1}, reply{status: status, header: h}, reply{status: 200})
				other := &script{start: e.start, replies: []reply{{status: 200}}}
				e.net.serve(t, "other.test:80", other)

				if got, _, err := e.do(t, newReq(t, t.Context(), "GET", apiURL, nil)); err != nil || got != status {
					t.Fatalf("first request: %d %v", got, err)
				}
				time.Sleep(time.Second)
				if got, _, err := e.do(t, newReq(t, t.Context(), "GET", "http://other.test/", nil)); err != nil || got != 200 {
					t.Fatalf("other host: %d %v", got, err)
				}
				if at := other.seen()[0].at; at != time.Second {
					t.Errorf("other host held until %v, want not held (1s)", at)
				}
				if got, _, err := e.do(t, newReq(t, t.Context(), "GET", apiURL, nil)); err != nil || got != 200 {
					t.Fatalf("second request: %d %v", got, err)
				}
				if at := e.server.seen()[1].at; at != 20*time.Second {
					t.Errorf("second request sent at %v, want at the reset, 20s", at)
				}
				want := httpretry.Event{Host: "api.test", Attempt: 1, Wait: 19 * time.Second, Source: httpretry.SourceQuota}
				if ev := e.waits.all(); len(ev) != 1 || !sameEvent(ev[0], want) {
					t.Errorf("events %+v, want %+v", ev, want)
				}
			})
		})
	}
}

// TestSelfThrottleBounds checks MaxWait and the deadline against a hold.
func TestSelfThrottleBounds(t *testing.T) {
	spent := reply{status: 200, header: map[string]string{"RateLimit": `"day";r=0;t=600`}}
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, httpretry.Config{MaxWait: 5 * time.Second}, spent, reply{status: 200})
		if _, _, err := e.do(t, newReq(t, t.Context(), "GET", apiURL, nil)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if _, _, err := e.do(t, newReq(t, t.Context(), "GET", apiURL, nil)); err != nil {
			t.Fatal(err)
		}
		if at := e.server.seen()[1].at; at != 6*time.Second {
			t.Errorf("held request sent at %v, want after MaxWait, at 6s", at)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, httpretry.Config{}, spent, reply{status: 200})
		if _, _, err := e.do(t, newReq(t, t.Context(), "GET", apiURL, nil)); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		e.stopped(t, ctx, httpretry.Error{Err: httpretry.ErrDeadline, Wait: 600 * time.Second, Source: httpretry.SourceQuota})
		// A request with a body that is never sent still has it closed.
		body := &closeCounter{Reader: strings.NewReader("unsent")}
		if _, _, err := e.do(t, newReq(t, ctx, "PUT", apiURL, body)); !errors.Is(err, httpretry.ErrDeadline) || body.closed != 1 {
			t.Errorf("err = %v, body closed %d times; want ErrDeadline, closed once", err, body.closed)
		}
		if n := len(e.server.seen()); n != 1 || time.Since(e.start) != 0 {
			t.Errorf("%d requests, returned after %v; want 1, at once", n, time.Since(e.start))
		}
	})
}

type closeCounter struct {
	io.Reader
	closed int
}

func (c *closeCounter) Close() error {
	c.closed++
	return nil
}

// TestPacing checks the per-host token bucket: requests beyond the burst
// go out at the rate, a request whose turn is past its deadline fails at
// once and books nothing, and a cancelled wait gives its turn back.
func TestPacing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, httpretry.Config{Pace: httpretry.Pace{Rate: 2, Burst: 1}}, reply{status: 200})
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				if _, _, err := e.do(t, newReq(t, t.Context(), "GET", apiURL, nil)); err != nil {
					t.Error(err)
				}
			})
		}
		synctest.Wait() // all four have booked their turns: 0, 0.5s, 1s, 1.5s

		// Its turn would come at 2s, past its deadline: it fails at once.
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		_, _, err := e.do(t, newReq(t, ctx, "GET", apiURL, nil))
		cancel()
		var re *httpretry.Error
		if !errors.As(err, &re) || re.Err != httpretry.ErrDeadline || re.Source != httpretry.SourcePacing || re.Wait != 2*time.Second {
			t.Errorf("err = %v (%+v), want ErrDeadline from pacing, a 2s wait", err, re)
		}
		// It books the 2s turn and gives it back when cancelled at 0.2s.
		ctx, cancel = context.WithCancel(t.Context())
		time.AfterFunc(200*time.Millisecond, cancel)
		if _, _, err := e.do(t, newReq(t, ctx, "GET", apiURL, nil)); !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", err)
		}
		// So this one takes the 2s turn.
		if _, _, err := e.do(t, newReq(t, t.Context(), "GET", apiURL, nil)); err != nil {
			t.Error(err)
		}
		wg.Wait()
		var at []time.Duration
		for _, h := range e.server.seen() {
			at = append(at, h.at)
		}
		want := []time.Duration{0, 500 * time.Millisecond, time.Second, 1500 * time.Millisecond, 2 * time.Second}
		if !equalDurations(at, want) {
			t.Errorf("sent at %v, want %v", at, want)
		}
	})
}

// TestBudget checks the adaptive retry budget against a server that
// accepts 5 requests a second from a client that wants 50: with K = 2 the
// client sends about K × 5 a second and rejects the rest locally, a
// fraction of 1 − 2×5/50 = 0.8, without sending them.
func TestBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newPipeNet()
		var mu sync.Mutex
		var window int64
		var inWindow, served int
		n.serve(t, "api.test:80", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			served++
			if s := time.Now().Unix(); s != window {
				window, inWindow = s, 0
			}
			if inWindow++; inWindow > 5 {
				w.WriteHeader(http.StatusTooManyRequests)
			}
		}))
		client := httpretry.NewClient(httpretry.Config{
			Base: n.transport(t), MaxAttempts: 1, Budget: &httpretry.Budget{}, Rand: seeded(2),
		})
		var sent, rejected, lateTotal, lateRejected int
		for i := range 50 * 240 { // four minutes at 50 a second
			resp, err := client.Do(newReq(t, t.Context(), "GET", apiURL, nil))
			switch {
			case errors.Is(err, httpretry.ErrRejected):
				rejected++
			case err != nil:
				t.Fatal(err)
			default:
				resp.Body.Close()
				sent++
			}
			if i >= 50*120 { // the last two minutes: the window is full
				lateTotal++
				if err != nil {
					lateRejected++
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		frac := float64(lateRejected) / float64(lateTotal)
		t.Logf("sent %d, rejected locally %d; in the last two minutes %.3f rejected (want about 0.8)", sent, rejected, frac)
		if frac < 0.77 || frac > 0.83 {
			t.Errorf("rejected %.3f locally in steady state, want 0.8 ± 0.03", frac)
		}
		mu.Lock()
		defer mu.Unlock()
		if served != sent {
			t.Errorf("server saw %d requests, client sent %d: rejected requests must not be sent", served, sent)
		}
	})
}

// TestHintJitterSpreads checks that clients told the same Retry-After come
// back spread over HintJitter after it, never before it, where without
// the jitter they all arrive at the same instant.
func TestHintJitterSpreads(t *testing.T) {
	hint := http.Header{"Retry-After": {"2"}}
	plain := arrivalsAfter(t, httpretry.Config{HintJitter: -1, Rand: seeded(1)}, hint)
	if slices.Min(plain) != 2*time.Second || slices.Max(plain) != 2*time.Second {
		t.Errorf("without hint jitter: arrivals from %v to %v, want all at 2s", slices.Min(plain), slices.Max(plain))
	}
	spread := arrivalsAfter(t, httpretry.Config{Rand: seeded(2)}, hint)
	std, busiest := spreadOf(spread)
	t.Logf("100 retries after Retry-After: 2: std %v, %d in the busiest 100ms, from %v to %v", std, busiest, slices.Min(spread), slices.Max(spread))
	if lo, hi := slices.Min(spread), slices.Max(spread); lo < 2*time.Second || hi > 3*time.Second {
		t.Errorf("arrivals from %v to %v, want within [2s, 3s]: never before the hint, at most HintJitter (1s) after", lo, hi)
	}
	if std < 200*time.Millisecond || busiest > 25 {
		t.Errorf("std %v, busiest 100ms bucket %d: want std >= 200ms and at most 25", std, busiest)
	}
}
