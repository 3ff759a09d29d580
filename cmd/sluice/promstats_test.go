package main

import (
	"bytes"
	"fmt"
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
// allow; timers in milliseconds are observed in seconds. A stat whose
// label names differ from those of its metric's first is served as a
// series of its own, as statsd_exporter serves it: Envoy Gateway's
// mapping names over_limit with domain and key1 for a descriptor of one
// entry, and with key2 too for one of more.
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
	if logs.Len() > 0 {
		t.Errorf("the mapper's own warnings are shown:\n%s", logs.String())
	}
	// The same name with other labels: a series of each.
	s.FlushCounter("ratelimit.service.rate_limit.api.route_r.rule_0.user.over_limit", 4)
	s.FlushCounter("ratelimit_service_rate_limit_over_limit", 1)
	s.FlushCounter("ratelimit_service_rate_limit_over_limit", 1)
	if logs.Len() > 0 {
		t.Errorf("warnings for stats with other labels:\n%s", logs.String())
	}
	want = `
# HELP ratelimit_service_rate_limit_over_limit envoyproxy/ratelimit's stat, by --metrics-mapping
# TYPE ratelimit_service_rate_limit_over_limit counter
ratelimit_service_rate_limit_over_limit 2
ratelimit_service_rate_limit_over_limit{domain="api",key1="user_a"} 3
ratelimit_service_rate_limit_over_limit{domain="api",key1="route_r",key2="rule_0"} 4
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ratelimit_service_rate_limit_over_limit"); err != nil {
		t.Errorf("stats with other labels: %v", err)
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

// TestPromSinkGuards: a mapping file that would cost too much to load
// (more than maxMappingBytes, more than maxMappings mappings) or that
// would make every scrape of the metrics listener fail (a metric named as
// sluice's own, a label Prometheus reserves) is refused at start, naming
// the file and the mapping; so are two mappings that name one metric as
// two types (match_metric_type), or with labels none of which tells
// their series apart (a stat of each would add into one series, which
// statsd_exporter serves silently), naming both mappings. A templated
// name that maps a stat onto a reserved name, or a name mapped as two
// types at run time, is dropped with one warning: the listener keeps
// answering.
func TestPromSinkGuards(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	mapping := func(match, name string, labels ...string) string {
		s := fmt.Sprintf("  - match: %q\n    name: %q\n", match, name)
		if len(labels) > 0 {
			s += "    labels:\n"
			for _, l := range labels {
				s += fmt.Sprintf("      %s: \"$1\"\n", l)
			}
		}
		return s
	}
	var many strings.Builder
	many.WriteString("mappings:\n")
	for i := range maxMappings + 1 {
		many.WriteString(mapping(fmt.Sprintf("ratelimit.*.s%d", i), fmt.Sprintf("m%d", i), "domain"))
	}
	for _, c := range []struct{ file, content, want string }{
		{"big.yaml", "mappings: []\n" + strings.Repeat("# padding\n", maxMappingBytes/10+1), "more than 262144"},
		{"many.yaml", many.String(), "501 mappings, more than 500"},
		{"sluice.yaml", "mappings:\n" + mapping("ratelimit.*.x", "sluice_config_loads_total", "result"), `"sluice_config_loads_total" takes a name of sluice's own metrics`},
		{"go.yaml", "mappings:\n" + mapping("ratelimit.*.x", "go_goroutines"), "go_*"},
		{"process.yaml", "mappings:\n" + mapping("ratelimit.*.x", "process_open_fds"), "process_*"},
		{"promhttp.yaml", "mappings:\n" + mapping("ratelimit.*.x", "promhttp_metric_handler_requests_total"), "promhttp_*"},
		{"name.yaml", "mappings:\n" + mapping("ratelimit.*.x", "x", "__name__"), `label "__name__"`},
		{"meta.yaml", "mappings:\n" + mapping("ratelimit.*.x", "x", "__meta_x"), `label "__meta_x"`},
		{"sum.yaml", "mappings:\n" + mapping("ratelimit.*.hits", "hits", "domain") + mapping("ratelimit.*.x", "other") +
			mapping("ratelimit.*.within", "hits", "domain") + "    timer_type: histogram\n",
			`mappings 1 ("ratelimit.*.hits") and 3 ("ratelimit.*.within"): both name hits[domain] with no label that tells their series apart`},
		{"const.yaml", "mappings:\n  - {match: a.x, name: n, labels: {kind: one}}\n  - {match: b.x, name: n, labels: {kind: one}}\n", "both name n[kind]"},
		{"types.yaml", "mappings:\n  - {match: a.*, name: n, match_metric_type: counter, labels: {dom: $1}}\n  - {match: b.*, name: n, match_metric_type: gauge, labels: {env: $1}}\n",
			`mappings 1 ("a.*") and 2 ("b.*"): both name n, as a counter and as a gauge`},
	} {
		path := write(c.file, c.content)
		if _, err := newPromSink(path, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v, want an error naming the file and saying %q", c.file, err, c.want)
		}
	}

	var logs bytes.Buffer
	// One name with other label names, or with a label of another value
	// in each, loads: their series are apart.
	s, err := newPromSink(write("ok.yaml", "mappings:\n"+
		mapping("ratelimit.service.*", "ratelimit_$1")+
		mapping("ratelimit.twice.*", "ratelimit_twice", "domain")+
		mapping("ratelimit.gauge.*", "ratelimit_twice", "region")+
		"  - {match: a.*, name: n, labels: {dom: $1, stat: a}}\n  - {match: b.*, name: n, labels: {dom: $1, stat: b}}\n"), slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	mapped := prometheus.NewRegistry()
	mapped.MustRegister(s)
	own := prometheus.NewRegistry()
	own.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_config_loads_total", Help: "sluice's own"}))
	s.FlushCounter("ratelimit.service.ok", 1)
	s.FlushGauge("ratelimit.service.ok", 1) // the name of a counter, as a gauge
	s.FlushCounter("ratelimit.twice.api", 1)
	s.FlushGauge("ratelimit.gauge.api", 1)
	s.FlushCounter("a.x", 1)
	s.FlushCounter("b.x", 1)
	// A template that makes a reserved name: sluice_config_loads_total.
	s2, err := newPromSink(write("tmpl.yaml", "mappings:\n"+mapping("ratelimit.*.loads_total", "$1_loads_total")), slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	mapped.MustRegister(s2)
	s2.FlushCounter("ratelimit.sluice_config.loads_total", 1)
	if _, err := (prometheus.Gatherers{own, mapped}).Gather(); err != nil {
		t.Errorf("scrape: %v", err)
	}
	if n := strings.Count(logs.String(), "a stat not exported"); n != 3 {
		t.Errorf("%d warnings, want 3 (a gauge of a counter's name twice, a reserved name):\n%s", n, logs.String())
	}
	if n, err := testutil.GatherAndCount(mapped, "ratelimit_ok", "ratelimit_twice", "n"); err != nil || n != 4 {
		t.Errorf("the stats first mapped, and n's of two stats: %d series, %v; want 4", n, err)
	}
}
