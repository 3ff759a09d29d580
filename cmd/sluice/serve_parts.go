package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/decision/overrides"
	"github.com/sluicehq/sluice/internal/edges/hitters"
	"github.com/sluicehq/sluice/internal/edges/reload"
	"github.com/sluicehq/sluice/internal/edges/rlqs"
	"github.com/sluicehq/sluice/internal/edges/server"
	"github.com/sluicehq/sluice/internal/edges/xdsrules"
	"github.com/sluicehq/sluice/internal/stores/redishash"
	"github.com/sluicehq/sluice/internal/stores/regions"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/rules"
)

// shareTopKeys publishes the node's top keys through r's Redis every 2 s,
// so that any node's cluster view (serve's /hitters?scope=cluster, the
// dashboards of serve and proxy) merges them all; stop stops it.
func shareTopKeys(top *hitters.Tracker, r *redisstore.Store) (shared *hitters.Shared, stop func()) {
	host, _ := os.Hostname()
	shared = hitters.NewShared(top, redishash.New(r.Client, r.Prefix()+"hitters"), fmt.Sprintf("%s:%d", host, os.Getpid()), 20)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { shared.Run(ctx); close(done) }()
	return shared, func() { cancel(); <-done }
}

// runtimeOverrides are the runtime overrides of a node: their index (the
// decision core's Runtime), where they are kept (nil: nowhere, none), and
// stop, which stops keeping them.
type runtimeOverrides struct {
	idx     *overrides.Index
	backend overrides.Backend
	stop    func()
}

// openOverrides sets up the runtime overrides: kept in Redis with --store
// redis (every node sees every change), in --overrides-file with --store
// memory, or none.
func (s *serveSettings) openOverrides(stores *storeSet, log *slog.Logger) (*runtimeOverrides, error) {
	audit := log.With("component", "admin")
	idx := overrides.NewIndex(nil)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var backend overrides.Backend
	var closeFile func()
	switch {
	case stores.Redis != nil:
		rs := overrides.NewRedisStore(stores.Redis.Client, stores.Redis.Prefix(), idx, nil, audit)
		wg.Go(func() { rs.Run(ctx) })
		backend = rs
	case s.overridesFile != "":
		fs, err := overrides.OpenFile(s.overridesFile, idx, nil)
		if err != nil {
			cancel()
			return nil, err
		}
		log.Info("runtime overrides loaded", "file", s.overridesFile, "overrides", len(fs.List()))
		wg.Go(func() { sweepFile(ctx, fs, audit) })
		backend, closeFile = fs, func() { fs.Close() }
	default:
		cancel()
		return &runtimeOverrides{stop: func() {}}, nil
	}
	stop := func() {
		cancel()
		wg.Wait()
		if closeFile != nil {
			closeFile()
		}
	}
	return &runtimeOverrides{idx: idx, backend: backend, stop: stop}, nil
}

// runtime is the decision core's Runtime: nil without overrides.
func (ro *runtimeOverrides) runtime() rules.Runtime {
	if ro.idx == nil {
		return nil
	}
	return ro.idx
}

// admin is the admin API's handler, nil without --admin-addr or without
// overrides kept anywhere.
func (s *serveSettings) admin(ro *runtimeOverrides, dec *decide.Decider, rs *regions.Store, log *slog.Logger) (http.Handler, error) {
	if s.adminAddr == "" || ro.backend == nil {
		return nil, nil
	}
	tokens, err := overrides.LoadTokens(s.adminTokenFile)
	if err != nil {
		return nil, err
	}
	return overrides.NewAdmin(overrides.AdminConfig{
		Backend: ro.backend,
		Tokens:  tokens,
		Explain: func(ctx context.Context, domain string, descs []rules.Descriptor) (any, error) {
			e, err := dec.Explain(ctx, domain, descs)
			if err == nil && rs != nil {
				explainRegions(ctx, e, rs, s.regions.region)
			}
			return e, err
		},
		Logger: log.With("component", "admin"),
	}), nil
}

// sweepFile removes the expired overrides of fs every second until ctx
// ends.
func sweepFile(ctx context.Context, fs *overrides.FileStore, audit *slog.Logger) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		changes, err := fs.Sweep()
		if err != nil {
			audit.Error("expired overrides not removed", "err", err)
		}
		for _, c := range changes {
			audit.Info("override expired", "id", c.Before.ID())
		}
	}
}

// rlqsServer is the Rate Limit Quota Service of the node, on the gRPC
// listener: shares kept in Redis with --store redis (so that any Envoy
// may talk to any node), else in memory.
func (s *serveSettings) rlqsServer(stores *storeSet, dec *decide.Decider, reg prometheus.Registerer, log *slog.Logger) (*rlqs.Server, error) {
	policy := rlqs.PolicyDefaults(rlqs.Policy{TTL: s.rlqsTTL, Grace: s.rlqsGrace})
	var pools rlqs.Pools = rlqs.NewMemPools(policy, nil)
	if stores.Redis != nil {
		pools = rlqs.NewRedisPools(policy, stores.Redis.Client, stores.Redis.Prefix())
	}
	windows := rlqs.TokenBuckets
	if s.rlqsWindows == "requests_per_time_unit" {
		windows = rlqs.RequestsPerTimeUnit
	}
	return rlqs.New(rlqs.Config{
		Rules:         dec.Rules,
		Runtime:       dec.Runtime,
		FailurePolicy: dec.FailurePolicy,
		Pools:         pools,
		Policy:        policy,
		ShadowMode:    s.shadowMode,
		Windows:       windows,
		MaxBytes:      int64(s.rlqsMaxBytes),
		Logger:        log.With("component", "rlqs"),
		Registry:      reg,
	})
}

// envoyHeadersConfig is the server's EnvoyHeaders: nil unless --envoy-headers.
func (s *serveSettings) envoyHeadersConfig() *server.EnvoyHeaderNames {
	if !s.envoyHeaders {
		return nil
	}
	names := s.envoyHeaderNames
	return &names
}

// readyCheck is the server's extra readiness check: with
// --ready-needs-domain, not ready until rules with a domain are loaded
// (envoy-rl's HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED); with --config-xds,
// not ready until the server's first rules are in force, unless
// --start-without-config (envoy-rl waits for them before it serves).
func (s *serveSettings) readyCheck(current func() *rules.Config, source rulesSource) func(context.Context) error {
	xc, _ := source.(*xdsrules.Client)
	waitXDS := xc != nil && !s.startWithoutConfig
	if !s.readyNeedsDomain && !waitXDS {
		return nil
	}
	return func(context.Context) error {
		if waitXDS {
			select {
			case <-xc.First():
			default:
				return errors.New("no rules from the xDS server yet")
			}
		}
		if c := current(); s.readyNeedsDomain && (c == nil || len(c.Domains()) == 0) {
			return errors.New("no rules with a domain loaded yet")
		}
		return nil
	}
}

// rulesSource starts where the rules come from, files or xDS, and returns
// it with the rules in force at start. With files, a bad initial config
// fails the start with every problem; with xDS, the start waits for the
// server's first rules unless --start-without-config.
func (s *serveSettings) rulesSource(onLoad func(*rules.Config), onError func(error), log *slog.Logger) (rulesSource, *rules.Config, error) {
	if s.xds.addr != "" {
		c, err := s.xds.client(onLoad, onError, s.mergeDomains, log.With("component", "xds"))
		if err != nil {
			return nil, nil, err
		}
		return c, c.Current(), nil
	}
	watcher, err := reload.New(reload.Config{
		Path:         s.config,
		Logger:       log.With("component", "reload"),
		OnLoad:       onLoad,
		OnError:      onError,
		MergeDomains: s.mergeDomains,
		AllowMissing: s.startWithoutConfig,
		Check:        s.checkRules,
	})
	if err != nil {
		var re *rules.Error
		if errors.As(err, &re) {
			for _, p := range re.Problems {
				log.Error("rules problem", "file", p.File, "line", p.Line, "column", p.Column, "problem", p.Msg)
			}
			for _, p := range re.Warnings {
				log.Warn("rules warning", "file", p.File, "line", p.Line, "column", p.Column, "problem", p.Msg)
			}
			return nil, nil, fmt.Errorf("%d problem(s) in %s:\n%s", len(re.Problems), s.config, re.Error())
		}
		return nil, nil, fmt.Errorf("rules: %w", err)
	}
	return watcher, watcher.Current(), nil
}

// checkRules is the check of every rules load: concurrency limits only
// with --stream-done-release.
func (s *serveSettings) checkRules(c *rules.Config) error {
	if s.streamDoneRelease {
		return nil
	}
	return refuseConcurrency(c)
}

// refuseConcurrency refuses rules with a concurrency limit, unless the
// operator says Envoy is configured to release (--stream-done-release):
// RLS has no release call, and only a route's apply_on_stream_done entry
// that sends the permit token back tells sluice serve that an admitted
// request ended. Without it every permit would be held until its TTL
// whatever the request did: a cap on requests started per TTL, not on
// those in flight, which denies far more than the rule says. sluice
// cannot see Envoy's configuration, so the operator states it.
func refuseConcurrency(c *rules.Config) error {
	if rs := concurrencyRules(c); len(rs) > 0 {
		return fmt.Errorf("%s:%d: a concurrency limit needs Envoy to release each request's permits when its stream is done (apply_on_stream_done with the permit token, docs/envoy-apis.md): with that configured, start sluice serve with --stream-done-release; or use sluice proxy, or httplimit in Go", rs[0].File, rs[0].Line)
	}
	return nil
}

// concurrencyRules are the rules of c with a concurrency limit, in the
// order of c's domains and their rules.
func concurrencyRules(c *rules.Config) []*rules.Rule {
	var out []*rules.Rule
	for _, name := range c.Domains() {
		for _, r := range c.Domain(name).Rules {
			if r.Concurrency != nil {
				out = append(out, r)
			}
		}
	}
	return out
}

// explainRegions adds to e's global limits this region's allocation of
// them and its safe share.
func explainRegions(ctx context.Context, e *decide.Explanation, rs *regions.Store, region string) {
	annotate := func(le *decide.LimitExplanation) {
		if l := le.Hit.Limit; l != nil && l.Global {
			alloc, share, _ := rs.Allocation(ctx, le.Hit.Key, l)
			le.Region, le.Allocation, le.SafeShare = region, alloc, share
		}
	}
	for i := range e.Descriptors {
		for j := range e.Descriptors[i].Limits {
			annotate(&e.Descriptors[i].Limits[j])
		}
	}
	if e.Capacity != nil {
		annotate(e.Capacity)
	}
}
