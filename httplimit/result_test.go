package httplimit_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/httplimit"
)

// results collects what OnResult is told.
type results struct {
	mu  sync.Mutex
	got []string
}

func (rs *results) on(w http.ResponseWriter, r *http.Request, res httplimit.Result) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.got = append(rs.got, res.String())
}

func (rs *results) take() string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	s := strings.Join(rs.got, ",")
	rs.got = nil
	return s
}

type errDecider struct{}

func (errDecider) Decide(_ context.Context, _ *decide.Request, o *decide.Outcome) error {
	o.Reset()
	return errors.New("store on fire")
}

// OnResult is told once per request what became of it.
func TestOnResult(t *testing.T) {
	user := []httplimit.Descriptor{{{Key: "user", Source: httplimit.Header("X-User")}}}
	for _, tc := range []struct {
		name   string
		cfg    httplimit.Config
		header http.Header
		n      int
		want   string
	}{
		{"limits", httplimit.Config{Decider: decider(t, ipRules)}, nil, 4, "allowed,allowed,allowed,denied"},
		{"shadow", httplimit.Config{Decider: decider(t, ipRules), ShadowMode: true}, nil, 4, "allowed,allowed,allowed,shadow"},
		{"unlimited", httplimit.Config{Decider: decider(t, userRules), Descriptors: user}, nil, 2, "unlimited,unlimited"},
		{"invalid", httplimit.Config{Decider: decider(t, userRules), Descriptors: user}, http.Header{"X-User": {"\xff\xfe"}}, 1, "invalid"},
		{"error", httplimit.Config{Decider: errDecider{}}, nil, 1, "error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rs results
			tc.cfg.Domain, tc.cfg.OnResult = "api", rs.on
			srv := limited(t, tc.cfg)
			for range tc.n {
				do(t, srv.Client(), "GET", srv.URL, tc.header)
			}
			if got := rs.take(); got != tc.want {
				t.Errorf("results %s, want %s", got, tc.want)
			}
		})
	}
}

// Over the concurrency cap: too_concurrent, or shadow in shadow mode
// (let through).
func TestOnResultConcurrency(t *testing.T) {
	for _, shadow := range []bool{false, true} {
		var rs results
		release, entered := make(chan struct{}), make(chan struct{}, 2)
		mw, err := httplimit.New(httplimit.Config{
			Decider:     decider(t, ipRules),
			Domain:      "api",
			ShadowMode:  shadow,
			Concurrency: &httplimit.Concurrency{Max: 1},
			OnResult:    rs.on,
		})
		if err != nil {
			t.Fatal(err)
		}
		srv := server(t, mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			entered <- struct{}{}
			<-release
		})))
		done := make(chan int)
		go func() { done <- do(t, http.DefaultClient, "GET", srv.URL, nil).status }()
		<-entered
		want, wantStatus := "allowed,too_concurrent", 429
		if shadow {
			want, wantStatus = "allowed,shadow", 200
		}
		second := make(chan int)
		go func() { second <- do(t, http.DefaultClient, "GET", srv.URL, nil).status }()
		if shadow {
			<-entered // let through, while the first is still in flight
		} else {
			if s := <-second; s != wantStatus {
				t.Errorf("shadow %v: second request %d, want %d", shadow, s, wantStatus)
			}
		}
		close(release)
		<-done
		if shadow {
			if s := <-second; s != wantStatus {
				t.Errorf("shadow %v: second request %d, want %d", shadow, s, wantStatus)
			}
		}
		if got := rs.take(); got != want {
			t.Errorf("shadow %v: results %s, want %s", shadow, got, want)
		}
	}
}
