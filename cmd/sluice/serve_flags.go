package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/base/redact"
	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
	"github.com/sluicehq/sluice/internal/edges/rlqs"
	"github.com/sluicehq/sluice/internal/edges/server"
)

// serveSettings are the settings of sluice serve, from flags, then the
// environment, then the defaults.
type serveSettings struct {
	config              string
	grpcAddr            string
	httpAddr            string
	debugAddr           string
	metricsAddr         string
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
	streamDoneRelease   bool
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
	h := s.help()
	fs := h.fs
	if err := h.parse(args, false, stderr); err != nil {
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
	if probs := s.check(env); len(probs) > 0 {
		return nil, errors.New(strings.Join(probs, "; "))
	}
	return s, nil
}

// help builds the flags of sluice serve, bound to s, in the groups of its
// help.
func (s *serveSettings) help() *help {
	h := newHelp("serve", "serve --config PATH [flags]", `Runs the rate limit service: Envoy's rate limit services (RLS v3 and RLQS)
and gRPC health over gRPC; POST /json, /healthz, /readyz and /metrics over
HTTP; pprof, the rules, the top keys and the dashboard on the debug listener.
Rules are reloaded when their files change (or on SIGHUP).`)
	h.more = `The debug listener answers only the loopback unless --debug-addr names
another address. A bad reload of the rules keeps the rules in force.
SIGTERM or SIGINT fails readiness, waits --drain-delay, finishes in-flight
requests, saves --state-file and exits 0.

A corrupt --state-file is logged, renamed to FILE.corrupt, and the service
starts with empty counters; a state file that cannot be read or written
otherwise (permissions) is an error. docs/operations.md has the details.`
	h.env = envReading{
		brief: "Every flag can also be set by its environment variable, SLUICE_ and its name (SLUICE_REDIS_URL), and many by envoyproxy/ratelimit's (REDIS_URL).",
		note: `Every flag can also be set by its environment variable: SLUICE_ and the
flag's name in capitals, dashes as underscores (SLUICE_REDIS_URL); a flag
wins over its variable. Variables of envoyproxy/ratelimit are read after
the SLUICE_ ones, for the flags that name them, its booleans as it reads
them (strconv.ParseBool: another value is an error), CONFIG_TYPE,
REDIS_TYPE and REDIS_SOCKET_TYPE only with the values it takes, and
GRPC_SERVER_USE_TLS=true only with a certificate and key; an empty variable
of the gRPC listener's TLS files or client CA counts as unset. Those it
has that sluice does not honour are named in a warning at start. Beside these, --tracing
reads the OTEL_EXPORTER_OTLP_* variables (its endpoint),
--dogstatsd-mogrifiers DOG_STATSD_MOGRIFIER_*, and GOMEMLIMIT, when set,
wins over the memory limit of the process --max-bytes sets.`,
		all:   true,
		envoy: envoyVars,
	}
	h.group("Rules", s.ruleFlags)
	h.group("Rules from xDS (instead of --config)", s.xds.flags)
	h.group("Listeners", s.listenerFlags)
	h.group("TLS of the gRPC listener", s.tls.flags)
	h.group("Store", func(fs *flag.FlagSet) {
		s.storeSettings.flags(fs)
		s.stateFlags(fs)
	})
	h.group("Redis (--store redis)", func(fs *flag.FlagSet) { s.redis.flags(fs) })
	h.group("Regions (one limit across regions)", s.regions.flags)
	h.group("Envoy compatibility", s.envoyFlags)
	h.group("Observability", s.observabilityFlags)
	h.group("Statsd", s.statsd.flags)
	h.group("Tracing", s.tracing.flags)
	h.group("Admin API", s.adminFlags)
	h.group("Rate Limit Quota Service (RLQS)", s.rlqsFlags)
	h.first = []briefGroup{
		{"Rules", []briefFlag{
			{"config", "rules file, or directory of files (one domain each)"},
			{"config-xds", "or an xDS server to take the rules from"},
			{"shadow-mode", "decide and count, but never deny"},
		}},
		{"Listeners", []briefFlag{
			{"grpc-addr", "Envoy's rate limit services"},
			{"http-addr", "/json, /healthz, /readyz, /metrics"},
			{"debug-addr", "pprof, rules, top keys"},
			{"grpc-tls-cert", "TLS certificate of --grpc-addr (PEM)"},
			{"grpc-tls-key", "its key (PEM)"},
			{"grpc-client-ca", "CAs of client certificates: mutual TLS"},
		}},
		{"Store", []briefFlag{
			{"store", "memory (one node) or redis (shared)"},
			{"failure-policy", "local, fail_closed or fail_open"},
			{"max-bytes", "memory cap of the store (512MiB, 2GB)"},
			{"state-file", "save and restore the counters (--store memory)"},
		}},
		{"Redis", []briefFlag{
			{"redis-url", "redis://[user:pass@]host:port, rediss:// for TLS"},
			{"redis-password", "password (overrides the URL's)"},
			{"redis-sentinel-master", "master set: --redis-url lists the Sentinels"},
		}},
		{"Envoy compatibility", []briefFlag{
			{"envoy-headers", "envoyproxy/ratelimit's RateLimit-* headers"},
			{"response-headers", "ietf, x-ratelimit, retry-after, all"},
			{"response-dynamic-metadata", "envoyproxy/ratelimit's dynamic metadata"},
			{"stream-done-release", "concurrency limits: Envoy releases at stream done"},
			{"statsd", "statsd server for envoyproxy/ratelimit's stats"},
		}},
		{"Observability", []briefFlag{
			{"log-level", "debug, info, warn or error"},
			{"log-format", "text or json"},
			{"tracing", "OpenTelemetry traces over OTLP"},
		}},
		{"Admin", []briefFlag{
			{"admin-addr", "admin API (overrides, explain); empty: off"},
			{"admin-token-file", "its bearer tokens, name:secret, one a line"},
			{"overrides-file", "where overrides are kept with --store memory"},
		}},
	}
	return h
}

// stateFlags are the flags of the memory store's state file.
func (s *serveSettings) stateFlags(fs *flag.FlagSet) {
	fs.StringVar(&s.stateFile, "state-file", "", "`file` to save usage to on shutdown and every --snapshot-interval, and restore from on start; empty disables")
	fs.DurationVar(&s.snapshotInterval, "snapshot-interval", defaultSnapshotInterval, "how often to save usage to --state-file: a crash (kill -9) loses at most the hits of one interval; 0 saves only on shutdown")
}

// listenerFlags are the flags of the listeners and of their lifecycle.
func (s *serveSettings) listenerFlags(fs *flag.FlagSet) {
	fs.StringVar(&s.grpcAddr, "grpc-addr", ":8081", "`address` of the gRPC listener (Envoy RLS v3 and gRPC health): host:port, or unix:PATH for a Unix socket")
	fs.StringVar(&s.httpAddr, "http-addr", ":8080", "`address` of the HTTP listener (/json, /healthz, /readyz, /metrics)")
	fs.StringVar(&s.debugAddr, "debug-addr", "127.0.0.1:6070", "`address` of the debug listener (pprof, loaded rules, top keys, dashboard); a bare :PORT listens on 127.0.0.1, 0.0.0.0:PORT on every interface; empty disables it")
	fs.StringVar(&s.metricsAddr, "metrics-addr", "", "`address` of a listener that serves only /metrics (as envoyproxy/ratelimit's PROMETHEUS_ADDR); empty: /metrics on --http-addr only")
	fs.DurationVar(&s.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long in-flight requests may take to finish on shutdown")
	fs.DurationVar(&s.drainDelay, "drain-delay", 0, "on shutdown, how long to fail readiness and keep serving before closing the listeners")
	fs.DurationVar(&s.bodyTimeout, "body-timeout", defaultBodyTimeout, bodyTimeoutUsage)
	fs.DurationVar(&s.grpcMaxConnAge, "grpc-max-connection-age", 24*time.Hour, "gRPC connections are asked to reconnect after this long, to spread clients over new instances")
	fs.DurationVar(&s.grpcMaxConnAgeGrace, "grpc-max-connection-age-grace", time.Hour, "then closed after this much longer")
}

// ruleFlags are the flags of how the rules are read and decided.
func (s *serveSettings) ruleFlags(fs *flag.FlagSet) {
	fs.StringVar(&s.config, "config", "", "rules `path`: a file, or a directory of files (one domain each); required")
	fs.BoolVar(&s.shadowMode, "shadow-mode", false, "decide and count every limit, but never answer OVER_LIMIT")
	fs.BoolVar(&s.allOrNothing, "all-or-nothing", false, "decide every limit of a request together, none consumed when one denies (default: each on its own, as envoyproxy/ratelimit; a domain's all_or_nothing: wins)")
	fs.BoolVar(&s.mergeDomains, "merge-domains", false, "let several rules files define one domain, merging their descriptors (default: one domain per file)")
	fs.BoolVar(&s.startWithoutConfig, "start-without-config", false, "start when --config does not exist yet or holds no rules files, allowing every request, and load the rules when they appear")
	fs.BoolVar(&s.readyNeedsDomain, "ready-needs-domain", false, "report not ready (/readyz, gRPC health) until rules with at least one domain are loaded")
	fs.BoolVar(&s.quotaMode, "quota-mode", false, "make every descriptor a quota: a request is denied by its descriptors only when all of them are over their limits")
}

// envoyFlags are the flags of envoyproxy/ratelimit's answers: its headers
// and dynamic metadata, and the IETF and X-RateLimit headers.
func (s *serveSettings) envoyFlags(fs *flag.FlagSet) {
	fs.StringVar(&s.responseHeaders, "response-headers", "off", "`modes` of rate limit response headers: off, ietf, x-ratelimit, retry-after, all, or a comma list")
	fs.BoolVar(&s.envoyHeaders, "envoy-headers", false, "add envoyproxy/ratelimit's own rate limit headers (the limit, remaining and reset of the descriptor with the least left), under the names below")
	fs.StringVar(&s.envoyHeaderNames.Limit, "envoy-limit-header", server.DefaultEnvoyHeaderNames.Limit, "`name` of --envoy-headers' limit header")
	fs.StringVar(&s.envoyHeaderNames.Remaining, "envoy-remaining-header", server.DefaultEnvoyHeaderNames.Remaining, "`name` of --envoy-headers' remaining header")
	fs.StringVar(&s.envoyHeaderNames.Reset, "envoy-reset-header", server.DefaultEnvoyHeaderNames.Reset, "`name` of --envoy-headers' reset header")
	fs.BoolVar(&s.dynamicMetadata, "response-dynamic-metadata", false, "add envoyproxy/ratelimit's dynamic metadata to every response (the domain, the descriptors, and the metadata of the rules of those that passed)")
	fs.BoolVar(&s.streamDoneRelease, "stream-done-release", false, "accept rules with concurrency limits: Envoy (1.33 or later) gives an admitted request's permits back when its stream is done, sending the token of the answer's dynamic metadata (sluice_permit) in an apply_on_stream_done descriptor (docs/envoy-apis.md); without it such rules are refused, since a permit Envoy never gives back is held its whole ttl")
}

// observabilityFlags are the flags of the logs, metrics and top keys.
func (s *serveSettings) observabilityFlags(fs *flag.FlagSet) {
	fs.Float64Var(&s.nearLimitRatio, "near-limit-ratio", server.DefaultNearLimitRatio, "`ratio`: the share of a limit beyond which admitted hits count as near the limit")
	fs.TextVar(&s.logLevel, "log-level", slog.LevelInfo, "`level` of the logs: debug, info, warn or error")
	fs.StringVar(&s.logFormat, "log-format", "text", "`format` of the logs: text or json")
	fs.BoolVar(&s.limitedBy, "limited-by-header", false, "add x-sluice-limited-by to every OVER_LIMIT answer: the rule (and the runtime override, when one decided), descriptor, algorithm, limit, what is left and when it resets (tells clients about the rules)")
	fs.BoolVar(&s.topKeys, "top-keys", true, "keep the top keys of each rule by requests and denials, over the last minute and hour, in bounded memory (the debug listener's /hitters)")
}

// adminFlags are the flags of the admin API and the runtime overrides.
func (s *serveSettings) adminFlags(fs *flag.FlagSet) {
	fs.StringVar(&s.adminAddr, "admin-addr", "", "`address` of the admin API (runtime overrides, explain); empty disables it; a bare :PORT listens on 127.0.0.1")
	fs.StringVar(&s.adminTokenFile, "admin-token-file", "", "`file` of the admin API's bearer tokens, one a line, name:secret (required with --admin-addr)")
	fs.StringVar(&s.overridesFile, "overrides-file", "", "`file` the runtime overrides are kept in with --store memory (required there with --admin-addr), loaded at start; with --store redis they are kept in Redis")
}

// rlqsFlags are the flags of the Rate Limit Quota Service.
func (s *serveSettings) rlqsFlags(fs *flag.FlagSet) {
	fs.DurationVar(&s.rlqsTTL, "rlqs-ttl", rlqs.DefaultTTL, "Rate Limit Quota Service: how long Envoy keeps an assignment (must exceed Envoy's reporting_interval); a dropped Envoy's share goes to the others this long plus --rlqs-grace after its last report")
	fs.DurationVar(&s.rlqsGrace, "rlqs-grace", rlqs.DefaultGrace, "Rate Limit Quota Service: the longest an assignment may take to reach Envoy; a lowered share is held this long before others get it")
	s.rlqsMaxBytes = rlqs.DefaultMaxBytes
	fs.Var(&s.rlqsMaxBytes, "rlqs-max-bytes", "`size`: memory cap of the Rate Limit Quota Service's buckets, across all streams (a bucket of a short id counts about 1.2 KB); past it, new buckets get no assignment and Envoy applies their no_assignment_behavior; counted in the memory limit of --max-bytes")
	fs.StringVar(&s.rlqsWindows, "rlqs-windows", "token_bucket", "Rate Limit Quota Service: how shares of window limits are sent, token_bucket or requests_per_time_unit (which Envoy does not enforce yet)")
}

// check lists every problem of the settings.
func (s *serveSettings) check(env lookupEnv) []string {
	probs := s.storeSettings.check()
	probs = append(probs, s.tls.check()...)
	probs = append(probs, checkEnvoyTLS(env, &s.tls)...)
	probs = append(probs, s.statsd.check(env)...)
	probs = append(probs, s.tracing.check()...)
	probs = append(probs, s.xds.check()...)
	if s.config != "" && s.xds.addr != "" {
		probs = append(probs, "--config and --config-xds exclude each other: the rules come from files or from xDS")
	}
	if s.store != "memory" && s.stateFile != "" {
		probs = append(probs, "--state-file applies to --store memory only (Redis keeps its own state)")
	}
	var err error
	if s.headers, err = ratelimitheaders.ParseHeaderMode(s.responseHeaders); err != nil {
		probs = append(probs, fmt.Sprintf("--response-headers: %v", err))
	}
	probs = append(probs, checkLogFormat(s.logFormat)...)
	if s.nearLimitRatio <= 0 || s.nearLimitRatio > 1 {
		probs = append(probs, fmt.Sprintf("--near-limit-ratio %v is not in (0, 1]", s.nearLimitRatio))
	}
	probs = append(probs, checkDurations(map[string]time.Duration{"snapshot-interval": s.snapshotInterval, "shutdown-timeout": s.shutdownTimeout, "drain-delay": s.drainDelay, "body-timeout": s.bodyTimeout})...)
	probs = append(probs, s.checkListeners()...)
	return append(probs, s.checkRLQS()...)
}

// checkListeners checks the addresses, and what the admin API needs.
func (s *serveSettings) checkListeners() []string {
	var probs []string
	addrs := map[string]string{"grpc-addr": s.grpcAddr, "http-addr": s.httpAddr}
	if s.debugAddr != "" {
		s.debugAddr = loopbackUnlessNamed(s.debugAddr)
		addrs["debug-addr"] = s.debugAddr
	}
	if s.metricsAddr != "" {
		addrs["metrics-addr"] = s.metricsAddr
	}
	if s.statsd.mapping != "" && s.metricsAddr == "" {
		probs = append(probs, "--metrics-mapping needs --metrics-addr, where its metrics are served")
	}
	probs = append(probs, checkAddrs(addrs)...)
	if s.adminAddr != "" {
		s.adminAddr = loopbackUnlessNamed(s.adminAddr)
		probs = append(probs, checkAddrs(map[string]string{"admin-addr": s.adminAddr})...)
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
	if s.grpcMaxConnAge <= 0 || s.grpcMaxConnAgeGrace <= 0 {
		probs = append(probs, "--grpc-max-connection-age and --grpc-max-connection-age-grace must be positive")
	}
	return probs
}

// checkRLQS checks the Rate Limit Quota Service's settings.
func (s *serveSettings) checkRLQS() []string {
	var probs []string
	if s.rlqsTTL <= 0 || s.rlqsGrace <= 0 {
		probs = append(probs, "--rlqs-ttl and --rlqs-grace must be positive")
	}
	if s.rlqsMaxBytes <= 0 {
		probs = append(probs, "--rlqs-max-bytes must be positive")
	}
	if s.rlqsWindows != "token_bucket" && s.rlqsWindows != "requests_per_time_unit" {
		probs = append(probs, fmt.Sprintf("--rlqs-windows %q is neither token_bucket nor requests_per_time_unit", s.rlqsWindows))
	}
	return probs
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

// shownValue is the value of the flag name as it may be shown: Mask for a
// flag that holds a secret, else with the userinfo of a URL masked.
func shownValue(name, v string) string {
	if redact.SecretFlag(name) {
		return redact.Mask
	}
	return redact.Value(v)
}

// checkLogFormat reports a --log-format that is neither text nor json.
func checkLogFormat(format string) []string {
	if format != "text" && format != "json" {
		return []string{fmt.Sprintf("unknown log format %q (text or json)", format)}
	}
	return nil
}

// wantedForm says what form a flag of v's kind takes, for the error of a
// variable that does not parse (the flag package says only "parse
// error").
func wantedForm(v flag.Value) string {
	g, ok := v.(flag.Getter)
	if !ok {
		return ""
	}
	switch g.Get().(type) {
	case time.Duration:
		return " (want a duration with its unit: 5s, 500ms, 1m)"
	case bool:
		return " (want true or false)"
	case int, int64, uint, uint64:
		return " (want a whole number)"
	case float64:
		return " (want a number)"
	}
	return ""
}

// emptyIsUnset are the flags whose variables count as unset when empty:
// the gRPC listener's TLS files and client name, so that an empty
// SLUICE_GRPC_CLIENT_CA or GRPC_CLIENT_TLS_CACERT (a template's blank)
// never hides the variable after it and turns mutual TLS, or TLS, off.
var emptyIsUnset = map[string]bool{"grpc-tls-cert": true, "grpc-tls-key": true, "grpc-client-ca": true, "grpc-client-san": true}

// applyEnv sets every flag of fs that the command line did not from its
// environment variable (envName), else from the envoyproxy/ratelimit
// variables that envoy maps onto it, and returns "flag from VARIABLE" for
// each flag so set.
func applyEnv(fs *flag.FlagSet, env lookupEnv, envoy map[string]envoyVar) ([]string, error) {
	if err := checkEnvoyValues(env, envoy); err != nil {
		return nil, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var sources []string
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || set[f.Name] {
			return
		}
		from, v, ok := envName(f.Name), "", false
		var check func(lookupEnv) error
		if v, ok = env(from); !ok || (v == "" && emptyIsUnset[f.Name]) {
			if ev, known := envoy[f.Name]; known {
				v, ok = ev.value(env)
				from, check = strings.Join(ev.names, "+"), ev.check
			}
		}
		if !ok || (v == "" && emptyIsUnset[f.Name]) {
			return
		}
		if check != nil {
			if err = check(env); err != nil {
				return
			}
		}
		if e := fs.Set(f.Name, v); e != nil {
			err = fmt.Errorf("%s=%q: %v%s", from, shownValue(f.Name, v), e, wantedForm(f.Value))
			return
		}
		sources = append(sources, f.Name+" from "+from)
	})
	return sources, err
}
