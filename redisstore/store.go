package redisstore

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/internal/base/logsample"
	"github.com/sluicehq/sluice/internal/stores/breaker"
)

// Defaults of Config.
const (
	DefaultPrefix      = "sluice:"
	DefaultTimeout     = 500 * time.Millisecond
	DefaultDialTimeout = time.Second
	DefaultMaxInFlight = 256
	DefaultMaxQueue    = 4096
	DefaultHeartbeat   = time.Second
)

// ErrUnavailable wraps every error of a call that did not reach a decision
// because Redis could not be asked: not connected yet, the circuit breaker
// is open, or the node shed the call (ErrOverload).
var ErrUnavailable = errors.New("redis unavailable")

// ErrOverload wraps the error of a call the store shed without asking
// Redis: Config.MaxInFlight calls were in flight and Config.MaxQueue more
// waiting. It also wraps ErrUnavailable.
var ErrOverload = fmt.Errorf("%w: %w", ErrUnavailable, errShed)

// Config configures a Store. Give the server by URL, or by Addrs and the
// fields after it.
type Config struct {
	// URL is redis://[user:password@]host:port[/db], rediss:// for TLS, or
	// unix:///path. More seed addresses (of a Cluster, or the Sentinels)
	// go in repeated addr= query parameters; master_set=NAME selects
	// Sentinel with that master set. A Cluster is detected. A password's
	// '/', '?', '#' and '@' are percent-encoded: an '@' after the host is
	// refused, as is one in Addrs. Errors show the URL with its user and
	// password masked.
	URL string

	// Addrs are host:port seed addresses, used when URL is empty.
	Addrs []string
	// SentinelMaster makes Addrs Sentinels monitoring this master set.
	SentinelMaster string
	// SentinelUsername and SentinelPassword authenticate to the
	// Sentinels, when they have a password of their own
	// (envoyproxy/ratelimit's REDIS_SENTINEL_AUTH). Both empty: the
	// Sentinels are sent Username and Password, which a Sentinel without
	// a password accepts.
	SentinelUsername, SentinelPassword string
	// Username and Password authenticate (Redis ACL; Username may be
	// empty for the default user). They override the URL's.
	Username, Password string
	// DB selects a database (standalone and Sentinel only).
	DB int
	// TLS, when not nil, connects with TLS. It overrides the URL's.
	TLS *tls.Config

	// Prefix starts every key; empty means DefaultPrefix.
	Prefix string
	// HashTag chooses the Cluster slot of a key; nil means wholeKey.
	HashTag HashTag

	// Timeout is how long Redis may stay silent before the store gives
	// up on it: when a connection with calls waiting has had no reply for
	// Timeout/2, the store asks Redis for a PING on it, and if that has no
	// answer within Timeout, the connection is closed and its calls fail
	// (fault.Timeout). A Redis that answers, however slowly, is busy,
	// not gone: calls wait for it, bounded by MaxInFlight and MaxQueue,
	// and never fail because the node or Redis is slow. Zero means
	// DefaultTimeout.
	Timeout time.Duration
	// DialTimeout bounds connecting, the handshake included; 0 means
	// Timeout, at most DefaultDialTimeout.
	DialTimeout time.Duration

	// MaxInFlight bounds the store's requests in flight to Redis at once;
	// more wait for a slot. A slot is held until Redis answers, even when
	// the caller has given up, so the bound holds the work sent to Redis.
	// Zero means DefaultMaxInFlight.
	MaxInFlight int
	// MaxQueue bounds the requests waiting for a slot (each for as long
	// as its own context allows). Beyond it a request is shed at once
	// with ErrOverload (fault.Overload), counted and logged, and the
	// caller's failure policy answers it. Zero means DefaultMaxQueue.
	MaxQueue int

	// BreakerFailures consecutive failed calls open the circuit breaker,
	// which then fails calls at once for BreakerCooldown (doubling up to
	// 5s while Redis stays down) before letting one probe through. Zero
	// values mean the internal/stores/breaker defaults (5 and 200ms). A call
	// fails for the breaker when Redis is silent or unreachable; an error
	// reply (Redis refusing one request, say a key of the wrong type)
	// shows Redis is there, and fails only that request.
	BreakerFailures int
	BreakerCooldown time.Duration

	// Heartbeat is how often the store registers its node in Redis, so
	// that the nodes sharing the limits learn how many they are (Nodes;
	// the local failure policy divides every limit by it). A node that
	// has not renewed its entry for three heartbeats is no longer counted;
	// Close removes it at once. Zero means DefaultHeartbeat; negative
	// turns the registry off (Nodes is then 0).
	Heartbeat time.Duration

	// Client, when not nil, is used instead of connecting; Close leaves it
	// open.
	Client rueidis.Client

	// Logger receives connection state changes; nil means slog.Default().
	Logger *slog.Logger
}

// Store is a sluice.Store on Redis. It is safe for concurrent use.
type Store struct {
	cfg     Config
	opt     rueidis.ClientOption
	client  atomic.Pointer[conn]
	br      *breaker.Breaker
	log     *slog.Logger
	timeout time.Duration
	tag     HashTag

	// ctx is the context of every Redis call: not the caller's, whose
	// deadline measures more than Redis (see Config.Timeout); cancelled
	// by Close.
	ctx    context.Context
	cancel context.CancelFunc
	gate   *gate
	batch  *batcher

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	shedLog   logsample.Sampler

	nodeID string
	nodes  atomic.Int64 // the nodes registered, as last learnt; 0 before
	hbDone chan struct{}

	probeDone chan struct{} // closed when probe has returned

	lastErr atomic.Pointer[error]
	loadMu  sync.Mutex  // serializes reloads of the function library
	loaded  atomic.Bool // the library was loaded (or found) once
	// forgotLog is when forgot last logged, Unix ns.
	forgotLog atomic.Int64
	metrics   metrics

	// now, when set (tests only), replaces Redis TIME.
	now func() time.Time

	clock *clock // the estimate of Redis's clock (Now, Earliest)
}

type conn struct {
	c       rueidis.Client
	cluster bool
	owned   bool
}

// New returns a Store for cfg. An invalid configuration is an error. If
// Redis cannot be reached, New still returns the Store, which connects in
// the background and meanwhile fails every call with ErrUnavailable, so
// that a node starts, and applies its failure policy, while Redis is down.
func New(cfg Config) (*Store, error) {
	s := &Store{
		cfg:     cfg,
		log:     cfg.Logger,
		timeout: cfg.Timeout,
		tag:     cfg.HashTag,
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
		s.cfg.Timeout = s.timeout
	}
	inFlight, queue := cfg.MaxInFlight, cfg.MaxQueue
	if inFlight <= 0 {
		inFlight = DefaultMaxInFlight
	}
	if queue <= 0 {
		queue = DefaultMaxQueue
	}
	s.gate = newGate(inFlight, queue)
	if s.tag == nil {
		s.tag = wholeKey
	}
	if cfg.Prefix == "" {
		s.cfg.Prefix = DefaultPrefix
	}
	if strings.ContainsAny(cfg.Prefix, "{}") {
		// A brace in the prefix would become every key's hash tag.
		return nil, fmt.Errorf("redisstore: the key prefix %q must not contain { or }", cfg.Prefix)
	}
	s.metrics.init()
	s.br = breaker.New(breaker.Config{Failures: cfg.BreakerFailures, Cooldown: cfg.BreakerCooldown})
	s.br.OnChange(func(from, to breaker.State) {
		s.log.Warn("redis circuit breaker", "from", from.String(), "to", to.String())
	})
	var opt rueidis.ClientOption
	if cfg.Client == nil {
		var err error
		if opt, err = clientOption(s.cfg); err != nil {
			return nil, err
		}
	}
	s.opt = opt
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.batch = newBatcher(s) // its runner ends with stop
	s.nodeID = nodeID()
	s.hbDone = make(chan struct{})
	if cfg.Client != nil {
		s.client.Store(&conn{c: cfg.Client, cluster: cfg.Client.Mode() == rueidis.ClientModeCluster})
		close(s.done)
	} else if err := s.connect(); err != nil {
		s.setErr(err)
		s.log.Warn("redis not reachable; retrying in the background", "err", err)
		go s.reconnect()
	} else {
		close(s.done)
	}
	if cfg.Heartbeat >= 0 {
		go s.heartbeat(cmp.Or(cfg.Heartbeat, DefaultHeartbeat))
	} else {
		close(s.hbDone)
	}
	s.probeDone = make(chan struct{})
	go s.probe(s.timeout)
	s.clock = startClock(clockConfig{Time: s.redisTime, Logger: s.log})
	return s, nil
}

// Close stops connecting and closes the client (unless it was given in
// Config.Client). Close is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.clock.shutdown()
		close(s.stop)
		<-s.hbDone
		<-s.probeDone
		s.cancel()
		<-s.done
		if c := s.client.Load(); c != nil && c.owned {
			c.c.Close()
		}
	})
	return nil
}

// Client returns the Redis client the store decides with, for a caller
// that keeps state of its own beside the store's (package rlqs), or an
// error wrapping ErrUnavailable before the store first connected. The
// client belongs to the store: the caller must not close it.
func (s *Store) Client() (rueidis.Client, error) {
	c := s.client.Load()
	if c == nil {
		return nil, s.notConnected()
	}
	return c.c, nil
}

// Prefix returns what starts every key of the store (Config.Prefix, or
// DefaultPrefix).
func (s *Store) Prefix() string { return s.cfg.Prefix }
