package redisstore

import (
	"context"
	"crypto/sha1"
	"crypto/tls"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algo"
	"github.com/sluicehq/sluice/internal/breaker"
	"github.com/sluicehq/sluice/redisstore/internal/luasrc"
)

//go:embed take.lua
var takeLua string

// The store runs its Lua as a Redis function library (FUNCTION LOAD, then
// FCALL): the exact-integer library, the algorithms and take.lua. A plain
// script (EVALSHA) would run all of their definitions again on every
// call (measured: 30.6 against 21µs of Redis CPU per decision); a library runs them
// once, on its first call (code that runs while a library loads sees only
// the redis table, so the definitions wait for the first call and stay in
// an upvalue). The names carry a hash of the code, so that nodes of two
// sluice versions sharing a Redis each call their own.
var (
	takeCode = luasrc.Lib + "\n" + takeLua
	libHash  = func() string { h := sha1.Sum([]byte(takeCode)); return hex.EncodeToString(h[:6]) }()
	fnName   = "sluice_take_" + libHash
	libCode  = "#!lua name=sluice_" + libHash + "\n" +
		"local function lib()\n" + takeCode + "\nreturn take\nend\n" +
		"local take\n" +
		"redis.register_function('" + fnName + "', function(keys, args)\n" +
		"  take = take or lib()\n" +
		"  return take(keys, args)\n" +
		"end)\n"
)

// Defaults of Config.
const (
	DefaultPrefix      = "sluice:"
	DefaultTimeout     = 50 * time.Millisecond
	DefaultDialTimeout = time.Second
)

// ErrUnavailable wraps every error of a call that did not reach a decision
// because Redis could not be asked: not connected yet, or the circuit
// breaker is open.
var ErrUnavailable = errors.New("redis unavailable")

// Config configures a Store. Give the server by URL, or by Addrs and the
// fields after it.
type Config struct {
	// URL is redis://[user:password@]host:port[/db], rediss:// for TLS, or
	// unix:///path. More seed addresses (of a Cluster, or the Sentinels)
	// go in repeated addr= query parameters; master_set=NAME selects
	// Sentinel with that master set. A Cluster is detected.
	URL string

	// Addrs are host:port seed addresses, used when URL is empty.
	Addrs []string
	// SentinelMaster makes Addrs Sentinels monitoring this master set.
	SentinelMaster string
	// Username and Password authenticate (Redis ACL; Username may be
	// empty for the default user). They override the URL's.
	Username, Password string
	// DB selects a database (standalone and Sentinel only).
	DB int
	// TLS, when not nil, connects with TLS. It overrides the URL's.
	TLS *tls.Config

	// Prefix starts every key; empty means DefaultPrefix.
	Prefix string
	// HashTag chooses the Cluster slot of a key; nil means WholeKey.
	HashTag HashTag

	// Timeout bounds every call to Redis, within the caller's own
	// deadline; 0 means DefaultTimeout.
	Timeout time.Duration
	// DialTimeout bounds connecting; 0 means DefaultDialTimeout.
	DialTimeout time.Duration

	// BreakerFailures consecutive failed calls open the circuit breaker,
	// which then fails calls at once for BreakerCooldown (doubling up to
	// 5s while Redis stays down) before letting one probe through. Zero
	// values mean the internal/breaker defaults (5 and 200ms).
	BreakerFailures int
	BreakerCooldown time.Duration

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

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once

	lastErr atomic.Pointer[error]
	loadMu  sync.Mutex // serializes reloads of the function library
	metrics metrics

	// now, when set (tests only), replaces Redis TIME.
	now func() time.Time
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
	}
	if s.tag == nil {
		s.tag = WholeKey
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
	if cfg.Client != nil {
		s.client.Store(&conn{c: cfg.Client, cluster: cfg.Client.Mode() == rueidis.ClientModeCluster})
		close(s.done)
		return s, nil
	}
	opt, err := clientOption(cfg)
	if err != nil {
		return nil, err
	}
	s.opt = opt
	if err := s.connect(); err != nil {
		s.setErr(err)
		s.log.Warn("redis not reachable; retrying in the background", "err", err)
		go s.reconnect()
	} else {
		close(s.done)
	}
	return s, nil
}

// clientOption turns cfg into rueidis options.
func clientOption(cfg Config) (rueidis.ClientOption, error) {
	var opt rueidis.ClientOption
	switch {
	case cfg.URL != "":
		o, err := rueidis.ParseURL(cfg.URL)
		if err != nil {
			return opt, fmt.Errorf("redisstore: bad URL: %w", err)
		}
		opt = o
	case len(cfg.Addrs) > 0:
		opt.InitAddress = cfg.Addrs
	default:
		return opt, errors.New("redisstore: no URL and no addresses")
	}
	for _, a := range opt.InitAddress {
		if opt.DialCtxFn != nil {
			if a == "" {
				return opt, errors.New("redisstore: a unix:// URL needs a socket path")
			}
			break
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			return opt, fmt.Errorf("redisstore: address %q: %v", a, err)
		}
	}
	if cfg.SentinelMaster != "" {
		opt.Sentinel.MasterSet = cfg.SentinelMaster
	}
	if cfg.Username != "" {
		opt.Username = cfg.Username
	}
	if cfg.Password != "" {
		opt.Password = cfg.Password
	}
	if cfg.DB != 0 {
		opt.SelectDB = cfg.DB
	}
	if cfg.TLS != nil {
		opt.TLSConfig = cfg.TLS
	}
	if opt.Sentinel.MasterSet != "" {
		opt.Sentinel.Username, opt.Sentinel.Password = opt.Username, opt.Password
		opt.Sentinel.TLSConfig = opt.TLSConfig
	}
	opt.DisableCache = true // no client-side caching: no CLIENT TRACKING
	opt.Dialer.Timeout = cfg.DialTimeout
	if opt.Dialer.Timeout <= 0 {
		opt.Dialer.Timeout = DefaultDialTimeout
	}
	return opt, nil
}

func (s *Store) connect() error {
	c, err := rueidis.NewClient(s.opt)
	if err != nil {
		return err
	}
	cn := &conn{c: c, cluster: c.Mode() == rueidis.ClientModeCluster, owned: true}
	// Load the library now, so that the first request does not wait for
	// it; if this fails, the first call loads it.
	ctx, cancel := context.WithTimeout(context.Background(), s.opt.Dialer.Timeout)
	if err := loadLibrary(ctx, cn); err != nil {
		s.log.Warn("redis: could not load the function library; the first request will try again", "err", err)
	}
	cancel()
	s.client.Store(cn)
	s.lastErr.Store(nil)
	s.log.Info("connected to redis", "mode", string(c.Mode()), "addrs", s.opt.InitAddress)
	return nil
}

// reconnect retries connect with backoff until it succeeds or Close.
func (s *Store) reconnect() {
	defer close(s.done)
	wait := 100 * time.Millisecond
	for {
		select {
		case <-s.stop:
			return
		case <-time.After(wait):
		}
		err := s.connect()
		if err == nil {
			return
		}
		s.setErr(err)
		if wait >= 5*time.Second {
			// Every 5s at most: a configuration that can never work
			// (a wrong password, a bad TLS setting) stays visible.
			s.log.Warn("redis still not reachable; retrying", "err", err)
		}
		wait = min(2*wait, 5*time.Second)
	}
}

func (s *Store) setErr(err error) {
	s.lastErr.Store(&err)
}

// Close stops connecting and closes the client (unless it was given in
// Config.Client). Close is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.stop)
		<-s.done
		if c := s.client.Load(); c != nil && c.owned {
			c.c.Close()
		}
	})
	return nil
}

// Health implements sluice.HealthReporter: nil while Redis answers, the
// reason otherwise. It does no I/O.
func (s *Store) Health() error {
	if s.client.Load() == nil {
		return s.notConnected()
	}
	if st := s.br.State(); st != breaker.Closed {
		return fmt.Errorf("%w: circuit breaker %s", ErrUnavailable, st)
	}
	return nil
}

// notConnected is the error of a call made before the store connected.
func (s *Store) notConnected() error {
	if p := s.lastErr.Load(); p != nil {
		return fmt.Errorf("%w: not connected: %v", ErrUnavailable, *p)
	}
	return fmt.Errorf("%w: not connected", ErrUnavailable)
}

// Take implements sluice.Store; see its documentation for the contract.
// The hits whose keys share a Cluster slot (all of them, on a standalone or
// Sentinel server) are decided by one script call; a request spanning
// several slots makes one call per slot, in parallel, and takes back what
// the allowing slots consumed when another slot denies (see the package
// documentation).
func (s *Store) Take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(out) < len(hits) {
		return fmt.Errorf("redisstore: %d decisions for %d hits", len(out), len(hits))
	}
	if len(hits) == 0 {
		return nil
	}
	c := s.client.Load()
	if c == nil {
		s.metrics.rejected.Add(1)
		return s.notConnected()
	}
	if err := s.br.Allow(); err != nil {
		s.metrics.rejected.Add(1)
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	timeout := s.timeout
	if s.br.State() == breaker.HalfOpen {
		// The one probe that may close the breaker: give it more time,
		// so that a Redis that is back but slow (a loaded machine, a
		// cold start) is not taken for dead again.
		timeout = max(timeout, min(4*timeout, time.Second))
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	start := time.Now()
	err := s.take(cctx, c, hits, out)
	cancel()
	s.metrics.observe(time.Since(start), err)
	if err != nil && errors.Is(ctx.Err(), context.Canceled) {
		// The caller gave up: that says nothing about Redis, so the
		// breaker hears nothing (a probe that does not report is
		// replaced after a cooldown). A caller's deadline that passed
		// while Redis did not answer does count: Envoy's own deadline
		// (20ms by default) can be shorter than Config.Timeout, and a
		// silent Redis must still open the breaker.
		return ctx.Err()
	}
	s.br.Done(err)
	if err != nil {
		return fmt.Errorf("redisstore: %w", err)
	}
	return nil
}

// op is one hit, encoded for the script.
type op struct {
	p     algo.Params
	slot  uint16 // on a Cluster
	state string // the state key, or a sketch's meta key
	args  []string
	keys  []string
}

// group is the hits of one script call.
type group struct {
	idx  []int // indexes into hits
	keys []string
	args []string
	res  []string
	err  error
}

func (s *Store) take(ctx context.Context, c *conn, hits []sluice.Hit, out []sluice.Decision) error {
	ops := make([]op, len(hits))
	k := keyer{prefix: s.cfg.Prefix, tag: s.tag}
	for i := range hits {
		s.encode(&k, &hits[i], &ops[i])
		if c.cluster {
			ops[i].slot = slotOf(ops[i].state)
		}
	}
	var groups []*group
	if !c.cluster {
		g := &group{idx: make([]int, len(hits))}
		for i := range hits {
			g.idx[i] = i
		}
		groups = []*group{g}
	} else {
		bySlot := make(map[uint16]*group, 1)
		for i := range ops {
			g := bySlot[ops[i].slot]
			if g == nil {
				g = &group{}
				bySlot[ops[i].slot] = g
				groups = append(groups, g)
			}
			g.idx = append(g.idx, i)
		}
	}
	nowArg := ""
	if s.now != nil {
		nowArg = strconv.FormatInt(s.now().UnixNano(), 10)
	}
	for _, g := range groups {
		g.build(hits, ops, nowArg, "t", nil)
	}
	s.run(ctx, c, groups)
	var failed error
	allowed := true
	for _, g := range groups {
		if g.err != nil {
			failed = g.err
			continue
		}
		for j, i := range g.idx {
			if g.res[8*j] != "1" && !hits[i].Limit.Shadow {
				allowed = false
			}
		}
	}
	if (failed != nil || !allowed) && len(groups) > 1 {
		// Another slot denied, or failed: take back what the allowing
		// slots consumed, and report their hits as peeks. The refunds
		// get a deadline of their own: the request's is mostly spent.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
		defer cancel()
		var refunds []*group
		var taken [][]string
		for _, g := range groups {
			if g.err != nil {
				continue
			}
			var undo []string
			committed := false
			for j := range g.idx {
				committed = committed || g.res[8*j+5] == "1"
				undo = append(undo, g.res[8*j+6], g.res[8*j+7])
			}
			if committed {
				g.build(hits, ops, nowArg, "r", undo)
				refunds = append(refunds, g)
				taken = append(taken, g.res)
			}
		}
		s.run(rctx, c, refunds)
		for k, g := range refunds {
			if g.err != nil {
				// The slot's consumption stays (the safe side); its
				// hits report what the take answered.
				s.metrics.refundFailed.Add(1)
				s.log.Warn("redis: could not take back a cross-slot request's consumption", "err", g.err)
				g.err, g.res = nil, taken[k]
				continue
			}
			// The refund answers peeks; as in a request denied in one
			// slot, only the hits that allowed and would have consumed
			// report them, the others (denying shadow limits, peeks)
			// keep their answers.
			for j, i := range g.idx {
				if taken[k][8*j] != "1" || hits[i].Cost == 0 {
					copy(g.res[8*j:8*j+5], taken[k][8*j:8*j+5])
				}
			}
		}
	}
	if failed != nil {
		return failed
	}
	for _, g := range groups {
		for j, i := range g.idx {
			d, err := decision(&hits[i], &ops[i].p, g.res[8*j:8*j+5])
			if err != nil {
				return err
			}
			out[i] = d
		}
	}
	return nil
}

// run executes the script for every group, in parallel when there are
// several.
func (s *Store) run(ctx context.Context, c *conn, groups []*group) {
	exec := func(g *group) {
		g.res, g.err = nil, nil
		arr, err := s.fcall(ctx, c, g.keys, g.args).AsStrSlice()
		if err == nil && len(arr) != 8*len(g.idx) {
			err = fmt.Errorf("script returned %d values for %d hits", len(arr), len(g.idx))
		}
		g.res, g.err = arr, err
	}
	if len(groups) == 1 {
		exec(groups[0])
		return
	}
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			exec(g)
		}()
	}
	wg.Wait()
}

// fcall calls the request function. When Redis does not know it (a fresh
// or restarted server, FUNCTION FLUSH, a failover to a replica that was
// never given it), it loads the library and calls again.
func (s *Store) fcall(ctx context.Context, c *conn, keys, args []string) rueidis.RedisResult {
	call := func() rueidis.RedisResult {
		return c.c.Do(ctx, c.c.B().Fcall().Function(fnName).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	}
	res := call()
	if err := res.Error(); err != nil && strings.Contains(err.Error(), "Function not found") {
		// One load at a time: the calls that met the same restart wait
		// for it, and their own loads then find the library there.
		s.loadMu.Lock()
		err := loadLibrary(ctx, c)
		s.loadMu.Unlock()
		if err != nil {
			return res
		}
		res = call()
	}
	return res
}

// loadLibrary loads the function library on every node that takes writes:
// the server, or each node of a Cluster (replicas refuse it, and get it by
// replication).
func loadLibrary(ctx context.Context, c *conn) error {
	load := func(cl rueidis.Client) error {
		err := cl.Do(ctx, cl.B().FunctionLoad().FunctionCode(libCode).Build()).Error()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil
		}
		return err
	}
	if !c.cluster {
		return load(c.c)
	}
	var errs []error
	loaded := false
	for _, n := range c.c.Nodes() {
		if err := load(n); err != nil {
			errs = append(errs, err)
		} else {
			loaded = true
		}
	}
	if loaded {
		return nil
	}
	return errors.Join(errs...)
}

// encode fills o with the keys and script arguments of hit h, except prev.
func (s *Store) encode(k *keyer, h *sluice.Hit, o *op) {
	o.p = h.Limit.Params()
	p := &o.p
	o.args = append(o.args,
		strconv.Itoa(int(p.Kind)),
		strconv.FormatInt(p.Rate, 10),
		strconv.FormatInt(p.Period, 10),
		strconv.FormatInt(p.Capacity, 10),
		strconv.FormatInt(p.Interval, 10),
		strconv.FormatInt(h.Cost, 10),
		boolArg(h.Limit.Shadow),
		strconv.FormatInt(int64(h.Limit.BlockFor), 10),
	)
	if p.Kind == algo.Sketch {
		meta, k0, k1, block := k.sketchKeys(h, p)
		o.state = meta
		o.keys = append(o.keys, meta, k0, k1)
		w, d := h.Limit.SketchDims()
		cells := algo.SketchCells(sketchHash(h.Key, p), w, d, nil)
		o.args = append(o.args, strconv.Itoa(len(cells)))
		for _, c := range cells {
			o.args = append(o.args, strconv.FormatUint(uint64(c), 10))
		}
		if block != "" {
			o.keys = append(o.keys, block)
		}
	} else {
		o.state = k.stateKey(h, p)
		o.keys = append(o.keys, o.state)
		if h.Limit.BlockFor > 0 {
			o.keys = append(o.keys, o.state+":b")
		}
	}
}

// build sets the script call of g for the given mode; undo holds the undo
// strings of a refund.
func (g *group) build(hits []sluice.Hit, ops []op, now, mode string, undo []string) {
	g.keys = g.keys[:0]
	g.args = append(g.args[:0], now, mode, strconv.Itoa(len(g.idx)))
	for j, i := range g.idx {
		o := &ops[i]
		prev := 0
		for jj := j - 1; jj >= 0; jj-- {
			q := &ops[g.idx[jj]]
			if q.state == o.state && (o.p.Kind != algo.Sketch || hits[g.idx[jj]].Key == hits[i].Key) {
				prev = jj + 1
				break
			}
		}
		g.args = append(g.args, o.args[:8]...)
		g.args = append(g.args, strconv.Itoa(prev))
		g.args = append(g.args, o.args[8:]...)
		g.keys = append(g.keys, o.keys...)
	}
	g.args = append(g.args, undo...)
}

func boolArg(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// decision turns the script's answer for one hit (allowed, remaining,
// reset, retry, block time left) into a Decision, as memstore does.
func decision(h *sluice.Hit, p *algo.Params, f []string) (sluice.Decision, error) {
	var n [4]int64
	for i := range n {
		v, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil {
			return sluice.Decision{}, fmt.Errorf("script returned %q: %w", f[i+1], err)
		}
		n[i] = v
	}
	r := algo.Result{Allowed: f[0] == "1", Remaining: n[0], ResetAfter: n[1], RetryAfter: n[2]}
	d := h.Limit.Decide(r, p)
	if left := time.Duration(n[3]); left > 0 {
		d = d.BlockedFor(left)
	}
	return d, nil
}
