package server

import (
	"errors"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gostats "github.com/lyft/gostats"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/fault"
	"github.com/sluicehq/sluice/internal/base/wheremetric"
	"github.com/sluicehq/sluice/rules"
)

// The reserved values of the rule label. Stats keys always contain a dot
// (the domain, then the descriptor path), so they never take these.
const (
	// labelOther gathers the stats keys of a domain beyond the label cap.
	labelOther = "_other"
	// labelOverride counts descriptors that carried their own limit
	// (Envoy's per-descriptor override): their stats keys hold request
	// values, which never become labels.
	labelOverride = "_override"
	// labelCapacity counts the domain-wide capacity limit.
	labelCapacity = "_capacity"
)

// metrics are the server's Prometheus metrics, described in the package
// documentation.
type metrics struct {
	nearRatio float64
	maxLabels int64
	labels    atomic.Int64
	domains   sync.Map // domain name -> *domainMetrics

	hits, within, over, near, shadow *prometheus.CounterVec

	latency       prometheus.Histogram
	storeErrors   prometheus.Counter
	failurePolicy *prometheus.CounterVec
	policyDecided prometheus.Counter // sluice_decisions_total{where="policy"}
	requests      [numTransports][numResults]prometheus.Counter
	tooLarge      [numTransports]prometheus.Counter
	configLoads   struct{ success, failure prometheus.Counter }
	configInfo    *prometheus.GaugeVec
	configTime    prometheus.Gauge
	infoMu        sync.Mutex
	permits       [numPermitEvents]prometheus.Counter

	statsd  *statsdStats // envoy-rl's stats to statsd; nil: none
	unknown sync.Map     // statsd only: unknown domain -> its domain_not_found counter
}

// ruleCounters are the counters of one rule label, curried once.
type ruleCounters struct {
	hits, within, over, near, shadow prometheus.Counter
	statsd                           *ruleStatsd // nil without statsd
}

type domainMetrics struct {
	name      string
	rules     sync.Map // rule label -> *ruleCounters
	overrides sync.Map // statsd only: override stats key -> *ruleCounters
}

func newMetrics(reg *prometheus.Registry, maxLabels int, nearRatio float64, storeUp func() error) (*metrics, error) {
	m := &metrics{nearRatio: nearRatio, maxLabels: int64(maxLabels)}
	ruleVec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"domain", "rule"})
	}
	m.hits = ruleVec("sluice_rule_hits_total", "Hits decided, by domain and rule (Envoy stats key).")
	m.within = ruleVec("sluice_rule_within_limit_total", "Hits admitted by the rule's limits.")
	m.over = ruleVec("sluice_rule_over_limit_total", "Hits denied by the rule's limits, shadow-mode denials included.")
	m.near = ruleVec("sluice_rule_near_limit_total", "Admitted hits beyond the near-limit ratio of the limit.")
	m.shadow = ruleVec("sluice_rule_shadow_mode_total", "Over-limit hits let through by shadow mode (the rule's or the global one).")
	m.latency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sluice_decision_duration_seconds",
		Help:    "Time to decide one rate limit request: matching the rules and the store's decision.",
		Buckets: prometheus.ExponentialBuckets(5e-6, 2.5, 12), // 5µs to 120ms
	})
	m.storeErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_store_errors_total",
		Help: "Requests whose store decision failed, whether a failure policy answered them or they failed.",
	})
	m.failurePolicy = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_failure_policy_total",
		Help: "Requests answered by a failure policy (fail_open, fail_closed, local) because the store could not decide, by domain and reason (overload: the node shed the call; timeout: the store stayed silent; breaker_open; unreachable; error: the store refused).",
	}, []string{"domain", "policy", "reason"})
	m.policyDecided = wheremetric.Counter("policy")
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_requests_total",
		Help: "Rate limit requests by transport (grpc, http) and result (ok, over_limit, shadow_over_limit, invalid, error).",
	}, []string{"transport", "result"})
	for t := range numTransports {
		for r := range numResults {
			m.requests[t][r] = requests.WithLabelValues(transportNames[t], resultNames[r])
		}
	}
	tooLarge := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_requests_too_large_total",
		Help: "Rate limit requests refused before decoding or matching because they were over a bound (bytes, descriptors, entries), by transport; each is also counted as invalid in sluice_requests_total.",
	}, []string{"transport"})
	for t := range numTransports {
		m.tooLarge[t] = tooLarge.WithLabelValues(transportNames[t])
	}
	loads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_config_loads_total",
		Help: "Loads of the rate limit configuration by result (success, failure); a failure keeps the previous configuration.",
	}, []string{"result"})
	m.configLoads.success = loads.WithLabelValues("success")
	m.configLoads.failure = loads.WithLabelValues("failure")
	m.configInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sluice_config_info",
		Help: "The configuration in force: 1, labelled with its hash.",
	}, []string{"hash"})
	m.configTime = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_config_load_timestamp_seconds",
		Help: "When the configuration in force was loaded, in Unix seconds.",
	})

	permits := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_permit_tokens_total",
		Help: "Permit tokens of concurrency limits: issued in answers, and release descriptors by result (released: the store removed their permits; stale: it held none of them any more, released before or expired; refused: malformed, or naming no permit of the descriptor, one of no concurrency limit not counted; failed: the store failed, the permits expire by their ttl). Issued minus released is what Envoy did not give back while it was held.",
	}, []string{"event"})
	for e := range numPermitEvents {
		m.permits[e] = permits.WithLabelValues(permitEventNames[e])
	}

	cs := []prometheus.Collector{
		m.hits, m.within, m.over, m.near, m.shadow, m.latency, m.storeErrors,
		m.failurePolicy, m.policyDecided, requests, tooLarge, loads, m.configInfo, m.configTime, permits,
	}
	if storeUp != nil {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_store_up",
			Help: "1 while the store reports that it can decide, 0 while it cannot (requests are then answered by the failure policies).",
		}, func() float64 {
			if storeUp() != nil {
				return 0
			}
			return 1
		}))
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, c := range []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := reg.Register(c); err != nil {
			if are := (prometheus.AlreadyRegisteredError{}); !errors.As(err, &are) {
				return nil, err
			}
		}
	}
	return m, nil
}

// setConfig records the configuration in force.
func (m *metrics) setConfig(hash string, at time.Time) {
	m.infoMu.Lock()
	defer m.infoMu.Unlock()
	m.configInfo.Reset()
	m.configInfo.WithLabelValues(hash).Set(1)
	if !at.IsZero() {
		m.configTime.Set(float64(at.UnixNano()) / 1e9)
	}
}

// count adds the outcome of one request of domain to the per-rule
// counters. shadow is the global shadow mode.
func (m *metrics) count(domain string, o *decide.Outcome, shadow bool) {
	consumed := o.Overall.Allowed && !o.ShadowDenied
	var dm *domainMetrics
	for i := range o.Descriptors {
		d := &o.Descriptors[i]
		if !d.Limited {
			continue
		}
		if dm == nil {
			dm = m.domain(domain)
		}
		label, capped := d.StatKey, true
		if d.Status == rules.Overridden {
			label, capped = labelOverride, false
		}
		rc := m.rule(dm, label, capped)
		if d.Status == rules.Overridden && m.statsd != nil {
			// statsd names an override's stats by the request's entries,
			// as envoy-rl does; Prometheus keeps one label for them all.
			rc = m.override(dm, rc, d.StatKey)
		}
		m.add(rc, d.Cost, &d.Decision, d.Over, d.ShadowOver || (d.Over && shadow), consumed)
	}
	if n := len(o.Limits); n > 0 && o.Limits[n-1].Descriptor < 0 {
		if dm == nil {
			dm = m.domain(domain)
		}
		c := &o.Limits[n-1]
		over := !c.Decision.Allowed
		m.add(m.rule(dm, labelCapacity, false), c.Cost, &c.Decision, over, over && (c.Limit.Shadow || shadow), consumed)
	}
}

// degraded counts a request of domain answered by a failure policy. The
// domain has a limit, so it is one of the configuration's: the label is
// bounded as the per-rule metrics' is.
func (m *metrics) degraded(domain string, p rules.FailurePolicy, why fault.Reason) {
	m.storeErrors.Inc()
	m.policyDecided.Inc()
	m.failurePolicy.WithLabelValues(m.domain(domain).name, p.String(), why.String()).Inc()
}

// add counts cost hits decided by d. Near-limit hits are counted only when
// the request was admitted: a denied request consumed nothing.
func (m *metrics) add(rc *ruleCounters, cost int64, d *sluice.Decision, over, shadow, consumed bool) {
	c := float64(cost)
	sd := rc.statsd
	rc.hits.Add(c)
	if sd != nil {
		sd.hits.Add(uint64(cost))
	}
	if over {
		rc.over.Add(c)
		if shadow {
			rc.shadow.Add(c)
		}
		if sd != nil {
			sd.over.Add(uint64(cost))
			if shadow {
				sd.shadow.Add(uint64(cost))
			}
		}
		return
	}
	rc.within.Add(c)
	if sd != nil {
		sd.within.Add(uint64(cost))
	}
	// Envoy's arithmetic: of the hits that brought the use of the limit
	// from before to after, those beyond floor(limit × ratio).
	if d.Limit <= 0 || !consumed {
		return
	}
	threshold := int64(math.Floor(float64(d.Limit) * m.nearRatio))
	after := d.Limit - d.Remaining
	if after > threshold {
		before := after - cost
		near := after - max(before, threshold)
		rc.near.Add(float64(near))
		if sd != nil {
			sd.near.Add(uint64(near))
		}
	}
}

// domain returns the metrics of a domain.
func (m *metrics) domain(name string) *domainMetrics {
	if v, ok := m.domains.Load(name); ok {
		return v.(*domainMetrics)
	}
	name = strings.Clone(name)
	v, _ := m.domains.LoadOrStore(name, &domainMetrics{name: name})
	return v.(*domainMetrics)
}

// notFound counts n descriptors of a request to a domain the rules do not
// have, on statsd as envoy-rl does (<domain>.domain_not_found, once per
// descriptor, as its GetLimit counts). Any client can name any domain, so
// the names count against the cap on keys; beyond it they count as
// _other.domain_not_found.
func (m *metrics) notFound(domain string, n int) {
	if v, ok := m.unknown.Load(domain); ok {
		v.(gostats.Counter).Add(uint64(n))
		return
	}
	name := domain
	if m.labels.Add(1) > m.maxLabels {
		m.labels.Add(-1)
		name = labelOther
	}
	name = strings.Clone(name)
	v, loaded := m.unknown.LoadOrStore(name, m.statsd.notFound(name))
	if loaded && name != labelOther {
		m.labels.Add(-1)
	}
	v.(gostats.Counter).Add(uint64(n))
}

// override returns the counters of an override's stats key: rc's
// Prometheus counters (the one _override label) with statsd counters of
// the key's own, within the cap on keys (beyond it, _other's).
func (m *metrics) override(dm *domainMetrics, rc *ruleCounters, key string) *ruleCounters {
	if v, ok := dm.overrides.Load(key); ok {
		return v.(*ruleCounters)
	}
	if m.labels.Add(1) > m.maxLabels {
		m.labels.Add(-1)
		return m.rule(dm, labelOther, false)
	}
	key = strings.Clone(key)
	oc := *rc
	oc.statsd = m.statsd.rule(key)
	v, loaded := dm.overrides.LoadOrStore(key, &oc)
	if loaded {
		m.labels.Add(-1)
	}
	return v.(*ruleCounters)
}

// rule returns the counters of a rule label of dm. A capped label counts
// against the cap and falls back to labelOther beyond it.
func (m *metrics) rule(dm *domainMetrics, label string, capped bool) *ruleCounters {
	if v, ok := dm.rules.Load(label); ok {
		return v.(*ruleCounters)
	}
	if capped {
		if m.labels.Add(1) > m.maxLabels {
			m.labels.Add(-1)
			return m.rule(dm, labelOther, false)
		}
	}
	label = strings.Clone(label)
	rc := &ruleCounters{
		hits:   m.hits.WithLabelValues(dm.name, label),
		within: m.within.WithLabelValues(dm.name, label),
		over:   m.over.WithLabelValues(dm.name, label),
		near:   m.near.WithLabelValues(dm.name, label),
		shadow: m.shadow.WithLabelValues(dm.name, label),
	}
	if m.statsd != nil {
		key := label // a stats key starts with its domain
		if !strings.HasPrefix(key, dm.name+".") {
			key = dm.name + "." + label // _override, _capacity, _other
		}
		rc.statsd = m.statsd.rule(key)
	}
	v, loaded := dm.rules.LoadOrStore(label, rc)
	if loaded && capped {
		m.labels.Add(-1)
	}
	return v.(*ruleCounters)
}
