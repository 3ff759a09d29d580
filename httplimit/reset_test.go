package httplimit_test

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
)

// clocked is a server of okHandler behind the middleware, deciding one
// limit on the client address with a memstore whose clock the test moves.
type clocked struct {
	t      *testing.T
	client *http.Client
	url    string
	now    atomic.Int64
	name   string
	nowStr func() string
}

func newClocked(t *testing.T, limit string, start time.Time) *clocked {
	t.Helper()
	c := &clocked{t: t, name: "api.remote_address"}
	c.now.Store(start.UnixNano())
	store := memstore.New(memstore.Config{Now: func() time.Time { return time.Unix(0, c.now.Load()) }})
	t.Cleanup(func() { store.Close() })
	dec := mustDecider(sluice.NewLimiter(store), rulestest.Config(t, "domain: api\ndescriptors:\n  - key: remote_address\n    rate_limit: "+limit+"\n"))
	srv := limited(t, httplimit.Config{Decider: dec, Domain: "api"})
	c.client, c.url = srv.Client(), srv.URL
	c.nowStr = func() string { return time.Unix(0, c.now.Load()).UTC().Format("15:04:05.00") }
	return c
}

// answer is what a client reads from a response's rate limit headers.
type answer struct {
	status int
	r, t   int64 // the RateLimit field's r and t
	retry  int64 // Retry-After; -1 when absent
	at     string
}

func (a answer) String() string {
	s := fmt.Sprintf("%s %d r=%d t=%d", a.at, a.status, a.r, a.t)
	if a.retry >= 0 {
		s += fmt.Sprintf(" Retry-After=%d", a.retry)
	}
	return s
}

// get sends a request at the clock's time and reads its headers, checking
// that they agree with each other: X-RateLimit-Remaining is r and
// X-RateLimit-Reset is t, and a denial's Retry-After is never earlier
// than t.
func (c *clocked) get() answer {
	c.t.Helper()
	rep := do(c.t, c.client, "GET", c.url, nil)
	a := answer{status: rep.status, retry: -1, at: c.nowStr()}
	rl := rep.header.Get("RateLimit")
	var ok [2]bool
	for i, part := range strings.Split(rl, ";") {
		if i == 0 {
			if part != strconv.Quote(c.name) {
				c.t.Fatalf("%s: RateLimit %q names another limit", a.at, rl)
			}
			continue
		}
		k, v, _ := strings.Cut(part, "=")
		n, err := strconv.ParseInt(v, 10, 64)
		switch {
		case err != nil:
			c.t.Fatalf("%s: RateLimit %q: %v", a.at, rl, err)
		case k == "r":
			a.r, ok[0] = n, true
		case k == "t":
			a.t, ok[1] = n, true
		}
	}
	if !ok[0] || !ok[1] {
		c.t.Fatalf("%s: RateLimit %q without r and t", a.at, rl)
	}
	if v := rep.header.Get("Retry-After"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			c.t.Fatalf("%s: Retry-After %q", a.at, v)
		}
		a.retry = n
	}
	if got := rep.header.Get("X-RateLimit-Remaining"); got != strconv.FormatInt(a.r, 10) {
		c.t.Errorf("%v: X-RateLimit-Remaining %s, not r", a, got)
	}
	if got := rep.header.Get("X-RateLimit-Reset"); got != strconv.FormatInt(a.t, 10) {
		c.t.Errorf("%v: X-RateLimit-Reset %s, not t", a, got)
	}
	switch {
	case a.status == 200 && a.retry >= 0:
		c.t.Errorf("%v: Retry-After on an admitted request", a)
	case a.status == 429 && a.retry < a.t:
		c.t.Errorf("%v: Retry-After earlier than t", a)
	case a.status != 200 && a.status != 429:
		c.t.Fatalf("%v: status %d", a, a.status)
	}
	return a
}

// advance moves the clock d on.
func (c *clocked) advance(d time.Duration) { c.now.Add(int64(d)) }

func secs(n int64) time.Duration { return time.Duration(n) * time.Second }

// The RateLimit field's t is the time until more quota is available, for
// every algorithm, and X-RateLimit-Reset and Retry-After agree with it. A
// client at one address sends requests until it has no quota left (r=0),
// then once more: the denial's t is its Retry-After (a request of cost 1
// fits as soon as there is more quota), it counts down (at half the wait
// and a second before it the request is still denied, with t and
// Retry-After the time left), and a client that waits t finds quota.
//
// Where the decision tells exactly when more quota comes (fixed window,
// the buckets, GCRA), the t of the last admitted request is that time
// too; for the sliding window, sliding log and sketch it is a time by
// which more quota has surely come, never earlier, and a client that
// waits that long is admitted.
func TestResetIsMoreQuota(t *testing.T) {
	// The clock starts 20.25 s into a minute (and into a 30 s refill step
	// of the epoch), or as the case says.
	for _, tc := range []struct {
		name  string
		limit string
		start time.Duration // into the minute
		exact bool          // an admitted request's t is exactly when more quota comes
	}{
		{"fixed_window", "{unit: minute, requests_per_unit: 3, algorithm: fixed_window}", 20250 * time.Millisecond, true},
		{"sliding_window", "{unit: minute, requests_per_unit: 5, algorithm: sliding_window}", 51 * time.Second, false},
		{"sliding_log", "{unit: minute, requests_per_unit: 3, algorithm: sliding_log}", 20250 * time.Millisecond, false},
		{"token_bucket", "{unit: minute, requests_per_unit: 10, burst: 3, algorithm: token_bucket}", 20250 * time.Millisecond, true},
		{"token_bucket_discrete", "{unit: minute, requests_per_unit: 2, burst: 3, algorithm: token_bucket, refill_interval: 30s}", 20250 * time.Millisecond, true},
		{"leaky_bucket", "{unit: minute, requests_per_unit: 10, burst: 3, algorithm: leaky_bucket}", 20250 * time.Millisecond, true},
		{"gcra", "{unit: hour, requests_per_unit: 1, burst: 4, algorithm: gcra}", 20250 * time.Millisecond, true},
		{"sketch", "{unit: minute, requests_per_unit: 5, algorithm: sketch}", 51 * time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClocked(t, tc.limit, time.Unix(1_700_000_000-20, 0).Add(tc.start))
			var next answer // the request admitted after the last wait
			for cycle := range 6 {
				// Spend the quota left: every admitted request's t says
				// when more comes.
				last := next
				for i := 0; cycle == 0 || last.r > 0; i++ {
					last = c.get()
					if last.status != 200 {
						t.Fatalf("cycle %d: %v: denied with quota left", cycle, last)
					}
					if last.r == 0 {
						break
					}
					if i > 10 {
						t.Fatalf("cycle %d: %v: the quota never runs out", cycle, last)
					}
				}
				deny := c.get()
				if deny.status != 429 || deny.r != 0 {
					t.Fatalf("cycle %d: after %v: %v, want a denial", cycle, last, deny)
				}
				// A request of cost 1 is admitted as soon as there is more
				// quota: the denial's t is its Retry-After.
				if deny.t != deny.retry || deny.t < 1 {
					t.Errorf("cycle %d: %v: t is not Retry-After", cycle, deny)
				}
				if tc.exact && last.t != deny.t || !tc.exact && last.t < deny.t {
					t.Errorf("cycle %d: admitted %v, then denied %v", cycle, last, deny)
				}
				// t counts down to more quota.
				wait := deny.t
				for _, at := range []int64{wait / 2, wait - 1} {
					if at <= 0 {
						continue
					}
					c.advance(secs(at))
					if a := c.get(); a.status != 429 || a.t != wait-at || a.retry != wait-at {
						t.Errorf("cycle %d: %s after %v: %v, want a denial with t and Retry-After %d", cycle, secs(at), deny, a, wait-at)
					}
					c.advance(-secs(at))
				}
				// A client that honours the admitted request's t, or the
				// denial's Retry-After, finds quota.
				c.advance(secs(max(last.t, deny.retry)))
				if next = c.get(); next.status != 200 {
					t.Fatalf("cycle %d: admitted %v, denied %v; after waiting: %v", cycle, last, deny, next)
				}
			}
		})
	}
}

// The case of examples/proxy.yaml: 5 requests a minute in a sliding
// window, all 5 sent 51 s into a minute. The sixth is denied until 12 s
// into the next minute (the 5 then weigh 5 × 48/60 = 4): 21 s, which t,
// X-RateLimit-Reset and Retry-After all say, and 15 s later 6 s; then it
// is admitted. Before the fifth, t says when the quota left grows: the
// first request's share of it only once it has left, at the end of the
// next minute.
func TestSlidingWindowResetIsRetry(t *testing.T) {
	c := newClocked(t, "{unit: minute, requests_per_unit: 5, algorithm: sliding_window}", time.Unix(1_700_000_000-20+51, 0))
	var got []string
	for range 6 {
		got = append(got, c.get().String())
	}
	c.advance(15 * time.Second)
	got = append(got, c.get().String())
	c.advance(6 * time.Second)
	got = append(got, strconv.Itoa(c.get().status))
	want := []string{
		"22:13:51.00 200 r=4 t=69",
		"22:13:51.00 200 r=3 t=39",
		"22:13:51.00 200 r=2 t=29",
		"22:13:51.00 200 r=1 t=24",
		"22:13:51.00 200 r=0 t=21",
		"22:13:51.00 429 r=0 t=21 Retry-After=21",
		"22:14:06.00 429 r=0 t=6 Retry-After=6",
		"200",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
