package httpretry_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/httpretry"
	"github.com/sluicehq/sluice/internal/testsupport/logtest"
)

const apiURL = "http://api.test/v1/things"

// reply is one scripted answer. A header value "-" removes the field (the
// server's Date, for one).
type reply struct {
	status int
	header map[string]string
	body   string
}

// hit is a request as the server saw it.
type hit struct {
	at     time.Duration // since the server started
	method string
	body   string
}

// script is a handler that answers the i-th request with replies[i] (past
// the end, the last reply) and records what it saw.
type script struct {
	start   time.Time
	replies []reply
	mu      sync.Mutex
	hits    []hit
}

func (s *script) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	i := len(s.hits)
	s.hits = append(s.hits, hit{at: time.Since(s.start), method: r.Method, body: string(body)})
	rep := s.replies[min(i, len(s.replies)-1)]
	s.mu.Unlock()
	for k, v := range rep.header {
		if v == "-" {
			w.Header()[k] = nil
		} else {
			w.Header().Set(k, v)
		}
	}
	w.WriteHeader(rep.status)
	_, _ = io.WriteString(w, rep.body)
}

func (s *script) seen() []hit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]hit(nil), s.hits...)
}

// waits records the events of OnWait.
type waits struct {
	mu sync.Mutex
	ev []httpretry.Event
}

func (w *waits) add(e httpretry.Event) {
	w.mu.Lock()
	w.ev = append(w.ev, e)
	w.mu.Unlock()
}

func (w *waits) all() []httpretry.Event {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]httpretry.Event(nil), w.ev...)
}

// env is a client and a scripted server on an in-memory network, in a
// synctest bubble.
type env struct {
	net    *pipeNet
	server *script
	client *http.Client
	waits  *waits
	start  time.Time
}

func newEnv(t *testing.T, cfg httpretry.Config, replies ...reply) *env {
	t.Helper()
	e := &env{net: newPipeNet(), waits: new(waits), start: time.Now()}
	e.server = &script{start: e.start, replies: replies}
	e.net.serve(t, "api.test:80", e.server)
	cfg.Base = e.net.transport(t)
	cfg.OnWait = e.waits.add
	if cfg.HintJitter == 0 {
		cfg.HintJitter = -1 // exact waits; TestHintJitterSpreads tests the jitter
	}
	e.client = httpretry.NewClient(cfg)
	return e
}

// get sends a GET and returns the status and body.
func (e *env) do(t *testing.T, req *http.Request) (int, string, error) {
	t.Helper()
	resp, err := e.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func newReq(t *testing.T, ctx context.Context, method, url string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func gaps(hits []hit) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(hits); i++ {
		out = append(out, hits[i].at-hits[i-1].at)
	}
	return out
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestHintWaits checks that the wait before a retry is exactly the
// server's hint, for each kind of hint, and that the event says so.
func TestHintWaits(t *testing.T) {
	// A server clock one hour ahead of the client's: dates in hints are
	// measured from the response's Date, not the client's clock.
	base := time.Date(2000, 1, 1, 1, 0, 0, 0, time.UTC)
	date := func(d time.Duration) string { return base.Add(d).Format(http.TimeFormat) }
	local := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC) // the bubble's start
	cases := []struct {
		name   string
		header map[string]string
		status int
		want   time.Duration
		source httpretry.Source
	}{
		{"Retry-After seconds", map[string]string{"Retry-After": "7"}, 429, 7 * time.Second, httpretry.SourceRetryAfter},
		{"Retry-After 503", map[string]string{"Retry-After": "120"}, 503, 120 * time.Second, httpretry.SourceRetryAfter},
		{"Retry-After date from Date", map[string]string{"Date": date(0), "Retry-After": date(42 * time.Second)}, 429, 42 * time.Second, httpretry.SourceRetryAfter},
		{"Retry-After date, no Date", map[string]string{"Date": "-", "Retry-After": local.Add(13 * time.Second).Format(http.TimeFormat)}, 429, 13 * time.Second, httpretry.SourceRetryAfter},
		{"Retry-After RFC 850 date", map[string]string{"Date": date(0), "Retry-After": base.Add(5 * time.Second).Format(time.RFC850)}, 429, 5 * time.Second, httpretry.SourceRetryAfter},
		{"RateLimit t", map[string]string{"RateLimit": `"burst";r=0;t=12, "day";r=50;t=3000`}, 429, 12 * time.Second, httpretry.SourceRateLimit},
		{"RateLimit longest exhausted", map[string]string{"RateLimit": `"burst";r=0;t=12, "day";r=0;t=30`}, 429, 30 * time.Second, httpretry.SourceRateLimit},
		{"RateLimit policy window", map[string]string{"RateLimit": `"burst";r=0`, "RateLimit-Policy": `"burst";q=10;w=25, "day";q=1000;w=86400`}, 429, 25 * time.Second, httpretry.SourceRateLimit},
		{"X-RateLimit-Reset delta", map[string]string{"X-RateLimit-Reset": "9"}, 429, 9 * time.Second, httpretry.SourceXRateLimitReset},
		{"X-RateLimit-Reset epoch", map[string]string{"Date": date(0), "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": strconv.FormatInt(base.Add(15*time.Second).Unix(), 10)}, 429, 15 * time.Second, httpretry.SourceXRateLimitReset},
		{"Retry-After before RateLimit", map[string]string{"Retry-After": "3", "RateLimit": `"a";r=0;t=8`, "X-RateLimit-Reset": "11"}, 429, 3 * time.Second, httpretry.SourceRetryAfter},
		{"RateLimit before X-RateLimit-Reset", map[string]string{"RateLimit": `"a";r=0;t=8`, "X-RateLimit-Reset": "11"}, 429, 8 * time.Second, httpretry.SourceRateLimit},
		{"malformed RateLimit skipped", map[string]string{"RateLimit": `"a";r=0;t=8,`, "X-RateLimit-Reset": "11"}, 429, 11 * time.Second, httpretry.SourceXRateLimitReset},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, httpretry.Config{MaxWait: time.Hour},
					reply{status: c.status, header: c.header, body: "slow down"},
					reply{status: 200, body: "ok"})
				status, body, err := e.do(t, newReq(t, t.Context(), "GET", apiURL, nil))
				if err != nil || status != 200 || body != "ok" {
					t.Fatalf("got %d %q %v, want 200 ok", status, body, err)
				}
				if g := gaps(e.server.seen()); !equalDurations(g, []time.Duration{c.want}) {
					t.Errorf("retry came after %v, want %v", g, c.want)
				}
				want := httpretry.Event{Host: "api.test", Attempt: 2, Status: c.status, Wait: c.want, Source: c.source}
				if ev := e.waits.all(); len(ev) != 1 || !sameEvent(ev[0], want) {
					t.Errorf("events %+v, want one %+v", ev, want)
				}
			})
		})
	}
}

// stopped sends a GET with ctx, which must fail with an *httpretry.Error
// equal to want (its Header aside), and returns the error.
func (e *env) stopped(t *testing.T, ctx context.Context, want httpretry.Error) *httpretry.Error {
	t.Helper()
	_, _, err := e.do(t, newReq(t, ctx, "GET", apiURL, nil))
	var re *httpretry.Error
	if !errors.As(err, &re) {
		t.Fatalf("err = %v, want *httpretry.Error", err)
	}
	got := *re
	got.Header = nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("error %+v, want %+v", got, want)
	}
	return re
}

func sameEvent(a, b httpretry.Event) bool {
	a.Request, b.Request = nil, nil
	return a == b
}

// TestBadHintsIgnored checks that hints that are negative, absurd, in the
// past or malformed are ignored: the retry falls back to the backoff, and
// never waits longer than its ceiling.
func TestBadHintsIgnored(t *testing.T) {
	local := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	bad := []map[string]string{
		{"Retry-After": "-5"},
		{"Retry-After": "+5"},
		{"Retry-After": "5.5"},
		{"Retry-After": "99999999999999999999"},
		{"Retry-After": "400000000"}, // more than ten years
		{"Retry-After": "soon"},
		{"Retry-After": local.Add(-time.Hour).Format(http.TimeFormat)},
		{"Date": local.Format(http.TimeFormat), "Retry-After": local.AddDate(20, 0, 0).Format(http.TimeFormat)},
		{"RateLimit": `"a";r=0;t=-1`},
		{"RateLimit": `"a";r=-1;t=5`},
		{"RateLimit": `"a";t=5`},
		{"RateLimit": `"a";r=0;t=5.0`},
		{"RateLimit": `a;r=0;t=5`},
		{"RateLimit": `"a";r=0;t=5,`},
		{"RateLimit": `("a" "b");r=0;t=5`},
		{"RateLimit": `"a";r=0;t=5;R=1`},
		{"RateLimit": `"a";r=0;t=5 "b"`},
		{"RateLimit": `"a";r=0;t=999999999999999999`},
		{"RateLimit": `"a";r=0`, "RateLimit-Policy": `"a";w=30`},
		{"RateLimit": `"a";r=0`, "RateLimit-Policy": `"a";q=10;w=-30`},
		{"X-RateLimit-Reset": "-3"},
		{"X-RateLimit-Reset": "1e3"},
		{"X-RateLimit-Reset": strconv.FormatInt(local.Add(-time.Minute).Unix(), 10)},
		{"X-RateLimit-Reset": "999999999999999999"},
		{"X-RateLimit-Reset": "5", "X-RateLimit-Remaining": "3"},
	}
	for _, h := range bad {
		t.Run(strings.ReplaceAll(toString(h), "/", "|"), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, httpretry.Config{BaseDelay: time.Second, MaxWait: time.Hour},
					reply{status: 429, header: h}, reply{status: 200})
				if status, _, err := e.do(t, newReq(t, t.Context(), "GET", apiURL, nil)); err != nil || status != 200 {
					t.Fatalf("got %d %v, want 200", status, err)
				}
				ev := e.waits.all()
				if len(ev) != 1 || ev[0].Source != httpretry.SourceBackoff || ev[0].Wait < 0 || ev[0].Wait > time.Second {
					t.Errorf("events %+v, want one backoff wait in [0, 1s]", ev)
				}
				if g := gaps(e.server.seen()); len(g) != 1 || g[0] != ev[0].Wait {
					t.Errorf("retry came after %v, want the backoff", g)
				}
			})
		})
	}
}

func toString(h map[string]string) string {
	var b strings.Builder
	for k, v := range h {
		b.WriteString(k + "=" + v + " ")
	}
	return b.String()
}

// TestMaxWaitCaps checks that a hint longer than MaxWait is waited for
// MaxWait only, and that self-throttling does not add a second wait to
// the retry that already waited.
func TestMaxWaitCaps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, httpretry.Config{MaxWait: 10 * time.Second},
			reply{status: 429, header: map[string]string{"Retry-After": "3600"}},
			reply{status: 200})
		if status, _, err := e.do(t, newReq(t, t.Context(), "GET", apiURL, nil)); err != nil || status != 200 {
			t.Fatalf("got %d %v", status, err)
		}
		if g := gaps(e.server.seen()); !equalDurations(g, []time.Duration{10 * time.Second}) {
			t.Errorf("retry came after %v, want 10s", g)
		}
	})
}

// TestHintBeyondDeadline checks that a hint past the context's deadline
// fails at once with a typed error instead of sleeping in vain.
func TestHintBeyondDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, httpretry.Config{},
			reply{status: 429, header: map[string]string{"Retry-After": "30"}},
			reply{status: 200})
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		re := e.stopped(t, ctx, httpretry.Error{Err: httpretry.ErrDeadline, Attempts: 1, Status: 429, Wait: 30 * time.Second, Source: httpretry.SourceRetryAfter})
		if !errors.Is(re, httpretry.ErrDeadline) || !errors.Is(re, context.DeadlineExceeded) {
			t.Errorf("err = %v, want ErrDeadline and context.DeadlineExceeded", re)
		}
		if re.Header.Get("Retry-After") != "30" {
			t.Errorf("error's header %v, want the 429's", re.Header)
		}
		if d := time.Since(e.start); d != 0 {
			t.Errorf("returned after %v, want at once", d)
		}
		if n := len(e.server.seen()); n != 1 {
			t.Errorf("%d requests, want 1", n)
		}
		if ev := e.waits.all(); len(ev) != 0 {
			t.Errorf("waits %+v, want none", ev)
		}
	})
}

// maxRand always draws the ceiling: plain exponential backoff, no jitter.
func maxRand(n int64) int64 { return n - 1 }

// TestBackoffDoubles checks the backoff's ceiling, base × 2^k capped at
// MaxDelay, and that the last response is returned intact when attempts
// run out.
func TestBackoffDoubles(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, httpretry.Config{MaxAttempts: 6, BaseDelay: time.Second, MaxDelay: 5 * time.Second, Rand: maxRand},
			reply{status: 503, body: "busy"})
		status, body, err := e.do(t, newReq(t, t.Context(), "GET", apiURL, nil))
		if err != nil || status != 503 || body != "busy" {
			t.Fatalf("got %d %q %v, want the last 503 with its body", status, body, err)
		}
		want := []time.Duration{1, 2, 4, 5, 5}
		for i := range want {
			want[i] *= time.Second
		}
		if g := gaps(e.server.seen()); !equalDurations(g, want) {
			t.Errorf("gaps %v, want %v", g, want)
		}
	})
}

// TestZeroHintsBounded: a server that answers every request 429 with
// Retry-After: 0 (a storm invited) gets MaxAttempts requests per call and
// no more, at once, and the caller gets its last 429.
func TestZeroHintsBounded(t *testing.T) {
	for _, attempts := range []int{0, 2} {
		synctest.Test(t, func(t *testing.T) {
			e := newEnv(t, httpretry.Config{MaxAttempts: attempts}, reply{status: 429, header: map[string]string{"Retry-After": "0"}, body: "no"})
			status, body, err := e.do(t, newReq(t, t.Context(), "GET", apiURL, nil))
			if err != nil || status != 429 || body != "no" {
				t.Fatalf("got %d %q %v, want the last 429", status, body, err)
			}
			want := attempts
			if want == 0 {
				want = 4 // the default
			}
			if n := len(e.server.seen()); n != want {
				t.Errorf("MaxAttempts %d: %d requests, want %d", attempts, n, want)
			}
		})
	}
}

// TestBackoffBeyondDeadline checks that a backoff sleep that would reach
// the deadline fails at once.
func TestBackoffBeyondDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, httpretry.Config{BaseDelay: time.Second, Rand: maxRand}, reply{status: 503})
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		e.stopped(t, ctx, httpretry.Error{Err: httpretry.ErrDeadline, Attempts: 2, Status: 503, Wait: 2 * time.Second, Source: httpretry.SourceBackoff})
		if d := time.Since(e.start); d != time.Second {
			t.Errorf("returned after %v, want 1s (the first backoff)", d)
		}
	})
}

// TestSafeRetriesOnly checks which requests are retried.
func TestSafeRetriesOnly(t *testing.T) {
	opaque := func() io.Reader { return io.MultiReader(strings.NewReader("no GetBody")) }
	cases := []struct {
		name   string
		method string
		body   func() io.Reader
		key    string
		all    bool
		want   int // requests the server sees
	}{
		{"GET", "GET", nil, "", false, 2},
		{"HEAD", "HEAD", nil, "", false, 2},
		{"DELETE", "DELETE", nil, "", false, 2},
		{"PUT replayable", "PUT", func() io.Reader { return strings.NewReader("x") }, "", false, 2},
		{"POST", "POST", func() io.Reader { return strings.NewReader("x") }, "", false, 1},
		{"PATCH", "PATCH", func() io.Reader { return strings.NewReader("x") }, "", false, 1},
		{"POST with Idempotency-Key", "POST", func() io.Reader { return strings.NewReader("x") }, "8e03978e-40d5-43e8-bc93-6894a57f9324", false, 2},
		{"POST allowed", "POST", func() io.Reader { return strings.NewReader("x") }, "", true, 2},
		{"PUT without GetBody", "PUT", opaque, "", false, 1},
		{"POST allowed without GetBody", "POST", opaque, "", true, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, httpretry.Config{RetryNonIdempotent: c.all},
					reply{status: 429, header: map[string]string{"Retry-After": "1"}},
					reply{status: 200})
				var body io.Reader
				if c.body != nil {
					body = c.body()
				}
				req := newReq(t, t.Context(), c.method, apiURL, body)
				if c.key != "" {
					req.Header.Set("Idempotency-Key", c.key)
				}
				status, _, err := e.do(t, req)
				if err != nil {
					t.Fatal(err)
				}
				if n := len(e.server.seen()); n != c.want {
					t.Errorf("%d requests, want %d", n, c.want)
				}
				if wantStatus := map[int]int{1: 429, 2: 200}[c.want]; status != wantStatus {
					t.Errorf("status %d, want %d", status, wantStatus)
				}
			})
		})
	}
}

// TestBodyReplayed checks that every attempt sends the whole body.
func TestBodyReplayed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, httpretry.Config{},
			reply{status: 503, header: map[string]string{"Retry-After": "2"}},
			reply{status: 503, header: map[string]string{"Retry-After": "2"}},
			reply{status: 200})
		payload := bytes.Repeat([]byte("sluice-payload-"), 10000)
		if status, _, err := e.do(t, newReq(t, t.Context(), "PUT", apiURL, bytes.NewReader(payload))); err != nil || status != 200 {
			t.Fatalf("got %d %v", status, err)
		}
		hits := e.server.seen()
		if len(hits) != 3 {
			t.Fatalf("%d requests, want 3", len(hits))
		}
		for i, h := range hits {
			if h.body != string(payload) || h.method != "PUT" {
				t.Errorf("attempt %d: %s with %d bytes, want PUT with the %d-byte payload", i+1, h.method, len(h.body), len(payload))
			}
		}
	})
}

// TestDrainReusesConnection checks that a retried response's body is
// drained so that the retry reuses its connection, up to the drain limit.
func TestDrainReusesConnection(t *testing.T) {
	for _, c := range []struct {
		size  int
		dials int64
	}{{10 << 10, 1}, {200 << 10, 2}} {
		t.Run(strconv.Itoa(c.size), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, httpretry.Config{},
					reply{status: 429, header: map[string]string{"Retry-After": "0"}, body: strings.Repeat("x", c.size)},
					reply{status: 200})
				if status, _, err := e.do(t, newReq(t, t.Context(), "GET", apiURL, nil)); err != nil || status != 200 {
					t.Fatalf("got %d %v", status, err)
				}
				if n := e.net.dials.Load(); n != c.dials {
					t.Errorf("%d connections for a %d-byte refused body, want %d", n, c.size, c.dials)
				}
			})
		})
	}
}

// TestCancelDuringWait checks that cancelling the context during a wait
// returns at once with the context's error.
func TestCancelDuringWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, httpretry.Config{},
			reply{status: 429, header: map[string]string{"Retry-After": "30"}},
			reply{status: 200})
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(5*time.Second, cancel)
		_, _, err := e.do(t, newReq(t, ctx, "GET", apiURL, nil))
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if d := time.Since(e.start); d != 5*time.Second {
			t.Errorf("returned after %v, want 5s", d)
		}
		if n := len(e.server.seen()); n != 1 {
			t.Errorf("%d requests, want 1", n)
		}
	})
}

// TestLogger checks that every wait is logged: a retry at Info, a hold at
// Debug.
func TestLogger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf logtest.Buffer
		e := newEnv(t, httpretry.Config{Logger: buf.Logger(), Pace: httpretry.Pace{Rate: 1, Period: 5 * time.Second}},
			reply{status: 503, header: map[string]string{"Retry-After": "2"}},
			reply{status: 200})
		if status, _, err := e.do(t, newReq(t, t.Context(), "GET", apiURL, nil)); err != nil || status != 200 {
			t.Fatalf("got %d %v", status, err)
		}
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		want := []string{
			`level=INFO msg="httpretry: retry" method=GET host=api.test attempt=2 status=503 wait=2s source=Retry-After`,
			`level=DEBUG msg="httpretry: hold" method=GET host=api.test attempt=2 status=0 wait=3s source=pacing`,
		}
		if len(lines) != len(want) {
			t.Fatalf("logged %q, want %d lines", lines, len(want))
		}
		for i, w := range want {
			if _, rest, _ := strings.Cut(lines[i], " "); rest != w { // drop the time
				t.Errorf("line %d: %q, want %q", i, rest, w)
			}
		}
	})
}
