package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestServeE2EMetricsMapping: sluice serve with Envoy Gateway's mapping
// serves the stats of a descriptor of one entry (its glob mappings:
// domain, key1) and of two (its regex ones: domain, key1, key2), which
// name the same metrics, side by side on --metrics-addr: the second
// label set was dropped with a warning. A mapping file two of whose
// mappings would add their stats into one series, or name one metric as
// two types, stops the start (exit 1), naming both mappings.
func TestServeE2EMetricsMapping(t *testing.T) {
	beside(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	writeRules(t, rules, `domain: api
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: route
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 100}
`)
	eg, err := filepath.Abs("testdata/envoygateway/statsd_conf.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := startSluice(t, nil, "--config", rules, "--metrics-addr", "127.0.0.1:0", "--metrics-mapping", eg)
	p.must("api", desc("user", "a"))
	p.must("api", desc("user", "a"))
	p.must("api", desc("route", "r", "user", "a"))
	_, body, _ := httpDo(t, "GET", "http://"+p.addr("metrics")+"/metrics", "")
	for _, want := range []string{
		`ratelimit_service_rate_limit_total_hits{domain="api",key1="user"} 2`,
		`ratelimit_service_rate_limit_total_hits{domain="api",key1="route",key2="user"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics has no %s:\n%s", want, grepLines(body, "ratelimit_service_rate_limit"))
		}
	}
	if log := p.log(); strings.Contains(log, "not exported") {
		t.Errorf("a stat not exported:\n%s", log)
	}

	for _, c := range []struct{ mapping, want string }{
		{`mappings:
- match: "ratelimit.service.rate_limit.*.*.total_hits"
  name: "rl_hits"
  labels: {domain: "$1", key: "$2"}
- match: "ratelimit.service.rate_limit.*.*.over_limit"
  name: "rl_hits"
  labels: {dom: "$1"}
- match: "ratelimit.service.rate_limit.*.*.within_limit"
  name: "rl_hits"
  timer_type: histogram
  labels: {domain: "$1", key: "$2"}
`, `mappings 1 ("ratelimit.service.rate_limit.*.*.total_hits") and 3 ("ratelimit.service.rate_limit.*.*.within_limit"): both name rl_hits[domain key]`},
		{`mappings:
- {match: "ratelimit.*.a", name: "rl_x", match_metric_type: counter}
- {match: "ratelimit.*.b", name: "rl_x", match_metric_type: gauge, labels: {domain: "$1"}}
`, `mappings 1 ("ratelimit.*.a") and 2 ("ratelimit.*.b"): both name rl_x, as a counter and as a gauge`},
	} {
		mapping := filepath.Join(t.TempDir(), "mapping.yaml")
		writeRules(t, mapping, c.mapping)
		p := launch(t, nil, "--config", rules, "--metrics-addr", "127.0.0.1:0", "--metrics-mapping", mapping)
		if code := p.wait(); code != 1 || !strings.Contains(p.log(), c.want) || !strings.Contains(p.log(), mapping) {
			t.Errorf("exit status %d, want 1 and %q naming %s:\n%s", code, c.want, mapping, p.log())
		}
	}
}
