package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/edges/server"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
)

func debugGet(t *testing.T, h http.Handler, path string) (int, string, string) {
	t.Helper()
	ts := httptest.NewServer(h)
	defer ts.Close()
	resp, err := http.Get(ts.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
}

const debugRules = `
domain: api
capacity: {unit: second, requests_per_unit: 500}
failure_policy: local
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: login
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 1, burst: 10, algorithm: token_bucket, block_for: 15m}
`

func TestDebugRules(t *testing.T) {
	e := newEnv(t, "", server.Config{})
	h := e.srv.DebugHandler()
	if code, _, body := debugGet(t, h, "/rules"); code != http.StatusServiceUnavailable || !strings.Contains(body, "no rate limit configuration") {
		t.Errorf("/rules without rules: %d %s", code, body)
	}
	cfg := rulestest.Config(t, debugRules)
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	e.srv.ConfigLoaded(cfg, at)

	code, ctype, body := debugGet(t, h, "/rules")
	if code != 200 || ctype != "application/json" {
		t.Fatalf("/rules: %d %s %s", code, ctype, body)
	}
	var sum server.RulesSummary
	if err := json.Unmarshal([]byte(body), &sum); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	if sum.Hash != cfg.Hash() || sum.LoadedAt == nil || !sum.LoadedAt.Equal(at) || len(sum.Domains) != 1 {
		t.Fatalf("summary %+v", sum)
	}
	dom := sum.Domains[0]
	if dom.Name != "api" || dom.Capacity == nil || dom.Capacity.Rate != 500 || dom.FailurePolicy != "local" || len(dom.Rules) != 2 {
		t.Fatalf("domain %+v", dom)
	}
	login := dom.Rules[1]
	if login.StatKey != "api.login" || login.Line != 8 || !login.DetailedMetric || len(login.Limits) != 1 {
		t.Errorf("rule %+v", login)
	}
	if l := login.Limits[0]; l.Algorithm != "token_bucket" || l.Burst != 10 || l.BlockFor != "15m0s" || l.Period != "1h0m0s" {
		t.Errorf("limit %+v", l)
	}

	code, ctype, body = debugGet(t, h, "/rules?format=text")
	if code != 200 || !strings.HasPrefix(ctype, "text/plain") {
		t.Fatalf("/rules?format=text: %d %s", code, ctype)
	}
	for _, want := range []string{
		"config " + cfg.Hash() + " loaded 2026-03-01T12:00:00Z",
		"domain api (test.yaml)",
		"capacity: 500 per 1s fixed_window",
		"failure_policy: local",
		"test.yaml:6: api.user",
		"100 per 1m0s fixed_window",
		"test.yaml:8: api.login [detailed_metric]",
		"1 per 1h0m0s token_bucket burst=10 block_for=15m0s",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("text rules lack %q:\n%s", want, body)
		}
	}

	if code, _, body := debugGet(t, h, "/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Errorf("/debug/pprof/: %d", code)
	}
	if code, _, body := debugGet(t, h, "/"); code != 200 || !strings.Contains(body, "/rules") {
		t.Errorf("/: %d %s", code, body)
	}
	if code, _, _ := debugGet(t, h, "/nope"); code != 404 {
		t.Errorf("/nope: %d", code)
	}
}

type stringer struct{}

func (stringer) String() string { return "from the command\n" }

func TestDebugRulesHook(t *testing.T) {
	for _, tc := range []struct {
		v     any
		ctype string
		body  string
	}{
		{"text\n", "text/plain; charset=utf-8", "text\n"},
		{stringer{}, "text/plain; charset=utf-8", "from the command\n"},
		{map[string]int{"files": 2}, "application/json", "{\n  \"files\": 2\n}\n"},
	} {
		e := newEnv(t, "", server.Config{Rules: func() any { return tc.v }})
		code, ctype, body := debugGet(t, e.srv.DebugHandler(), "/rules")
		if code != 200 || ctype != tc.ctype || body != tc.body {
			t.Errorf("%v: %d %s %q", tc.v, code, ctype, body)
		}
	}
}
