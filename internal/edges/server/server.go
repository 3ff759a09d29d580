// Package server is the network face of sluice serve: the Envoy rate limit
// service (RLS v3) over gRPC with the gRPC health service, the HTTP JSON API
// (POST /json), health and readiness (/healthz, /readyz), Prometheus
// metrics (/metrics), and a debug handler (pprof with the secrets of the
// command line masked, the loaded rules, the top keys, the dashboard).
//
// It answers every request through the one door of package decide, whose
// Decider it makes with the hooks of what the server adds (global shadow
// mode, rate limit response headers, metrics, statsd, top keys), converts
// with package rls, and owns the transports' error codes and readiness. It does not listen, read flags or watch files: the
// command wires listeners, configuration and lifecycle to it. It must not
// import cmd/ or any store.
//
// # Metrics
//
// Per rule, labelled domain and rule (the rule's Envoy stats key, e.g.
// "api.user" or "api.path_/v1/*"), counted in hits (each descriptor's
// hits_addend) as envoyproxy/ratelimit counts them:
//
//	sluice_rule_hits_total          every hit decided
//	sluice_rule_within_limit_total  hits the rule's limits admitted
//	sluice_rule_over_limit_total    hits the rule's limits denied, shadow-mode
//	                                denials included
//	sluice_rule_near_limit_total    admitted hits beyond NearLimitRatio of the
//	                                limit: of the hits that took the use from
//	                                before to after, those above
//	                                floor(limit × ratio)
//	sluice_rule_shadow_mode_total   over-limit hits let through by shadow mode,
//	                                the rule's or the global one
//
// Request values never become label values unless a rule asks for them
// (detailed_metric, value_to_metric: the stats key then holds them), and
// even then at most Config.MaxRuleLabels (10,000 by default) distinct
// stats keys become labels over the server's life; later ones count under
// rule="_other" of their domain. Per-descriptor limit overrides, whose
// Envoy stats keys hold request values, count under rule="_override"; the
// domain capacity under rule="_capacity". Unlimited, replaced and
// unmatched descriptors are not counted, as in Envoy. When a request is
// denied, nothing is consumed: the descriptors whose own limits admitted it
// count as within the limit, and no hit counts as near the limit.
//
// Per server:
//
//	sluice_requests_total{transport,result}  transport grpc or http; result
//	                       ok, over_limit, shadow_over_limit (answered OK
//	                       because of shadow mode), invalid, error
//	sluice_decision_duration_seconds  histogram of the time to decide one
//	                       request (rules and store)
//	sluice_store_errors_total        requests whose store decision failed,
//	                       whether a failure policy answered them or not
//	sluice_failure_policy_total{domain,policy}  requests answered by a
//	                       failure policy (fail_open, fail_closed, local);
//	                       only configured domains have limits, so the
//	                       domain label is bounded by the configuration
//	sluice_store_up                  1 while the store reports it can
//	                       decide, else 0; only when there is a
//	                       Config.StoreHealth
//	sluice_config_loads_total{result}  configuration loads, success or
//	                       failure (a failure keeps the previous one)
//	sluice_config_info{hash}         1, labelled with the hash of the
//	                       configuration in force
//	sluice_config_load_timestamp_seconds  when it was loaded
//	sluice_permit_tokens_total{event}  permit tokens of concurrency limits
//	                       (rls.PermitKey): issued in answers; release
//	                       descriptors released (the store removed
//	                       their permits), stale (it held none any
//	                       more: a release replayed, or after the
//	                       expiry), refused (malformed, or naming no
//	                       permit of theirs) or failed (store); one of
//	                       no concurrency limit counts in none
//
// and the Go and process collectors.
//
// # Store failures
//
// The decider answers a store failure with the domain's failure policy
// (decide.Failover). The server counts those requests as above and logs them
// at most once per second per domain; a fail_open answer carries no rate
// limit headers, since it knows no quota.
//
// Readiness (/readyz, gRPC health) does not follow the store, except in one
// case: it fails while the store reports itself down (Config.StoreHealth)
// and the decider's default failure policy is fail_closed, when the node
// could only deny. Otherwise the node still answers by its policy, and
// taking every node out of the load balancer during a store outage would
// turn fail_open into a full outage. /readyz always shows the store's state.
package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	gostats "github.com/lyft/gostats"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/base/logsample"
	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
	"github.com/sluicehq/sluice/internal/decision/readiness"
	"github.com/sluicehq/sluice/internal/edges/dashboard"
	"github.com/sluicehq/sluice/internal/edges/hitters"
	"github.com/sluicehq/sluice/internal/edges/topkeys"
	"github.com/sluicehq/sluice/rules"
)

// Config configures a Server. Zero fields mean the documented default.
type Config struct {
	// Decide configures the decision core that answers the requests
	// (decide.New): Limiter is required. The server adds its own hooks
	// before Decide.Hooks. Its rules may be nil until the first
	// ConfigLoaded: the server is then not ready and answers Unavailable
	// (gRPC) or 503 (HTTP).
	Decide decide.Config

	// DynamicMetadata adds to every response the dynamic metadata of
	// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA (rls.DynamicMetadata).
	DynamicMetadata bool

	// Logger receives request failures and configuration events. Nil
	// discards them.
	Logger *slog.Logger

	// Registry receives the server's metrics and is served on /metrics.
	// Nil means a new registry. The Go and process collectors are added
	// unless already registered.
	Registry *prometheus.Registry

	// Headers selects the rate limit response headers; zero adds none,
	// as Envoy's rate limit service by default (so does HeadersNone).
	Headers ratelimitheaders.HeaderMode

	// Statsd, when set, receives envoyproxy/ratelimit's stats with its
	// names (see statsdStats), tagged with StatsdTags (its EXTRA_TAGS),
	// beside the Prometheus metrics. The caller starts and flushes it.
	Statsd     gostats.Store
	StatsdTags map[string]string

	// EnvoyHeaders, when set, adds envoyproxy/ratelimit's own rate limit
	// headers (its LIMIT_RESPONSE_HEADERS_ENABLED) under these names: the
	// limit, remaining count and reset (whole seconds) of the descriptor
	// with the least remaining, or of the last one over its limit that is
	// not a quota.
	EnvoyHeaders *EnvoyHeaderNames

	// ShadowMode is the global shadow mode: every limit is decided and
	// counted, but no request is answered OVER_LIMIT overall; each
	// descriptor's status still says OVER_LIMIT where its limit denied, as
	// envoyproxy/ratelimit answers. Would-be denials
	// count in sluice_rule_shadow_mode_total and as requests with result
	// shadow_over_limit.
	ShadowMode bool

	// NearLimitRatio is the share of a limit beyond which admitted hits
	// count as near the limit (Envoy's near_limit). Zero means 0.8.
	NearLimitRatio float64

	// Ready is an extra readiness check, called by /readyz and the gRPC
	// health service; nil means none. The store's state is StoreHealth's.
	Ready func(ctx context.Context) error

	// StoreHealth reports whether the store can decide now: nil, or why
	// not. It must be cheap (no I/O): it backs sluice_store_up and the
	// store line of /readyz, which is 503 while it fails only when the
	// decider's default failure policy is fail_closed (see Readiness in
	// the package documentation). Nil means none: the store is taken to
	// be always up and sluice_store_up is not exported. (A store's Health
	// method is one.)
	StoreHealth func() error

	// Rules returns what the debug handler's /rules prints: a string (or
	// fmt.Stringer) as text, anything else as JSON. Nil prints a summary
	// of the decider's rules.
	Rules func() any

	// MaxRuleLabels caps the distinct values of the rule label of the
	// per-rule metrics; beyond it, new stats keys count under
	// rule="_other" of their domain. Zero means DefaultMaxRuleLabels.
	MaxRuleLabels int

	// LimitedBy adds to every OVER_LIMIT answer the header
	// x-sluice-limited-by, which says why: the rule (its stats key), the
	// runtime override when its limit decided (its ID), the descriptor,
	// the algorithm and limit, what is left and when the limit resets.
	// Off by default: it tells clients about the rules.
	LimitedBy bool

	// Hitters, when set, is told every limited descriptor of every
	// request (its rule's stats key, its entries, whether it was denied):
	// the top keys of each rule, on the debug listener's /hitters.
	Hitters *hitters.Tracker

	// Explain reads a counter's state for the dashboard's near-limit
	// list; nil means the tightest limit of the server's own decider
	// (dashboard.TightestLimit).
	Explain Explainer

	// HittersShared, when set, lets /hitters?scope=cluster merge every
	// node's top keys.
	HittersShared *hitters.Shared

	// Region, when set, gives the region tier's figures on this node for
	// the dashboard's Region panel; nil: no region tier.
	Region func() dashboard.Region
}

// DefaultMaxRuleLabels is the default cap on distinct rule label values.
const DefaultMaxRuleLabels = 10000

// DefaultNearLimitRatio is Envoy's near-limit ratio.
const DefaultNearLimitRatio = 0.8

// Server answers rate limit requests over gRPC and HTTP. Make one with New.
// It is safe for concurrent use.
type Server struct {
	dec           *decide.Decider
	metadata      bool
	log           *slog.Logger
	reg           *prometheus.Registry
	headers       ratelimitheaders.HeaderMode // the families sent; 0: none
	envoyHdrs     *EnvoyHeaderNames           // envoy-rl's own headers; nil: none
	shadow        bool
	nearRatio     float64
	ready         func(ctx context.Context) error
	storeUp       func() error // nil: no way to tell, taken as up
	rulesDebug    func() any
	hitters       *hitters.Tracker
	explain       Explainer
	hittersShared *hitters.Shared
	limitedBy     bool
	region        func() dashboard.Region

	m *metrics

	draining atomic.Bool
	loaded   atomic.Pointer[loadInfo]

	// Watchers of the health status, woken by a change of readiness.
	mu      sync.Mutex
	changed chan struct{}

	exchanges sync.Pool         // *exchange
	storeLog  logsample.Sampler // of the store failures logged
	policyLog logsample.Sampler // of the requests answered by a failure policy: one line a minute
	policy    policyWatch
}

// loadInfo is the configuration loaded last.
type loadInfo struct {
	cfg *rules.Config
	at  time.Time
}

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	if cfg.NearLimitRatio < 0 || cfg.NearLimitRatio > 1 {
		return nil, errors.New("server: NearLimitRatio must be between 0 and 1")
	}
	if cfg.MaxRuleLabels < 0 {
		return nil, errors.New("server: MaxRuleLabels must not be negative")
	}
	if err := cfg.Headers.Validate(); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	if err := cfg.EnvoyHeaders.validate(); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	s := &Server{
		metadata:      cfg.DynamicMetadata,
		log:           cfg.Logger,
		reg:           cfg.Registry,
		headers:       cfg.Headers.With(0),
		envoyHdrs:     cfg.EnvoyHeaders,
		shadow:        cfg.ShadowMode,
		nearRatio:     cfg.NearLimitRatio,
		ready:         cfg.Ready,
		storeUp:       cfg.StoreHealth,
		rulesDebug:    cfg.Rules,
		hitters:       cfg.Hitters,
		explain:       cfg.Explain,
		hittersShared: cfg.HittersShared,
		region:        cfg.Region,
		limitedBy:     cfg.LimitedBy,
		changed:       make(chan struct{}),
	}
	s.policyLog.Interval = policyLogEvery
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if s.reg == nil {
		s.reg = prometheus.NewRegistry()
	}
	if s.nearRatio == 0 {
		s.nearRatio = DefaultNearLimitRatio
	}
	maxLabels := cfg.MaxRuleLabels
	if maxLabels == 0 {
		maxLabels = DefaultMaxRuleLabels
	}
	m, err := newMetrics(s.reg, maxLabels, s.nearRatio, s.storeUp)
	if err == nil && cfg.Statsd != nil {
		m.statsd = newStatsdStats(cfg.Statsd, cfg.StatsdTags)
	}
	if err != nil {
		return nil, err
	}
	s.m = m
	if s.hitters != nil {
		if err := s.reg.Register(dashboard.NewCollector(s.hitters)); err != nil {
			return nil, err
		}
	}
	dc := cfg.Decide
	dc.Hooks = append(s.hooks(), cfg.Decide.Hooks...)
	if s.dec, err = decide.New(dc); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	if s.explain == nil {
		s.explain = dashboard.TightestLimit(s.dec)
	}
	if err := s.reg.Register(newScheduleWindows(s.dec.Rules)); err != nil {
		return nil, err
	}
	s.exchanges.New = func() any { return new(exchange) }
	if rc := s.dec.Rules(); rc != nil {
		s.m.setConfig(rc.Hash(), time.Time{})
	}
	return s, nil
}

// ConfigLoaded puts cfg in force (the decider's rules) and records the load
// at time at in the metrics: a successful load, the configuration's hash and
// the load time. The first call makes the server ready.
func (s *Server) ConfigLoaded(cfg *rules.Config, at time.Time) {
	if cfg == nil {
		s.ConfigRejected(errors.New("nil configuration"))
		return
	}
	s.dec.SetRules(cfg)
	s.loaded.Store(&loadInfo{cfg: cfg, at: at})
	s.m.configLoads.success.Inc()
	if sd := s.m.statsd; sd != nil {
		sd.configLoadSuccess.Inc()
	}
	s.m.setConfig(cfg.Hash(), at)
	s.log.Info("rate limit configuration loaded", "hash", cfg.Hash(), "domains", len(cfg.Domains()))
	s.notify()
}

// ConfigRejected counts a failed load of the configuration; the rules in
// force stay. The source of the rules (package reload, xdsrules) logs the
// refusal with its problems: the server logs it again only at debug
// level.
func (s *Server) ConfigRejected(err error) {
	s.m.configLoads.failure.Inc()
	if sd := s.m.statsd; sd != nil {
		sd.configLoadErr.Inc()
	}
	s.log.Debug("rate limit configuration rejected; the previous one stays in force", "err", err)
}

// SetDraining makes the server report not ready (/readyz answers 503, the
// gRPC health service NOT_SERVING) so that load balancers stop sending new
// requests, while it keeps answering those that still arrive. It cannot be
// undone.
func (s *Server) SetDraining() {
	if !s.draining.Swap(true) {
		s.log.Info("draining: reporting not ready")
		s.notify()
	}
}

// notify wakes the health watchers.
func (s *Server) notify() {
	s.mu.Lock()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// changes returns a channel closed at the next change of readiness.
func (s *Server) changes() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// errDraining and errNoConfig are the reasons for not being ready.
var (
	errDraining = errors.New("draining")
	errNoConfig = errors.New("no rate limit configuration loaded")
)

// readiness returns nil when the server is ready: a configuration is
// loaded, it is not draining, the Ready check passes, the store has been
// reached once since start, and it is up or the default failure policy
// answers without it (anything but fail_closed).
func (s *Server) readiness(ctx context.Context) error {
	if s.draining.Load() {
		return errDraining
	}
	if s.dec.Rules() == nil {
		return errNoConfig
	}
	if s.ready != nil {
		if err := s.ready(ctx); err != nil {
			return err
		}
	}
	return readiness.Store(s.storeHealth(), s.dec.Failover().Default)
}

// Decider returns the server's decision core, for the parts that share
// it: the admin API's explanations, the Rate Limit Quota Service, the
// dashboard.
func (s *Server) Decider() *decide.Decider { return s.dec }

// hooks are what the server adds to every decision, in this order:
// envoyproxy/ratelimit's own headers (before global shadow mode turns the
// answer, as Envoy), global shadow mode, the metrics and top keys, the
// rate limit headers, x-sluice-limited-by.
func (s *Server) hooks() []decide.Hook {
	var hs []decide.Hook
	if s.envoyHdrs != nil {
		hs = append(hs, s.envoyHdrs.hook)
	}
	if s.shadow {
		hs = append(hs, decide.GlobalShadow)
	}
	hs = append(hs, s.record)
	if s.hitters != nil {
		hs = append(hs, topkeys.Hook(s.hitters, s.shadow))
	}
	if s.headers != 0 {
		hs = append(hs, ratelimitheaders.Hook(s.headers))
	}
	if s.limitedBy {
		hs = append(hs, limitedBy)
	}
	return hs
}

// record is the hook of the server's metrics: the decision's duration,
// the answers of the failure policies, the per-rule counters, and
// envoyproxy/ratelimit's statsd stats.
func (s *Server) record(_ context.Context, r *decide.Request, o *decide.Outcome, err error) {
	s.m.latency.Observe(o.Elapsed.Seconds())
	if err != nil {
		return
	}
	sd := s.m.statsd
	if o.Degraded != rules.FailDefault {
		s.m.degraded(r.Domain, o.Degraded, o.Reason)
		if sd != nil {
			sd.redisError.Inc() // the store failed, as envoy-rl counts it
		}
	}
	if o.ShadowDenied && sd != nil {
		sd.globalShadow.Inc()
	}
	s.m.count(r.Domain, o, s.shadow)
	if sd != nil && len(r.Descriptors) > 0 && !anyMatched(o) {
		if cfg := s.dec.Rules(); cfg != nil && cfg.Domain(r.Domain) == nil {
			s.m.notFound(r.Domain, len(r.Descriptors))
		}
	}
}

// storeHealth is the store's state: nil when it is up or cannot tell.
func (s *Server) storeHealth() error {
	if s.storeUp == nil {
		return nil
	}
	return s.storeUp()
}
