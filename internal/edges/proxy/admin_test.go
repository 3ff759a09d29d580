package proxy_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/fault"
	"github.com/sluicehq/sluice/internal/edges/hitters"
	"github.com/sluicehq/sluice/internal/edges/proxy"
	"github.com/sluicehq/sluice/rules"
)

// Readiness follows the store, the policy and draining; health is the
// process; /metrics serves the registry.
func TestAdminHandler(t *testing.T) {
	down := errors.New("connection refused")
	never := fmt.Errorf("redis unavailable: %w: dial: refused", fault.ErrNeverConnected)
	for _, tc := range []struct {
		name     string
		health   error
		policy   rules.FailurePolicy
		draining bool
		code     int
		body     string
	}{
		{"up", nil, rules.FailLocal, false, 200, "OK\n"},
		{"down, local", down, rules.FailLocal, false, 200, "OK\n"},
		{"down, fail_open", down, rules.FailOpen, false, 200, "OK\n"},
		{"down, fail_closed", down, rules.FailClosed, false, 503, "not ready: store down (connection refused) and the default failure policy is fail_closed\n"},
		{"never reached", never, rules.FailLocal, false, 503, "not ready: store not reached since start"},
		{"draining", nil, rules.FailLocal, true, 503, "not ready: draining\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_test_total", Help: "A counter."}))
			h := proxy.AdminHandler(proxy.AdminConfig{
				StoreHealth: func() error { return tc.health },
				Policy:      tc.policy,
				Draining:    func() bool { return tc.draining },
				Gatherer:    reg,
			})
			get := func(path string) (int, string) {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
				b, _ := io.ReadAll(w.Result().Body)
				return w.Code, string(b)
			}
			if code, body := get("/readyz"); code != tc.code || !strings.HasPrefix(body, tc.body) {
				t.Errorf("/readyz: %d %q, want %d %q", code, body, tc.code, tc.body)
			}
			if code, body := get("/healthz"); code != 200 || body != "OK\n" {
				t.Errorf("/healthz: %d %q", code, body)
			}
			if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "sluice_test_total 0") {
				t.Errorf("/metrics: %d %q", code, body)
			}
		})
	}
	// The zero config: always ready, no /metrics.
	h := proxy.AdminHandler(proxy.AdminConfig{})
	for path, want := range map[string]int{"/readyz": 200, "/healthz": 200, "/metrics": 404} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		if w.Code != want {
			t.Errorf("zero config %s: %d, want %d", path, w.Code, want)
		}
	}
}

// The dashboard answers the loopback only, unless DashboardRemote: it
// names keys, and the admin listener is often reachable by others.
func TestAdminDashboardLoopback(t *testing.T) {
	top := hitters.New(hitters.Config{})
	defer top.Close()
	for _, remote := range []bool{false, true} {
		h := proxy.AdminHandler(proxy.AdminConfig{Hitters: top, DashboardRemote: remote})
		for _, tc := range []struct {
			peer string
			code int
		}{
			{"127.0.0.1:4000", 200},
			{"[::1]:4000", 200},
			{"10.0.0.7:4000", 403},
			{"[2001:db8::1]:4000", 403},
			{"garbage", 403},
		} {
			if remote && tc.code == 403 {
				tc.code = 200
			}
			for _, path := range []string{"/dashboard", "/dashboard/data"} {
				r := httptest.NewRequest("GET", path, nil)
				r.RemoteAddr = tc.peer
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if w.Code != tc.code {
					t.Errorf("remote %v, %s from %s: %d, want %d (%s)", remote, path, tc.peer, w.Code, tc.code, w.Body)
				}
			}
		}
		r := httptest.NewRequest("GET", "/healthz", nil)
		r.RemoteAddr = "10.0.0.7:4000"
		w := httptest.NewRecorder()
		if h.ServeHTTP(w, r); w.Code != 200 {
			t.Errorf("/healthz from afar: %d", w.Code)
		}
	}
}

// TestAdminAPIMounted: the admin API is served under /v1/ when given (it
// checks its own tokens), and not at all otherwise; the other paths stay
// the admin handler's.
func TestAdminAPIMounted(t *testing.T) {
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "api "+r.Method+" "+r.URL.Path) })
	for _, c := range []struct {
		api          http.Handler
		path         string
		code         int
		body         string
		method, name string
	}{
		{api, "/v1/explain", 200, "api POST /v1/explain", "POST", "with the API"},
		{api, "/healthz", 200, "OK\n", "GET", "health beside it"},
		{nil, "/v1/explain", 404, "404 page not found\n", "POST", "without it"},
	} {
		srv := httptest.NewServer(proxy.AdminHandler(proxy.AdminConfig{API: c.api}))
		req, _ := http.NewRequest(c.method, srv.URL+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		srv.Close()
		if resp.StatusCode != c.code || string(body) != c.body {
			t.Errorf("%s: %s %s: %d %q, want %d %q", c.name, c.method, c.path, resp.StatusCode, body, c.code, c.body)
		}
	}
}
