package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestPromSink: Envoy Gateway's mapping (timer_type, its older spelling,
// included) names envoy-rl's stats; a tag suffix is dropped; an unmapped
// stat is exported under its name with _ for what Prometheus does not
// allow; a stat whose labels differ from its metric's first is dropped
// with one warning; timers in milliseconds are observed in seconds.
func TestPromSink(t *testing.T) {
	var logs bytes.Buffer
	s, err := newPromSink("testdata/envoygateway/statsd_conf.yaml", slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	s.FlushCounter("ratelimit.service.rate_limit.api.user_a.over_limit.__k=v", 2)
	s.FlushCounter("ratelimit.service.rate_limit.api.user_a.over_limit", 1)
	s.FlushCounter("ratelimit.service.rate_limit.api.route_r.rule_0.user.total_hits", 5)
	s.FlushCounter("ratelimit.service.config_load_success", 1)
	s.FlushCounter("some.other-stat", 4)
	s.FlushTimer("ratelimit_server.ShouldRateLimit.response_time", 20)
	reg := prometheus.NewRegistry()
	reg.MustRegister(s)
	want := `
# HELP ratelimit_service_rate_limit_over_limit envoyproxy/ratelimit's stat, by --metrics-mapping
# TYPE ratelimit_service_rate_limit_over_limit counter
ratelimit_service_rate_limit_over_limit{domain="api",key1="user_a"} 3
# HELP ratelimit_service_rate_limit_total_hits envoyproxy/ratelimit's stat, by --metrics-mapping
# TYPE ratelimit_service_rate_limit_total_hits counter
ratelimit_service_rate_limit_total_hits{domain="api",key1="route_r",key2="rule_0"} 5
# HELP ratelimit_service_config_load_success envoyproxy/ratelimit's stat, by --metrics-mapping
# TYPE ratelimit_service_config_load_success counter
ratelimit_service_config_load_success 1
# HELP some_other_stat envoyproxy/ratelimit's stat, by --metrics-mapping
# TYPE some_other_stat counter
some_other_stat 4
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratelimit_service_rate_limit_over_limit", "ratelimit_service_rate_limit_total_hits",
		"ratelimit_service_config_load_success", "some_other_stat"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg, "ratelimit_service_response_time_seconds"); err != nil || n != 1 {
		t.Errorf("response_time: %d series, %v", n, err)
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "ratelimit_service_response_time_seconds" {
			if sum := mf.GetMetric()[0].GetHistogram().GetSampleSum(); sum != 0.02 {
				t.Errorf("20 ms observed as %v s, want 0.02", sum)
			}
		}
	}
	// The same name with other labels: dropped, one warning.
	if logs.Len() > 0 {
		t.Errorf("the mapper's own warnings are shown:\n%s", logs.String())
	}
	s.FlushCounter("ratelimit_service_rate_limit_over_limit", 1)
	s.FlushCounter("ratelimit_service_rate_limit_over_limit", 1)
	if n := strings.Count(logs.String(), "a stat not exported"); n != 1 {
		t.Errorf("%d warnings for a stat with other labels, want 1:\n%s", n, logs.String())
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratelimit_service_rate_limit_over_limit"); err != nil {
		t.Errorf("after a stat with other labels: %v", err)
	}
}

// TestPromSinkBadMapping: a mapping that does not load fails the start
// with its file's name.
func TestPromSinkBadMapping(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "conf.yaml")
	if err := os.WriteFile(bad, []byte("mappings:\n  - match: a.b\n    name: \"x\"\n    lables: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := newPromSink(bad, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("a misspelled field: %v, want an error naming %s", err, bad)
	}
	if _, err := newPromSink(filepath.Join(t.TempDir(), "none.yaml"), slog.New(slog.DiscardHandler)); err == nil {
		t.Error("a missing file: no error")
	}
}
