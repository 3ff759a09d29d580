package redisstore

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/algo"
	"github.com/sluicehq/sluice/internal/breaker"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/logsample"
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

	// Timeout is how long Redis may stay silent before the store gives
	// up on it: when a connection with calls waiting has had no reply for
	// Timeout/2, the store asks Redis for a PING on it, and if that has no
	// answer within Timeout, the connection is closed and its calls fail
	// (sluice.FailTimeout). A Redis that answers, however slowly, is busy,
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
	// with ErrOverload (sluice.FailOverload), counted and logged, and the
	// caller's failure policy answers it. Zero means DefaultMaxQueue.
	MaxQueue int

	// BreakerFailures consecutive failed calls open the circuit breaker,
	// which then fails calls at once for BreakerCooldown (doubling up to
	// 5s while Redis stays down) before letting one probe through. Zero
	// values mean the internal/breaker defaults (5 and 200ms). A call
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
	s.batch = &batcher{s: s}
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
	var opt rueidis.ClientOption
	if cfg.Client == nil {
		var err error
		if opt, err = clientOption(s.cfg); err != nil {
			return nil, err
		}
	}
	s.opt = opt
	s.ctx, s.cancel = context.WithCancel(context.Background())
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
	return s, nil
}

// Close stops connecting and closes the client (unless it was given in
// Config.Client). Close is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.stop)
		<-s.hbDone
		s.cancel()
		<-s.done
		if c := s.client.Load(); c != nil && c.owned {
			c.c.Close()
		}
	})
	return nil
}

// Take implements sluice.Store; see its documentation for the contract.
// The hits whose keys share a Cluster slot (all of them, on a standalone or
// Sentinel server) are decided by one script call; a request spanning
// several slots makes one call per slot, in parallel, and takes back what
// the allowing slots consumed when another slot denies (see the package
// documentation).
//
// ctx bounds only the wait for a slot among the calls in flight
// (Config.MaxInFlight): once sent, a call waits for Redis's answer, or for
// Redis to be found silent (Config.Timeout), whatever ctx does, so that a
// caller's deadline, which measures the node's own queue as much as Redis,
// never takes a busy Redis for a dead one. Errors are
// *sluice.StoreError, whose reason says what failed.
func (s *Store) Take(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	return s.call1(ctx, hits, out, false)
}

// TakeEach implements sluice.EachTaker: the hits decided one by one, in
// order, in the same script calls as Take (mode "e"), a denied hit with
// room left consumed past its limit (algo.Overdraw). On a Cluster, the
// slots' calls need no refund: each hit stands on its own.
func (s *Store) TakeEach(ctx context.Context, hits []sluice.Hit, out []sluice.Decision) error {
	return s.call1(ctx, hits, out, true)
}

// call1 is Take, or TakeEach when each is set: one request, through the
// gate, the breaker and the batcher.
func (s *Store) call1(ctx context.Context, hits []sluice.Hit, out []sluice.Decision, each bool) error {
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
		return &sluice.StoreError{Reason: sluice.FailUnreachable, Err: s.notConnected()}
	}
	if err := s.gate.enter(ctx); err != nil {
		if err != errShed {
			return err // the caller gave up waiting
		}
		s.metrics.shed.Add(1)
		if n, ok := s.shedLog.Allow(time.Now()); ok {
			s.log.Warn("redis: calls in flight and queue full; shedding calls to the failure policy",
				"in_flight", s.gate.inFlight(), "queued", s.gate.queued(), "shed_not_logged", n)
		}
		return &sluice.StoreError{Reason: sluice.FailOverload, Err: fmt.Errorf("redisstore: %w", ErrOverload)}
	}
	defer s.gate.leave()
	if err := s.br.Allow(); err != nil {
		s.metrics.rejected.Add(1)
		return &sluice.StoreError{Reason: sluice.FailBreakerOpen, Err: fmt.Errorf("%w: %v", ErrUnavailable, err)}
	}
	start := time.Now()
	err := s.take(s.ctx, c, hits, out, each)
	s.metrics.observe(time.Since(start), err)
	if err != nil && s.ctx.Err() != nil {
		// Closed under the call: that says nothing about Redis.
		return &sluice.StoreError{Reason: sluice.FailUnreachable, Err: fmt.Errorf("redisstore: closed: %w", err)}
	}
	switch {
	case errors.Is(err, errOpenWhileQueued):
		// Never sent: it says nothing of Redis.
	case err != nil && reasonOf(err) == sluice.FailError:
		s.br.Done(nil) // Redis answered, refusing this request
	default:
		s.br.Done(err)
	}
	if err != nil {
		why := reasonOf(err)
		if errors.Is(err, errOpenWhileQueued) {
			why = sluice.FailBreakerOpen
		}
		return &sluice.StoreError{Reason: why, Err: fmt.Errorf("redisstore: %w", err)}
	}
	return nil
}

// reasonOf classifies the error of a call that reached rueidis: an error
// reply is Redis refusing; a deadline is a connection found silent (or a
// handshake that had no answer); a network error or a closed connection is
// Redis unreachable; anything else (a malformed answer) an error.
func reasonOf(err error) sluice.FailReason {
	var re *rueidis.RedisError
	var ne net.Error
	switch {
	case errors.As(err, &re):
		return sluice.FailError
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return sluice.FailTimeout
	case errors.As(err, &ne):
		if ne.Timeout() {
			return sluice.FailTimeout
		}
		return sluice.FailUnreachable
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, rueidis.ErrClosing),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EPIPE):
		return sluice.FailUnreachable
	}
	return sluice.FailError
}

// op is one hit, encoded for the script.
type op struct {
	p     algo.Params
	slot  uint16 // on a Cluster
	state string // the state key, or a sketch's meta key
	spec  string // the limit's spec (spec.go)
	req   []byte // the cost
	cells []uint32
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

// take decides hits all-or-nothing in one script call per slot (one call
// on a standalone server or Sentinel, batched with concurrent requests):
// when several slots are involved and one denies or fails, the others'
// consumption is taken back.
func (s *Store) take(ctx context.Context, c *conn, hits []sluice.Hit, out []sluice.Decision, each bool) error {
	ops := make([]op, len(hits))
	k := keyer{prefix: s.cfg.Prefix, tag: s.tag}
	for i := range hits {
		s.encode(&k, &hits[i], &ops[i])
		if c.cluster {
			ops[i].slot = slotOf(ops[i].state)
		}
	}
	groups := groupBySlot(c, ops)
	nowArg := ""
	if s.now != nil {
		nowArg = strconv.FormatInt(s.now().UnixNano(), 10)
	}
	mode := "t"
	switch {
	case each:
		mode = "e" // one by one: nothing to refund
	case len(groups) > 1:
		mode = "u" // with the undo strings of a refund
	}
	for _, g := range groups {
		g.build(hits, ops, nowArg, mode, nil)
	}
	if len(groups) == 1 && !c.cluster {
		s.batch.do(c, groups[0], nowArg)
	} else {
		s.run(ctx, c, groups)
	}
	failed, allowed := verdict(hits, groups)
	if (failed != nil || !allowed) && len(groups) > 1 && !each {
		s.refund(ctx, c, hits, ops, groups, nowArg)
	}
	if failed != nil {
		return failed
	}
	for _, g := range groups {
		for j, i := range g.idx {
			d, err := decision(&hits[i], &ops[i].p, g.res[j])
			if err != nil {
				return err
			}
			out[i] = d
		}
	}
	return nil
}

// groupBySlot puts the hits in script calls: all in one, or on a Cluster
// one a slot.
func groupBySlot(c *conn, ops []op) []*group {
	if !c.cluster {
		g := &group{idx: make([]int, len(ops))}
		for i := range ops {
			g.idx[i] = i
		}
		return []*group{g}
	}
	var groups []*group
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
	return groups
}

// verdict reads the calls' answers: an error of a call, and whether every
// enforced hit allowed.
func verdict(hits []sluice.Hit, groups []*group) (failed error, allowed bool) {
	allowed = true
	for _, g := range groups {
		if g.err != nil {
			failed = g.err
			continue
		}
		for j, i := range g.idx {
			if g.res[j][0] != '1' && !hits[i].Limit.Shadow {
				allowed = false
			}
		}
	}
	return failed, allowed
}

// refund takes back what the allowing slots consumed when another slot
// denied, or failed, and has their hits report peeks.
func (s *Store) refund(ctx context.Context, c *conn, hits []sluice.Hit, ops []op, groups []*group, nowArg string) {
	var refunds []*group
	var taken [][]string
	for _, g := range groups {
		if g.err != nil {
			continue
		}
		n := len(g.idx)
		committed := false
		for j := range g.idx {
			committed = committed || field(g.res[j], 5) == "1"
		}
		if committed {
			g.build(hits, ops, nowArg, "r", g.res[n:3*n])
			refunds = append(refunds, g)
			taken = append(taken, g.res)
		}
	}
	s.run(ctx, c, refunds)
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
			if taken[k][j][0] != '1' || hits[i].Cost == 0 {
				g.res[j] = taken[k][j]
			}
		}
	}
}

// run executes the script for every group, in parallel when there are
// several.
func (s *Store) run(ctx context.Context, c *conn, groups []*group) {
	exec := func(g *group) {
		g.res, g.err = nil, nil
		s.metrics.fcalls.Add(1)
		arr, err := s.fcall(ctx, c, fnName, g.keys, g.args).AsStrSlice()
		want := len(g.idx)
		if m := g.args[0][0]; m == 'u' || m == 'r' {
			want *= 3 // and two undo strings a hit
		}
		if err == nil && len(arr) != want {
			err = fmt.Errorf("script returned %d values for %d hits", len(arr), len(g.idx))
		}
		for i := 0; err == nil && i < len(g.idx); i++ {
			if len(arr[i]) < 2 {
				err = fmt.Errorf("script returned %q for a hit", arr[i])
			}
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

// encode fills o with the keys of hit h and its spec; its cost, and for a
// sketch its counters, go in req (prev, which depends on the group, is
// added by build).
func (s *Store) encode(k *keyer, h *sluice.Hit, o *op) {
	o.p = limits.Params(h.Limit)
	p := &o.p
	o.spec = specOf(h.Limit, p)
	o.req = strconv.AppendInt(o.req[:0], h.Cost, 10)
	if p.Kind == algo.Sketch {
		meta, k0, k1, block := k.sketchKeys(h, p)
		o.state = meta
		o.keys = append(o.keys, meta, k0, k1)
		w, d := limits.SketchDims(h.Limit)
		o.cells = algo.SketchCells(sketchHash(h.Key, p), w, d, o.cells[:0])
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
	head := mode + " " + strconv.Itoa(len(g.idx))
	if now != "" {
		head += " " + now
	}
	g.args = append(g.args[:0], head)
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
		req := append(o.req, ' ')
		req = strconv.AppendInt(req, int64(prev), 10)
		for _, c := range o.cells {
			req = append(req, ' ')
			req = strconv.AppendUint(req, uint64(c), 10)
		}
		g.args = append(g.args, o.spec, string(req))
		g.keys = append(g.keys, o.keys...)
	}
	g.args = append(g.args, undo...)
}

// decision turns the script's answer for one hit, "allowed remaining
// reset retry left committed" (ns; left: block time left), into a
// Decision, as memstore does.
func decision(h *sluice.Hit, p *algo.Params, f string) (sluice.Decision, error) {
	var n [5]int64
	rest := f
	if len(rest) < 2 || rest[1] != ' ' {
		return sluice.Decision{}, fmt.Errorf("script returned %q", f)
	}
	allowed := rest[0] == '1'
	rest = rest[2:]
	for i := range n {
		tok, tail, _ := strings.Cut(rest, " ")
		v, err := strconv.ParseInt(tok, 10, 64)
		if err != nil {
			return sluice.Decision{}, fmt.Errorf("script returned %q: %w", f, err)
		}
		n[i], rest = v, tail
	}
	// A hit denied yet committed was overdrawn (mode "e").
	r := algo.Result{Allowed: allowed, Remaining: n[0], ResetAfter: n[1], RetryAfter: n[2], Overdrawn: !allowed && n[4] == 1}
	d := limits.Decision(h.Limit, r, p)
	if left := time.Duration(n[3]); left > 0 {
		d = limits.Blocked(d, left)
	}
	return d, nil
}

// field returns the i-th space-separated field of a hit's answer.
func field(f string, i int) string {
	for ; i > 0; i-- {
		_, f, _ = strings.Cut(f, " ")
	}
	tok, _, _ := strings.Cut(f, " ")
	return tok
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
