package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/base/redact"
	"github.com/sluicehq/sluice/internal/decision/overrides"
	"github.com/sluicehq/sluice/internal/edges/dashboard"
	"github.com/sluicehq/sluice/internal/edges/hitters"
	"github.com/sluicehq/sluice/internal/edges/httpconf"
	"github.com/sluicehq/sluice/internal/edges/proxy"
	"github.com/sluicehq/sluice/internal/edges/reload"
	"github.com/sluicehq/sluice/internal/edges/server"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/rules"
)

func init() {
	commands["proxy"] = command{
		summary: "run a rate limiting reverse proxy in front of an HTTP API",
		run: func(ctx context.Context, args []string, _ io.Reader, _, stderr io.Writer) error {
			return cmdProxy(ctx, args, os.LookupEnv, stderr)
		},
		help: func(lookupEnv) *help { return new(proxySettings).help() },
	}
}

// proxySettings are the settings of sluice proxy, from flags, then the
// environment, then the defaults.
type proxySettings struct {
	config          string
	upstream        string
	listen          string
	adminListen     string
	adminTokenFile  string
	logLevel        slog.Level
	logFormat       string
	shutdownTimeout time.Duration
	drainDelay      time.Duration
	bodyTimeout     time.Duration
	writeIdle       time.Duration // --write-idle-timeout
	upstreamTimeout time.Duration
	topKeys         bool
	dashboardRemote bool
	storeSettings
	remote      remoteSettings
	upstreamURL *url.URL
	sources     []string // for the startup log
}

// help builds the flags of sluice proxy, bound to s, in the groups of its
// help.
func (s *proxySettings) help() *help {
	h := newHelp("proxy", "proxy --config FILE --upstream URL [flags]", `Runs a rate limiting reverse proxy: every request is limited by the route of
the rules file's http section it matches, with the file's rules, before the
upstream sees it; a request that matches no route is proxied unlimited.
/metrics, /healthz, /readyz, /dashboard and, with --admin-token-file, the
admin API's explain are served on --admin-listen.`)
	h.more = `The file is reloaded when it changes (or on SIGHUP); a bad reload keeps the
configuration in force. SIGTERM or SIGINT fails readiness, waits
--drain-delay, finishes in-flight requests and exits 0. docs/proxy.md has
the details.`
	// Only the Redis variables of envoyproxy/ratelimit apply here: its
	// other settings (ports, the runtime directory) are the service's.
	h.env = envReading{
		brief: "Every flag can also be set by its environment variable, SLUICE_ and its name (SLUICE_UPSTREAM), and the Redis ones by envoyproxy/ratelimit's (REDIS_URL).",
		note: `Every flag can also be set by its environment variable: SLUICE_ and the
flag's name in capitals, dashes as underscores (SLUICE_UPSTREAM); a flag
wins over its variable. The Redis variables of envoyproxy/ratelimit
(REDIS_URL, REDIS_AUTH, ...) are read after the SLUICE_ ones, for the
flags that name them. GOMEMLIMIT, when set, wins over the memory limit of
the process --max-bytes sets.`,
		all:   true,
		envoy: envoyRedis,
	}
	h.group("Proxy", func(fs *flag.FlagSet) {
		fs.StringVar(&s.config, "config", "", "rules `file` with its http section (routes, client address, headers); required")
		fs.StringVar(&s.upstream, "upstream", "", "`URL` of the API behind the proxy: http:// or https:// and a host, optionally a path prefix; required")
		fs.StringVar(&s.listen, "listen", ":8090", "`address` the proxy serves on (not :8080, so that it runs beside sluice serve)")
		fs.StringVar(&s.adminListen, "admin-listen", ":9090", "`address` of /metrics, /healthz, /readyz and /dashboard, kept apart from --listen so that no path of the upstream is shadowed")
		fs.StringVar(&s.adminTokenFile, "admin-token-file", "", "`file` of bearer tokens, one a line, name:secret: serves the admin API's explain (POST /v1/explain, as sluice explain --server asks it) on --admin-listen; empty: not served")
		fs.BoolVar(&s.dashboardRemote, "dashboard-remote", false, "serve /dashboard to every client of --admin-listen, not only the loopback (it names keys: client addresses, users, API keys)")
		fs.BoolVar(&s.topKeys, "top-keys", true, "keep the top keys of each rule by requests and denials, over the last minute and hour, in bounded memory, and the series of each rule: the admin listener's live /dashboard")
	})
	h.group("Logs and shutdown", func(fs *flag.FlagSet) {
		fs.TextVar(&s.logLevel, "log-level", slog.LevelInfo, "`level` of the logs: debug, info, warn or error")
		fs.StringVar(&s.logFormat, "log-format", "text", "`format` of the logs: text or json")
		fs.DurationVar(&s.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long in-flight requests may take to finish on shutdown")
		fs.DurationVar(&s.drainDelay, "drain-delay", 0, "on shutdown, how long to fail readiness and keep serving before closing the listeners")
	})
	h.group("Timeouts", func(fs *flag.FlagSet) {
		fs.DurationVar(&s.bodyTimeout, "body-timeout", defaultBodyTimeout, bodyTimeoutUsage)
		fs.DurationVar(&s.writeIdle, "write-idle-timeout", defaultWriteIdleTimeout, writeIdleTimeoutUsage)
		fs.DurationVar(&s.upstreamTimeout, "upstream-timeout", defaultUpstreamTimeout, upstreamTimeoutUsage)
	})
	s.storeSettings.remoteOK = true
	h.group("Store", s.storeSettings.flags)
	h.group("Redis (--store redis)", func(fs *flag.FlagSet) { s.redis.flags(fs) })
	h.group("Remote store (--store remote)", s.remote.flags)
	h.first = []briefGroup{
		{"Proxy", []briefFlag{
			{"config", "rules file with its http section"},
			{"upstream", "URL of the API behind the proxy"},
			{"listen", "address the proxy serves on"},
			{"admin-listen", "metrics, health and /dashboard"},
		}},
		{"Store", []briefFlag{
			{"store", "memory, redis (shared) or remote"},
			{"failure-policy", "local, fail_closed or fail_open"},
			{"redis-url", "with --store redis: redis://[user:pass@]host:port"},
			{"redis-password", "password (overrides the URL's)"},
			{"rls-addr", "with --store remote: the sluice serve that decides"},
		}},
		{"Timeouts", []briefFlag{
			{"body-timeout", "let go of a client that stops sending"},
			{"write-idle-timeout", "let go of a client that stops reading"},
			{"upstream-timeout", "504 if the upstream does not answer"},
		}},
		{"Logs", []briefFlag{
			{"log-level", "debug, info, warn or error"},
			{"log-format", "text or json"},
		}},
	}
	return h
}

func parseProxy(args []string, env lookupEnv, stderr io.Writer) (*proxySettings, error) {
	s := &proxySettings{}
	h := s.help()
	fs := h.fs
	if err := h.parse(args, false, stderr); err != nil {
		return nil, err
	}
	var err error
	if s.sources, err = applyEnv(fs, env, envoyRedis); err != nil {
		return nil, err
	}
	var missing []string
	if s.config == "" {
		missing = append(missing, "--config (or SLUICE_CONFIG)")
	}
	if s.upstream == "" {
		missing = append(missing, "--upstream (or SLUICE_UPSTREAM)")
	}
	if len(missing) > 0 {
		for _, m := range missing {
			fmt.Fprintf(stderr, "sluice proxy: %s is required\n", m)
		}
		usageHint(fs)
		return nil, errUsage
	}
	probs := s.storeSettings.check()
	probs = append(probs, s.remote.check(s.store)...)
	probs = append(probs, checkLogFormat(s.logFormat)...)
	if s.adminTokenFile != "" && s.store == "remote" {
		probs = append(probs, "--admin-token-file serves explain, which reads the store the proxy decides on: with --store remote, ask the sluice serve of --rls-addr (its --admin-addr)")
	}
	if info, err := os.Stat(s.config); err == nil && info.IsDir() {
		probs = append(probs, fmt.Sprintf("--config %s is a directory: the proxy reads one rules file", s.config))
	}
	// Each problem shows the URL with its userinfo masked (redact.Value),
	// and not what url.Parse quotes of it: a password given in it, valid
	// URL or not, is shown nowhere.
	u, err := url.Parse(s.upstream)
	switch {
	case err != nil:
		probs = append(probs, fmt.Sprintf("--upstream %q: %s", redact.Value(s.upstream), redact.URLError(err)))
	case strings.Contains(s.upstream, "@"):
		// Userinfo, or a password with a '/' (not percent-encoded) whose
		// first part url.Parse took for the host: the proxy would dial it.
		probs = append(probs, fmt.Sprintf("--upstream %q: credentials in the URL are not sent; leave them out (an @ of the path is written %%40)", redact.Value(s.upstream)))
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		probs = append(probs, fmt.Sprintf("--upstream %q: want http:// or https:// and a host", u.Redacted()))
	}
	s.upstreamURL = u
	probs = append(probs, checkDurations(map[string]time.Duration{"shutdown-timeout": s.shutdownTimeout, "drain-delay": s.drainDelay, "body-timeout": s.bodyTimeout,
		"write-idle-timeout": s.writeIdle, "upstream-timeout": s.upstreamTimeout})...)
	probs = append(probs, checkAddrs(map[string]string{"listen": s.listen, "admin-listen": s.adminListen})...)
	if len(probs) > 0 {
		return nil, errors.New(strings.Join(probs, "; "))
	}
	return s, nil
}

// defaultWriteIdleTimeout is the default of --write-idle-timeout: the
// longest a write of an answer may wait for a client that reads nothing,
// as nginx's send_timeout.
const defaultWriteIdleTimeout = time.Minute

const writeIdleTimeoutUsage = "the longest a write of an answer to a client may wait while the client reads nothing of it (each write: at most 32 KB of the upstream's body, or a write to an upgraded connection); then the request is aborted: its connection closed, its upstream request cancelled, its concurrency permits released. It bounds a client that stops reading, not a long stream that flows or pauses; 0 disables it"

// defaultUpstreamTimeout is the default of --upstream-timeout: as long as
// the OpenAI and Anthropic SDKs wait for an answer, so that no slow LLM
// answer that is not streamed is cut while its client still waits
// (docs/internals/proxy-notes.md).
const defaultUpstreamTimeout = 10 * time.Minute

const upstreamTimeoutUsage = "the longest the upstream may take to send its response headers once it has the request; then the request is answered 504, its upstream request cancelled and its concurrency permits released. The body that follows is not bounded by it. Long enough for a slow LLM answer that is not streamed; 0 disables it"

// proxyDecider is what the proxy decides with, built from the store flags
// by openProxyDecider.
type proxyDecider struct {
	*decide.Decider // its rules are the file's, its default failure policy --failure-policy

	// health is the store's health (nil: always up): /readyz fails while
	// the store is down and the default failure policy is fail_closed, as
	// sluice serve's does.
	health func() error

	register func(*prometheus.Registry) // the store's collectors
	close    func()

	// explain peeks at a descriptor's tightest limit for the dashboard,
	// and inFlight at the permits the top keys hold; nil when the proxy
	// does not decide itself (--store remote): its own store holds only
	// the failure policy's.
	explain  server.Explainer
	inFlight dashboard.InFlightReader

	// redis is the store with --store redis, through which the nodes'
	// top keys are shared; nil otherwise.
	redis *redisstore.Store
}

// openProxyDecider builds the proxy's Decider from the store flags, with
// the rules initial. This is the one place that chooses how the proxy
// decides: --store memory and redis decide here with the rules of the
// file, through the decision core (decide.Decider) over that store; --store remote asks the
// sluice serve at --rls-addr, and the rules of the file answer by their
// failure policy when it cannot.
func openProxyDecider(s *storeSettings, remote *remoteSettings, initial *rules.Config, log *slog.Logger) (*proxyDecider, error) {
	if s.store == "remote" {
		return openRemoteDecider(s, remote, initial, log)
	}
	core, set, err := localDecideConfig(s, log)
	if err != nil {
		return nil, err
	}
	core.Rules = initial
	dec, err := decide.New(core)
	if err != nil {
		set.close()
		return nil, err
	}
	return &proxyDecider{
		Decider:  dec,
		health:   set.health(),
		register: set.register,
		close:    set.close,
		explain:  dashboard.TightestLimit(dec),
		inFlight: dashboard.HeldPermits(dec),
		redis:    set.Redis,
	}, nil
}

func cmdProxy(ctx context.Context, args []string, env lookupEnv, stderr io.Writer) error {
	s, err := parseProxy(args, env, stderr)
	if err != nil {
		return err
	}
	if err := checkConfig(s.config); err != nil {
		return err
	}
	log := newLogger(s.logLevel, s.logFormat, stderr)
	log.Info("starting sluice proxy", "version", version, "config", s.config, "upstream", redact.Value(s.upstream),
		"store", s.store, "failure_policy", s.failurePolicy.String(), "local_nodes", s.localNodes)
	for _, src := range s.sources {
		log.Debug("setting from the environment", "setting", src)
	}
	s.limitMemory(env, 0, log)

	// The file first: a bad one fails fast with every problem.
	cfg, section, err := loadProxyConfig(s.config, s.store, log)
	if err != nil {
		return err
	}
	domain := cfg.Domains()[0]
	var domainNow atomic.Pointer[string] // the domain in force, for the dashboard
	domainNow.Store(&domain)

	dec, err := openProxyDecider(&s.storeSettings, &s.remote, cfg, log)
	if err != nil {
		return err
	}
	defer dec.close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := proxy.NewMetrics(reg)
	if err != nil {
		return err
	}
	dec.register(reg)
	loads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_config_loads_total",
		Help: "Loads of the configuration file, by result (success, failure); a failure keeps the previous configuration.",
	}, []string{"result"})
	reg.MustRegister(loads)
	loads.WithLabelValues("success").Inc()

	var top *hitters.Tracker
	var cluster func(context.Context) ([]hitters.Snapshot, error)
	if s.topKeys {
		top = hitters.New(hitters.Config{})
		defer top.Close()
		if err := reg.Register(dashboard.NewCollector(top)); err != nil {
			return err
		}
		if dec.redis != nil {
			shared, stop := shareTopKeys(top, dec.redis)
			defer stop()
			cluster = shared.Snapshots
		}
	}
	p, err := proxy.New(proxy.Config{
		Upstream: s.upstreamURL,
		Decider:  dec,
		Domain:   domain,
		HTTP:     section,
		Logger:   log.With("component", "proxy"),
		Metrics:  metrics,
		Hitters:  top,

		WriteIdleTimeout: s.writeIdle,
		UpstreamTimeout:  s.upstreamTimeout,
	})
	if err != nil {
		return err
	}

	// Reloads: the watcher sees the file change (its rules hash covers
	// the whole file, http section included); the file is then read once
	// more for both its rules and its section, so that the two agree.
	// What the proxy refuses of a file that loads as rules (a section in
	// error, tokens with --store remote) the watcher rejects (Check)
	// before it puts the rules in force and says so.
	var next struct {
		c   *rules.Config
		sec *httpconf.Section
	}
	watcher, err := reload.New(reload.Config{
		Path:   s.config,
		Logger: log.With("component", "reload"),
		Check: func(*rules.Config) (err error) {
			next.c, next.sec, err = loadProxyConfig(s.config, s.store, log)
			return err
		},
		OnLoad: func(*rules.Config) {
			c, sec := next.c, next.sec
			d := c.Domains()[0]
			if err := p.SetRoutes(d, sec); err != nil { // a section that parsed builds: not seen
				log.Error("configuration rejected; the previous one stays in force", "err", err)
				loads.WithLabelValues("failure").Inc()
				return
			}
			dec.SetRules(c)
			domainNow.Store(&d)
			log.Info("configuration loaded", "hash", c.Hash(), "domain", d, "routes", len(sec.Routes))
			loads.WithLabelValues("success").Inc()
		},
		OnError: func(error) { loads.WithLabelValues("failure").Inc() },
	})
	if err != nil {
		return fmt.Errorf("rules: %w", err)
	}

	api, err := proxyAdminAPI(s.adminTokenFile, dec.Decider, log)
	if err != nil {
		return err
	}
	var draining atomic.Bool
	admin := proxy.AdminHandler(proxy.AdminConfig{
		StoreHealth:     dec.health,
		Policy:          dec.Failover().Default,
		Draining:        draining.Load,
		Gatherer:        reg,
		Hitters:         top,
		HittersCluster:  cluster,
		Domains:         func() []string { return []string{*domainNow.Load()} },
		Explain:         dec.explain,
		InFlight:        dec.inFlight,
		API:             api,
		DashboardRemote: s.dashboardRemote,
	})

	rs := runSettings{
		endpoints: []endpoint{
			{name: "proxy", addr: s.listen, http: newHTTPServer(p, log, s.bodyTimeout)},
			{name: "admin", addr: s.adminListen, http: newHTTPServer(withPid(admin), log, s.bodyTimeout)},
		},
		watcher: watcher,
		ready: func() {
			log.Info("ready", "domain", domain, "routes", len(section.Routes), "hash", cfg.Hash())
		},
		drain:           func() { draining.Store(true) },
		drainDelay:      s.drainDelay,
		shutdownTimeout: s.shutdownTimeout,
		log:             log,
	}
	if err := rs.listen(); err != nil {
		return err
	}
	runErr := rs.serve(ctx)
	log.Info("stopped")
	return runErr
}

// proxyAdminAPI is the proxy's admin API, nil without a token file: explain
// (POST /v1/explain), behind the file's bearer tokens, as sluice serve's
// admin API answers it; the proxy keeps no runtime overrides.
func proxyAdminAPI(tokenFile string, dec *decide.Decider, log *slog.Logger) (http.Handler, error) {
	if tokenFile == "" {
		return nil, nil
	}
	tokens, err := overrides.LoadTokens(tokenFile)
	if err != nil {
		return nil, fmt.Errorf("--admin-token-file: %w", err)
	}
	return overrides.NewAdmin(overrides.AdminConfig{
		Tokens: tokens,
		Explain: func(ctx context.Context, domain string, descs []rules.Descriptor) (any, error) {
			return dec.Explain(ctx, domain, descs)
		},
		Logger: log.With("component", "admin"),
	}), nil
}

// loadProxyConfig loads the rules file with its http section, logging
// every problem; the file must hold a domain. A token budget needs a store
// the proxy decides on itself: a remote sluice serve cannot settle.
func loadProxyConfig(path, store string, log *slog.Logger) (*rules.Config, *httpconf.Section, error) {
	c, s, err := httpconf.LoadFile(path)
	var re *rules.Error
	switch {
	case errors.As(err, &re):
		for _, p := range re.Problems {
			log.Error("configuration problem", "file", p.File, "line", p.Line, "column", p.Column, "problem", p.Msg)
		}
		for _, p := range re.Warnings {
			log.Warn("rules warning", "file", p.File, "line", p.Line, "column", p.Column, "problem", p.Msg)
		}
		return nil, nil, fmt.Errorf("%d problem(s) in %s:\n%s", len(re.Problems), path, re.Error())
	case err != nil:
		return nil, nil, fmt.Errorf("--config: %w", err)
	}
	for _, p := range c.Warnings() {
		log.Warn("rules warning", "file", p.File, "line", p.Line, "column", p.Column, "problem", p.Msg)
	}
	if store == "remote" {
		for _, r := range s.Routes {
			if r.Tokens != nil {
				return nil, nil, fmt.Errorf("%s:%d: route %q has tokens, which --store remote cannot settle (a remote sluice serve decides, and the rate limit protocol has no settlement); use --store memory or redis", path, r.Line, r.Name)
			}
		}
	}
	return c, s, nil
}
