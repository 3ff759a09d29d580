package server_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	gostats "github.com/lyft/gostats"
	statsmock "github.com/lyft/gostats/mock"
	"github.com/prometheus/client_golang/prometheus"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
	"github.com/sluicehq/sluice/internal/edges/server"
	"github.com/sluicehq/sluice/internal/testsupport/metrictest"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
)

// metric returns the value of the counter, gauge or histogram count name
// with exactly the labels given as "name=value", or -1 if absent.
func metric(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	return metrictest.Value(t, reg, name, labels...)
}

// series counts the series of name.
func series(t *testing.T, reg *prometheus.Registry, name string) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return len(mf.Metric)
		}
	}
	return 0
}

func TestMetrics(t *testing.T) {
	e := newEnv(t, `
domain: api
capacity: {unit: second, requests_per_unit: 1000}
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: probe
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`, server.Config{})
	reg := e.reg
	rule := func(name, rule string) float64 {
		t.Helper()
		return metric(t, reg, "sluice_rule_"+name+"_total", "domain=api", "rule="+rule)
	}
	user := req("api", d("user=a"))
	e.expect(user, 8, "OK: OK")
	two := req("api", d("user=a"))
	two.HitsAddend = 2
	e.expect(two, 1, "OK: OK") // 10 of 10: 2 hits beyond 8
	e.expect(user, 1, "OVER_LIMIT: OVER_LIMIT")
	e.expect(req("api", d("probe=x")), 2, "OK: OK")
	over := req("api", d("user=o"))
	over.Descriptors[0].Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: 2 /* MINUTE */}
	e.expect(over, 1, "OK: OK")
	e.expect(over, 1, "OVER_LIMIT: OVER_LIMIT")
	e.expect(req("api", d("nothing=1")), 1, "OK: OK")
	if _, err := e.rls.ShouldRateLimit(context.Background(), req("")); status.Code(err) != grpccodes.InvalidArgument {
		t.Fatalf("no domain: %v", err)
	}
	resp, _ := e.post(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"h"}]}]}`)
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	e.post(`{`)

	for _, tc := range []struct {
		metric, rule string
		want         float64
	}{
		{"hits", "api.user", 12},
		{"within_limit", "api.user", 11},
		{"over_limit", "api.user", 1},
		{"near_limit", "api.user", 2},
		{"shadow_mode", "api.user", 0},
		{"hits", "api.probe", 2},
		{"within_limit", "api.probe", 1},
		{"over_limit", "api.probe", 1},
		{"shadow_mode", "api.probe", 1},
		{"near_limit", "api.probe", 1},
		{"hits", "_override", 2},
		{"over_limit", "_override", 1},
		{"within_limit", "_override", 1},
		{"hits", "_capacity", 17},
		{"within_limit", "_capacity", 17}, // the capacity admitted the denied requests too
		{"over_limit", "_capacity", 0},
	} {
		if got := rule(tc.metric, tc.rule); got != tc.want {
			t.Errorf("%s{rule=%q} = %v, want %v", tc.metric, tc.rule, got, tc.want)
		}
	}
	if n := series(t, reg, "sluice_rule_hits_total"); n != 4 {
		t.Errorf("%d series of sluice_rule_hits_total, want 4 (user, probe, _override, _capacity)", n)
	}
	for _, tc := range []struct {
		transport, result string
		want              float64
	}{
		{"grpc", "ok", 12},
		{"grpc", "over_limit", 2},
		{"grpc", "shadow_over_limit", 1},
		{"grpc", "invalid", 1},
		{"http", "ok", 1},
		{"http", "invalid", 1},
		{"http", "error", 0},
	} {
		if got := metric(t, reg, "sluice_requests_total", "transport="+tc.transport, "result="+tc.result); got != tc.want {
			t.Errorf("requests{%s,%s} = %v, want %v", tc.transport, tc.result, got, tc.want)
		}
	}
	if got := metric(t, reg, "sluice_decision_duration_seconds"); got != 17 {
		t.Errorf("%v decisions timed, want 17", got)
	}
	if got := metric(t, reg, "sluice_store_errors_total"); got != 0 {
		t.Errorf("store errors %v", got)
	}

	// Configuration.
	cfg := e.cfg
	if got := metric(t, reg, "sluice_config_info", "hash="+cfg.Hash()); got != 1 {
		t.Errorf("config info %v", got)
	}
	if got := metric(t, reg, "sluice_config_load_timestamp_seconds"); got != float64(epoch.Unix()) {
		t.Errorf("load timestamp %v", got)
	}
	e.srv.ConfigRejected(errors.New("bad"))
	next := rulestest.Config(t, hitsRules)
	e.srv.ConfigLoaded(next, epoch.Add(90e9))
	if got := metric(t, reg, "sluice_config_loads_total", "result=success"); got != 2 {
		t.Errorf("successful loads %v", got)
	}
	if got := metric(t, reg, "sluice_config_loads_total", "result=failure"); got != 1 {
		t.Errorf("failed loads %v", got)
	}
	if metric(t, reg, "sluice_config_info", "hash="+cfg.Hash()) != -1 || metric(t, reg, "sluice_config_info", "hash="+next.Hash()) != 1 {
		t.Errorf("config info not replaced")
	}
	if got := metric(t, reg, "sluice_config_load_timestamp_seconds"); got != float64(epoch.Unix()+90) {
		t.Errorf("load timestamp %v", got)
	}

	// The exposition over HTTP.
	code, body := e.get("/metrics")
	for _, want := range []string{
		`sluice_rule_near_limit_total{domain="api",rule="api.user"} 2`,
		`sluice_config_info{hash="` + next.Hash() + `"} 1`,
		"go_goroutines ",
		"process_cpu_seconds_total ",
	} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics (%d) lacks %q", code, want)
		}
	}
}

// failingStore fails every decision, as a store that cannot be reached.
type failingStore struct{}

func (failingStore) Take(context.Context, []sluice.Hit, []sluice.Decision) error {
	return errors.New("dial tcp 10.0.0.1:6379: connection refused")
}

func TestStoreErrors(t *testing.T) {
	// fail_open, the default: answered OK, and counted.
	e := newEnvStore(t, hitsRules, server.Config{}, failingStore{})
	e.expect(req("api", d("user=a")), 1, "OK: OK")
	resp, b := e.post(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}`)
	if resp.StatusCode != 200 {
		t.Errorf("/json: %d %s", resp.StatusCode, b)
	}
	// A request that matches no limit needs no store.
	e.expect(req("api", d("nothing=1")), 1, "OK: OK")
	if got := metric(t, e.reg, "sluice_store_errors_total"); got != 2 {
		t.Errorf("store errors %v, want 2", got)
	}

	// A store failure that no policy answers (the local policy without a
	// local limiter) is Unavailable / 503.
	e = newEnvStore(t, "failure_policy: local\n"+hitsRules, server.Config{}, failingStore{})
	_, err := e.rls.ShouldRateLimit(context.Background(), req("api", d("user=a")))
	if status.Code(err) != grpccodes.Unavailable || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("gRPC: %v", err)
	}
	resp, b = e.post(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}`)
	if resp.StatusCode != 503 || !strings.Contains(string(b), "connection refused") {
		t.Errorf("/json: %d %s", resp.StatusCode, b)
	}
	if got := metric(t, e.reg, "sluice_store_errors_total"); got != 2 {
		t.Errorf("store errors %v, want 2", got)
	}
	for _, tr := range []string{"grpc", "http"} {
		if got := metric(t, e.reg, "sluice_requests_total", "transport="+tr, "result=error"); got != 1 {
			t.Errorf("%s errors %v, want 1", tr, got)
		}
	}
}

func TestLabelCap(t *testing.T) {
	e := newEnv(t, `
domain: api
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 10}
`, server.Config{MaxRuleLabels: 3})
	for i := range 6 {
		e.expect(req("api", d(fmt.Sprintf("user=u%d", i))), 1, "OK: OK")
		e.expect(req("api", d(fmt.Sprintf("ip=10.0.0.%d", i))), 1, "OK: OK")
	}
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_rule_hits_total" {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == "rule" {
					got[l.GetValue()] = m.Counter.GetValue()
				}
			}
		}
	}
	// The first three stats keys: detailed ones of u0 and u1, and api.ip
	// (values never in a label without detailed_metric); then _other.
	want := map[string]float64{"api.user_u0": 1, "api.ip": 6, "api.user_u1": 1, "_other": 4}
	if len(got) != len(want) {
		t.Fatalf("rule labels %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("rule %q: %v, want %v (all %v)", k, got[k], v, got)
		}
	}
}

// TestDomainNotFoundCap: envoy-rl's <domain>.domain_not_found counts each
// descriptor of a request to a domain the rules lack, under the domain's
// sanitized name; a flood of made-up domains shares the cap on keys, and
// beyond it counts as _other, so the stats store stays bounded.
func TestDomainNotFoundCap(t *testing.T) {
	sink := statsmock.NewSink()
	store := gostats.NewStore(sink, false)
	e := newEnv(t, `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
`, server.Config{MaxRuleLabels: 2, Statsd: store})
	e.expect(req("api", d("user=a")), 1, "OK: OK") // known: one label
	e.expect(req("a:b", d("user=a"), d("user=b")), 1, "OK: OK OK")
	for i := range 5 {
		e.expect(req(fmt.Sprintf("flood%d", i), d("user=a")), 1, "OK: OK")
	}
	e.expect(req("a:b", d("user=a")), 1, "OK: OK")
	store.Flush()
	var names []string
	for name := range sink.Counters() {
		if strings.HasSuffix(name, ".domain_not_found") {
			names = append(names, name)
		}
	}
	const p = "ratelimit.service.rate_limit."
	want := map[string]uint64{p + "a_b.domain_not_found": 3, p + "_other.domain_not_found": 5}
	if len(names) != len(want) {
		t.Errorf("domain_not_found counters %v, want %v", names, want)
	}
	for name, n := range want {
		if got := sink.Counter(name); got != n {
			t.Errorf("%s = %d, want %d", name, got, n)
		}
	}
}

// Every bad request is InvalidArgument with a clear message, counts as
// invalid, and changes no counter.
func TestBadRequests(t *testing.T) {
	e := newEnv(t, hitsRules, server.Config{Headers: ratelimitheaders.HeadersAll})
	good := func() *rlv3.RateLimitDescriptor { return d("user=a") }
	withHits := func(n uint64) *rlv3.RateLimitDescriptor {
		x := good()
		x.HitsAddend = wrapperspb.UInt64(n)
		return x
	}
	negative := good()
	negative.IsNegativeHits = true
	badUnit := good()
	badUnit.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}
	zeroMult := good()
	zeroMult.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: 1}
	zeroMult.Limit.UnitMultiplier = wrapperspb.UInt32(0)
	cases := []struct {
		name string
		r    *rlsv3.RateLimitRequest
		want string
	}{
		{"no domain", req("", good()), "domain must not be empty"},
		{"no descriptors", req("api"), "descriptor list must not be empty"},
		{"no entries", req("api", good(), d()), "descriptor 1 has no entries"},
		{"empty key", req("api", good(), d("=v")), "empty key"},
		{"10 KB value", req("api", good(), d("user="+strings.Repeat("v", 10<<10))), "longer than 1024 bytes"},
		{"huge hits_addend", req("api", good(), withHits(1<<50)), "hits_addend 1125899906842624 is too large"},
		{"is_negative_hits", req("api", good(), negative), "is_negative_hits is not supported"},
		{"override without unit", req("api", good(), badUnit), "limit override has unit"},
		{"override multiplier 0", req("api", good(), zeroMult), "unit_multiplier must be positive"},
		{"too many limits", req("api", manyDescriptors(65)...), "at most 64"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.rls.ShouldRateLimit(context.Background(), tc.r)
			if status.Code(err) != grpccodes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
				t.Errorf("%v, want InvalidArgument with %q", err, tc.want)
			}
		})
	}
	if got := metric(t, e.reg, "sluice_requests_total", "transport=grpc", "result=invalid"); got != float64(len(cases)) {
		t.Errorf("%v invalid requests counted, want %d", got, len(cases))
	}
	if got := metric(t, e.reg, "sluice_rule_hits_total", "domain=api", "rule=api.user"); got != -1 {
		t.Errorf("bad requests counted hits: %v", got)
	}
	// The counter of user=a is untouched: 10 left.
	resp := e.call(req("api", withHits(0)))
	if resp.Statuses[0].LimitRemaining != 10 {
		t.Errorf("remaining after bad requests %d, want 10", resp.Statuses[0].LimitRemaining)
	}
}

func manyDescriptors(n int) []*rlv3.RateLimitDescriptor {
	out := make([]*rlv3.RateLimitDescriptor, n)
	for i := range out {
		out[i] = d(fmt.Sprintf("user=u%d", i))
	}
	return out
}

// sluice_schedule_window_active says which window of each rule's schedules
// applies now: the first that holds, 1; the others, 0.
func TestScheduleWindowMetric(t *testing.T) {
	e := newEnv(t, `
domain: geo
descriptors:
  - key: country
    value: IN
    rate_limit: {unit: minute, requests_per_unit: 100}
    schedules:
      - {name: mondays, days: [mon], from: "00:00", to: "00:00", tz: UTC, rate_limit: {unit: minute, requests_per_unit: 1}}
      - {name: always, from: "00:00", to: "24:00", tz: UTC, rate_limit: {unit: minute, requests_per_unit: 5}}
      - {name: shadowed, from: "00:00", to: "24:00", tz: Asia/Kolkata, rate_limit: {unit: minute, requests_per_unit: 7}}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 100}
`, server.Config{})
	check := func() (bad []string) {
		monday := time.Now().UTC().Weekday() == time.Monday
		want := map[string]float64{"mondays": 0, "always": 1, "shadowed": 0}
		if monday {
			want = map[string]float64{"mondays": 1, "always": 0, "shadowed": 0}
		}
		for window, v := range want {
			if got := metric(t, e.reg, "sluice_schedule_window_active", "domain=geo", "rule=geo.country_IN", "window="+window); got != v {
				bad = append(bad, fmt.Sprintf("window %s: %v, want %v", window, got, v))
			}
		}
		if monday != (time.Now().UTC().Weekday() == time.Monday) {
			return nil // Monday began or ended meanwhile: ask again
		}
		return bad
	}
	bad := check()
	if bad == nil {
		bad = check()
	}
	for _, b := range bad {
		t.Error(b)
	}
	if n := series(t, e.reg, "sluice_schedule_window_active"); n != 3 {
		t.Errorf("%d series, want one per window of the rules with schedules (3)", n)
	}
}
