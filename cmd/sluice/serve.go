package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	gostats "github.com/lyft/gostats"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/base/redact"
	"github.com/sluicehq/sluice/internal/edges/hitters"
	"github.com/sluicehq/sluice/internal/edges/server"
	"github.com/sluicehq/sluice/internal/edges/xdsrules"
	"github.com/sluicehq/sluice/rules"
)

func init() {
	commands["serve"] = command{
		summary: "run the rate limit service (Envoy RLS, RLQS, HTTP JSON)",
		run: func(ctx context.Context, args []string, _ io.Reader, _, stderr io.Writer) error {
			return cmdServe(ctx, args, os.LookupEnv, stderr)
		},
		help: func(lookupEnv) *help { return new(serveSettings).help() },
	}
}

// waitForStop waits for ctx to end (SIGTERM, SIGINT) or a listener to fail,
// whose error it returns, reloading on every SIGHUP meanwhile.
func waitForStop(ctx context.Context, failed <-chan error, reload func(), log *slog.Logger) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			log.Info("shutting down")
			return nil
		case err := <-failed:
			log.Error("listener failed; shutting down", "err", err)
			return err
		case <-hup:
			log.Info("SIGHUP: reloading the configuration")
			reload()
		}
	}
}

func cmdServe(ctx context.Context, args []string, env lookupEnv, stderr io.Writer) error {
	s, err := parseServe(args, env, stderr)
	if err != nil {
		return err
	}
	if s.config != "" && !s.startWithoutConfig {
		if err := checkConfig(s.config); err != nil {
			return err
		}
	}
	log := newLogger(s.logLevel, s.logFormat, stderr)
	s.logStart(log)
	s.limitMemory(env, int64(s.rlqsMaxBytes), log)
	n := &node{s: s, log: log}
	defer n.close()
	if err := n.open(); err != nil {
		return err
	}
	return n.run(ctx)
}

// logStart logs the settings sluice serve starts with.
func (s *serveSettings) logStart(log *slog.Logger) {
	log.Info("starting sluice serve", "version", version, "config", s.config, "store", s.store,
		"failure_policy", s.failurePolicy.String(), "local_nodes", s.localNodes,
		"state_file", s.stateFile, "shadow_mode", s.shadowMode, "all_or_nothing", s.allOrNothing, "response_headers", s.responseHeaders)
	for _, src := range s.sources {
		log.Debug("setting from the environment", "setting", src)
	}
	if len(s.envoyIgnored) > 0 {
		// One line names them all, each with what to use instead.
		log.Warn("envoyproxy/ratelimit settings with no effect in sluice", "variables", strings.Join(s.envoyIgnored, "; "))
	}
}

// node is a running sluice serve: its parts, made by open in order (the
// rules, the stores, the overrides, the metrics, the server and its
// listeners), and what close undoes, in reverse.
type node struct {
	s   *serveSettings
	log *slog.Logger

	source  rulesSource
	initial *rules.Config
	core    decide.Config // of the store, for the server's decision core
	stores  *storeSet
	ro      *runtimeOverrides
	reg     *prometheus.Registry
	mapped  *prometheus.Registry // envoy-rl's stats by --metrics-mapping, on --metrics-addr
	snaps   *snapshotMetrics
	statsd  gostats.Store
	tags    map[string]string
	top     *hitters.Tracker
	shared  *hitters.Shared
	srv     *server.Server
	ends    []endpoint
	closers []func()
}

// onClose adds f to what close does.
func (n *node) onClose(f func()) { n.closers = append(n.closers, f) }

// close undoes what open did, last first.
func (n *node) close() {
	for i := len(n.closers) - 1; i >= 0; i-- {
		n.closers[i]()
	}
}

// open makes the node's parts: rules first, so that a bad initial config
// fails fast with every problem.
func (n *node) open() error {
	for _, step := range []func() error{n.openRules, n.openStores, n.openObservers, n.openServer, n.openListeners} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// openRules starts the source of the rules (files or xDS) and reads the
// rules in force at start.
func (n *node) openRules() error {
	s, log := n.s, n.log
	var err error
	n.source, n.initial, err = s.rulesSource(func(c *rules.Config) { n.srv.ConfigLoaded(c, time.Now()) }, func(err error) { n.srv.ConfigRejected(err) }, log)
	if err != nil {
		return err
	}
	for _, p := range n.initial.Warnings() {
		log.Warn("rules warning", "file", p.File, "line", p.Line, "column", p.Column, "problem", p.Msg)
	}
	if len(n.initial.Domains()) == 0 {
		log.Warn("no domains in the rules: every request is allowed", "config", s.config, "config_xds", redact.Value(s.xds.addr))
	}
	return nil
}

// openStores opens the store (and restores its state file) and the
// runtime overrides.
func (n *node) openStores() error {
	var err error
	n.core, n.stores, err = localDecideConfig(&n.s.storeSettings, n.log)
	if err != nil {
		return err
	}
	n.onClose(n.stores.close)
	if st := n.stores.Mem; st != nil {
		if err := restoreState(st, n.s.stateFile, n.log); err != nil {
			return err
		}
	}
	if n.ro, err = n.s.openOverrides(n.stores, n.log); err != nil {
		return err
	}
	n.onClose(n.ro.stop)
	n.reg = prometheus.NewRegistry()
	if n.stores.Mem != nil {
		n.snaps = newSnapshotMetrics(n.reg)
	}
	n.stores.register(n.reg)
	return nil
}

// openObservers starts what watches the decisions: statsd and the top keys
// (shared through Redis with --store redis).
func (n *node) openObservers() error {
	statsCtx, stopStats := context.WithCancel(context.Background())
	n.onClose(stopStats) // sends the last stats
	var err error
	var prom *promSink
	if n.statsd, n.tags, prom, err = n.s.statsd.start(statsCtx, n.log); err != nil {
		return err
	}
	if prom != nil {
		n.mapped = prometheus.NewRegistry()
		n.mapped.MustRegister(prom)
	}
	if !n.s.topKeys {
		return nil
	}
	n.top = hitters.New(hitters.Config{})
	n.onClose(n.top.Close)
	if n.stores.Redis != nil {
		var stop func()
		n.shared, stop = shareTopKeys(n.top, n.stores.Redis)
		n.onClose(stop)
	}
	return nil
}

// openServer makes the server, with the decision core of the store, the
// overrides and the flags, and puts the initial rules in force.
func (n *node) openServer() error {
	s := n.s
	core := n.core
	// Envoy's way by default: each limit of a request counts on its own.
	core.CountEach = !s.allOrNothing
	core.QuotaMode = s.quotaMode
	core.Runtime = n.ro.runtime()
	srv, err := server.New(server.Config{
		Decide:          core,
		DynamicMetadata: s.dynamicMetadata,
		Hitters:         n.top,
		HittersShared:   n.shared,
		Region:          regionFigures(n.stores),
		LimitedBy:       s.limitedBy,
		Statsd:          n.statsd,
		StatsdTags:      n.tags,
		StoreHealth:     n.stores.health(),
		Logger:          n.log.With("component", "server"),
		Registry:        n.reg,
		Headers:         s.headers,
		EnvoyHeaders:    s.envoyHeadersConfig(),
		ShadowMode:      s.shadowMode,
		NearLimitRatio:  s.nearLimitRatio,
		Ready:           s.readyCheck(func() *rules.Config { return n.srv.Decider().Rules() }, n.source),
	})
	if err != nil {
		return err
	}
	n.srv = srv
	srv.ConfigLoaded(n.initial, time.Now())
	return nil
}

// openListeners makes the gRPC server (RLS, RLQS, health) and the HTTP
// ones (the API, debug, admin), not listening yet.
func (n *node) openListeners() error {
	s, log := n.s, n.log
	gs, err := n.grpcServer()
	if err != nil {
		return err
	}
	dec := n.srv.Decider()
	quota, err := s.rlqsServer(n.stores, dec, n.reg, log)
	if err != nil {
		return err
	}
	quota.Register(gs)
	n.ends = []endpoint{
		{name: "grpc", addr: s.grpcAddr, grpc: gs},
		{name: "http", addr: s.httpAddr, http: newHTTPServer(withPid(n.srv.Handler()), log, s.bodyTimeout)},
	}
	if s.metricsAddr != "" {
		metrics := http.NewServeMux()
		if n.mapped != nil {
			// The text format only, as envoy-rl serves them: in
			// OpenMetrics a counter's samples take _total, and the
			// dashboards read ratelimit_service_rate_limit_over_limit.
			metrics.Handle("/metrics", promhttp.HandlerFor(prometheus.Gatherers{n.reg, n.mapped}, promhttp.HandlerOpts{}))
		} else {
			metrics.Handle("/metrics", n.srv.Handler())
		}
		n.ends = append(n.ends, endpoint{name: "metrics", addr: s.metricsAddr, http: newHTTPServer(metrics, log, s.bodyTimeout)})
	}
	if s.debugAddr != "" {
		n.ends = append(n.ends, endpoint{name: "debug", addr: s.debugAddr, http: newHTTPServer(n.srv.DebugHandler(), log, s.bodyTimeout)})
	}
	admin, err := s.admin(n.ro, dec, n.stores.Regions, log)
	if err != nil {
		return err
	}
	if admin != nil {
		n.ends = append(n.ends, endpoint{name: "admin", addr: s.adminAddr, http: newHTTPServer(admin, log, s.bodyTimeout)})
	}
	return nil
}

// grpcServer is the gRPC server of the rate limit services: keepalive,
// tracing, envoy-rl's statsd interceptor and TLS as the flags say.
func (n *node) grpcServer() (*grpc.Server, error) {
	s, log := n.s, n.log
	tlsCfg, err := s.tls.config(log, n.reg)
	if err != nil {
		return nil, err
	}
	gopts := append(server.GRPCServerOptions(), grpc.KeepaliveParams(keepalive.ServerParameters{
		MaxConnectionAge:      s.grpcMaxConnAge,
		MaxConnectionAgeGrace: s.grpcMaxConnAgeGrace,
	}))
	traceOpts, stopTracing, err := s.tracing.start(context.Background(), log)
	if err != nil {
		return nil, err
	}
	n.onClose(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stopTracing(ctx); err != nil {
			log.Warn("tracing: spans not sent at shutdown", "err", err)
		}
	})
	gopts = append(gopts, traceOpts...)
	if n.statsd != nil {
		gopts = append(gopts, grpc.ChainUnaryInterceptor(server.StatsdInterceptor(n.statsd, n.tags)))
	}
	if tlsCfg != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(tlsCfg)))
		log.Info("gRPC listener speaks TLS", "cert", s.tls.cert, "mutual", s.tls.clientCA != "", "client_san", s.tls.clientSAN)
	}
	gs := grpc.NewServer(gopts...)
	n.srv.RegisterGRPC(gs)
	return gs, nil
}

// logReady logs "ready" when the node is ready as /readyz says it: at
// once, but with rules from xDS (without --start-without-config) once the
// first rules have arrived, and until then "not ready yet". It gives up
// when done is closed.
func (n *node) logReady(done <-chan struct{}) {
	ready := func(c *rules.Config) { n.log.Info("ready", "domains", c.Domains(), "hash", c.Hash()) }
	xc, _ := n.source.(*xdsrules.Client)
	if xc == nil || n.s.startWithoutConfig {
		ready(n.initial)
		return
	}
	select {
	case <-xc.First():
		ready(xc.Current())
		return
	default:
	}
	n.log.Info("not ready yet: waiting for the first rules from the xDS server", "config_xds", redact.Value(n.s.xds.addr))
	go func() {
		select {
		case <-xc.First():
			ready(xc.Current())
		case <-done:
		}
	}()
}

// run listens, serves until ctx ends or a signal stops it, snapshots the
// store every --snapshot-interval meanwhile, and saves it at the end.
func (n *node) run(ctx context.Context) error {
	s, log := n.s, n.log
	rs := runSettings{
		endpoints:       n.ends,
		watcher:         n.source,
		ready:           func() { n.logReady(ctx.Done()) },
		drain:           n.srv.SetDraining,
		drainDelay:      s.drainDelay,
		shutdownTimeout: s.shutdownTimeout,
		log:             log,
	}
	if err := rs.listen(); err != nil {
		return err
	}
	store := n.stores.Mem
	snapCtx, stopSnaps := context.WithCancel(context.Background())
	defer stopSnaps()
	var snapWG sync.WaitGroup
	if s.stateFile != "" && s.snapshotInterval > 0 {
		snapWG.Go(func() { snapshotLoop(snapCtx, store, s.stateFile, s.snapshotInterval, n.snaps, log) })
	}
	runErr := rs.serve(ctx)
	stopSnaps()
	snapWG.Wait()
	if s.stateFile != "" {
		if err := saveState(store, s.stateFile, n.snaps, log, slog.LevelInfo); err != nil {
			return errors.Join(runErr, err)
		}
	}
	log.Info("stopped")
	return runErr
}
