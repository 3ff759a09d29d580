package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
	"github.com/sluicehq/sluice/internal/edges/server"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
)

// On the real clock (a synctest bubble's): the reset counts down, Retry-After
// is the true wait, and the quota is back once it has passed.
func TestResetOnTheClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, post := clockServer(t, `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: login
    rate_limit: {unit: hour, requests_per_unit: 1, burst: 2, algorithm: token_bucket}
`)
		// The bubble's clock starts on a minute.
		time.Sleep(15 * time.Second)
		if w := post("user"); w.Code != http.StatusOK || w.Header().Get("X-RateLimit-Reset") != "45" {
			t.Fatalf("first: %d %v", w.Code, w.Header())
		}
		time.Sleep(10 * time.Second)
		if w := post("user"); w.Code != http.StatusOK || w.Header().Get("X-RateLimit-Remaining") != "0" || w.Header().Get("RateLimit") != `"api.user";r=0;t=35` {
			t.Fatalf("second: %d %v", w.Code, w.Header())
		}
		w := post("user")
		if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "35" {
			t.Fatalf("third: %d %v", w.Code, w.Header())
		}
		time.Sleep(35*time.Second - time.Nanosecond)
		if w := post("user"); w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "1" {
			t.Fatalf("a nanosecond early: %d %v", w.Code, w.Header())
		}
		time.Sleep(time.Nanosecond)
		if w := post("user"); w.Code != http.StatusOK {
			t.Fatalf("after the wait: %d %v", w.Code, w.Header())
		}

		// A token bucket of 2 refilled 1 per hour: the reset, as t and
		// Retry-After, is the time to one token (the bucket is full in
		// two hours, the policy's window).
		post("login")
		post("login")
		w = post("login")
		if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "3600" || w.Header().Get("X-RateLimit-Reset") != "3600" ||
			w.Header().Get("RateLimit") != `"api.login";r=0;t=3600` || w.Header().Get("RateLimit-Policy") != `"api.login";q=2;w=7200` {
			t.Fatalf("login: %d %v", w.Code, w.Header())
		}
		time.Sleep(time.Hour)
		resp, err := srv.ShouldRateLimit(context.Background(), req("api", d("login=a")))
		if err != nil || codes(resp) != "OK: OK" {
			t.Fatalf("login after an hour: %v %v", resp, err)
		}
	})
}

// A sliding window of 5 a minute, all 5 spent 51 s into a minute: the
// sixth fits 12 s into the next minute (the 5 then weigh 4). The headers
// and the response's duration_until_reset all say 21 s, and 15 s later 6.
func TestSlidingWindowResetOnTheClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, postKey := clockServer(t, `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window}
`)
		post := func() string {
			w := postKey("user")
			var body struct {
				Statuses []struct{ DurationUntilReset string }
			}
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || len(body.Statuses) != 1 {
				t.Fatalf("body %q: %v", w.Body, err)
			}
			hd := w.Header()
			return fmt.Sprintf("%d %s reset=%s retry=%s until=%s", w.Code, hd.Get("RateLimit"), hd.Get("X-RateLimit-Reset"), hd.Get("Retry-After"), body.Statuses[0].DurationUntilReset)
		}
		// The bubble's clock starts on a minute.
		time.Sleep(51 * time.Second)
		for range 4 {
			post()
		}
		got := []string{post(), post()}
		time.Sleep(15 * time.Second)
		got = append(got, post())
		want := []string{
			`200 "api.user";r=0;t=21 reset=21 retry= until=21s`,
			`429 "api.user";r=0;t=21 reset=21 retry=21 until=21s`,
			`429 "api.user";r=0;t=6 reset=6 retry=6 until=6s`,
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
}

// clockServer is a server of the rules in yaml over a memstore on the
// clock of the synctest bubble it is called in, with every header
// family, and post, which decides a descriptor {key: a} through /json.
func clockServer(t *testing.T, yaml string) (*server.Server, func(key string) *httptest.ResponseRecorder) {
	t.Helper()
	store := memstore.New(memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	srv, err := server.New(server.Config{
		Decide:  decide.Config{Limiter: sluice.NewLimiter(store), Rules: rulestest.Config(t, yaml)},
		Headers: ratelimitheaders.HeadersAll,
	})
	if err != nil {
		t.Fatal(err)
	}
	h := srv.Handler()
	return srv, func(key string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		body := `{"domain":"api","descriptors":[{"entries":[{"key":"` + key + `","value":"a"}]}]}`
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(body)))
		return w
	}
}
