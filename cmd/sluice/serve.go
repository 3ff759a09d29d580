package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/hitters"
	"github.com/sluicehq/sluice/internal/overrides"
	"github.com/sluicehq/sluice/internal/ratelimitheaders"
	"github.com/sluicehq/sluice/internal/reload"
	"github.com/sluicehq/sluice/internal/rlqs"
	"github.com/sluicehq/sluice/internal/server"
	"github.com/sluicehq/sluice/internal/xdsrules"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/rules"
)

func init() {
	commands["serve"] = command{
		summary: "run the rate limit service: Envoy RLS v3 over gRPC, HTTP JSON, metrics",
		run: func(ctx context.Context, args []string, _ io.Reader, _, stderr io.Writer) error {
			return cmdServe(ctx, args, os.LookupEnv, stderr)
		},
	}
}

// serveSettings are the settings of sluice serve, from flags, then the
// environment, then the defaults.
type serveSettings struct {
	config              string
	grpcAddr            string
	httpAddr            string
	debugAddr           string
	stateFile           string
	snapshotInterval    time.Duration
	responseHeaders     string
	shadowMode          bool
	allOrNothing        bool
	quotaMode           bool
	envoyHeaders        bool
	mergeDomains        bool
	startWithoutConfig  bool
	readyNeedsDomain    bool
	tls                 tlsSettings
	statsd              statsdSettings
	tracing             tracingSettings
	xds                 xdsSettings
	envoyHeaderNames    server.EnvoyHeaderNames
	dynamicMetadata     bool
	nearLimitRatio      float64
	logLevel            slog.Level
	logFormat           string
	shutdownTimeout     time.Duration
	drainDelay          time.Duration
	bodyTimeout         time.Duration
	grpcMaxConnAge      time.Duration
	grpcMaxConnAgeGrace time.Duration
	rlqsTTL             time.Duration
	rlqsGrace           time.Duration
	rlqsWindows         string
	rlqsMaxBytes        byteSize
	adminAddr           string
	topKeys             bool
	limitedBy           bool
	adminTokenFile      string
	overridesFile       string
	headers             ratelimitheaders.HeaderMode
	storeSettings
	envoyIgnored, sources []string // for the startup log
}

// lookupEnv is os.LookupEnv, or a map in tests.
type lookupEnv func(string) (string, bool)

// envName is the environment variable of a flag: SLUICE_ and the flag's
// name in capitals, dashes as underscores.
func envName(flagName string) string {
	return "SLUICE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseServe reads the settings from args, then env.
func parseServe(args []string, env lookupEnv, stderr io.Writer) (*serveSettings, error) {
	s := &serveSettings{}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&s.config, "config", "", "rules `path`: a file, or a directory of files (one domain each); required")
	fs.StringVar(&s.grpcAddr, "grpc-addr", ":8081", "`address` of the gRPC listener (Envoy RLS v3 and gRPC health): host:port, or unix:PATH for a Unix socket")
	fs.StringVar(&s.httpAddr, "http-addr", ":8080", "`address` of the HTTP listener (/json, /healthz, /readyz, /metrics)")
	fs.StringVar(&s.debugAddr, "debug-addr", "127.0.0.1:6070", "`address` of the debug listener (pprof, loaded rules, top keys, dashboard); a bare :PORT listens on 127.0.0.1, 0.0.0.0:PORT on every interface; empty disables it")
	s.storeSettings.flags(fs)
	s.tls.flags(fs)
	s.statsd.flags(fs)
	s.tracing.flags(fs)
	s.xds.flags(fs)
	fs.StringVar(&s.stateFile, "state-file", "", "`file` to save usage to on shutdown and every --snapshot-interval, and restore from on start; empty disables")
	fs.DurationVar(&s.snapshotInterval, "snapshot-interval", defaultSnapshotInterval, "how often to save usage to --state-file: a crash (kill -9) loses at most the hits of one interval; 0 saves only on shutdown")
	fs.StringVar(&s.responseHeaders, "response-headers", "off", "`modes` of rate limit response headers: off, ietf, x-ratelimit, retry-after, all, or a comma list")
	fs.BoolVar(&s.shadowMode, "shadow-mode", false, "decide and count every limit, but never answer OVER_LIMIT")
	fs.BoolVar(&s.allOrNothing, "all-or-nothing", false, "decide every limit of a request together, none consumed when one denies (default: each on its own, as envoyproxy/ratelimit; a domain's all_or_nothing: wins)")
	fs.BoolVar(&s.envoyHeaders, "envoy-headers", false, "add envoyproxy/ratelimit's own rate limit headers (the limit, remaining and reset of the descriptor with the least left), under the names below")
	fs.StringVar(&s.envoyHeaderNames.Limit, "envoy-limit-header", server.DefaultEnvoyHeaderNames.Limit, "`name` of --envoy-headers' limit header")
	fs.StringVar(&s.envoyHeaderNames.Remaining, "envoy-remaining-header", server.DefaultEnvoyHeaderNames.Remaining, "`name` of --envoy-headers' remaining header")
	fs.StringVar(&s.envoyHeaderNames.Reset, "envoy-reset-header", server.DefaultEnvoyHeaderNames.Reset, "`name` of --envoy-headers' reset header")
	fs.BoolVar(&s.mergeDomains, "merge-domains", false, "let several rules files define one domain, merging their descriptors (default: one domain per file)")
	fs.BoolVar(&s.startWithoutConfig, "start-without-config", false, "start when --config does not exist yet, allowing every request, and load the rules when it appears")
	fs.BoolVar(&s.readyNeedsDomain, "ready-needs-domain", false, "report not ready (/readyz, gRPC health) until rules with at least one domain are loaded")
	fs.BoolVar(&s.quotaMode, "quota-mode", false, "make every descriptor a quota: a request is denied by its descriptors only when all of them are over their limits")
	fs.BoolVar(&s.dynamicMetadata, "response-dynamic-metadata", false, "add envoyproxy/ratelimit's dynamic metadata to every response (the domain, the descriptors, and the metadata of the rules of those that passed)")
	fs.Float64Var(&s.nearLimitRatio, "near-limit-ratio", server.DefaultNearLimitRatio, "`ratio`: the share of a limit beyond which admitted hits count as near the limit")
	fs.TextVar(&s.logLevel, "log-level", slog.LevelInfo, "`level` of the logs: debug, info, warn or error")
	fs.StringVar(&s.logFormat, "log-format", "text", "`format` of the logs: text or json")
	fs.DurationVar(&s.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long in-flight requests may take to finish on shutdown")
	fs.DurationVar(&s.drainDelay, "drain-delay", 0, "on shutdown, how long to fail readiness and keep serving before closing the listeners")
	fs.DurationVar(&s.bodyTimeout, "body-timeout", defaultBodyTimeout, bodyTimeoutUsage)
	fs.DurationVar(&s.grpcMaxConnAge, "grpc-max-connection-age", 24*time.Hour, "gRPC connections are asked to reconnect after this long, to spread clients over new instances")
	fs.DurationVar(&s.grpcMaxConnAgeGrace, "grpc-max-connection-age-grace", time.Hour, "then closed after this much longer")
	fs.DurationVar(&s.rlqsTTL, "rlqs-ttl", rlqs.DefaultTTL, "Rate Limit Quota Service: how long Envoy keeps an assignment (must exceed Envoy's reporting_interval); a dropped Envoy's share goes to the others this long plus --rlqs-grace after its last report")
	fs.DurationVar(&s.rlqsGrace, "rlqs-grace", rlqs.DefaultGrace, "Rate Limit Quota Service: the longest an assignment may take to reach Envoy; a lowered share is held this long before others get it")
	fs.BoolVar(&s.limitedBy, "limited-by-header", false, "add x-sluice-limited-by to every OVER_LIMIT answer: the rule (and the runtime override, when one decided), descriptor, algorithm, limit, what is left and when it resets (tells clients about the rules)")
	fs.BoolVar(&s.topKeys, "top-keys", true, "keep the top keys of each rule by requests and denials, over the last minute and hour, in bounded memory (the debug listener's /hitters)")
	fs.StringVar(&s.adminAddr, "admin-addr", "", "`address` of the admin API (runtime overrides, explain); empty disables it; a bare :PORT listens on 127.0.0.1")
	fs.StringVar(&s.adminTokenFile, "admin-token-file", "", "`file` of the admin API's bearer tokens, one a line, name:secret (required with --admin-addr)")
	fs.StringVar(&s.overridesFile, "overrides-file", "", "`file` the runtime overrides are kept in with --store memory (required there with --admin-addr), loaded at start; with --store redis they are kept in Redis")
	s.rlqsMaxBytes = rlqs.DefaultMaxBytes
	fs.Var(&s.rlqsMaxBytes, "rlqs-max-bytes", "`size`: memory cap of the Rate Limit Quota Service's buckets, across all streams (a bucket of a short id counts about 1.2 KB); past it, new buckets get no assignment and Envoy applies their no_assignment_behavior; counted in the memory limit of --max-bytes")
	fs.StringVar(&s.rlqsWindows, "rlqs-windows", "token_bucket", "Rate Limit Quota Service: how shares of window limits are sent, token_bucket or requests_per_time_unit (which Envoy does not enforce yet)")
	fs.Usage = func() { serveUsage(fs, fs.Output()) }

	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	var err error
	if s.sources, err = applyEnv(fs, env, envoyVars); err != nil {
		return nil, err
	}
	for _, u := range envoyUnmapped {
		if _, ok := env(u.name); ok {
			s.envoyIgnored = append(s.envoyIgnored, u.name+" (use "+u.hint+")")
		}
	}

	if s.config == "" && s.xds.addr == "" {
		fmt.Fprintln(stderr, "sluice serve: --config (or SLUICE_CONFIG) is required, or --config-xds")
		usageHint(fs)
		return nil, errUsage
	}
	probs := s.storeSettings.check()
	probs = append(probs, s.tls.check()...)
	probs = append(probs, s.statsd.check(env)...)
	probs = append(probs, s.tracing.check()...)
	probs = append(probs, s.xds.check()...)
	if s.config != "" && s.xds.addr != "" {
		probs = append(probs, "--config and --config-xds exclude each other: the rules come from files or from xDS")
	}
	if s.store != "memory" && s.stateFile != "" {
		probs = append(probs, "--state-file applies to --store memory only (Redis keeps its own state)")
	}
	if s.headers, err = ratelimitheaders.ParseHeaderMode(s.responseHeaders); err != nil {
		probs = append(probs, fmt.Sprintf("--response-headers: %v", err))
	}
	probs = append(probs, checkLogFormat(s.logFormat)...)
	if s.nearLimitRatio <= 0 || s.nearLimitRatio > 1 {
		probs = append(probs, fmt.Sprintf("--near-limit-ratio %v is not in (0, 1]", s.nearLimitRatio))
	}
	probs = append(probs, checkDurations(map[string]time.Duration{"snapshot-interval": s.snapshotInterval, "shutdown-timeout": s.shutdownTimeout, "drain-delay": s.drainDelay, "body-timeout": s.bodyTimeout})...)
	addrs := map[string]string{"grpc-addr": s.grpcAddr, "http-addr": s.httpAddr}
	if s.debugAddr != "" {
		s.debugAddr = loopbackUnlessNamed(s.debugAddr)
		addrs["debug-addr"] = s.debugAddr
	}
	probs = append(probs, checkAddrs(addrs)...)
	if s.adminAddr != "" {
		s.adminAddr = loopbackUnlessNamed(s.adminAddr)
		addrs := map[string]string{"admin-addr": s.adminAddr}
		probs = append(probs, checkAddrs(addrs)...)
		if s.adminTokenFile == "" {
			probs = append(probs, "--admin-addr needs --admin-token-file: the admin API answers only with a bearer token")
		}
		if s.overridesFile == "" && s.store == "memory" {
			probs = append(probs, "--admin-addr needs --overrides-file with --store memory: where the runtime overrides are kept")
		}
	}
	if s.overridesFile != "" && s.store != "memory" {
		probs = append(probs, "--overrides-file applies to --store memory: with --store redis, overrides are kept in Redis")
	}
	if s.rlqsTTL <= 0 || s.rlqsGrace <= 0 {
		probs = append(probs, "--rlqs-ttl and --rlqs-grace must be positive")
	}
	if s.rlqsMaxBytes <= 0 {
		probs = append(probs, "--rlqs-max-bytes must be positive")
	}
	if s.rlqsWindows != "token_bucket" && s.rlqsWindows != "requests_per_time_unit" {
		probs = append(probs, fmt.Sprintf("--rlqs-windows %q is neither token_bucket nor requests_per_time_unit", s.rlqsWindows))
	}
	if s.grpcMaxConnAge <= 0 || s.grpcMaxConnAgeGrace <= 0 {
		probs = append(probs, "--grpc-max-connection-age and --grpc-max-connection-age-grace must be positive")
	}
	if len(probs) > 0 {
		return nil, errors.New(strings.Join(probs, "; "))
	}
	return s, nil
}

// dashboardExplainer reads, for the dashboard's near-limit list, what is
// left of a descriptor's tightest limit (a peek, through the decisions'
// own matching).
func dashboardExplainer(dec *decide.Decider) server.Explainer {
	return func(ctx context.Context, domain string, descs []rules.Descriptor) (int64, int64, bool) {
		e, err := dec.Explain(ctx, domain, descs)
		if err != nil || len(e.Descriptors) == 0 {
			return 0, 0, false
		}
		found := false
		var remaining, limit int64
		for _, l := range e.Descriptors[0].Limits {
			if l.State == nil || l.State.Limit <= 0 {
				continue
			}
			if !found || l.State.Remaining*limit < remaining*l.State.Limit {
				remaining, limit, found = l.State.Remaining, l.State.Limit, true
			}
		}
		return remaining, limit, found
	}
}

// shareTopKeys publishes the node's top keys through r's Redis every 2 s,
// so that any node's cluster view (serve's /hitters?scope=cluster, the
// dashboards of serve and proxy) merges them all; stop stops it.
func shareTopKeys(top *hitters.Tracker, r *redisstore.Store) (shared *hitters.Shared, stop func()) {
	host, _ := os.Hostname()
	shared = hitters.NewShared(top, r.Client, r.Prefix(), fmt.Sprintf("%s:%d", host, os.Getpid()), 20)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { shared.Run(ctx); close(done) }()
	return shared, func() { cancel(); <-done }
}

// overrides sets up the runtime overrides: kept in Redis with --store
// redis (every node sees every change), in --overrides-file with --store
// memory, or none. It returns the admin API's handler (nil without
// --admin-addr) and a function that stops keeping them.
func (s *serveSettings) overrides(dec *decide.Decider, stores *storeSet, log *slog.Logger) (http.Handler, func(), error) {
	audit := log.With("component", "admin")
	idx := overrides.NewIndex(nil)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var backend overrides.Backend
	var closeFile func()
	switch {
	case stores.redis != nil:
		rs := overrides.NewRedisStore(stores.redis.Client, stores.redis.Prefix(), idx, nil, audit)
		wg.Go(func() { rs.Run(ctx) })
		backend = rs
	case s.overridesFile != "":
		fs, err := overrides.OpenFile(s.overridesFile, idx, nil)
		if err != nil {
			cancel()
			return nil, nil, err
		}
		log.Info("runtime overrides loaded", "file", s.overridesFile, "overrides", len(fs.List()))
		wg.Go(func() { sweepFile(ctx, fs, audit) })
		backend, closeFile = fs, func() { fs.Close() }
	default:
		cancel()
		return nil, func() {}, nil
	}
	dec.SetRuntime(idx)
	stop := func() {
		cancel()
		wg.Wait()
		if closeFile != nil {
			closeFile()
		}
	}
	if s.adminAddr == "" {
		return nil, stop, nil
	}
	tokens, err := overrides.LoadTokens(s.adminTokenFile)
	if err != nil {
		stop()
		return nil, nil, err
	}
	h := overrides.NewAdmin(overrides.AdminConfig{
		Backend: backend,
		Tokens:  tokens,
		Explain: func(ctx context.Context, domain string, descs []rules.Descriptor) (any, error) {
			return dec.Explain(ctx, domain, descs)
		},
		Logger: audit,
	})
	return h, stop, nil
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
func (s *serveSettings) rlqsServer(stores *storeSet, rulesNow func() *rules.Config, runtimeNow func() rules.Runtime, reg prometheus.Registerer, log *slog.Logger) (*rlqs.Server, error) {
	policy := rlqs.PolicyDefaults(rlqs.Policy{TTL: s.rlqsTTL, Grace: s.rlqsGrace})
	var pools rlqs.Pools = rlqs.NewMemPools(policy, nil)
	if stores.redis != nil {
		pools = rlqs.NewRedisPools(policy, stores.redis.Client, stores.redis.Prefix())
	}
	windows := rlqs.TokenBuckets
	if s.rlqsWindows == "requests_per_time_unit" {
		windows = rlqs.RequestsPerTimeUnit
	}
	return rlqs.New(rlqs.Config{
		Rules:      rulesNow,
		Runtime:    runtimeNow,
		Pools:      pools,
		Policy:     policy,
		ShadowMode: s.shadowMode,
		Windows:    windows,
		MaxBytes:   int64(s.rlqsMaxBytes),
		Logger:     log.With("component", "rlqs"),
		Registry:   reg,
	})
}

// serveUsage prints every flag with its environment variables and default.
func serveUsage(fs *flag.FlagSet, w io.Writer) {
	fmt.Fprint(w, `Usage: sluice serve --config PATH [flags]

Runs the rate limit service: envoy.service.ratelimit.v3.RateLimitService,
envoy.service.rate_limit_quota.v3.RateLimitQuotaService (RLQS) and
grpc.health.v1.Health over gRPC; POST /json, /healthz, /readyz and /metrics
over HTTP; pprof, the loaded rules, the top keys and the dashboard on the
debug listener, which answers only the loopback unless --debug-addr names
another address. Rules are
reloaded when their files change (or on SIGHUP); a bad reload keeps the rules
in force. SIGTERM or SIGINT fails readiness, waits --drain-delay, finishes
in-flight requests, saves --state-file and exits 0.

Every flag can be set by its environment variable (SLUICE_ and the flag name
in capitals, dashes as underscores); a flag wins over its variable. Some
variables of envoyproxy/ratelimit are read too, after the SLUICE_ ones.

Flags:
`)
	printFlags(fs, w, envoyVars)
	fmt.Fprint(w, `
A corrupt --state-file is logged, renamed to FILE.corrupt, and the service
starts with empty counters; a state file that cannot be read or written
otherwise (permissions) is an error. docs/operations.md has the details.
`)
}

func newLogger(level slog.Level, format string, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// checkDurations reports the flags, by name, whose duration is negative.
func checkDurations(ds map[string]time.Duration) []string {
	var probs []string
	for _, name := range slices.Sorted(maps.Keys(ds)) {
		if d := ds[name]; d < 0 {
			probs = append(probs, fmt.Sprintf("--%s must not be negative, got %s", name, d))
		}
	}
	return probs
}

// loopbackUnlessNamed is the address of a listener that shows what only
// operators should see (keys, rules, profiles, the admin API): a bare
// :PORT, with no host named, listens on 127.0.0.1; a named host, 0.0.0.0
// included, is kept.
func loopbackUnlessNamed(addr string) string {
	if strings.HasPrefix(addr, ":") {
		return "127.0.0.1" + addr
	}
	return addr
}

// checkAddrs reports the flags, by name, whose address is not host:port.
func checkAddrs(addrs map[string]string) []string {
	var probs []string
	for _, name := range slices.Sorted(maps.Keys(addrs)) {
		addr := addrs[name]
		if path, ok := strings.CutPrefix(addr, "unix:"); ok {
			if name != "grpc-addr" || path == "" {
				probs = append(probs, fmt.Sprintf("--%s %q: a Unix socket is for --grpc-addr only, as unix:PATH", name, addr))
			}
			continue
		}
		if _, port, err := net.SplitHostPort(addr); err != nil {
			probs = append(probs, fmt.Sprintf("--%s %q: %v", name, addr, err))
		} else if _, err := net.LookupPort("tcp", port); err != nil {
			probs = append(probs, fmt.Sprintf("--%s %q: bad port", name, addr))
		}
	}
	return probs
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

// checkLogFormat reports a --log-format that is neither text nor json.
func checkLogFormat(format string) []string {
	if format != "text" && format != "json" {
		return []string{fmt.Sprintf("unknown log format %q (text or json)", format)}
	}
	return nil
}

// applyEnv sets every flag of fs that the command line did not from its
// environment variable (envName), else from the envoyproxy/ratelimit
// variables that envoy maps onto it, and returns "flag from VARIABLE" for
// each flag so set.
func applyEnv(fs *flag.FlagSet, env lookupEnv, envoy map[string]envoyVar) ([]string, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var sources []string
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || set[f.Name] {
			return
		}
		from, v, ok := envName(f.Name), "", false
		if v, ok = env(from); !ok {
			if ev, known := envoy[f.Name]; known {
				v, ok = ev.value(env)
				from = strings.Join(ev.names, "+")
			}
		}
		if !ok {
			return
		}
		if e := fs.Set(f.Name, v); e != nil {
			err = fmt.Errorf("%s=%q: %v", from, v, e)
			return
		}
		sources = append(sources, f.Name+" from "+from)
	})
	return sources, err
}

// printFlags prints every flag of fs with its default and its variables.
func printFlags(fs *flag.FlagSet, w io.Writer, envoy map[string]envoyVar) {
	writeFlags(w, fs, func(f *flag.Flag) string {
		s := "\n      env: " + envName(f.Name)
		if ev, ok := envoy[f.Name]; ok {
			s += ", then Envoy's " + strings.Join(ev.names, ", ")
		}
		return s
	})
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
	s.limitMemory(env, int64(s.rlqsMaxBytes), log)

	// Rules first: a bad initial config fails fast with every problem.
	var srv *server.Server
	source, initial, err := s.rulesSource(func(c *rules.Config) { srv.ConfigLoaded(c, time.Now()) }, func(err error) { srv.ConfigRejected(err) }, log)
	if err != nil {
		return err
	}
	for _, p := range initial.Warnings() {
		log.Warn("rules warning", "file", p.File, "line", p.Line, "column", p.Column, "problem", p.Msg)
	}
	if len(initial.Domains()) == 0 {
		log.Warn("no domains in the rules: every request is allowed", "config", s.config, "config_xds", s.xds.addr)
	}

	dec, stores, err := newLocalDecider(&s.storeSettings, log)
	if err != nil {
		return err
	}
	defer stores.close()
	// Envoy's way by default: each limit of a request counts on its own.
	dec.Core().SetAllOrNothing(s.allOrNothing)
	dec.Core().SetQuotaMode(s.quotaMode)
	dec.SetDynamicMetadata(s.dynamicMetadata)
	store := stores.mem
	if store != nil {
		if err := restoreState(store, s.stateFile, log); err != nil {
			return err
		}
	}

	reg := prometheus.NewRegistry()
	var snaps *snapshotMetrics
	if store != nil {
		snaps = newSnapshotMetrics(reg)
	}
	stores.register(reg)
	statsCtx, stopStats := context.WithCancel(context.Background())
	defer stopStats() // sends the last stats
	statsdStore, statsdTags, err := s.statsd.start(statsCtx, log)
	if err != nil {
		return err
	}
	var top *hitters.Tracker
	var shared *hitters.Shared
	if s.topKeys {
		top = hitters.New(hitters.Config{})
		defer top.Close()
		if stores.redis != nil {
			var stop func()
			shared, stop = shareTopKeys(top, stores.redis)
			defer stop()
		}
	}
	srv, err = server.New(server.Config{
		Hitters:        top,
		Explain:        dashboardExplainer(dec.Core()),
		HittersShared:  shared,
		LimitedBy:      s.limitedBy,
		Statsd:         statsdStore,
		StatsdTags:     statsdTags,
		Decider:        dec,
		StoreHealth:    stores.health(),
		Logger:         log.With("component", "server"),
		Registry:       reg,
		Headers:        s.headers,
		EnvoyHeaders:   s.envoyHeadersConfig(),
		ShadowMode:     s.shadowMode,
		NearLimitRatio: s.nearLimitRatio,
		Ready:          s.readyCheck(dec.Core().Rules, source),
	})
	if err != nil {
		return err
	}
	srv.ConfigLoaded(initial, time.Now())

	tlsCfg, err := s.tls.config()
	if err != nil {
		return err
	}
	gopts := append(server.GRPCServerOptions(), grpc.KeepaliveParams(keepalive.ServerParameters{
		MaxConnectionAge:      s.grpcMaxConnAge,
		MaxConnectionAgeGrace: s.grpcMaxConnAgeGrace,
	}))
	traceOpts, stopTracing, err := s.tracing.start(context.Background(), log)
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stopTracing(ctx); err != nil {
			log.Warn("tracing: spans not sent at shutdown", "err", err)
		}
	}()
	gopts = append(gopts, traceOpts...)
	if statsdStore != nil {
		gopts = append(gopts, grpc.ChainUnaryInterceptor(server.StatsdInterceptor(statsdStore, statsdTags)))
	}
	if tlsCfg != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(tlsCfg)))
		log.Info("gRPC listener speaks TLS", "cert", s.tls.cert, "mutual", s.tls.clientCA != "", "client_san", s.tls.clientSAN)
	}
	gs := grpc.NewServer(gopts...)
	srv.RegisterGRPC(gs)
	quota, err := s.rlqsServer(stores, dec.Core().Rules, dec.Core().Runtime, reg, log)
	if err != nil {
		return err
	}
	quota.Register(gs)
	endpoints := []endpoint{
		{name: "grpc", addr: s.grpcAddr, grpc: gs},
		{name: "http", addr: s.httpAddr, http: newHTTPServer(srv.Handler(), log, s.bodyTimeout)},
	}
	if s.debugAddr != "" {
		endpoints = append(endpoints, endpoint{name: "debug", addr: s.debugAddr, http: newHTTPServer(srv.DebugHandler(), log, s.bodyTimeout)})
	}
	admin, stopOverrides, err := s.overrides(dec.Core(), stores, log)
	if err != nil {
		return err
	}
	defer stopOverrides()
	if admin != nil {
		endpoints = append(endpoints, endpoint{name: "admin", addr: s.adminAddr, http: newHTTPServer(admin, log, s.bodyTimeout)})
	}

	rs := runSettings{
		endpoints: endpoints,
		watcher:   source,
		ready: func() {
			log.Info("ready", "domains", initial.Domains(), "hash", initial.Hash())
		},
		drain:           srv.SetDraining,
		drainDelay:      s.drainDelay,
		shutdownTimeout: s.shutdownTimeout,
		log:             log,
	}
	if err := rs.listen(); err != nil {
		return err
	}
	snapCtx, stopSnaps := context.WithCancel(context.Background())
	defer stopSnaps()
	var snapWG sync.WaitGroup
	if s.stateFile != "" && s.snapshotInterval > 0 {
		snapWG.Go(func() { snapshotLoop(snapCtx, store, s.stateFile, s.snapshotInterval, snaps, log) })
	}
	runErr := rs.serve(ctx)
	stopSnaps()
	snapWG.Wait()

	if s.stateFile != "" {
		if err := saveState(store, s.stateFile, snaps, log, slog.LevelInfo); err != nil {
			return errors.Join(runErr, err)
		}
	}
	log.Info("stopped")
	return runErr
}

// restoreState loads the state file into store. A missing file is a first
// start. A corrupt one is moved aside to FILE.corrupt and the store starts
// empty: a restart without state hands clients a fresh quota once, which
// is less harm than a rate limit service that cannot start. Any other
// failure (permissions, a directory where the file should be) would also
// break the save on shutdown, and is an error now.
func restoreState(store *memstore.Store, path string, log *slog.Logger) error {
	if path == "" {
		return nil
	}
	if err := checkWritable(path); err != nil {
		return fmt.Errorf("--state-file: %w", err)
	}
	start := time.Now()
	err := store.LoadFile(path)
	switch {
	case err == nil:
		log.Info("state restored", "file", path, "keys", store.Len(), "took", time.Since(start))
	case errors.Is(err, fs.ErrNotExist):
		log.Info("no state file yet; starting with empty counters", "file", path)
	case errors.Is(err, memstore.ErrSnapshot):
		aside := path + ".corrupt"
		if rerr := os.Rename(path, aside); rerr != nil {
			return fmt.Errorf("--state-file: %v; moving it aside: %w", err, rerr)
		}
		log.Error("state file is corrupt; starting with empty counters", "file", path, "moved_to", aside, "err", err)
	default:
		return fmt.Errorf("--state-file: %w", err)
	}
	return nil
}

// checkWritable reports whether a state file can be written at path, as
// the snapshot does: a temporary file in its directory.
func checkWritable(path string) error {
	if info, err := os.Stat(path); err == nil && info.IsDir() {
		return fmt.Errorf("%s is a directory", path)
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".probe-*")
	if err != nil {
		return err
	}
	f.Close()
	return os.Remove(f.Name())
}

type snapshotMetrics struct {
	success, failure prometheus.Counter
	last             prometheus.Gauge
}

// newSnapshotMetrics registers the metrics of the snapshots written to
// --state-file (the store's own are registered with the store's, by
// storeSet.register).
func newSnapshotMetrics(reg *prometheus.Registry) *snapshotMetrics {
	writes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_state_snapshots_total",
		Help: "Snapshots of the store written to --state-file, by result.",
	}, []string{"result"})
	m := &snapshotMetrics{
		success: writes.WithLabelValues("success"),
		failure: writes.WithLabelValues("failure"),
		last: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_state_snapshot_timestamp_seconds",
			Help: "Unix time of the last snapshot written to --state-file.",
		}),
	}
	reg.MustRegister(writes, m.last)
	return m
}

// snapshotLoop saves the store every interval until ctx is done.
// defaultSnapshotInterval is the default of --snapshot-interval: what a
// crash may lose. A snapshot of 1M keys costs some 6 ms of CPU and 24 MB
// written (docs/operations.md).
const defaultSnapshotInterval = 5 * time.Second

func snapshotLoop(ctx context.Context, store *memstore.Store, path string, every time.Duration, m *snapshotMetrics, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			saveState(store, path, m, log, slog.LevelDebug)
		}
	}
}

// saveState writes a snapshot of store to path (atomically: memstore
// writes a temporary file and renames it), counts it, and logs success at
// level and failure as an error.
func saveState(store *memstore.Store, path string, m *snapshotMetrics, log *slog.Logger, level slog.Level) error {
	start := time.Now()
	if err := store.WriteFile(path); err != nil {
		m.failure.Inc()
		log.Error("saving state", "file", path, "err", err)
		return err
	}
	m.success.Inc()
	m.last.SetToCurrentTime()
	log.Log(context.Background(), level, "state saved", "file", path, "keys", store.Len(), "took", time.Since(start))
	return nil
}

// byteSize is a flag of bytes with an optional unit: KB, MB, GB, TB are
// powers of 1000, KiB, MiB, GiB, TiB (or Ki, Mi, Gi, Ti) of 1024.
type byteSize int64

var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12},
	{"B", 1},
}

func (b *byteSize) String() string { return fmt.Sprint(int64(*b)) }

func (b *byteSize) Set(s string) error {
	num, mult := strings.TrimSpace(s), int64(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(num, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(num, u.suffix)), u.mult
			break
		}
	}
	var n int64
	if _, err := fmt.Sscan(num, &n); err != nil || n < 0 || fmt.Sprint(n) != num {
		return fmt.Errorf("not a size in bytes: %q (e.g. 536870912, 512MiB, 2GB)", s)
	}
	if n > (1<<62)/mult {
		return fmt.Errorf("size %q is too large", s)
	}
	*b = byteSize(n * mult)
	return nil
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
