package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/fault"
	"github.com/sluicehq/sluice/internal/base/redact"
	"github.com/sluicehq/sluice/internal/stores/stack"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/rules"
)

// redisSettings are the flags of --store redis.
type redisSettings struct {
	url            string
	sentinelMaster string
	username       string
	password       string
	sentinelUser   string
	sentinelPass   string
	tls            bool
	tlsCA          string
	tlsCert        string
	tlsKey         string
	prefix         string
	timeout        time.Duration
	maxInFlight    int
	maxQueue       int
	hashTag        string
	tagMode        rules.TagMode
	cacheSize      int
}

func (r *redisSettings) flags(fs interface {
	StringVar(*string, string, string, string)
	BoolVar(*bool, string, bool, string)
	DurationVar(*time.Duration, string, time.Duration, string)
	IntVar(*int, string, int, string)
}) {
	fs.StringVar(&r.url, "redis-url", "", "Redis to use with --store redis: a `URL` (redis://[user:pass@]host:port[/db], rediss:// for TLS, unix:///path; more seed addresses as ?addr=host:port) or a comma list of host:port; a Cluster is detected")
	fs.StringVar(&r.sentinelMaster, "redis-sentinel-master", "", "`name` of the master set: --redis-url then lists the Sentinels")
	fs.StringVar(&r.username, "redis-username", "", "Redis ACL `user` (overrides the URL's)")
	fs.StringVar(&r.password, "redis-password", "", "Redis `password` (overrides the URL's)")
	fs.StringVar(&r.sentinelUser, "redis-sentinel-username", "", "ACL `user` of the Sentinels, with --redis-sentinel-password")
	fs.StringVar(&r.sentinelPass, "redis-sentinel-password", "", "`password` of the Sentinels, when they have their own; unset, they are sent the master's")
	fs.BoolVar(&r.tls, "redis-tls", false, "connect to Redis with TLS (implied by rediss://)")
	fs.StringVar(&r.tlsCA, "redis-tls-ca", "", "PEM `file` of the CAs that sign Redis's certificate; empty means the system's")
	fs.StringVar(&r.tlsCert, "redis-tls-cert", "", "PEM `file` of a client certificate to show Redis (tls-auth-clients), with --redis-tls-key")
	fs.StringVar(&r.tlsKey, "redis-tls-key", "", "PEM `file` of the key of --redis-tls-cert")
	fs.StringVar(&r.prefix, "redis-prefix", redisstore.DefaultPrefix, "`prefix` of every Redis key")
	fs.DurationVar(&r.timeout, "redis-timeout", redisstore.DefaultTimeout, "how long Redis may stay silent (no reply at all on a connection with calls waiting) before its calls fail and the domain's failure policy answers; a Redis that answers slowly is waited for")
	fs.IntVar(&r.maxInFlight, "redis-max-in-flight", redisstore.DefaultMaxInFlight, "`requests` in flight to Redis at once from this node; more wait in a queue")
	fs.IntVar(&r.maxQueue, "redis-max-queue", redisstore.DefaultMaxQueue, "`requests` that may wait for a slot among those in flight; beyond it a request is shed to the failure policy (counted, logged)")
	fs.StringVar(&r.hashTag, "redis-hash-tag", "entry", "what places a counter in a Redis Cluster slot: entry (a descriptor's first entry: its limits decide in one call), key, or domain")
	fs.IntVar(&r.cacheSize, "local-cache-size", 100000, "`entries` of the node-local cache of keys known to be over their limit (answered without Redis until they may pass); 0 disables it")
}

// check validates the Redis settings when store is redis.
func (r *redisSettings) check(store string) []string {
	var probs []string
	if store != "redis" {
		if r.url != "" {
			probs = append(probs, "--redis-url needs --store redis")
		}
		return probs
	}
	if r.url == "" {
		probs = append(probs, "--store redis needs --redis-url")
	}
	if !strings.Contains(r.url, "://") && strings.Contains(r.url, "@") {
		// A list of addresses: each would be dialled, and named in errors.
		probs = append(probs, fmt.Sprintf("--redis-url %q: a user and password go in a redis:// URL (redis://user:password@host:port), or in --redis-username and --redis-password", redact.Value(r.url)))
	}
	if (r.sentinelUser != "" || r.sentinelPass != "") && r.sentinelMaster == "" && !strings.Contains(r.url, "master_set=") {
		probs = append(probs, "--redis-sentinel-username and --redis-sentinel-password need --redis-sentinel-master (or master_set= in --redis-url)")
	}
	if r.timeout <= 0 {
		probs = append(probs, fmt.Sprintf("--redis-timeout must be positive, got %s", r.timeout))
	}
	if r.maxInFlight < 1 {
		probs = append(probs, fmt.Sprintf("--redis-max-in-flight must be at least 1, got %d", r.maxInFlight))
	}
	if r.maxQueue < 0 {
		probs = append(probs, fmt.Sprintf("--redis-max-queue must not be negative, got %d", r.maxQueue))
	}
	if r.cacheSize < 0 {
		probs = append(probs, fmt.Sprintf("--local-cache-size must not be negative, got %d", r.cacheSize))
	}
	if (r.tlsCert == "") != (r.tlsKey == "") {
		probs = append(probs, "--redis-tls-cert and --redis-tls-key go together")
	}
	m, err := rules.ParseTagMode(r.hashTag)
	if err != nil {
		probs = append(probs, "--redis-hash-tag: "+err.Error())
	}
	r.tagMode = m
	return probs
}

// config turns the settings into a redisstore.Config.
func (r *redisSettings) config(log *slog.Logger) (redisstore.Config, error) {
	cfg := redisstore.Config{
		SentinelMaster:   r.sentinelMaster,
		SentinelUsername: r.sentinelUser,
		SentinelPassword: r.sentinelPass,
		Username:         r.username,
		Password:         r.password,
		Prefix:           r.prefix,
		Timeout:          r.timeout,
		MaxInFlight:      r.maxInFlight,
		MaxQueue:         max(r.maxQueue, 0),
		HashTag:          rules.HashTag(r.tagMode),
		Logger:           log,
	}
	if strings.Contains(r.url, "://") {
		cfg.URL = r.url
	} else {
		for _, a := range strings.Split(r.url, ",") {
			cfg.Addrs = append(cfg.Addrs, strings.TrimSpace(a))
		}
	}
	if r.tls || r.tlsCA != "" || r.tlsCert != "" {
		cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
		if r.tlsCA != "" {
			pool, err := readCAs("redis-tls-ca", r.tlsCA)
			if err != nil {
				return cfg, err
			}
			cfg.TLS.RootCAs = pool
		}
		if r.tlsCert != "" {
			pair, err := tls.LoadX509KeyPair(r.tlsCert, r.tlsKey)
			if err != nil {
				return cfg, fmt.Errorf("--redis-tls-cert and --redis-tls-key: %w", err)
			}
			cfg.TLS.Certificates = []tls.Certificate{pair}
		}
	}
	return cfg, nil
}

// storeSet is what serve and proxy decide with: the store stack
// (internal/stores/stack) and the node-local store of the local failure
// policy beside it.
type storeSet struct {
	*stack.Stack
	local *memstore.Store // decide.Failover.Local's
}

// close closes the stack, then the local policy's store.
func (set *storeSet) close() {
	set.Stack.Close()
	set.local.Close()
}

// stores lists the values of --store.
var stores = []string{"memory", "redis"}

// storeSettings are the flags that choose the store and what answers when
// it fails, shared by the commands that decide (serve, proxy).
type storeSettings struct {
	store         string
	maxBytes      byteSize
	redis         redisSettings
	failurePolicy rules.FailurePolicy
	localNodes    int
	remoteOK      bool // --store remote is allowed (sluice proxy)
	regions       regionSettings
}

// storeNames lists the values of --store that s takes.
func (s *storeSettings) storeNames() []string {
	if s.remoteOK {
		return append(slices.Clip(stores), "remote")
	}
	return stores
}

// flags defines the flags of the store, but for Redis's (redisSettings.flags).
func (s *storeSettings) flags(fs *flag.FlagSet) {
	usage := "`name` of the store that keeps the counters: " + strings.Join(s.storeNames(), ", ")
	if s.remoteOK {
		usage += " (remote: a sluice serve at --rls-addr decides)"
	}
	fs.StringVar(&s.store, "store", "memory", usage)
	fs.TextVar(&s.failurePolicy, "failure-policy", rules.FailLocal, "`policy` when the store cannot decide, for domains that set no failure_policy: local (limit on this node alone, each node admitting its share of every limit), fail_closed, or fail_open")
	fs.IntVar(&s.localNodes, "local-nodes", 0, "the least number of `nodes` sharing the limits: the local failure policy gives each node 1/N of every limit, N the larger of this and the count the nodes learn from each other through Redis (0: that count alone; 1 with another store, or until learnt)")
	fs.Var(&s.maxBytes, "max-bytes", "`size`: memory cap of the store, e.g. 512MiB or 2GB, at least 256KiB; beyond it idle-soonest keys are evicted; 0 means no cap")
}

// check validates the settings.
func (s *storeSettings) check() []string {
	var probs []string
	if !slices.Contains(s.storeNames(), s.store) {
		probs = append(probs, fmt.Sprintf("unknown store %q (supported: %s)", s.store, strings.Join(s.storeNames(), ", ")))
	}
	probs = append(probs, s.redis.check(s.store)...)
	probs = append(probs, s.regions.check(s.store)...)
	if s.failurePolicy == rules.FailDefault {
		probs = append(probs, "--failure-policy must be fail_open, fail_closed or local")
	}
	if s.localNodes < 0 {
		probs = append(probs, fmt.Sprintf("--local-nodes must not be negative, got %d", s.localNodes))
	}
	if s.store != "memory" && s.maxBytes != 0 {
		probs = append(probs, "--max-bytes applies to --store memory only (Redis keeps its own state)")
	}
	if s.maxBytes > 0 && s.maxBytes < minMaxBytes {
		probs = append(probs, fmt.Sprintf("--max-bytes %d is below %d (256KiB), the least it takes: the store's empty shards take up to 128 KiB (1,024 shards of 128 bytes), and with no room left every new key evicts another, handing its client a fresh quota; 0 means no cap", int64(s.maxBytes), minMaxBytes))
	}
	return probs
}

// minMaxBytes is the least --max-bytes: twice what the memory store takes
// empty at its most shards (1,024 of 128 bytes: 16 per CPU from 64 CPUs
// on), so that at least half of it holds keys, some 4,000 of them (31
// bytes a key) on any machine. Below it, a cap of a few bytes evicted a
// key on every new one.
const minMaxBytes = 256 << 10

// localDecideConfig opens the store of s and returns the configuration of
// a decision core over it, with no rules yet, whose failure policy is
// --failure-policy; the node-local store of the local policy is always
// there, so that a domain may choose it whatever the default is. The
// storeSet's close closes both.
func localDecideConfig(s *storeSettings, log *slog.Logger) (decide.Config, *storeSet, error) {
	cfg, err := s.stackConfig(log)
	if err != nil {
		return decide.Config{}, nil, err
	}
	st, err := stack.Open(cfg)
	var ce *stack.CoordinatorError
	if errors.As(err, &ce) {
		err = fmt.Errorf("--coordinator-url: %w", ce.Err)
	}
	if err != nil {
		return decide.Config{}, nil, err
	}
	if st.Redis != nil {
		if err := st.Redis.Health(); errors.Is(err, fault.ErrNeverConnected) {
			log.Error("Redis is not reachable: until it is, this node is not ready (/readyz answers 503) and the failure policy answers every request; start redis-server or check --redis-url",
				"failure_policy", s.failurePolicy, "err", err)
		}
	}
	set := &storeSet{Stack: st, local: memstore.New(memstore.Config{})}
	f := decide.Failover{Default: s.failurePolicy, Local: sluice.NewLimiter(set.local), Nodes: s.localNodes}
	if st.Regions == nil {
		// Write back as soon as Redis is up, not at the next request.
		// Not in a region: there the write-back charges the region tier,
		// whose grants after a partition TestRegionsE2E measures, and
		// which was not measured with it (the first request starts it).
		f.Health = st.Health
		if r := st.Redis; r != nil {
			// And an idle node's failed PINGs, and a Redis found to
			// have lost the library (reserving, regrants).
			f.Errors = func() int64 { st := r.Stats(); return st.Errors + st.ProbeErrors + st.Forgot }
		}
	}
	if st.Regions != nil {
		// The local policy spends of a global limit what the region has
		// left of its allocation, not the whole limit.
		f.Budget = st.Regions.Budget
	}
	core := decide.Config{Limiter: sluice.NewLimiter(st.Store), Failover: f, Logger: log.With("component", "decide"), Now: st.Now, Earliest: st.Earliest}
	if st.Redis != nil {
		core.Failover.NodeCount = st.Redis.Nodes
	}
	return core, set, nil
}

// stackConfig maps the flags of s to the store stack's configuration.
func (s *storeSettings) stackConfig(log *slog.Logger) (stack.Config, error) {
	cfg := stack.Config{Kind: s.store, MaxBytes: int64(s.maxBytes), CacheSize: s.redis.cacheSize, Logger: log}
	if s.store == stack.Redis {
		var err error
		if cfg.Redis, err = s.redis.config(log.With("component", "redis")); err != nil {
			return cfg, err
		}
	}
	if s.regions.region != "" {
		rc, err := s.regions.config()
		if err != nil {
			return cfg, err
		}
		cfg.Region = &rc
	}
	return cfg, nil
}

// health is the store's health check: nil when it cannot tell (the
// embedded store is always up). Its errors are scrubbed.
func (set *storeSet) health() func() error {
	if set.Health != nil {
		return scrubbed(set.Health)
	}
	return nil
}

// scrubbed is health with scrub's secrets taken out of its errors, which
// /readyz shows on the public listener and the dashboard on its own.
func scrubbed(health func() error) func() error {
	return func() error {
		err := health()
		if err == nil {
			return nil
		}
		if msg := scrub.String(err.Error()); msg != err.Error() {
			return &scrubbedError{msg: msg, err: err}
		}
		return err
	}
}

// scrubbedError is an error with its message scrubbed, which still is
// (errors.Is) what it wraps.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// Headroom of the Go runtime's soft memory limit over --max-bytes: the
// process's own heap (gRPC and HTTP buffers, metrics, the rules: some 5 MB
// beside a full 32 MiB store under load, measured once) and the garbage of
// requests between two collections, and an
// eighth more for the tables' growth (a shard's table grows by copying
// itself, 1.2x larger, and the old copy is garbage). The binary's own
// code and data (some 18 MB resident, measured once) come on top: docs/operations.md.
const (
	memLimitBase  = 24 << 20
	memLimitShare = 8 // the limit is max-bytes + max-bytes/memLimitShare + memLimitBase
)

// limitMemory makes the process honour --max-bytes, not only the store:
// with --store memory and a cap, it sets the Go runtime's soft memory
// limit (runtime/debug.SetMemoryLimit) to the cap plus the headroom above,
// plus capped, the cap of what else the process may hold beside the store
// (serve's --rlqs-max-bytes), so that the garbage collector works harder
// as the process nears it, instead of letting the heap grow to twice what
// is live. GOMEMLIMIT, when set, wins.
func (s *storeSettings) limitMemory(env lookupEnv, capped int64, log *slog.Logger) {
	if s.store != "memory" || s.maxBytes <= 0 {
		return
	}
	if v, ok := env("GOMEMLIMIT"); ok {
		log.Info("GOMEMLIMIT is set: the Go runtime's memory limit is its, not one derived from --max-bytes", "GOMEMLIMIT", v, "max_bytes", int64(s.maxBytes))
		return
	}
	limit := int64(s.maxBytes) + int64(s.maxBytes)/memLimitShare + memLimitBase + capped
	debug.SetMemoryLimit(limit)
	log.Info("memory limit of the process set from --max-bytes", "max_bytes", int64(s.maxBytes), "besides_the_store", capped, "go_memory_limit", limit)
}

// register adds the store's metrics to reg.
func (set *storeSet) register(reg *prometheus.Registry) {
	reg.MustRegister(set.Collectors()...)
	reg.MustRegister(stack.LocalCollector(set.local))
}
