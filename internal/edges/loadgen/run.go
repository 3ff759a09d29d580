package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
)

// Mode is the protocol the generator speaks.
type Mode string

const (
	GRPC Mode = "grpc" // envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
	JSON Mode = "json" // HTTP POST /json with the request in protobuf JSON
	// HTTP is a plain HTTP GET of Path, for an HTTP API or a proxy in front
	// of one (sluice proxy): the key's value, when Header is set, in that
	// header.
	HTTP Mode = "http"
)

// Config describes a run. Zero fields mean the default written in their
// comment. A run stops by itself: at least one of Duration and Requests
// must be set.
type Config struct {
	Target string // host:port of the server; required
	Mode   Mode   // default GRPC

	// Connections is the number of gRPC client connections, or of HTTP
	// transports (each with its own pool of connections) in JSON mode.
	// Default 1.
	Connections int
	// Concurrency is the number of requests in flight: the number of
	// workers, each waiting for its answer before it sends again.
	// Default 16.
	Concurrency int

	// Keys is the number of distinct descriptor values ("k0" … "k<Keys-1>"),
	// chosen uniformly. Default 1000.
	Keys int
	// Hot is the share of requests (0..1) sent with the one hot value
	// HotValue instead of a uniformly chosen key.
	Hot float64
	// Domain and DescriptorKey make the request
	// {domain, descriptors: [{entries: [{key: DescriptorKey, value}]}]}.
	// Defaults "bench" and "key".
	Domain        string
	DescriptorKey string

	// Path is the path (and query) of HTTP mode's GET; default "/".
	Path string
	// Header, in HTTP mode, is the header each request carries its key's
	// value in ("k0" … or HotValue); empty sends every request alike,
	// without one.
	Header string
	// Body, in HTTP mode, makes each request a POST of this JSON body
	// instead of a GET.
	Body []byte

	// Fill sends one request for every key (and the hot key) before the
	// warm-up, so that the server holds every key when the measurement
	// starts. Fill requests are counted in Result.Filled only.
	Fill bool
	// Warmup is sent and not measured.
	Warmup time.Duration
	// Duration is the length of the measurement, after the warm-up.
	Duration time.Duration
	// Requests caps the number of measured requests; zero means no cap.
	Requests int64
	// Rate, when positive, makes the run open loop: requests are due at
	// a fixed rate (per second, over all workers) whatever the answers,
	// and the latency of a request that could not be sent when due,
	// because every worker was waiting for an answer, runs from when it
	// was due: a server that stalls is charged for the requests that
	// queued behind it. Zero means
	// closed loop: each worker sends as soon as it has its answer.
	Rate float64
	// Timeout bounds each request. Default 2s.
	Timeout time.Duration
	// Seed seeds the choice of keys; runs with the same seed send the same
	// sequence of keys from each worker.
	Seed uint64
}

// withDefaults returns c with its zero fields set to their defaults, and
// an error if the result does not describe a run.
func (c Config) withDefaults() (Config, error) {
	c.setDefaults()
	return c, c.check()
}

// setDefaults sets each zero field to the default written in its comment.
func (c *Config) setDefaults() {
	if c.Mode == "" {
		c.Mode = GRPC
	}
	if c.Path == "" {
		c.Path = "/"
	}
	if c.Connections == 0 {
		c.Connections = 1
	}
	if c.Concurrency == 0 {
		c.Concurrency = 16
	}
	if c.Keys == 0 {
		c.Keys = 1000
	}
	if c.Domain == "" {
		c.Domain = "bench"
	}
	if c.DescriptorKey == "" {
		c.DescriptorKey = "key"
	}
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Second
	}
}

// check reports the first field, defaults set, that makes no run: no
// target, an unknown mode, a value out of range, or no end.
func (c Config) check() error {
	if c.Target == "" {
		return errors.New("no target")
	}
	if c.Mode != GRPC && c.Mode != JSON && c.Mode != HTTP {
		return fmt.Errorf("mode %q: want grpc, json or http", c.Mode)
	}
	switch {
	case c.Connections < 0, c.Concurrency < 0, c.Keys < 0:
		return errors.New("connections, concurrency and keys must be positive")
	case c.Connections > c.Concurrency:
		return fmt.Errorf("%d connections for %d requests in flight: some would stay idle", c.Connections, c.Concurrency)
	case !(c.Hot >= 0 && c.Hot <= 1):
		return fmt.Errorf("hot share %v: want 0..1", c.Hot)
	case c.Warmup < 0, c.Duration < 0, c.Requests < 0, c.Timeout < 0:
		return errors.New("warmup, duration, requests and timeout must not be negative")
	case !strings.HasPrefix(c.Path, "/"):
		return fmt.Errorf("path %q: want one that starts with /", c.Path)
	case c.Header != "" && !httpguts.ValidHeaderFieldName(c.Header):
		return fmt.Errorf("header %q: not a header name", c.Header)
	case !(c.Rate >= 0) || math.IsInf(c.Rate, 0):
		return fmt.Errorf("rate %v: want a finite rate >= 0", c.Rate)
	case c.Duration == 0 && c.Requests == 0:
		return errors.New("neither a duration nor a request cap: the run would not stop")
	}
	return nil
}

// Result is what a run measured. Requests = OK + OverLimit + Unknown +
// Errors, counting the requests sent during the measurement; latency covers
// the requests that got an answer (all but Errors).
type Result struct {
	Config Config

	// Elapsed runs from the start of the measurement to the last answer
	// counted.
	Elapsed   time.Duration
	Requests  int64
	OK        int64 // overall code OK; HTTP 200
	OverLimit int64 // overall code OVER_LIMIT; HTTP 429
	Unknown   int64 // overall code UNKNOWN (or another value)
	Errors    int64 // gRPC error status, HTTP status other than 200 and 429, transport errors
	Hot       int64 // requests sent with the hot key
	Filled    int64 // fill requests that got an answer
	Warmup    int64 // requests sent during the warm-up, answered or not
	// ErrorKinds counts the errors by kind (a gRPC code such as
	// "Unavailable", "http 500", "connection refused", …), with one
	// message of each kind in ErrorSamples.
	ErrorKinds   map[string]int64
	ErrorSamples map[string]string

	Latency Latency
}

// Latency summarises the latency of the answered requests.
type Latency struct {
	Min, Mean, P50, P90, P99, P999, Max time.Duration
}

// RPS returns the requests per second of the measurement.
func (r *Result) RPS() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// ErrorKindsSorted returns the kinds of error, most frequent first.
func (r *Result) ErrorKindsSorted() []string {
	kinds := make([]string, 0, len(r.ErrorKinds))
	for k := range r.ErrorKinds {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool {
		if r.ErrorKinds[kinds[i]] != r.ErrorKinds[kinds[j]] {
			return r.ErrorKinds[kinds[i]] > r.ErrorKinds[kinds[j]]
		}
		return kinds[i] < kinds[j]
	})
	return kinds
}

// worker is the state of one worker, read by Run only after it finished.
type worker struct {
	lane    int
	rng     *rand.Rand
	hist    *histogram
	counts  [4]int64 // by outcome
	hot     int64
	filled  int64
	warmup  int64
	last    time.Time // last answer counted
	kinds   map[string]int64
	samples map[string]string
}

func (w *worker) countError(kind string, err error) {
	if w.kinds == nil {
		w.kinds, w.samples = map[string]int64{}, map[string]string{}
	}
	if w.kinds[kind] == 0 {
		w.samples[kind] = err.Error()
	}
	w.kinds[kind]++
}

// Run sends the load that cfg describes and returns what it measured. It
// returns early, with what it measured so far, when ctx is done. An error
// means the run could not start (a bad config); failed requests are
// counted, not returned.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	b, c, err := dial(cfg)
	if err != nil {
		return nil, err
	}
	defer c.close()

	workers := make([]*worker, cfg.Concurrency)
	for i := range workers {
		workers[i] = &worker{
			lane: i,
			rng:  rand.New(rand.NewPCG(cfg.Seed, uint64(i))),
			hist: newHistogram(),
		}
	}
	r := &loop{cfg: cfg, c: c, b: b, hotBelow: hotBelow(cfg.Hot)}
	if cfg.Fill {
		each(workers, func(w *worker) { r.fill(ctx, w) })
	}

	r.start = time.Now()
	r.measureStart = r.start.Add(cfg.Warmup)
	if cfg.Duration > 0 {
		r.measureEnd = r.measureStart.Add(cfg.Duration)
		// A backstop: every request has its own timeout, so the run is
		// over by then anyway.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, r.measureEnd.Add(cfg.Timeout+time.Second))
		defer cancel()
	}
	// Requests get a context that carries none of ctx's deadline and is
	// canceled only after ctx is done: a request interrupted by the end of
	// the run then always finds ctx.Err() set, and is not counted as a
	// failure of the server.
	var cancelReqs context.CancelFunc
	r.reqCtx, cancelReqs = context.WithCancel(context.WithoutCancel(ctx))
	defer cancelReqs()
	defer context.AfterFunc(ctx, cancelReqs)()
	if cfg.Rate > 0 {
		r.interval = float64(time.Second) / cfg.Rate
	}
	each(workers, func(w *worker) { r.work(ctx, w) })
	return collect(cfg, r.measureStart, workers), nil
}

// dial encodes the bodies of cfg's mode and makes its client.
func dial(cfg Config) (*bodies, client, error) {
	switch cfg.Mode {
	case GRPC:
		b, err := protoBodies(cfg.Domain, cfg.DescriptorKey, cfg.Keys)
		if err != nil {
			return nil, nil, err
		}
		c, err := newGRPCClient(cfg.Target, cfg.Connections, cfg.Concurrency)
		if err != nil {
			return nil, nil, err
		}
		return b, c, nil
	case JSON:
		b, err := jsonBodies(cfg.Domain, cfg.DescriptorKey, cfg.Keys)
		if err != nil {
			return nil, nil, err
		}
		return b, newJSONClient(cfg.Target, cfg.Connections, cfg.Concurrency, cfg.Timeout), nil
	default: // HTTP
		b, err := valueBodies(cfg.Keys)
		if err != nil {
			return nil, nil, err
		}
		return b, newGetClient(cfg.Target, cfg.Path, cfg.Header, cfg.Body, cfg.Connections, cfg.Concurrency, cfg.Timeout), nil
	}
}

// hotBelow is the threshold of a uniform uint64 under which a request goes
// to the hot key, for a hot share of hot.
func hotBelow(hot float64) uint64 {
	if hot >= 1 {
		return math.MaxUint64
	}
	return uint64(hot * (1 << 64))
}

// each runs f for every worker at once, and returns when all have.
func each(workers []*worker, f func(w *worker)) {
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() { f(w) })
	}
	wg.Wait()
}

// collect merges what the workers measured, from measureStart on.
func collect(cfg Config, measureStart time.Time, workers []*worker) *Result {
	res := &Result{Config: cfg, ErrorKinds: map[string]int64{}, ErrorSamples: map[string]string{}}
	h := newHistogram()
	last := measureStart
	for _, w := range workers {
		h.merge(w.hist)
		res.add(w)
		if w.last.After(last) {
			last = w.last
		}
	}
	res.Requests = res.OK + res.OverLimit + res.Unknown + res.Errors
	res.Elapsed = last.Sub(measureStart)
	res.Latency = Latency{
		Min: time.Duration(h.min), Mean: h.mean(), Max: time.Duration(h.max),
		P50: h.quantile(0.50), P90: h.quantile(0.90), P99: h.quantile(0.99), P999: h.quantile(0.999),
	}
	if h.n == 0 {
		res.Latency.Min = 0
	}
	return res
}

// add adds w's counts to res, and its errors, keeping the first sample of
// each kind.
func (res *Result) add(w *worker) {
	res.OK += w.counts[outOK]
	res.OverLimit += w.counts[outOver]
	res.Unknown += w.counts[outUnknown]
	res.Errors += w.counts[outError]
	res.Hot += w.hot
	res.Filled += w.filled
	res.Warmup += w.warmup
	for k, n := range w.kinds {
		res.ErrorKinds[k] += n
		if _, ok := res.ErrorSamples[k]; !ok {
			res.ErrorSamples[k] = w.samples[k]
		}
	}
}

// loop is the shared state of the workers of one run.
type loop struct {
	cfg          Config
	c            client
	b            *bodies
	reqCtx       context.Context // parent of every request's context
	start        time.Time
	measureStart time.Time
	measureEnd   time.Time // zero: no time limit
	interval     float64   // open loop: nanoseconds between requests; 0 closed loop
	hotBelow     uint64    // a request goes to the hot key when rng.Uint64() < hotBelow
	issued       atomic.Int64
	due          atomic.Int64 // open loop: sequence number of the next request
	filling      atomic.Int64 // fill: the next key to send
}

// fill sends, from worker w, one request for each key not yet taken by
// another worker (the hot key, Keys, last), until every key is sent or
// ctx is done.
func (r *loop) fill(ctx context.Context, w *worker) {
	for {
		i := r.filling.Add(1) - 1
		if i > int64(r.cfg.Keys) || ctx.Err() != nil {
			return
		}
		rctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
		o, _, _ := r.c.do(rctx, w.lane, r.b.body(int(i)))
		cancel()
		if o != outError {
			w.filled++
		}
	}
}

// work runs one worker until the measurement ends, the request cap is
// reached or ctx is done.
func (r *loop) work(ctx context.Context, w *worker) {
	for ctx.Err() == nil {
		// due decides whether the request is measured; latency runs
		// from sent.
		var due, sent time.Time
		if r.interval > 0 {
			var ok bool
			if due, sent, ok = r.waitDue(ctx); !ok {
				return
			}
		} else {
			due = time.Now()
			if r.ended(due) {
				return
			}
		}
		measured := !due.Before(r.measureStart)
		if measured && r.cfg.Requests > 0 && r.issued.Add(1) > r.cfg.Requests {
			return
		}
		key, hot := r.key(w)
		if r.interval == 0 {
			sent = time.Now()
		}
		rctx, cancel := context.WithTimeout(r.reqCtx, r.cfg.Timeout)
		o, kind, err := r.c.do(rctx, w.lane, r.b.body(key))
		cancel()
		done := time.Now()
		if !measured {
			w.warmup++
			continue
		}
		if o == outError && ctx.Err() != nil {
			return // interrupted: not the server's failure
		}
		w.record(o, hot, sent, done, kind, err)
	}
}

// waitDue takes the open loop's next request and waits until it is due. It
// returns when the request was due and when it is sent, and false when it
// falls at or after the end of the measurement or ctx is done first.
func (r *loop) waitDue(ctx context.Context) (due, sent time.Time, ok bool) {
	seq := r.due.Add(1) - 1
	due = r.start.Add(time.Duration(float64(seq) * r.interval))
	if r.ended(due) {
		return due, sent, false
	}
	sent = due
	if d := time.Until(due); d > 0 {
		// Idle until the request is due. The wake-up can be late
		// (the runtime's timers have a granularity of about a
		// millisecond when idle): that lateness is the
		// generator's, so latency runs from the actual send. A
		// request already overdue, because every worker was busy,
		// keeps its due time: the server's slowness made it wait.
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return due, sent, false
		case <-t.C:
		}
		sent = time.Now()
	}
	return due, sent, true
}

// ended reports whether the measurement has a time limit and t is at or
// after it.
func (r *loop) ended(t time.Time) bool {
	return !r.measureEnd.IsZero() && !t.Before(r.measureEnd)
}

// key picks the key of w's next request: the hot key (Keys) for the hot
// share, otherwise one of the others, uniformly.
func (r *loop) key(w *worker) (key int, hot bool) {
	if r.hotBelow > 0 && w.rng.Uint64() < r.hotBelow {
		return r.cfg.Keys, true
	}
	return int(w.rng.Uint64N(uint64(r.cfg.Keys))), false
}

// record counts a measured answer of outcome o, sent at sent and answered
// at done: its latency, or its error of the given kind.
func (w *worker) record(o outcome, hot bool, sent, done time.Time, kind string, err error) {
	w.counts[o]++
	if hot {
		w.hot++
	}
	w.last = done
	if o == outError {
		w.countError(kind, err)
		return
	}
	w.hist.record(done.Sub(sent))
}
