package main

// envoyproxy/ratelimit's stats as Prometheus metrics on --metrics-addr,
// named by a statsd_exporter mapping file (--metrics-mapping; envoy-rl's
// PROMETHEUS_MAPPER_YAML with USE_PROMETHEUS=true), as envoy-rl serves
// them: Envoy Gateway mounts its mapping and its dashboards read
// ratelimit_service_rate_limit_over_limit{domain,key1,key2} and the like.
// The stats are the ones sent to statsd (statsd.go), made by the same
// code; the mapping is statsd_exporter's own mapper.

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"

	gostats "github.com/lyft/gostats"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/statsd_exporter/pkg/mapper"
	"go.yaml.in/yaml/v3"
)

// promSink is a gostats sink that keeps the stats as Prometheus metrics
// named by a mapping, and the collector that serves them: each scrape
// flushes the stats first, so that they are current.
type promSink struct {
	mapper *mapper.MetricMapper
	log    *slog.Logger
	store  gostats.Store // flushed at each scrape; set once made

	// The vectors are by metric name and label names: one metric may
	// have series of other label names, as statsd_exporter serves them
	// (a series of each), but only one type.
	mu       sync.Mutex
	counters map[string]*prometheus.CounterVec
	gauges   map[string]*prometheus.GaugeVec
	hists    map[string]*prometheus.HistogramVec
	types    map[string]mapper.MetricType // each metric's, fixed by its first stat
	refused  map[string]bool              // names logged once as not exportable
}

// timerType is the older name of observer_type, which Envoy Gateway's
// mapping still uses and statsd_exporter no longer reads.
var timerType = regexp.MustCompile(`(?m)^(\s*-?\s*)timer_type:`)

// Bounds of a mapping file. statsd_exporter's mapper builds its glob
// matcher in time and memory that grow with the square of the mappings
// (measured: 500 globs of Envoy Gateway's shape take 0.3 s and 20 MB of
// live heap, 1,000 take 1.3 s and 68 MB, 2,000 take 8 s and 260 MB);
// Envoy Gateway's mapping has 15 in 3 KB.
const (
	maxMappingBytes = 256 << 10
	maxMappings     = 500
)

// reservedMetric are the prefixes of the names of sluice's own metrics
// and of the Go and process collectors', served on the same listener: a
// mapped metric of one of these names would make every scrape fail.
var reservedMetric = []string{"sluice_", "go_", "process_", "promhttp_"}

// validMetric and validLabel are the names Prometheus's text format takes.
var (
	validMetric = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	validLabel  = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
)

// badExport says why the metric name with label names keys cannot be
// served beside sluice's metrics ("" if it can): a name of theirs, a
// label Prometheus reserves (__name__, any starting with __), a name
// the text format cannot hold. Any of these would make the listener
// answer every scrape 500.
func badExport(name string, keys []string) string {
	if !validMetric.MatchString(name) {
		return fmt.Sprintf("%q is not a Prometheus metric name", name)
	}
	for _, p := range reservedMetric {
		if strings.HasPrefix(name, p) {
			return fmt.Sprintf("%q takes a name of sluice's own metrics (%s*)", name, p)
		}
	}
	for _, k := range keys {
		if strings.HasPrefix(k, "__") || !validLabel.MatchString(k) {
			return fmt.Sprintf("label %q of %q: Prometheus reserves names starting with __, and takes letters, digits and _", k, name)
		}
	}
	return ""
}

// mappingEntry is what checkMappings reads of one mapping.
type mappingEntry struct {
	Match      string            `yaml:"match"`
	Name       string            `yaml:"name"`
	Action     string            `yaml:"action"`
	MetricType string            `yaml:"match_metric_type"`
	Labels     map[string]string `yaml:"labels"`
}

// checkMappings refuses a mapping file that would cost too much to load,
// that names a metric badExport refuses (a name with $ is a template,
// checked as each stat is mapped), or two of whose mappings collide.
func checkMappings(data []byte) error {
	if len(data) > maxMappingBytes {
		return fmt.Errorf("%d bytes, more than %d: a mapping of envoyproxy/ratelimit's stats needs a few dozen", len(data), maxMappingBytes)
	}
	var f struct {
		Mappings []mappingEntry `yaml:"mappings"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		return err
	}
	if len(f.Mappings) > maxMappings {
		return fmt.Errorf("%d mappings, more than %d: the mapper's cost grows with their square", len(f.Mappings), maxMappings)
	}
	for i, m := range f.Mappings {
		if m.Action == string(mapper.ActionTypeDrop) {
			continue
		}
		keys := slices.Sorted(maps.Keys(m.Labels))
		name := m.Name
		if strings.Contains(name, "$") {
			name = "templated"
		}
		if why := badExport(name, keys); why != "" {
			return fmt.Errorf("mapping of %q: %s", m.Match, why)
		}
		for j, o := range f.Mappings[:i] {
			if why := collide(o, m); why != "" {
				return fmt.Errorf("mappings %d (%q) and %d (%q): %s", j+1, o.Match, i+1, m.Match, why)
			}
		}
	}
	return nil
}

// collide says why mappings a and b cannot both be served ("" if they
// can): they name one metric (not a template) as two types, or with the
// same labels, none of which tells their series apart (each is a
// template in one of them, or has one value in both), so that a stat of
// each would add into one series. One metric with other label names is
// served as statsd_exporter serves it: a series of each (Envoy Gateway's
// mapping names ratelimit_service_rate_limit_over_limit with domain and
// key1, and with domain, key1 and key2).
func collide(a, b mappingEntry) string {
	if a.Name != b.Name || strings.Contains(a.Name, "$") || a.Action == string(mapper.ActionTypeDrop) {
		return ""
	}
	if a.MetricType != "" && b.MetricType != "" && a.MetricType != b.MetricType {
		return fmt.Sprintf("both name %s, as a %s and as a %s: one of them could never be served", a.Name, a.MetricType, b.MetricType)
	}
	keys := slices.Sorted(maps.Keys(a.Labels))
	if !slices.Equal(keys, slices.Sorted(maps.Keys(b.Labels))) {
		return ""
	}
	for _, k := range keys {
		va, vb := a.Labels[k], b.Labels[k]
		if !strings.Contains(va, "$") && !strings.Contains(vb, "$") && va != vb {
			return "" // a label of one value in each tells them apart
		}
	}
	return fmt.Sprintf("both name %s%v with no label that tells their series apart: a stat of each would add into one series; give them other names, or a label of another value in each", a.Name, keys)
}

// newPromSink reads the mapping file.
func newPromSink(file string, log *slog.Logger) (*promSink, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--metrics-mapping: %w", err)
	}
	if err := checkMappings(data); err != nil {
		return nil, fmt.Errorf("--metrics-mapping %s: %v", file, err)
	}
	// The mapper warns of every glob that needs backtracking (Envoy
	// Gateway's do), at each start: its errors only.
	m := &mapper.MetricMapper{Logger: slog.New(minLevel{log.Handler(), slog.LevelError})}
	if err := m.InitFromYAMLString(timerType.ReplaceAllString(string(data), "${1}observer_type:")); err != nil {
		return nil, fmt.Errorf("--metrics-mapping %s: %v", file, err)
	}
	return &promSink{mapper: m, log: log, counters: map[string]*prometheus.CounterVec{}, gauges: map[string]*prometheus.GaugeVec{},
		hists: map[string]*prometheus.HistogramVec{}, types: map[string]mapper.MetricType{}, refused: map[string]bool{}}, nil
}

func (s *promSink) FlushCounter(name string, value uint64) {
	s.add(name, mapper.MetricTypeCounter, float64(value))
}

func (s *promSink) FlushGauge(name string, value uint64) {
	s.add(name, mapper.MetricTypeGauge, float64(value))
}

// FlushTimer takes milliseconds (the gRPC calls' response_time), and
// observes seconds, as statsd_exporter does with a statsd timer.
func (s *promSink) FlushTimer(name string, value float64) {
	s.add(name, mapper.MetricTypeObserver, value/1000)
}

// invalidName are the characters a Prometheus name cannot hold, which
// statsd_exporter turns into _ in an unmapped stat's name.
var invalidName = regexp.MustCompile(`[^a-zA-Z0-9_]`)

func (s *promSink) add(stat string, typ mapper.MetricType, v float64) {
	// gostats writes tags into the name: stat.__key=value...
	stat, _, _ = strings.Cut(stat, ".__")
	name, labels := invalidName.ReplaceAllString(stat, "_"), prometheus.Labels{}
	if m, l, ok := s.mapper.GetMapping(stat, typ); ok {
		if m.Action == mapper.ActionTypeDrop {
			return
		}
		name, labels = m.Name, l
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	s.mu.Lock()
	defer s.mu.Unlock()
	have, ok := s.types[name]
	if ok && have != typ {
		s.refuse(name, fmt.Sprintf("a %s, where the metric is a %s", typ, have))
		return
	}
	if !ok {
		// A templated name ($1) is known only now.
		if why := badExport(name, keys); why != "" {
			s.refuse(name, why)
			return
		}
		s.types[name] = typ
	}
	vec := name + "\x00" + strings.Join(keys, "\x00")
	switch typ {
	case mapper.MetricTypeCounter:
		c := s.counters[vec]
		if c == nil {
			c = prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: "envoyproxy/ratelimit's stat, by --metrics-mapping"}, keys)
			s.counters[vec] = c
		}
		c.With(labels).Add(v)
	case mapper.MetricTypeGauge:
		g := s.gauges[vec]
		if g == nil {
			g = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: "envoyproxy/ratelimit's stat, by --metrics-mapping"}, keys)
			s.gauges[vec] = g
		}
		g.With(labels).Set(v)
	default:
		h := s.hists[vec]
		if h == nil {
			h = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: "envoyproxy/ratelimit's stat, by --metrics-mapping"}, keys)
			s.hists[vec] = h
		}
		h.With(labels).Observe(v)
	}
}

// refuse logs, once per name, a stat that cannot be exported.
func (s *promSink) refuse(name, why string) {
	if !s.refused[name] {
		s.refused[name] = true
		s.log.Warn("metrics mapping: a stat not exported", "metric", name, "why", why)
	}
}

// Describe describes nothing: the metrics come and go with the stats (an
// unchecked collector).
func (s *promSink) Describe(chan<- *prometheus.Desc) {}

// Collect flushes the stats, then collects every metric.
func (s *promSink) Collect(ch chan<- prometheus.Metric) {
	if s.store != nil {
		s.store.Flush()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.counters {
		c.Collect(ch)
	}
	for _, g := range s.gauges {
		g.Collect(ch)
	}
	for _, h := range s.hists {
		h.Collect(ch)
	}
}

// minLevel passes on the records of level and above.
type minLevel struct {
	slog.Handler
	level slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.level && h.Handler.Enabled(ctx, l)
}

// sinks sends every stat to each of its sinks.
type sinks []gostats.Sink

func (ss sinks) FlushCounter(name string, value uint64) {
	for _, s := range ss {
		s.FlushCounter(name, value)
	}
}

func (ss sinks) FlushGauge(name string, value uint64) {
	for _, s := range ss {
		s.FlushGauge(name, value)
	}
}

func (ss sinks) FlushTimer(name string, value float64) {
	for _, s := range ss {
		s.FlushTimer(name, value)
	}
}
