package main

// End-to-end tests of sluice serve on Redis: four processes of the real
// binary share one Redis (standalone, then a 3-master Cluster), 64 client
// goroutines hammer a hot key and a few hundred cold keys of every
// algorithm over gRPC, and every admitted request is checked against its
// algorithm's bound, from above (never more than the limit allows) and
// from below (never a denial that what was admitted does not justify).
// Then Redis is killed under load and brought back.
//
// Timing. The client records for every request its send and receive times
// on the wall clock; the decision was taken in between, by Redis TIME
// (the same clock on the same machine) or by a process's own clock (the
// local failure policy). Each interval is widened by timingSlack on both
// sides. A check from above counts a request in a span of time only if its
// interval lies inside (or, for windows, places each request in some
// window its interval meets); a check from below counts every request
// whose interval meets the span. So the checks are exact on counts and
// lenient only on time.

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
	"github.com/sluicehq/sluice/internal/testsupport/stall"
)

const (
	distProcs      = 4  // sluice serve processes sharing one Redis
	distClients    = 64 // client goroutines over all processes
	clientsPerConn = 4  // client goroutines sharing one gRPC connection
	distColdValues = 40 // cold keys per algorithm

	// distLoad is how long the clients send in a distributed run; the
	// hot limits admit 50 a second (10 under -race), so each bound is
	// reached a hundred times or more (some dozens).
	distLoad = 3 * time.Second
	// distAlign aligns the start of the load: every period and refill
	// interval of the hot limits divides it, so the run starts at the
	// start of a window and of a refill tick.
	distAlign = time.Second

	// timingSlack widens the [send, recv] interval of every request. The
	// decisions are taken on the same wall clock as the client's: Redis
	// TIME (to the microsecond), or the wall clock at a memstore's start
	// advanced by the monotonic clock (the local failure policy), which NTP
	// slews at the same rate. A step of the wall clock during a test would
	// break the timing.
	timingSlack = time.Millisecond

	// rpcTimeout bounds every request: one that takes longer hangs.
	rpcTimeout = 5 * time.Second
)

// limitSpec is one rate limit of the rules, in the YAML keys of
// docs/rules.md.
type limitSpec struct {
	alg      string
	n        int64         // requests_per_unit: per period (windows), or the refill rate per period (buckets)
	period   time.Duration // period
	burst    int64         // burst: the capacity of token_bucket, leaky_bucket and gcra
	interval time.Duration // refill_interval: a token bucket refilled in discrete ticks
}

func (l limitSpec) yaml() string {
	s := fmt.Sprintf("{algorithm: %s, period: %s, requests_per_unit: %d", l.alg, l.period, l.n)
	if l.burst > 0 {
		s += fmt.Sprintf(", burst: %d", l.burst)
	}
	if l.interval > 0 {
		s += fmt.Sprintf(", refill_interval: %s", l.interval)
	}
	return s + "}"
}

// distKey is a descriptor key of the distributed runs: value "hot" has
// the hot limit, every other value the cold limit.
type distKey struct {
	key       string
	hot, cold limitSpec
}

// distKeys are the keys of the distributed runs, one per algorithm. The
// hot limits admit 50 a second, or 10 under -race, where the binaries run
// several times slower, so that the demand exceeds them several times
// over even on a busy machine; the buckets hold two seconds' worth. The cold limits admit
// 2 per key (1 under -race, where the cold keys are hit less often) per
// 2 seconds, or a bucket of that many refilled 1 a minute.
func distKeys() []distKey {
	n, c := int64(50), int64(2) // hot a second, cold per key
	if raceEnabled() {
		n, c = 10, 1
	}
	window := func(key, alg string) distKey {
		return distKey{key, limitSpec{alg: alg, n: n, period: time.Second}, limitSpec{alg: alg, n: c, period: 2 * time.Second}}
	}
	bucket := func(key, alg string, interval time.Duration) distKey {
		k := distKey{key, limitSpec{alg: alg, n: n, period: time.Second, burst: 2 * n, interval: interval},
			limitSpec{alg: alg, n: 1, period: time.Minute, burst: c}}
		if interval > 0 {
			k.cold.interval = time.Minute
		}
		return k
	}
	keys := []distKey{
		window("fixed", "fixed_window"),
		bucket("bucket", "token_bucket", 0),
		bucket("discrete", "token_bucket", 100*time.Millisecond),
		bucket("leaky", "leaky_bucket", 0),
		bucket("gcra", "gcra", 0),
		window("sliding", "sliding_window"),
		window("log", "sliding_log"),
		window("sketch", "sketch"),
	}
	return keys
}

// distRules is the rules file of the distributed runs. Its domain fails
// closed: a store failure can then only deny, and the bounds from above
// hold whatever happens; the runs require that no store call failed.
func distRules(keys []distKey) string {
	var b strings.Builder
	b.WriteString("domain: dist\nfailure_policy: fail_closed\ndescriptors:\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "  - key: %s\n    value: hot\n    rate_limit: %s\n", k.key, k.hot.yaml())
		fmt.Fprintf(&b, "  - key: %s\n    rate_limit: %s\n", k.key, k.cold.yaml())
	}
	return b.String()
}

// startSluices starts n sluice serve processes with args.
func startSluices(t *testing.T, n int, args ...string) []*proc {
	t.Helper()
	ps := make([]*proc, n)
	for i := range ps {
		ps[i] = launch(t, nil, args...) // all at once: each takes a while to start
	}
	for _, p := range ps {
		p.connect()
	}
	return ps
}

// target is one descriptor the clients send, alone in its request.
type target struct {
	name string // key/value, for messages
	req  *rlsv3.RateLimitRequest
	spec limitSpec
	hot  bool
}

func newTarget(domain, key, value string, spec limitSpec, hot bool) *target {
	return &target{
		name: key + "/" + value,
		req:  &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(key, value)}},
		spec: spec,
		hot:  hot,
	}
}

// sample is one request as the client saw it.
type sample struct {
	send, recv int64 // Unix nanoseconds
	target     int
	proc       int
	code       rlsv3.RateLimitResponse_Code
	err        error
}

func (s sample) ok() bool { return s.err == nil && s.code == rlsv3.RateLimitResponse_OK }

// span is the interval the request was decided in, widened by
// timingSlack.
func (s sample) span() span {
	return span{s.send - int64(timingSlack), s.recv + int64(timingSlack)}
}

// load is clients sending requests to processes until stopped.
type load struct {
	stop    atomic.Bool
	wg      sync.WaitGroup
	samples [][]sample
}

// startLoad starts clients goroutines that, from start on, send the
// targets pick chooses (pick(client, i) for the client's i-th request),
// as fast as they are answered, until finish. Client c uses gRPC
// connection c/clientsPerConn, and connection j goes to process
// j%len(procs). Each connection is warmed up before start with a request
// that matches no rule.
func startLoad(t *testing.T, procs []*proc, clients int, targets []*target, pick func(client, i int) int, start time.Time) *load {
	t.Helper()
	conns := make([]*grpc.ClientConn, (clients+clientsPerConn-1)/clientsPerConn)
	for j := range conns {
		p := procs[j%len(procs)]
		conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
		_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
			Domain: targets[0].req.Domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("warm", "up")}})
		cancel()
		if err != nil {
			t.Fatalf("warming up a connection to %s: %v", p.grpcAddr, err)
		}
		conns[j] = conn
	}
	l := &load{samples: make([][]sample, clients)}
	for c := range clients {
		l.wg.Go(func() {
			client := rlsv3.NewRateLimitServiceClient(conns[c/clientsPerConn])
			pi := (c / clientsPerConn) % len(procs)
			time.Sleep(time.Until(start))
			var mine []sample
			for i := 0; !l.stop.Load(); i++ {
				ti := pick(c, i)
				ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
				send := time.Now()
				resp, err := client.ShouldRateLimit(ctx, targets[ti].req)
				recv := time.Now()
				cancel()
				s := sample{send: send.UnixNano(), recv: recv.UnixNano(), target: ti, proc: pi, err: err}
				if err == nil {
					s.code = resp.GetOverallCode()
				}
				mine = append(mine, s)
			}
			l.samples[c] = mine
		})
	}
	return l
}

// finish stops the clients, waits for their last answers, and returns
// every sample.
func (l *load) finish() []sample {
	l.stop.Store(true)
	l.wg.Wait()
	var all []sample
	for _, s := range l.samples {
		all = append(all, s...)
	}
	return all
}

// alignedStart is 10ms after the first multiple of distAlign at least
// 100ms from now: a window starts just before the load, so that the
// widened interval of no request of the run meets the window before.
func alignedStart() time.Time {
	t := time.Now().Add(100 * time.Millisecond)
	return t.Truncate(distAlign).Add(distAlign + 10*time.Millisecond)
}

// latencies checks that every request was answered, in time, and returns
// the median, 99th percentile and maximum latency.
func latencies(t *testing.T, samples []sample, limit time.Duration) (p50, p99, most time.Duration) {
	t.Helper()
	if len(samples) == 0 {
		t.Fatal("no requests")
	}
	ds := make([]time.Duration, 0, len(samples))
	failed := 0
	for _, s := range samples {
		d := time.Duration(s.recv - s.send)
		ds = append(ds, d)
		if s.err != nil {
			if failed++; failed <= 5 {
				t.Errorf("request sent at %s failed after %s: %v", at(s.send), d, s.err)
			}
		} else if d > limit {
			if failed++; failed <= 5 {
				t.Errorf("request sent at %s took %s, more than %s", at(s.send), d, limit)
			}
		}
	}
	if failed > 5 {
		t.Errorf("%d requests failed or took more than %s", failed, limit)
	}
	slices.Sort(ds)
	return ds[len(ds)/2], ds[len(ds)*99/100], ds[len(ds)-1]
}

// between returns the samples sent after from and answered before to,
// and fails t when there are none.
func between(t *testing.T, samples []sample, from, to time.Time) []sample {
	t.Helper()
	var in []sample
	for _, s := range samples {
		if s.send > from.UnixNano() && s.recv < to.UnixNano() {
			in = append(in, s)
		}
	}
	if len(in) == 0 {
		t.Fatalf("no request sent after %s and answered before %s", at(from.UnixNano()), at(to.UnixNano()))
	}
	return in
}

// at formats a Unix nanosecond time for messages: seconds within the
// minute, to the microsecond.
func at(ns int64) string { return time.Unix(0, ns).Format("05.000000") }

// metricInt reads an integer metric of p (0 when absent).
func metricInt(p *proc, series string) int64 {
	v := p.metric(series)
	if v == "" {
		return 0
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		p.t.Fatalf("metric %s: %q", series, v)
	}
	return int64(f)
}

// TestServeRedisDistributed runs the distributed load on Redis with the
// default settings while a CPU hog keeps every core busy: overload is not
// an outage, so every bound holds and the failure policy answers nothing.
func TestServeRedisDistributed(t *testing.T) {
	// Not beside the tests that wait: it starts CPU hogs, which would slow them.
	sluiceBinary(t) // skips under -short
	t.Run("standalone", func(t *testing.T) {
		srv := redistest.Standalone(t)
		cpuHog(t)
		runDistributed(t, "redis", srv.URL())
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.Cluster(t, 3, 0)
		cpuHog(t)
		runDistributed(t, "redis", strings.Join(c.Addrs(), ","))
	})
	// The negative control: each process on its own memory, as if the
	// store did not share; four processes then admit four times the
	// limit, and the checks must say so.
	t.Run("memory control", func(t *testing.T) {
		runDistributed(t, "memory", "")
	})
}

// runDistributed runs the distributed load on distProcs processes of
// store (redis at url, or memory) and checks every key. With the memory
// store it requires instead that every hot key broke its bound.
func runDistributed(t *testing.T, store, url string) {
	keys := distKeys()
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, distRules(keys))
	args := []string{"--config", rules, "--debug-addr", "", "--store", store}
	if store == "redis" {
		// The defaults: a busy machine must not turn them into an outage.
		args = append(args, "--redis-url", url)
	}
	procs := startSluices(t, distProcs, args...)

	var targets []*target
	for _, k := range keys {
		targets = append(targets, newTarget("dist", k.key, "hot", k.hot, true))
	}
	hot := len(targets)
	for v := range distColdValues {
		for _, k := range keys {
			targets = append(targets, newTarget("dist", k.key, fmt.Sprintf("c%d", v), k.cold, false))
		}
	}
	// Three requests in four go to the hot keys, in turn; the fourth to
	// the next cold key, so that every cold key is hit about as often.
	// Under -race, one in three, so that the cold keys are hit a few
	// times each too.
	every := 4
	if raceEnabled() {
		every = 3
	}
	// The cold keys are visited in turn, each for burst requests in a row
	// (one more than its limit, whatever the machine's speed), so that
	// every visit ends in a denial: the cold limits are exercised from
	// both sides on a busy machine too, where fewer requests are sent.
	burst := int64(distKeys()[0].cold.n) + 1
	var coldSeq atomic.Int64
	pick := func(c, i int) int {
		if i%every == every-1 {
			return hot + int(coldSeq.Add(1)/burst%int64(len(targets)-hot))
		}
		return (c + i - i/every) % hot
	}
	start := alignedStart()
	stop := start.Truncate(distAlign).Add(distLoad)
	l := startLoad(t, procs, distClients, targets, pick, start)
	time.Sleep(time.Until(stop))
	samples := l.finish()
	run := stop.Sub(start)
	p50, p99, most := latencies(t, samples, rpcTimeout)
	t.Logf("%d requests from %d clients to %d processes in %s (%.0f/s); latency p50 %s, p99 %s, max %s",
		len(samples), distClients, distProcs, run, float64(len(samples))/run.Seconds(), p50, p99, most)

	if store == "redis" {
		var cacheHits int64
		for i, p := range procs {
			ok := metricInt(p, `sluice_redis_calls_total{result="ok"}`)
			failed := metricInt(p, `sluice_redis_calls_total{result="error"}`) + metricInt(p, `sluice_redis_calls_total{result="rejected"}`) +
				metricInt(p, `sluice_redis_calls_total{result="shed"}`)
			errs := metricInt(p, "sluice_store_errors_total")
			policy := int64(p.metricSum("sluice_failure_policy_total"))
			hits := metricInt(p, "sluice_local_cache_hits_total")
			cacheHits += hits
			t.Logf("process %d: %d Redis calls ok, %d failed or shed; %d store errors; %d answered by a failure policy; %d requests answered by the local cache; calls took up to %s",
				i, ok, failed, errs, policy, hits, slowestCall(p))
			if ok == 0 {
				t.Errorf("process %d made no successful Redis call", i)
			}
			if errs != 0 || failed != 0 || policy != 0 {
				t.Errorf("process %d: %d store errors, %d failed Redis calls, %d failure policy answers while Redis was alive", i, errs, failed, policy)
			}
		}
		t.Logf("the local cache answered %d of %d requests (%.0f%%)", cacheHits, len(samples), 100*float64(cacheHits)/float64(len(samples)))
	}

	byTarget := make([][]sample, len(targets))
	for _, s := range samples {
		byTarget[s.target] = append(byTarget[s.target], s)
	}
	var coldHits, coldAdmitted, coldDenied, coldOver, coldUnder, coldIdle int
	for ti, tg := range targets {
		ss := byTarget[ti]
		switch {
		case len(ss) == 0 && tg.hot:
			t.Errorf("%s: no requests", tg.name)
			continue
		case len(ss) == 0:
			coldIdle++ // a slow machine sends fewer requests
			continue
		}
		margin := int64(0)
		if tg.hot {
			margin = hotMargin(tg.spec, run)
		}
		v := checkKey(tg.spec, ss, margin, !tg.hot && tg.spec.alg == "sketch")
		if store != "redis" {
			if !tg.hot {
				continue
			}
			if len(v.over) == 0 {
				t.Errorf("%s (%s) on %d processes of their own: admitted %d, within the bound %d: the check does not bite",
					tg.name, tg.spec.alg, distProcs, v.admitted, v.upper)
			} else {
				t.Logf("%-12s %-14s admitted %4d, bound %4d: %4d violations found (as they must be), e.g. %s",
					tg.name, tg.spec.alg, v.admitted, v.upper, len(v.over), v.over[0])
			}
			continue
		}
		if tg.hot {
			want := ideal(tg.spec, start.UnixNano(), stop.UnixNano())
			short := want - int64(v.admitted)
			t.Logf("%-12s %-14s demand %4d (%3.0f/s), admitted %4d of %4d over the run: shortfall %3d (%4.1f%%); sound bound %4d; the denials certify %4d (margin %d)",
				tg.name, tg.spec.alg, len(ss), float64(len(ss))/run.Seconds(), v.admitted, want, short, 100*float64(short)/float64(want), v.upper, v.floor, margin)
			// The checks from below bite only if the demand kept the limit
			// at its bound: the denials must certify a good part of it (at
			// least half: on a loaded machine, latencies of half a second
			// leave denials in no certain window).
			if v.floor < want/2 {
				t.Errorf("%s: the denials certify only %d of %d: the demand (%d requests) did not keep the limit at its bound",
					tg.name, v.floor, want, len(ss))
			} else {
				checksBite(t, tg, ss, margin)
			}
		} else {
			coldHits += len(ss)
			coldAdmitted += v.admitted
			coldDenied += v.denied
			coldOver += len(v.over)
			coldUnder += len(v.under)
		}
		for i, msg := range v.over {
			if i == 3 {
				t.Errorf("%s: %d more violations of the bound", tg.name, len(v.over)-i)
				break
			}
			t.Errorf("%s (%s) admitted too much: %s", tg.name, tg.spec.alg, msg)
		}
		for i, msg := range v.under {
			if i == 3 {
				t.Errorf("%s: %d more unjustified denials", tg.name, len(v.under)-i)
				break
			}
			t.Errorf("%s (%s) admitted too little: %s", tg.name, tg.spec.alg, msg)
		}
		if int64(v.admitted)+margin < v.floor {
			t.Errorf("%s (%s): admitted %d, below what the denials certify, %d, by more than the margin %d", tg.name, tg.spec.alg, v.admitted, v.floor, margin)
		}
	}
	if store == "redis" {
		t.Logf("cold keys: %d keys (%d not reached in the run), %d requests, %d admitted, %d denied; %d violations from above, %d from below",
			len(targets)-hot, coldIdle, coldHits, coldAdmitted, coldDenied, coldOver, coldUnder)
		if coldDenied == 0 || coldAdmitted == 0 {
			t.Errorf("cold keys: %d admitted, %d denied: the cold limits were not exercised", coldAdmitted, coldDenied)
		}
	}
}

// slowestCall reads the bucket of sluice_redis_call_duration_seconds that
// holds the slowest call of p: the upper bound of the first bucket that
// holds them all.
func slowestCall(p *proc) string {
	total := p.metricSum("sluice_redis_call_duration_seconds_count")
	code, body, _ := p.http("GET", "/metrics", "")
	if code != 200 {
		return "?"
	}
	for _, line := range strings.Split(body, "\n") {
		rest, ok := strings.CutPrefix(line, `sluice_redis_call_duration_seconds_bucket{le="`)
		if !ok {
			continue
		}
		le, v, _ := strings.Cut(rest, `"} `)
		if n, err := strconv.ParseFloat(strings.Fields(v)[0], 64); err == nil && n >= total {
			return "≤" + le + "s"
		}
	}
	return "?"
}

// checksBite requires that the checks of a hot key can fail: against a
// limit one smaller (a token less a tick), its answers admitted too much;
// against one half larger, too little.
func checksBite(t *testing.T, tg *target, ss []sample, margin int64) {
	t.Helper()
	tighter, looser := tg.spec, tg.spec
	tighter.n--
	looser.n += tg.spec.n / 2
	if tg.spec.burst > 0 {
		tighter.burst--
		looser.burst += tg.spec.burst / 2
	}
	if tg.spec.interval > 0 {
		tighter.n = tg.spec.n - int64(tg.spec.period/tg.spec.interval)
	}
	// Against a limit one lower, the admissions break the bound, and
	// the checks must say so; unless the run admitted no more than that
	// bound allows (a loaded machine that sent too few requests), where
	// there is nothing to find.
	switch w := checkKey(tighter, ss, margin, false); {
	case len(w.over) > 0:
	case int64(w.admitted) <= w.upper:
		t.Logf("%s: %d admitted, within the bound %d of a limit of %d: the checks from above have nothing to find in this run", tg.name, w.admitted, w.upper, tighter.n)
	default:
		t.Errorf("%s: the checks from above find nothing wrong against a limit of %d", tg.name, tighter.n)
	}
	if w := checkKey(looser, ss, margin, false); len(w.under) == 0 && int64(w.admitted)+margin >= w.floor {
		t.Errorf("%s: the checks from below find nothing wrong against a limit of %d", tg.name, looser.n)
	}
}

// hotMargin is how far below its bound a hot key may fall at a denial:
// 2% of its bound over the run, at least 3 requests. The checks from
// below are exact on counts (lenient on time only) and account for the
// demand stalling (a window without a denial certifies nothing, a gap
// breaks a bucket's chain of denials), so in theory none is needed. It
// covers what could make a correct store look short by a request or two:
//   - a rate rounded to whole requests;
//   - the node-local cache of denied keys: a process answers a denied key
//     itself until t0 + RetryAfter, t0 read before it asked Redis, so it
//     never denies past the time Redis would allow, and its denials are
//     Redis's own; a retry time rounded the wrong way would show here.
func hotMargin(spec limitSpec, run time.Duration) int64 {
	rate := float64(spec.n) / spec.period.Seconds()
	bound := float64(spec.burst) + rate*run.Seconds()
	return max(int64(0.02*bound+0.999), 3)
}

// ideal is what spec admits over [from, to) under a demand that never
// lets up: the bucket's burst and refill, or the limit in every window
// the run touches (a rolling window, for the sliding log).
func ideal(spec limitSpec, from, to int64) int64 {
	P, n := spec.period.Nanoseconds(), spec.n
	switch {
	case spec.burst > 0 && spec.interval > 0:
		I := spec.interval.Nanoseconds()
		return spec.burst + n*I/P*(to/I-from/I)
	case spec.burst > 0:
		return spec.burst + (to-from)*n/P
	case spec.alg == "sliding_log":
		return n * ((to - from + P - 1) / P)
	}
	return n * ((to-1)/P - from/P + 1)
}

// verdict is what checkKey found for the samples of one key.
type verdict struct {
	admitted, denied int
	// upper is the most the limit admits over the span of the admitted
	// requests; floor the least the denials certify it admitted.
	upper, floor int64
	over         []string // admitted more than the bound allows
	under        []string // a denial the admitted requests do not justify
}

// span is a request's widened [send, recv] interval, in Unix
// nanoseconds: its decision lies in [lo, hi].
type span struct{ lo, hi int64 }

func byLo(a, b span) int { return cmp.Compare(a.lo, b.lo) }
func byHi(a, b span) int { return cmp.Compare(a.hi, b.hi) }

// spans returns the widened intervals of the admitted and the denied
// samples, each sorted by lo.
func spans(ss []sample) (adm, den []span) {
	for _, s := range ss {
		sp := s.span()
		if s.ok() {
			adm = append(adm, sp)
		} else if s.err == nil {
			den = append(den, sp)
		}
	}
	slices.SortFunc(adm, byLo)
	slices.SortFunc(den, byLo)
	return adm, den
}

// checkKey checks the samples of one key, all for the limit spec. The
// bounds from above are exact; those from below (every denial justified
// by what was admitted) allow margin requests, and are skipped when
// noLower (a cold sketch key, whose counters other keys share: a
// count-min sketch may over-estimate).
func checkKey(spec limitSpec, ss []sample, margin int64, noLower bool) verdict {
	adm, den := spans(ss)
	v := verdict{admitted: len(adm), denied: len(den)}
	switch spec.alg {
	case "token_bucket", "leaky_bucket", "gcra":
		checkBucket(&v, spec, adm, den, margin)
	case "sliding_log":
		checkLog(&v, spec, adm, den, margin)
	default:
		checkWindows(&v, spec, adm, den, margin)
	}
	if noLower {
		v.under, v.floor = nil, 0
	}
	return v
}

// checkBucket checks a token bucket (smooth or discrete), a leaky bucket
// or GCRA: burst B, refill rate R (or a tokens at every tick of the
// refill interval). They are one model: the bucket is full at the key's
// first decision, holds at most B, gains R·Δ over Δ (a at each tick), and
// each admission takes a token.
//
// From above: at any time x the bucket holds at most B tokens, and by y
// it gains at most R·(y−x) (a per tick in (x, y]), so the requests
// decided within [x, y] are at most B + R·(y−x). Checked for every x the
// start of an admitted request's interval and every y the end of one.
//
// From below: a denial at d means less than one token was left, and the
// tokens at d are exactly the least, over the times t from the first
// decision on (discrete: the first decision and the ticks), of
// B + R·(d−t) − (the admissions in [t, d]). So the admissions in [t, d]
// must be more than B − 1 + R·(d−t) for some t: checked with every
// admission the intervals allow. That t certifies as many admissions; the
// floor is the most a denial certifies with the latest t it can have.
func checkBucket(v *verdict, spec limitSpec, adm, den []span, margin int64) {
	P, B, n := spec.period.Nanoseconds(), spec.burst, spec.n
	I := spec.interval.Nanoseconds()
	var a int64 // tokens a tick
	if I > 0 {
		a = n * I / P
	}
	most := func(x, y int64) int64 { // decided within [x, y]
		if I > 0 {
			return B + a*(y/I-x/I)
		}
		return B + (y-x)*n/P
	}
	if len(adm) > 0 {
		v.upper = most(adm[0].lo, slices.MaxFunc(adm, byHi).hi)
	}
	ends := slices.Clone(adm)
	slices.SortFunc(ends, byHi)
	for _, x := range adm {
		count := int64(0)
		for _, y := range ends {
			if y.lo < x.lo {
				continue
			}
			count++ // every request counted lies within [x.lo, y.hi]
			if m := most(x.lo, y.hi); count > m {
				v.over = append(v.over, fmt.Sprintf("%d requests decided within [%s, %s], at most %d allowed", count, at(x.lo), at(y.hi), m))
				break
			}
		}
	}
	if len(den) == 0 {
		return
	}

	first := slices.MinFunc(slices.Concat(adm, den), byHi).hi // no decision of the key is later
	for _, d := range den {
		before := countWhile(adm, func(s span) bool { return s.lo <= d.hi })
		// At t, with gone of the admissions certainly before t, the
		// admissions in [t, d] are at most before−gone, and must be
		// at least need.
		cert := int64(-1)
		try := func(t int64, gone int) {
			var need int64
			if I > 0 {
				need = B + a*max(d.lo/I-t/I, 0)
			} else {
				need = ((B-1)*P+n*max(d.lo-t, 0))/P + 1 // more than B − 1 + R·(d−t)
			}
			if int64(before-gone)+margin >= need {
				cert = need // the latest such t certifies the least
			}
		}
		try(first, 0)
		if I > 0 {
			gone := 0
			for k := first/I + 1; k*I <= d.hi; k++ {
				for gone < len(ends) && ends[gone].hi < k*I {
					gone++
				}
				try(k*I, gone)
			}
		} else {
			for j, e := range ends {
				if e.hi > d.hi {
					break
				}
				try(e.hi, j)
			}
		}
		if cert < 0 {
			v.under = append(v.under, fmt.Sprintf("denied within [%s, %s] with a token left: %d admitted before, fewer than the bucket allows since any time",
				at(d.lo), at(d.hi), before))
		}
		v.floor = max(v.floor, cert)
	}
}

// countWhile counts the leading elements of s for which ok holds (s is
// sorted so that ok holds for a prefix).
func countWhile(s []span, ok func(span) bool) int {
	i, _ := slices.BinarySearchFunc(s, true, func(x span, _ bool) int {
		if ok(x) {
			return -1
		}
		return 1
	})
	return i
}

// checkLog checks a sliding log of L per period P: a request at d is
// admitted when fewer than L were admitted in (d−P, d].
//
// From above: the requests decided within any [a, a+P) are at most L
// (the last of them has all the others in its window). Checked for every
// a the start of an admitted request's interval.
//
// From below: at a denial at d, L were admitted in (d−P, d], and each
// has an interval that meets (d.lo−P, d.hi]. The floor chains denials
// back from the last one, each at least P before the previous, so that
// their windows are disjoint: L for each.
func checkLog(v *verdict, spec limitSpec, adm, den []span, margin int64) {
	P, L := spec.period.Nanoseconds(), spec.n
	if len(adm) > 0 {
		v.upper = L * ((slices.MaxFunc(adm, byHi).hi-adm[0].lo)/P + 1)
	}
	for i, a := range adm {
		count := int64(0)
		for _, b := range adm[i:] { // every b.lo >= a.lo
			if b.hi < a.lo+P {
				count++
			}
		}
		if count > L {
			v.over = append(v.over, fmt.Sprintf("%d requests decided within [%s, %s), at most %d allowed", count, at(a.lo), at(a.lo+P), L))
		}
	}
	for _, d := range den {
		in := int64(0)
		for _, a := range adm {
			if a.hi > d.lo-P && a.lo <= d.hi {
				in++
			}
		}
		if in+margin < L {
			v.under = append(v.under, fmt.Sprintf("denied within [%s, %s] with at most %d admitted in the window before, %d due", at(d.lo), at(d.hi), in, L))
		}
	}
	for i := len(den) - 1; i >= 0; {
		v.floor += L
		next := den[i].lo - P // the next denial of the chain is within it
		for i >= 0 && den[i].hi > next {
			i--
		}
	}
}

// checkWindows checks the window algorithms over epoch-aligned windows of
// P: a fixed window admits at most L in each; a sliding window (and a
// sketch, whose counts only over-estimate) admits at e into window k only
// when prev·(P−e)/P + curr + 1 <= L, prev being what window k−1 admitted
// and curr what window k admitted before.
//
// From above: the admitted requests can be placed each in a window its
// interval meets with at most L in every window; and, for the sliding
// algorithms, every admitted request met the condition with the fewest
// prev and curr it can have seen and the latest e it can have had: that
// is "never admits more than the exact sliding window would".
//
// From below, at a denial in window k: fixed, L were admitted in window
// k; sliding, prev·(P−e)/P + curr + 1 > L, with the most prev and curr it
// can have seen and the earliest e. The floor adds, for every window with
// a denial, L (fixed) or the curr its latest denial implies (sliding).
func checkWindows(v *verdict, spec limitSpec, adm, den []span, margin int64) {
	P, L := spec.period.Nanoseconds(), spec.n
	sliding := spec.alg != "fixed_window"
	if len(adm) > 0 {
		v.upper = L * (slices.MaxFunc(adm, byHi).hi/P - adm[0].lo/P + 1)
	}
	if n, k := overflow(adm, P, L); n > 0 {
		v.over = append(v.over, fmt.Sprintf("%d of the admitted requests cannot be placed %d a window, the first decided by %s", n, L, at((k+1)*P)))
	}
	definite := map[int64][]span{} // intervals within one window
	possible := map[int64]int64{}  // intervals meeting the window
	for _, a := range adm {
		if a.lo/P == a.hi/P {
			definite[a.lo/P] = append(definite[a.lo/P], a)
		}
		for k := a.lo / P; k <= a.hi/P; k++ {
			possible[k]++
		}
	}
	if sliding {
		for k, in := range definite {
			prev := int64(len(definite[k-1]))
			for _, a := range in {
				curr := int64(0)
				for _, b := range in {
					if b.hi < a.lo {
						curr++
					}
				}
				if e := a.hi - k*P; prev*(P-e)+(curr+1)*P > L*P {
					v.over = append(v.over, fmt.Sprintf("admitted within [%s, %s] after at least %d in the previous window and %d in this one: %.2f > %d",
						at(a.lo), at(a.hi), prev, curr, float64(prev)*float64(P-e)/float64(P)+float64(curr+1), L))
				}
			}
		}
	}
	certified := map[int64]int64{}
	for _, d := range den {
		k := d.lo / P
		if d.hi/P != k {
			continue // the window of the denial is not known
		}
		if !sliding {
			certified[k] = L
			if possible[k]+margin < L {
				v.under = append(v.under, fmt.Sprintf("denied within [%s, %s] with at most %d admitted in its window, %d due", at(d.lo), at(d.hi), possible[k], L))
			}
			continue
		}
		prev := possible[k-1]
		curr := int64(0)
		for _, a := range adm {
			if a.lo/P <= k && k <= a.hi/P && a.lo <= d.hi {
				curr++
			}
		}
		e := d.lo - k*P
		if prev*(P-e)+(curr+1+margin)*P <= L*P {
			v.under = append(v.under, fmt.Sprintf("denied within [%s, %s] with at most %d admitted in the previous window and %d in this one: %.2f <= %d",
				at(d.lo), at(d.hi), prev, curr, float64(prev)*float64(P-e)/float64(P)+float64(curr+1), L))
		}
		if x := L*P - P - prev*(P-e); x >= 0 { // curr·P > x
			certified[k] = max(certified[k], x/P+1)
		}
	}
	for _, c := range certified {
		v.floor += c
	}
}

// overflow is how many of the intervals cannot be placed, each in a
// window of P that it meets, with at most L in every window, and the last
// window of the first that cannot. It is Glover's greedy matching, which
// places as many as can be: window after window, place the waiting
// intervals that end soonest.
func overflow(spans []span, P, L int64) (n, k int64) {
	s := slices.Clone(spans)
	slices.SortFunc(s, byLo)
	var waiting []int64 // last windows of the intervals not yet placed, sorted
	for i, w := 0, int64(0); i < len(s) || len(waiting) > 0; w++ {
		if len(waiting) == 0 {
			w = s[i].lo / P
		}
		for ; i < len(s) && s[i].lo/P <= w; i++ {
			last := s[i].hi / P
			j, _ := slices.BinarySearch(waiting, last)
			waiting = slices.Insert(waiting, j, last)
		}
		for len(waiting) > 0 && waiting[0] < w {
			if n == 0 {
				k = waiting[0]
			}
			n++
			waiting = waiting[1:]
		}
		waiting = waiting[min(int64(len(waiting)), L):]
	}
	return n, k
}

// loadDomains starts distClients clients on procs, from an aligned start,
// asking for the descriptor k=hot of the domains, whose limit is spec:
// client c's i-th request goes to domains[pick(c, i)], and target i of the
// samples is domains[i].
func loadDomains(t *testing.T, procs []*proc, domains []string, spec limitSpec, pick func(c, i int) int) (*load, time.Time) {
	t.Helper()
	targets := make([]*target, len(domains))
	for i, d := range domains {
		targets[i] = newTarget(d, "k", "hot", spec, true)
	}
	start := alignedStart()
	return startLoad(t, procs, distClients, targets, pick, start), start
}

// allMetric reports whether series reads want on every process.
func allMetric(procs []*proc, series, want string) bool {
	for _, p := range procs {
		if p.metric(series) != want {
			return false
		}
	}
	return true
}

// policyAnswers sums over the processes, for each of domains, the requests
// that domain's failure policy (policies, in the same order) answered.
func policyAnswers(procs []*proc, domains, policies []string) []int64 {
	sum := make([]int64, len(domains))
	for _, p := range procs {
		for di, dom := range domains {
			sum[di] += int64(p.metricSum("sluice_failure_policy_total", `domain="`+dom+`"`, `policy="`+policies[di]+`"`))
		}
	}
	return sum
}

// outage is a way for Redis to stop deciding and come back.
type outage struct {
	name string
	// stop makes Redis decide nothing from when it returns, for at least
	// d; it returns the time before which Redis surely decides nothing,
	// or zero when that is until back is called. back lets Redis decide
	// again, at the latest when it returns.
	stop func(s *redistest.Server, d time.Duration) time.Time
	back func(*redistest.Server)
}

var outages = []outage{
	{"killed", func(s *redistest.Server, _ time.Duration) time.Time { s.Kill(); return time.Time{} }, (*redistest.Server).Restart},
	// SIGSTOP: connections stay open and nothing is answered, as with a
	// hung server or a partition that drops packets.
	{"sigstop", func(s *redistest.Server, _ time.Duration) time.Time { s.Freeze(); return time.Time{} }, (*redistest.Server).Thaw},
	// DEBUG SLEEP: Redis blocked by a long command, which ends by itself:
	// d from when it was sent at the earliest. A second and a half longer
	// than the others, so that the processes have found the outage (on
	// a busy machine, under -race, that takes a good part of a second)
	// well before it ends.
	{"debug sleep", func(s *redistest.Server, d time.Duration) time.Time {
		sent := time.Now()
		sleeping = s.Sleep(d + 1500*time.Millisecond)
		return sent.Add(d + 1500*time.Millisecond)
	}, func(*redistest.Server) { <-sleeping }},
}

// sleeping is closed when the DEBUG SLEEP of the running outage ends.
var sleeping <-chan struct{}

// TestServeRedisOutage stops Redis under load, in each way of outages, and
// brings it back: three domains, one per failure policy, each a fixed
// window hot key; four processes that learn they are four through Redis,
// with a 50ms Redis timeout (how long Redis may stay silent).
func TestServeRedisOutage(t *testing.T) {
	// Not beside the tests that wait: with their load, its clients do not reach the limit in every window (seen).
	sluiceBinary(t)
	for _, o := range outages {
		t.Run(o.name, func(t *testing.T) { runOutage(t, o) })
	}
}

func runOutage(t *testing.T, how outage) {
	const (
		redisTimeout = 50 * time.Millisecond
		answerSlack  = time.Second // on top of the Redis deadline: a loaded machine, -race
		window       = 500 * time.Millisecond
		limit        = 40 // a window, for the whole cluster
		perNode      = limit / distProcs
		outage       = 1500 * time.Millisecond
	)
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	domains := []string{"open", "local", "closed"}
	policies := []string{"fail_open", "local", "fail_closed"}
	for i, d := range domains {
		writeRules(t, filepath.Join(dir, d+".yaml"), fmt.Sprintf(
			"domain: %s\nfailure_policy: %s\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: fixed_window, period: %s, requests_per_unit: %d}\n",
			d, policies[i], window, limit))
	}
	procs := startSluices(t, distProcs, "--config", dir, "--debug-addr", "",
		"--store", "redis", "--redis-url", srv.URL(), "--redis-timeout", redisTimeout.String(),
		"--failure-policy", "fail_open")
	stalls := stall.Watch(t)
	l, start := loadDomains(t, procs, domains, limitSpec{alg: "fixed_window", n: limit, period: window},
		func(c, i int) int { return (c + i) % len(domains) })
	defer l.finish()

	P := window.Nanoseconds()
	everyProc := func(series, want string) bool { return allMetric(procs, series, want) }
	// answered sums, per domain, the requests the failure policy
	// answered. Before the outage and after it, that is those whose Redis
	// call failed (past its 50ms deadline, on a loaded machine): a
	// fail_open or local answer may admit beyond Redis's limit, and a call
	// that timed out may still have consumed in Redis.
	answered := func() []int64 { return policyAnswers(procs, domains, policies) }
	time.Sleep(time.Until(start.Add(time.Second)))
	// Under -race, the first calls can pass the 50ms deadline and open a
	// breaker for a while.
	poll(t, "sluice_redis_up 1 on every process before the outage", func() bool { return everyProc("sluice_redis_up", "1") })
	// The local policy divides by the nodes they learnt from each other.
	poll(t, "sluice_nodes 4 on every process", func() bool { return everyProc("sluice_nodes", strconv.Itoa(distProcs)) })

	read := time.Now() // what the policy answered before this is in failedBefore
	failedBefore := answered()
	killed := time.Now()
	resume := how.stop(srv, outage)
	dead := time.Now() // Redis decides nothing after this
	poll(t, "sluice_redis_up 0 on every process", func() bool { return everyProc("sluice_redis_up", "0") })
	downAfter := time.Since(killed)
	for i, p := range procs {
		code, body, _ := p.http("GET", "/readyz", "")
		up := p.metric("sluice_store_up")
		// An outage that ends by itself (DEBUG SLEEP) may be over by now
		// on a loaded machine, where finding it on every process took
		// seconds: what the process says after it ended is not about the
		// outage.
		if !resume.IsZero() && time.Now().After(resume) {
			t.Logf("process %d: the outage ended before /readyz was read (%s after it began): not checked", i, time.Since(killed).Round(time.Millisecond))
			continue
		}
		if code != 200 || !strings.Contains(body, "store: down") {
			t.Errorf("process %d during the outage: /readyz %d %q, want 200 and the store down", i, code, body)
		}
		if up != "0" {
			t.Errorf("process %d during the outage: sluice_store_up %s", i, up)
		}
	}
	restarting := resume // Redis decides nothing before this
	if resume.IsZero() {
		time.Sleep(time.Until(dead.Add(outage)))
		restarting = time.Now()
	} else {
		time.Sleep(time.Until(resume))
	}
	how.back(srv)
	restarted := time.Now()
	// Each process closes its breaker at the first probe that succeeds;
	// probes are at most 5s apart. Under -race on a loaded machine a
	// probe can also pass the 50ms deadline with Redis up, and the next
	// comes 5s later: allow three.
	recovery := 5*time.Second + answerSlack
	if raceEnabled() {
		recovery = 3*5*time.Second + answerSlack
	}
	for i := 0; !everyProc("sluice_redis_up", "1"); i++ {
		if time.Since(restarted) > recovery {
			t.Fatalf("sluice_redis_up not 1 on every process %s after Redis was back", recovery)
		}
		time.Sleep(pollPause(i))
	}
	up := time.Now()
	atUp := answered()
	for i, p := range procs {
		if code, body, _ := p.http("GET", "/readyz", ""); code != 200 {
			t.Errorf("process %d after the outage: /readyz %d %q", i, code, body)
		}
	}
	// Two whole windows after atUp was read, and a margin for a stall.
	from := (time.Now().UnixNano()/P + 1) * P
	time.Sleep(time.Until(time.Unix(0, from+2*P+150*int64(time.Millisecond))))
	samples := l.finish()
	failedAfter := answered()
	for di := range domains {
		failedAfter[di] -= atUp[di]
	}
	t.Logf("requests answered by the failure policy (domains %v): %v before the outage, %v after every process found Redis back",
		domains, failedBefore, failedAfter)

	t.Logf("Redis %s at %s; the store down on every process %s later; back at %s (took %s); up on every process %s later",
		how.name, at(killed.UnixNano()), downAfter.Round(time.Millisecond), at(restarting.UnixNano()),
		restarted.Sub(restarting).Round(time.Millisecond), up.Sub(restarted).Round(time.Millisecond))
	// The bound: the Redis timeout, a margin, and the longest the machine
	// stalled this process (a loaded machine holds back all alike).
	bound := redisTimeout + answerSlack + stalls.Max()
	t.Logf("the machine stalled this test's process by up to %s: the latency bound is %s", stalls.Max().Round(time.Millisecond), bound)
	p50, p99, most := latencies(t, samples, bound)
	t.Logf("%d requests; latency p50 %s, p99 %s, max %s", len(samples), p50, p99, most)
	during := between(t, samples, dead, restarting)
	p50, p99, most = latencies(t, during, bound)
	t.Logf("%d requests during the outage; latency p50 %s, p99 %s, max %s", len(during), p50, p99, most)

	// A denial the local cache learned before the outage lasts at most to
	// the end of its window: the first whole window of the outage starts
	// after it.
	settled := (dead.UnixNano()/P + 1) * P
	var cached, opened, closedWrong, openWrong int
	firstOpen := int64(math.MaxInt64)
	for _, s := range during {
		switch domains[s.target] {
		case "closed":
			if s.ok() {
				if closedWrong++; closedWrong <= 3 {
					t.Errorf("fail_closed: OK within [%s, %s], while Redis was down", at(s.send), at(s.recv))
				}
			}
		case "open":
			switch {
			case s.ok():
				opened++
				firstOpen = min(firstOpen, s.recv)
			case s.send < settled:
				cached++ // the local cache's denial, learned before the outage
			default:
				if openWrong++; openWrong <= 3 {
					t.Errorf("fail_open: %s within [%s, %s], while Redis was down", s.code, at(s.send), at(s.recv))
				}
			}
		}
	}
	if closedWrong > 3 || openWrong > 3 {
		t.Errorf("%d fail_closed and %d fail_open answers against the policy", closedWrong, openWrong)
	}
	if opened == 0 {
		t.Fatal("fail_open: no request answered OK during the outage")
	}
	t.Logf("fail_open during the outage: %d OK, the first %s after Redis died; %d denied by the local cache until the window of the kill ended",
		opened, time.Duration(firstOpen-dead.UnixNano()).Round(time.Millisecond), cached)

	admitted := func(target, proc int) []span {
		var out []span
		for _, s := range samples {
			if s.target == target && (proc < 0 || s.proc == proc) && s.ok() {
				out = append(out, s.span())
			}
		}
		return out
	}
	within := func(spans []span, from, to int64) []span {
		var out []span
		for _, s := range spans {
			if s.lo >= from && s.hi < to {
				out = append(out, s)
			}
		}
		return out
	}
	meeting := func(spans []span, k int64) int64 {
		n := int64(0)
		for _, s := range spans {
			if s.lo/P <= k && k <= s.hi/P {
				n++
			}
		}
		return n
	}
	// deniedBy reports a denial of target in window k, by process proc
	// (any, if negative), decided wholly within the window.
	deniedBy := func(target, proc int, k int64) bool {
		for _, s := range samples {
			if sp := s.span(); s.target == target && (proc < 0 || s.proc == proc) && s.err == nil && !s.ok() && sp.lo/P == k && sp.hi/P == k {
				return true
			}
		}
		return false
	}
	deniedIn := func(target int, k int64) bool { return deniedBy(target, -1, k) }
	// decidedIn counts the answers to target, admitted or denied, decided
	// wholly within window k.
	decidedIn := func(target int, k int64) int {
		n := 0
		for _, s := range samples {
			if sp := s.span(); s.target == target && s.err == nil && sp.lo/P == k && sp.hi/P == k {
				n++
			}
		}
		return n
	}

	// The local policy, in the whole windows of the outage: each process
	// limits alone to limit/distProcs a window; exactly in the windows
	// where it denied (its demand reached the bound: on a loaded machine a
	// process may get too few requests in a window to reach it).
	local := slices.Index(domains, "local")
	end := restarting.UnixNano() / P * P
	if end <= settled {
		t.Fatal("no whole window of the outage")
	}
	for pi := range distProcs {
		spans := admitted(local, pi)
		if n, k := overflow(within(spans, settled, end), P, perNode); n > 0 {
			t.Errorf("local policy, process %d: %d admitted beyond %d a window, the first by %s", pi, n, perNode, at((k+1)*P))
		}
		for k := settled / P; k < end/P; k++ {
			if got := meeting(spans, k); got < perNode && deniedBy(local, pi, k) {
				t.Errorf("local policy, process %d, window at %s: %d admitted, %d due", pi, at(k*P), got, perNode)
			}
		}
	}
	var each []int
	for pi := range distProcs {
		each = append(each, len(within(admitted(local, pi), settled, end)))
	}
	t.Logf("local policy: the processes admitted %v within the %d whole windows of the outage (those that may have been decided before left out); at most %d each (%d/%d a window)",
		each, (end-settled)/P, perNode*(end-settled)/P, limit, distProcs)

	// Limited by Redis at the limit of the whole cluster, in the whole
	// windows before the outage and after every process found Redis back;
	// give or take the requests the failure policy answered meanwhile (see
	// answered).
	redisLimited := func(when string, from, to int64, failed []int64) {
		for di, dom := range domains {
			spans := admitted(di, -1)
			if n, k := overflow(within(spans, from, to), P, limit); n > failed[di] {
				t.Errorf("%s, %s: %d admitted beyond %d a window over all processes, the first by %s; the failure policy answered %d",
					dom, when, n, limit, at((k+1)*P), failed[di])
			}
			for k := from / P; k < to/P; k++ {
				if got := meeting(spans, k); got+failed[di] < limit {
					t.Errorf("%s, %s, window at %s: %d admitted over all processes, %d due; the failure policy answered %d",
						dom, when, at(k*P), got, limit, failed[di])
				}
				// Limited: it denied, where more than the limit was
				// decided wholly within the window. On a machine that
				// stalled the clients (seen beside a CPU hog, in the
				// first window after the recovery) fewer were, and
				// whether it denied tests the machine, not the limiter.
				if asked := decidedIn(di, k); !deniedIn(di, k) && failed[di] == 0 && asked > limit {
					t.Errorf("%s, %s, window at %s: %d decided wholly within it, no OVER_LIMIT: not limited", dom, when, at(k*P), asked)
				} else if asked <= limit {
					t.Logf("%s, %s, window at %s: only %d decided wholly within it: whether it was limited is not checked", dom, when, at(k*P), asked)
				}
			}
		}
	}
	redisLimited("before the outage", start.UnixNano()/P*P, read.UnixNano()/P*P, failedBefore)
	last := slices.MaxFunc(samples, func(a, b sample) int { return cmp.Compare(a.send, b.send) }).send
	to := last / P * P
	if to-from < 2*P {
		t.Errorf("only %d whole windows after the recovery", (to-from)/P)
	}
	redisLimited("after the outage", from, to, failedAfter)
	// Whatever the failure policy answered meanwhile, Redis decides
	// again: only it denies fail_open's key, and only it admits
	// fail_closed's.
	var openDenied, closedAdmitted bool
	for _, s := range samples {
		if s.err != nil || s.send < from {
			continue
		}
		openDenied = openDenied || domains[s.target] == "open" && !s.ok()
		closedAdmitted = closedAdmitted || domains[s.target] == "closed" && s.ok()
	}
	if !openDenied || !closedAdmitted {
		t.Errorf("after the outage: fail_open's key denied: %v; fail_closed's admitted: %v; want both, from Redis", openDenied, closedAdmitted)
	}

	for i, p := range procs {
		for di, dom := range domains {
			if n := p.metricSum("sluice_failure_policy_total", `domain="`+dom+`"`, `policy="`+policies[di]+`"`); n == 0 {
				t.Errorf("process %d: no request of domain %s answered by %s", i, dom, policies[di])
			}
		}
		t.Logf("process %d: %d requests answered by the local cache", i, metricInt(p, "sluice_local_cache_hits_total"))
	}
}

// TestRedisE2EChecks holds the checks of the distributed runs to a few
// cases small enough to follow by hand.
func TestRedisE2EChecks(t *testing.T) {
	for _, c := range []struct {
		spans []span
		L, n  int64
	}{
		{[]span{{0, 9}, {1, 9}, {2, 9}}, 2, 1},                       // three in one window of two
		{[]span{{8, 12}, {9, 11}, {18, 21}, {19, 22}}, 2, 0},         // straddlers fit either side
		{[]span{{8, 12}, {8, 12}, {8, 12}}, 1, 1},                    // two windows for three
		{[]span{{0, 5}, {8, 12}, {9, 13}, {10, 15}, {25, 28}}, 2, 0}, // the greedy must keep window 1 for the last two
	} {
		if n, _ := overflow(c.spans, 10, c.L); n != c.n {
			t.Errorf("overflow(%v, 10, %d) = %d, want %d", c.spans, c.L, n, c.n)
		}
	}

	ms := int64(time.Millisecond)
	base := 1_000_000*int64(time.Second) + 100*ms // 100ms into a window
	req := func(t int64, ok bool) sample {
		s := sample{send: base + t*ms, recv: base + t*ms + ms}
		s.code = rlsv3.RateLimitResponse_OK
		if !ok {
			s.code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		return s
	}
	fixed := limitSpec{alg: "fixed_window", n: 2, period: time.Second}
	if v := checkKey(fixed, []sample{req(0, true), req(10, true), req(20, true)}, 0, false); len(v.over) == 0 {
		t.Error("fixed window: three admitted in a window of two, not noticed")
	}
	if v := checkKey(fixed, []sample{req(0, true), req(10, false)}, 0, false); len(v.under) == 0 {
		t.Error("fixed window: a denial after one admitted of two, not noticed")
	}
	if v := checkKey(fixed, []sample{req(0, true), req(10, true), req(20, false), req(1000, true)}, 0, false); len(v.over)+len(v.under) > 0 {
		t.Errorf("fixed window: a correct run found wrong: %v %v", v.over, v.under)
	}
	// GCRA, 10 a second (one every 100ms), burst 3.
	gcra := limitSpec{alg: "gcra", n: 10, period: time.Second, burst: 3}
	run := []sample{req(0, true), req(1, true), req(2, true), req(3, false), req(101, true), req(150, false), req(201, true), req(250, false)}
	if v := checkKey(gcra, run, 0, false); len(v.over)+len(v.under) > 0 || v.floor != 5 {
		t.Errorf("gcra: a correct run found wrong: %v %v, floor %d", v.over, v.under, v.floor)
	}
	if v := checkKey(gcra, append(run, req(260, true)), 0, false); len(v.over) == 0 {
		t.Error("gcra: one admitted too early, not noticed")
	}
	if v := checkKey(gcra, append(slices.Clone(run[:5]), req(420, false)), 0, false); len(v.under) == 0 {
		t.Error("gcra: a denial with tokens left, not noticed")
	}

	for _, c := range []struct {
		name       string
		spec       limitSpec
		good       []sample
		over, deny []sample // added to good[:cut]: one too many admitted, a denial with room left
		cut        int
	}{
		{
			name: "discrete", cut: 3, // burst 2, a token at every 100ms tick
			spec: limitSpec{alg: "token_bucket", n: 10, period: time.Second, burst: 2, interval: 100 * time.Millisecond},
			good: []sample{req(10, true), req(11, true), req(12, false), req(101, true), req(150, false), req(201, true), req(250, false)},
			over: []sample{req(13, true), req(14, true)},
			deny: []sample{req(420, false)},
		},
		{
			name: "sliding log", cut: 2, // 2 a second
			spec: limitSpec{alg: "sliding_log", n: 2, period: time.Second},
			good: []sample{req(0, true), req(10, true), req(20, false), req(1005, true), req(1006, false)},
			over: []sample{req(990, true)},
			deny: []sample{req(20, false), req(1020, false)},
		},
		{
			name: "sliding window", cut: 3, // 2 a second; the next window starts at 900ms
			spec: limitSpec{alg: "sliding_window", n: 2, period: time.Second},
			good: []sample{req(0, true), req(10, true), req(20, false), req(910, false), req(1410, true), req(1420, false)},
			over: []sample{req(950, true)},
			deny: []sample{req(1850, false)},
		},
	} {
		if v := checkKey(c.spec, c.good, 0, false); len(v.over)+len(v.under) > 0 || int64(v.admitted) < v.floor {
			t.Errorf("%s: a correct run found wrong: %v %v, floor %d", c.name, v.over, v.under, v.floor)
		}
		if v := checkKey(c.spec, slices.Concat(c.good[:c.cut], c.over), 0, false); len(v.over) == 0 {
			t.Errorf("%s: too many admitted, not noticed", c.name)
		}
		if v := checkKey(c.spec, slices.Concat(c.good[:c.cut], c.deny), 0, false); len(v.under) == 0 {
			t.Errorf("%s: a denial with room left, not noticed", c.name)
		}
	}
}

// TestServeRedisNeverReached starts sluice serve on a Redis that is not
// running: it says so at once on an ERROR line, is not ready until Redis
// is reached (the failure policy answers meanwhile), and becomes ready
// when Redis comes up.
func TestServeRedisNeverReached(t *testing.T) {
	beside(t)
	sluiceBinary(t) // skips under -short
	srv := redistest.Standalone(t)
	srv.Kill()
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	p := startSluice(t, nil, "--config", rules, "--store", "redis", "--redis-url", srv.URL(), "--debug-addr", "")
	if log := p.log(); !strings.Contains(log, `"level":"ERROR","msg":"Redis is not reachable`) {
		t.Errorf("no ERROR line about Redis at start:\n%s", log)
	}
	code, body, _ := p.http("GET", "/readyz", "")
	if code != 503 || !strings.Contains(body, "store not reached since start") {
		t.Errorf("/readyz with Redis never reached: %d %q", code, body)
	}
	// The policy (local) answers meanwhile.
	if code, body, _ := p.http("POST", "/json", `{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}`); code != 200 {
		t.Errorf("/json with Redis never reached: %d %q", code, body)
	}
	srv.Restart()
	deadline := time.Now().Add(e2eWait)
	for {
		code, body, _ := p.http("GET", "/readyz", "")
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready %s after Redis came up: %d %q", e2eWait, code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestServeE2EHittersCluster: two serve nodes on one real redis-server,
// each seeing half of mallory's denials: either node's
// /hitters?scope=cluster shows them all, within a few seconds (each node
// publishes its top keys every 2 s).
func TestServeE2EHittersCluster(t *testing.T) {
	beside(t)
	srv := redistest.Standalone(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, `domain: api
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
`)
	args := []string{"--config", rules, "--store", "redis", "--redis-url", srv.URL(), "--redis-prefix", t.Name() + ":"}
	nodes := []*proc{startSluice(t, nil, args...), startSluice(t, nil, args...)}
	for i := range 60 {
		nodes[i%2].must("api", desc("user", "mallory"))
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body, _ := httpDo(t, "GET", "http://"+nodes[0].dbg+"/hitters?scope=cluster&kind=denials", "")
		if code != 200 {
			t.Fatalf("/hitters?scope=cluster: %d %s", code, body)
		}
		var reports []struct {
			Rule string
			Hits uint64
			Top  []struct {
				Key   string
				Count uint64
			}
		}
		if err := json.Unmarshal([]byte(body), &reports); err != nil {
			t.Fatal(err)
		}
		if len(reports) == 1 && reports[0].Hits == 50 && len(reports[0].Top) > 0 && reports[0].Top[0].Key == "user=mallory" && reports[0].Top[0].Count == 50 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster's denials: %s, want user=mallory with 50 (25 on each node)", body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if code, _, _ := httpDo(t, "GET", "http://"+nodes[0].dbg+"/hitters?scope=galaxy", ""); code != 400 {
		t.Errorf("scope=galaxy: %d, want 400", code)
	}
	// The dashboard's offenders are the cluster's too: either node shows
	// all 50 of mallory's denials, while its own series counts its half.
	for i, n := range nodes {
		code, body, _ := httpDo(t, "GET", "http://"+n.dbg+"/dashboard/data", "")
		var d struct {
			Scope string
			Rules []struct {
				Rule         string
				Series       []struct{ Allowed, Denied int64 }
				TopOffenders []struct {
					Key   string
					Count uint64
				} `json:"top_offenders"`
			}
		}
		if err := json.Unmarshal([]byte(body), &d); code != 200 || err != nil {
			t.Fatalf("node %d: /dashboard/data: %d %v %s", i, code, err, body)
		}
		if d.Scope != "cluster (2 nodes)" || len(d.Rules) != 1 || len(d.Rules[0].TopOffenders) == 0 {
			t.Fatalf("node %d: dashboard data %s", i, body)
		}
		if o := d.Rules[0].TopOffenders[0]; o.Key != "user=mallory" || o.Count != 50 {
			t.Errorf("node %d: top offender %+v, want user=mallory with the cluster's 50", i, o)
		}
		var denied int64
		for _, p := range d.Rules[0].Series {
			denied += p.Denied
		}
		if denied != 25 {
			t.Errorf("node %d: its series counts %d denials, want its own 25", i, denied)
		}
	}
}

// TestProxyE2EHittersCluster: two sluice proxy processes on one real
// Redis share their top keys as serve's nodes do: either proxy's
// dashboard shows the cluster's offenders, merged, and its own series.
func TestProxyE2EHittersCluster(t *testing.T) {
	beside(t)
	srv := redistest.Standalone(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, strings.Replace(proxyRules, "LOGIN", "2", 1))
	args := []string{"--config", rules, "--upstream", up.URL, "--store", "redis", "--redis-url", srv.URL(), "--redis-prefix", t.Name() + ":"}
	nodes := []*proc{startProxy(t, args...), startProxy(t, args...)}
	// One client, alternately through each proxy: 2 allowed by the
	// limit both count in Redis, then 4 denied, 2 by each proxy.
	for i, want := range []int{200, 200, 429, 429, 429, 429} {
		if code, _, body := fetch(t, "POST", "http://"+nodes[i%2].addrs["proxy"]+"/login"); code != want {
			t.Fatalf("login %d through proxy %d: %d %q, want %d", i, i%2, code, body, want)
		}
	}
	for i, n := range nodes {
		var d struct {
			Scope string
			Rules []struct {
				Rule         string
				Series       []struct{ Denied int64 }
				TopOffenders []struct {
					Key   string
					Count uint64
				} `json:"top_offenders"`
			}
		}
		var body string
		poll(t, fmt.Sprintf("proxy %d's dashboard showing the cluster's offenders", i), func() bool {
			var code int
			code, _, body = fetch(t, "GET", "http://"+n.addrs["admin"]+"/dashboard/data")
			if code != 200 || json.Unmarshal([]byte(body), &d) != nil {
				t.Fatalf("proxy %d: /dashboard/data: %d %s", i, code, body)
			}
			for _, r := range d.Rules {
				if r.Rule == "api.login" && len(r.TopOffenders) > 0 && r.TopOffenders[0].Count == 4 {
					return d.Scope == "cluster (2 nodes)"
				}
			}
			return false
		})
		for _, r := range d.Rules {
			if r.Rule != "api.login" {
				continue
			}
			if o := r.TopOffenders[0]; o.Key != "login=127.0.0.1" {
				t.Errorf("proxy %d: top offender %+v, want login=127.0.0.1 with the cluster's 4", i, o)
			}
			var denied int64
			for _, p := range r.Series {
				denied += p.Denied
			}
			if denied != 2 {
				t.Errorf("proxy %d: its series counts %d denials, want its own 2", i, denied)
			}
		}
	}
}

// TestServeRedisIdleReadiness: a node that decides nothing says within a
// few seconds that its Redis died, and that it came back: /readyz's store
// line and sluice_store_up follow Redis, not the requests that happen to
// fail (the store probes Redis while no request does).
func TestServeRedisIdleReadiness(t *testing.T) {
	beside(t)
	sluiceBinary(t) // skips under -short
	srv := redistest.Standalone(t)
	rules := writeFile(t, "rules.yaml", "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")
	p := startSluice(t, nil, "--config", rules, "--store", "redis", "--redis-url", srv.URL())
	state := func() (string, string) {
		_, body, _ := p.http("GET", "/readyz", "")
		return body, p.metric("sluice_store_up")
	}
	waitState := func(what, line, up string) {
		t.Helper()
		redistest.WaitFor(t, what, func() bool {
			body, u := state()
			return strings.Contains(body, line) && u == up
		})
	}
	waitState("the node up", "store: up", "1")
	srv.Kill()
	waitState("an idle node to report its Redis down", "store: down", "0")
	srv.Restart()
	waitState("an idle node to report its Redis back", "store: up", "1")
}

// TestServeE2ESentinelAuth: Sentinels with a password of their own and a
// master with another, set as envoy-rl sets them (REDIS_TYPE=sentinel,
// REDIS_URL=master,sentinels, REDIS_AUTH for the master,
// REDIS_SENTINEL_AUTH for the Sentinels): sluice finds the master through
// the Sentinels and decides there; neither password shows in the log.
func TestServeE2ESentinelAuth(t *testing.T) {
	beside(t)
	ss := redistest.Sentinel(t, redistest.WithPassword("master-pw-1"), redistest.WithSentinelPassword("sentinel-pw-2"))
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, dayRule("sentinel", "k", 1))
	p := startSluice(t, []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=sentinel", "REDIS_URL=" + ss.MasterName + "," + strings.Join(ss.Addrs(), ","),
		"REDIS_AUTH=master-pw-1", "REDIS_SENTINEL_AUTH=sentinel-pw-2", "CACHE_KEY_PREFIX=" + t.Name() + ":"},
		"--config", rules, "--local-cache-size", "0")
	poll(t, "ready with Redis", func() bool {
		code, _, _ := p.http("GET", "/readyz", "")
		return code == 200
	})
	for i, want := range []string{"OK:OK", "OVER_LIMIT:OVER_LIMIT"} {
		if got := codesOf(p.must("sentinel", desc("k", "v"))); got != want {
			t.Errorf("request %d: %s, want %s", i+1, got, want)
		}
	}
	if keys, _ := ss.Master().Cmd("KEYS", t.Name()+":*").([]any); len(keys) == 0 {
		t.Errorf("no counter on the master under %s:*: the decisions were not made there", t.Name())
	}
	if log := p.log(); strings.Contains(log, "master-pw-1") || strings.Contains(log, "sentinel-pw-2") {
		t.Errorf("a password in the log:\n%s", log)
	}
}
