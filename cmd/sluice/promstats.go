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
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"

	gostats "github.com/lyft/gostats"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/statsd_exporter/pkg/mapper"
)

// promSink is a gostats sink that keeps the stats as Prometheus metrics
// named by a mapping, and the collector that serves them: each scrape
// flushes the stats first, so that they are current.
type promSink struct {
	mapper *mapper.MetricMapper
	log    *slog.Logger
	store  gostats.Store // flushed at each scrape; set once made

	mu       sync.Mutex
	counters map[string]*prometheus.CounterVec
	gauges   map[string]*prometheus.GaugeVec
	hists    map[string]*prometheus.HistogramVec
	labels   map[string][]string // each metric's label names, fixed by its first stat
	refused  map[string]bool     // names logged once as not exportable
}

// timerType is the older name of observer_type, which Envoy Gateway's
// mapping still uses and statsd_exporter no longer reads.
var timerType = regexp.MustCompile(`(?m)^(\s*-?\s*)timer_type:`)

// newPromSink reads the mapping file.
func newPromSink(file string, log *slog.Logger) (*promSink, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--metrics-mapping: %w", err)
	}
	// The mapper warns of every glob that needs backtracking (Envoy
	// Gateway's do), at each start: its errors only.
	m := &mapper.MetricMapper{Logger: slog.New(minLevel{log.Handler(), slog.LevelError})}
	if err := m.InitFromYAMLString(timerType.ReplaceAllString(string(data), "${1}observer_type:")); err != nil {
		return nil, fmt.Errorf("--metrics-mapping %s: %v", file, err)
	}
	return &promSink{mapper: m, log: log, counters: map[string]*prometheus.CounterVec{}, gauges: map[string]*prometheus.GaugeVec{},
		hists: map[string]*prometheus.HistogramVec{}, labels: map[string][]string{}, refused: map[string]bool{}}, nil
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
	if have, ok := s.labels[name]; ok && strings.Join(have, ",") != strings.Join(keys, ",") {
		s.refuse(name, fmt.Sprintf("labels %v, where the metric has %v", keys, have))
		return
	}
	s.labels[name] = keys
	switch typ {
	case mapper.MetricTypeCounter:
		c := s.counters[name]
		if c == nil {
			c = prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: "envoyproxy/ratelimit's stat, by --metrics-mapping"}, keys)
			s.counters[name] = c
		}
		c.With(labels).Add(v)
	case mapper.MetricTypeGauge:
		g := s.gauges[name]
		if g == nil {
			g = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: "envoyproxy/ratelimit's stat, by --metrics-mapping"}, keys)
			s.gauges[name] = g
		}
		g.With(labels).Set(v)
	default:
		h := s.hists[name]
		if h == nil {
			h = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: "envoyproxy/ratelimit's stat, by --metrics-mapping"}, keys)
			s.hists[name] = h
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
