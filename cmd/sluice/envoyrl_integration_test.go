package main

// envoyproxy/ratelimit's test/integration/integration_test.go (and its
// xds_sotw_integration_test.go) at f2fb157, translated to the real sluice
// binary: the same rules files (testdata/envoyrl/integration, copied
// verbatim, in envoy-rl's runtime layout), the same environment as the
// settings envoy-rl's test builds (RUNTIME_*, BACKEND_TYPE, REDIS_*,
// REDIS_PERSECOND_*, LOCAL_CACHE_SIZE_IN_BYTES, CACHE_KEY_PREFIX,
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, CONFIG_TYPE ...), real
// redis-servers (standalone, with a password, with TLS, a Cluster, a
// Sentinel setup) and the same requests and expected answers, field for
// field: the overall code, each status's code, current_limit,
// limit_remaining and duration_until_reset (whole seconds, in the range
// envoy-rl's arithmetic gives), with no other field set.
//
// envoy-rl's test reads its stats from its in-process store (with
// USE_STATSD=false); here they are read where a deployment reads them: a
// real statsd listener (USE_STATSD=true, STATSD_HOST, STATSD_PORT, over
// TCP as envoy-rl sends), after every request as envoy-rl's test reads
// them, with near_limit and within_limit too. The envoy-rl test's fixed
// ports (PORT, GRPC_PORT, DEBUG_PORT) are left to the harness, which picks
// free ones.
//
// Windows: a run of requests whose answers depend on one window (key2's
// minute, key3's hour, a per-second burst) is checked request by request,
// and a run that a window boundary splits (the clock before the run and
// after a request in different windows) is started again, with fresh
// values, in the next window, rather than asserted.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

const (
	erlPassword   = "password123"
	erlXDSNode    = "init-test-node"
	erlStatPrefix = "ratelimit.service.rate_limit."
	erlLoadStat   = "ratelimit.service.config_load_success"
	erlFlush      = 20 * time.Millisecond
	erlAttempts   = 4 // runs of one window before giving up
)

type rlUnit = rlsv3.RateLimitResponse_RateLimit_Unit

const (
	erlSecond = rlsv3.RateLimitResponse_RateLimit_SECOND
	erlMinute = rlsv3.RateLimitResponse_RateLimit_MINUTE
	erlHour   = rlsv3.RateLimitResponse_RateLimit_HOUR
	erlDay    = rlsv3.RateLimitResponse_RateLimit_DAY
)

var erlUnitSeconds = map[rlUnit]int64{erlSecond: 1, erlMinute: 60, erlHour: 3600, erlDay: 86400}

// erlRuntimeRoot is envoy-rl's runtime/current, copied.
func erlRuntimeRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("testdata", "envoyrl", "integration", "runtime", "current"))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// erlSettings is the environment of envoy-rl's defaultSettings and
// makeSimpleRedisSettings, but the Redis addresses: the runtime layout,
// tcp sockets, the per-second Redis switch, the local cache size, the
// redis backend.
func erlSettings(root string, perSecond bool, localCacheSize int) []string {
	return []string{
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_APPDIRECTORY=config",
		"REDIS_PERSECOND_SOCKET_TYPE=tcp", "REDIS_SOCKET_TYPE=tcp",
		"REDIS_PERSECOND=" + strconv.FormatBool(perSecond),
		"LOCAL_CACHE_SIZE_IN_BYTES=" + strconv.Itoa(localCacheSize),
		"BACKEND_TYPE=redis",
	}
}

// erlRedis is where a variant's Redis settings point.
type erlRedis struct {
	env  []string // REDIS_URL, REDIS_PERSECOND_URL, ...
	args []string // --redis-prefix, for setups several variants share
	// The standalone servers of REDIS_URL and REDIS_PERSECOND_URL; nil for
	// a Cluster or a Sentinel setup.
	main, perSecond *redistest.Server
}

// erlStandalone starts the two redis-servers of makeSimpleRedisSettings
// (REDIS_URL and REDIS_PERSECOND_URL), with the password of
// testBasicConfigAuth and the TLS of testBasicConfigAuthTLS when asked.
func erlStandalone(t *testing.T, password string, useTLS bool, more ...redistest.Option) erlRedis {
	t.Helper()
	opts := more
	if password != "" {
		opts = append(opts, redistest.WithPassword(password))
	}
	if useTLS {
		opts = append(opts, redistest.WithTLS())
	}
	main, perSecond := redistest.Standalone(t, opts...), redistest.Standalone(t, opts...)
	r := erlRedis{main: main, perSecond: perSecond, env: []string{
		"REDIS_URL=localhost:" + strconv.Itoa(main.Port()),
		"REDIS_PERSECOND_URL=localhost:" + strconv.Itoa(perSecond.Port()),
	}}
	if password != "" {
		r.env = append(r.env, "REDIS_AUTH="+password, "REDIS_PERSECOND_AUTH="+password)
	}
	if useTLS {
		// envoy-rl's test trusts its stunnel's certificate; sluice trusts
		// the CA named by envoy-rl's REDIS_TLS_CACERT.
		r.env = append(r.env, "REDIS_TLS=true", "REDIS_PERSECOND_TLS=true", "REDIS_TLS_CACERT="+main.CAFile)
	}
	return r
}

// erlKeys lists the keys of a standalone server.
func erlKeys(t *testing.T, s *redistest.Server) []string {
	t.Helper()
	v, _ := s.Cmd("KEYS", "*").([]any)
	keys := make([]string, 0, len(v))
	for _, k := range v {
		if s, ok := k.(string); ok {
			keys = append(keys, s)
		}
	}
	return keys
}

// erlRun is one running sluice serve of a translated test, with the statsd
// listener it sends to and the stats expected there.
type erlRun struct {
	t    *testing.T
	p    *proc
	l    *statsdListener
	want map[string]uint64 // stat name → expected count
}

// erlStart starts sluice serve with env (plus statsd to a real listener)
// and args.
func erlStart(t *testing.T, env []string, args ...string) *erlRun {
	t.Helper()
	l, addr := tcpStatsd(t)
	host, port, _ := net.SplitHostPort(addr)
	env = append(append([]string(nil), env...), "USE_STATSD=true", "STATSD_HOST="+host, "STATSD_PORT="+port,
		"STATS_FLUSH_INTERVAL="+erlFlush.String())
	return &erlRun{t: t, p: startSluice(t, env, args...), l: l, want: map[string]uint64{}}
}

// waitRules waits until /readyz says ready: with rules from xDS, once the
// first rules have arrived (envoy-rl's test waits for its gRPC port, and
// its xDS rules arrive meanwhile). With xDS it also waits for the server's
// log of the rules put in force: /readyz can say ready a moment before
// (xdsrules closes First before OnLoad puts the rules in force; see the
// report of this translation).
func (r *erlRun) waitRules(env []string) {
	r.t.Helper()
	poll(r.t, "/readyz 200", func() bool {
		code, _, _ := r.p.http("GET", "/readyz", "")
		return code == 200
	})
	for _, e := range env {
		if e == "CONFIG_TYPE=GRPC_XDS_SOTW" {
			r.p.waitLog("rate limit configuration loaded", `"domains":2`)
		}
	}
}

// call sends one request and notes the clock around it.
func (r *erlRun) call(domain string, descs ...*ratelimitv3.RateLimitDescriptor) (resp *rlsv3.RateLimitResponse, before, after time.Time) {
	r.t.Helper()
	before = time.Now()
	resp = r.p.must(domain, descs...)
	return resp, before, time.Now()
}

// erlStatus is one expected descriptor status; n == 0 is a status without
// a limit (a descriptor no rule matches: OK, nothing else).
type erlStatus struct {
	code      rlsv3.RateLimitResponse_Code
	n         uint32
	unit      rlUnit
	remaining uint32
}

func erlOK(n uint32, unit rlUnit, remaining uint32) erlStatus {
	return erlStatus{rlsv3.RateLimitResponse_OK, n, unit, remaining}
}

func erlOver(n uint32, unit rlUnit) erlStatus {
	return erlStatus{rlsv3.RateLimitResponse_OVER_LIMIT, n, unit, 0}
}

var erlNoLimit = erlStatus{code: rlsv3.RateLimitResponse_OK}

// erlResetRange is the duration_until_reset envoy-rl answers for a window
// of unit asked between before and after: unit - now%unit in whole
// seconds, now read once in between; any in 1..unit if a window ended
// meanwhile.
func erlResetRange(unit rlUnit, before, after time.Time) (lo, hi int64) {
	u := erlUnitSeconds[unit]
	b, a := before.Unix(), after.Unix()
	if b/u != a/u {
		return 1, u
	}
	return u - a%u, u - b%u
}

// erlCheck compares resp with envoy-rl's expected response (its
// common.AssertProtoEqual of the whole response): the overall code and
// the statuses, the reset in whole seconds within erlResetRange.
func erlCheck(resp *rlsv3.RateLimitResponse, before, after time.Time, overall rlsv3.RateLimitResponse_Code, want ...erlStatus) error {
	exp := &rlsv3.RateLimitResponse{OverallCode: overall}
	var probs []string
	for i, w := range want {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: w.code}
		if w.n != 0 {
			st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: w.n, Unit: w.unit}
			st.LimitRemaining = w.remaining
			got := resp.GetStatuses()
			var secs int64
			if i < len(got) {
				secs = got[i].GetDurationUntilReset().GetSeconds()
			}
			if lo, hi := erlResetRange(w.unit, before, after); secs < lo || secs > hi {
				probs = append(probs, fmt.Sprintf("status %d: duration_until_reset %ds, want %d..%d", i, secs, lo, hi))
			}
			st.DurationUntilReset = &durationpb.Duration{Seconds: secs}
		}
		exp.Statuses = append(exp.Statuses, st)
	}
	if !proto.Equal(exp, resp) {
		probs = append(probs, fmt.Sprintf("answer\n  %s\nwant\n  %s", prototext.Format(resp), prototext.Format(exp)))
	}
	if len(probs) > 0 {
		return fmt.Errorf("%s", strings.Join(probs, "; "))
	}
	return nil
}

// expect checks one answer, failing the test on a difference.
func (r *erlRun) expect(what string, resp *rlsv3.RateLimitResponse, before, after time.Time, overall rlsv3.RateLimitResponse_Code, want ...erlStatus) {
	r.t.Helper()
	if err := erlCheck(resp, before, after, overall, want...); err != nil {
		r.t.Errorf("%s: %v", what, err)
	}
}

// hits adds one request's expected stats to the stats key key.
func (r *erlRun) hits(key string, total, within, near, over uint64) {
	for stat, n := range map[string]uint64{"total_hits": total, "within_limit": within, "near_limit": near, "over_limit": over} {
		r.want[erlStatPrefix+key+"."+stat] += n
	}
}

// stats waits until the statsd listener has received every expected count
// (and no more: the counts only grow, and the next wait sees any excess).
func (r *erlRun) stats(what string) {
	r.t.Helper()
	deadline := time.Now().Add(e2eWait)
	for {
		var diff []string
		for name, n := range r.want {
			if got := r.l.get(name); got != n {
				diff = append(diff, fmt.Sprintf("%s = %d, want %d", name, got, n))
			}
		}
		if len(diff) == 0 {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: stats at the statsd listener after %s: %s", what, e2eWait, strings.Join(diff, "; "))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rebase, after a run a window boundary split, takes what the listener
// counted for keys as expected, once the total has arrived with the hits
// of the run not yet expected (hits per key).
func (r *erlRun) rebase(hits map[string]uint64) {
	r.t.Helper()
	for key, n := range hits {
		r.want[erlStatPrefix+key+".total_hits"] += n
	}
	deadline := time.Now().Add(e2eWait)
	for key := range hits {
		name := erlStatPrefix + key + ".total_hits"
		for r.l.get(name) != r.want[name] {
			if time.Now().After(deadline) {
				r.t.Fatalf("%s = %d, want %d", name, r.l.get(name), r.want[name])
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	time.Sleep(5 * erlFlush) // the other counters of the same requests
	for key := range hits {
		for _, stat := range []string{"within_limit", "near_limit", "over_limit"} {
			name := erlStatPrefix + key + "." + stat
			r.want[name] = r.l.get(name)
		}
	}
}

// loads returns config_load_success once it has counted the load in force
// (at least one) and stays put for a few flushes.
func (r *erlRun) loads() uint64 {
	r.t.Helper()
	poll(r.t, erlLoadStat+" counted", func() bool { return r.l.get(erlLoadStat) > 0 })
	for {
		n := r.l.get(erlLoadStat)
		time.Sleep(5 * erlFlush)
		if r.l.get(erlLoadStat) == n {
			return n
		}
	}
}

// reloaded waits, as envoy-rl's waitForConfigReload, until
// config_load_success has grown past before, and returns it.
func (r *erlRun) reloaded(before uint64) uint64 {
	r.t.Helper()
	poll(r.t, fmt.Sprintf("%s > %d", erlLoadStat, before), func() bool { return r.l.get(erlLoadStat) > before })
	return r.loads()
}

// erlOneWindow runs run until one run falls in one window of unit (a
// second: from the start of a fresh second): run reports false when a request of it ended in
// another window (the run then counts for nothing, and runs again in the
// next window, with fresh values).
func erlOneWindow(t *testing.T, unit rlUnit, run func(attempt int, same func(time.Time) bool) bool) {
	t.Helper()
	u := erlUnitSeconds[unit]
	for attempt := range erlAttempts {
		if unit == erlSecond {
			// At the start of a fresh second.
			time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
		}
		w := time.Now().Unix() / u
		if run(attempt, func(at time.Time) bool { return at.Unix()/u == w }) {
			return
		}
		t.Logf("attempt %d crossed a %s boundary: again in the next window", attempt+1, unit)
	}
	t.Fatalf("%d attempts each crossed a %s boundary", erlAttempts, unit)
}

// erlBasicBaseConfig translates envoy-rl's testBasicBaseConfig: the
// requests and answers of basic.yaml and another.yaml, with the _local
// keys when the variant has a local cache, and the stats of each key.
// envoy-rl's local cache stats (the gauges ratelimit.localcache.hitCount
// and missCount, and over_limit_with_local_cache) are not sent by sluice
// (docs/operations.md); its over_limit counts include the local cache's
// answers, as envoy-rl's does.
func erlBasicBaseConfig(t *testing.T, env []string, args []string, localCache bool) *erlRun {
	t.Helper()
	stop := false
	for _, e := range env {
		stop = stop || e == "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true"
	}
	k := func(key string) string {
		if localCache {
			return key + "_local"
		}
		return key
	}
	r := erlStart(t, env, args...)
	r.waitRules(env)
	OK, OVER := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT

	// A domain no rules file names: OK, no limit.
	resp, b, a := r.call("foo", desc(k("hello"), "world"))
	r.expect("foo hello=world", resp, b, a, OK, erlNoLimit)

	resp, b, a = r.call("basic", desc(k("key1"), "foo"))
	r.expect("basic key1=foo", resp, b, a, OK, erlOK(50, erlSecond, 49))
	r.hits("basic."+k("key1"), 1, 1, 0, 0)
	r.stats("after key1")

	// Over a minute limit with a random key: 20 OK, then OVER_LIMIT.
	key2 := "another." + k("key2")
	erlOneWindow(t, erlMinute, func(attempt int, same func(time.Time) bool) bool {
		v := strconv.FormatUint(rand.Uint64(), 10)
		for i := range 25 {
			resp, b, a := r.call("another", desc(k("key2"), v))
			if !same(a) {
				r.rebase(map[string]uint64{key2: 1})
				return false
			}
			if i < 20 {
				r.expect(fmt.Sprintf("key2 request %d", i+1), resp, b, a, OK, erlOK(20, erlMinute, uint32(20-(i+1))))
				near := uint64(0)
				if i+1 > 16 { // floor(20 * 0.8)
					near = 1
				}
				r.hits(key2, 1, 1, near, 0)
			} else {
				r.expect(fmt.Sprintf("key2 request %d", i+1), resp, b, a, OVER, erlOver(20, erlMinute))
				r.hits(key2, 1, 0, 0, 1)
			}
			r.stats(fmt.Sprintf("key2 request %d", i+1))
		}
		return true
	})

	// Two keys of one domain: key3's hour limit of 10 denies from the
	// 11th request; key2 goes on counting (20 - (i+1) left), or with
	// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT stays at 10 left.
	key3 := "another." + k("key3")
	erlOneWindow(t, erlMinute, func(attempt int, same func(time.Time) bool) bool {
		v := strconv.FormatUint(rand.Uint64(), 10)
		for i := range 15 {
			resp, b, a := r.call("another", desc(k("key2"), v), desc(k("key3"), v))
			if !same(a) {
				r.rebase(map[string]uint64{key2: 1, key3: 1})
				return false
			}
			left2 := uint32(20 - (i + 1))
			if i >= 10 && stop {
				left2 = 10
			}
			what := fmt.Sprintf("key2 and key3 request %d", i+1)
			if i < 10 {
				r.expect(what, resp, b, a, OK, erlOK(20, erlMinute, left2), erlOK(10, erlHour, uint32(10-(i+1))))
				near := uint64(0)
				if i+1 > 8 { // floor(10 * 0.8)
					near = 1
				}
				r.hits(key3, 1, 1, near, 0)
			} else {
				r.expect(what, resp, b, a, OVER, erlOK(20, erlMinute, left2), erlOver(10, erlHour))
				r.hits(key3, 1, 0, 0, 1)
			}
			// key2 is within its limit throughout (at most 15 of 20).
			r.hits(key2, 1, 1, 0, 0)
			r.stats(what)
		}
		return true
	})

	// duration_until_reset ticks down: key4's day limit asked twice, more
	// than a second apart (envoy-rl waits 2s; a little over 1s is enough
	// for whole seconds to differ).
	resp1, b1, a1 := r.call("another", desc(k("key4"), "durTest"))
	r.expect("key4 request 1", resp1, b1, a1, OK, erlOK(20, erlDay, 19))
	time.Sleep(1100 * time.Millisecond)
	resp2, b2, a2 := r.call("another", desc(k("key4"), "durTest"))
	r.expect("key4 request 2", resp2, b2, a2, OK, erlOK(20, erlDay, 18))
	d1, d2 := resp1.GetStatuses()[0].GetDurationUntilReset().GetSeconds(), resp2.GetStatuses()[0].GetDurationUntilReset().GetSeconds()
	if b1.Unix()/86400 == a2.Unix()/86400 && d2 >= d1 {
		t.Errorf("key4: duration_until_reset %ds, then %ds more than a second later", d1, d2)
	}
	r.hits("another."+k("key4"), 2, 2, 0, 0)
	r.stats("after key4")
	return r
}

// erlPerSecond checks what sluice does with envoy-rl's per-second Redis
// (REDIS_PERSECOND=true with its REDIS_PERSECOND_* settings): it names
// them at start as settings with no effect, and keeps per-second limits
// on REDIS_URL's Redis with the others. The answers are envoy-rl's: 50
// requests on key1 in one second are OK with 49..0 left and the 51st is
// OVER_LIMIT (this burst is sluice's own addition: envoy-rl's test sends
// one request to a per-second limit). The burst is sent at the start of a
// second, at once, and again in the next second if it did not fit in one.
func erlPerSecond(t *testing.T, r *erlRun, rd erlRedis, localCache bool) {
	t.Helper()
	line := r.p.waitLog("envoyproxy/ratelimit settings with no effect in sluice")
	for _, v := range []string{"REDIS_PERSECOND ", "REDIS_PERSECOND_URL", "REDIS_PERSECOND_SOCKET_TYPE"} {
		if !strings.Contains(line, v) {
			t.Errorf("the start warning does not name %s: %s", v, line)
		}
	}
	key1 := "key1"
	if localCache {
		key1 += "_local"
	}
	erlOneWindow(t, erlSecond, func(attempt int, same func(time.Time) bool) bool {
		start := time.Now()
		v := fmt.Sprintf("burst-%d-%d", attempt, rand.Uint64())
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			resps []*rlsv3.RateLimitResponse
		)
		for range 51 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
				defer cancel()
				resp, err := rlsv3.NewRateLimitServiceClient(r.p.conn).ShouldRateLimit(ctx,
					&rlsv3.RateLimitRequest{Domain: "basic", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(key1, v)}})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Errorf("burst: %v", err)
					return
				}
				resps = append(resps, resp)
			}()
		}
		wg.Wait()
		end := time.Now()
		if !same(end) {
			r.rebase(map[string]uint64{"basic." + key1: 51})
			return false
		}
		left := map[uint32]bool{}
		over := 0
		for _, resp := range resps {
			if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
				over++
				r.expect("the 51st of the burst", resp, start, end, rlsv3.RateLimitResponse_OVER_LIMIT, erlOver(50, erlSecond))
				continue
			}
			n := resp.GetStatuses()[0].GetLimitRemaining()
			left[n] = true
			r.expect("a burst request", resp, start, end, rlsv3.RateLimitResponse_OK, erlOK(50, erlSecond, n))
		}
		if over != 1 || len(left) != 50 {
			t.Errorf("burst of 51 in one second: %d OVER_LIMIT, %d distinct remaining of the OK; want 1 and 50 (49..0)", over, len(left))
		}
		r.hits("basic."+key1, 51, 50, 10, 1)
		r.stats("after the burst")
		return true
	})
	if rd.perSecond != nil {
		if keys := erlKeys(t, rd.perSecond); len(keys) != 0 {
			t.Errorf("REDIS_PERSECOND_URL's Redis has keys %v; sluice keeps every limit on REDIS_URL's", keys)
		}
		if len(erlKeys(t, rd.main)) == 0 {
			t.Error("REDIS_URL's Redis has no keys")
		}
	}
}

// erlVariant is one settings variant of envoy-rl's TestBasicConfig and
// its kin.
type erlVariant struct {
	name       string
	perSecond  bool
	localCache int
	extra      []string // more of the environment
}

// erlRedisVariants are the variants of envoy-rl's TestBasicAuthConfig,
// TestBasicAuthConfigWithRedisCluster, ...Sentinel and
// TestBasicTLSConfig (their names, with "Auth" or "TLS" in them).
func erlRedisVariants(kind string) []erlVariant {
	return []erlVariant{
		{name: "WithoutPerSecondRedis" + kind},
		{name: "WithPerSecondRedis" + kind, perSecond: true},
		{name: "WithoutPerSecondRedis" + kind + "WithLocalCache", localCache: 1000},
		{name: "WithPerSecondRedis" + kind + "WithLocalCache", perSecond: true, localCache: 1000},
	}
}

// run runs one variant of testBasicBaseConfig on rd.
func (v erlVariant) run(t *testing.T, root string, rd erlRedis) *erlRun {
	t.Helper()
	env := append(erlSettings(root, v.perSecond, v.localCache), rd.env...)
	env = append(env, v.extra...)
	r := erlBasicBaseConfig(t, env, rd.args, v.localCache > 0)
	if v.perSecond {
		erlPerSecond(t, r, rd, v.localCache > 0)
	}
	return r
}

// TestEnvoyRLIntegrationBasicConfig translates envoy-rl's TestBasicConfig
// (test/integration/integration_test.go): testBasicConfig on a standalone
// redis-server, each of its nine variants on its own pair of servers
// (REDIS_URL, REDIS_PERSECOND_URL). WithoutPerSecondRedisWithCachePrefix
// also checks that every key sluice writes starts with CACHE_KEY_PREFIX.
func TestEnvoyRLIntegrationBasicConfig(t *testing.T) {
	t.Parallel() // not beside: its subtests are, each in a place of its own
	root := erlRuntimeRoot(t)
	stop := []string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true"}
	for _, v := range []erlVariant{
		{name: "WithoutPerSecondRedis"},
		{name: "WithPerSecondRedis", perSecond: true},
		{name: "WithoutPerSecondRedisWithLocalCache", localCache: 1000},
		{name: "WithPerSecondRedisWithLocalCache", perSecond: true, localCache: 1000},
		{name: "WithoutPerSecondRedisWithCachePrefix", extra: []string{"CACHE_KEY_PREFIX=prefix:"}},
		{name: "WithoutPerSecondRedisWithstopCacheKeyIncrementWhenOverlimitConfig", extra: stop},
		{name: "WithPerSecondRedisWithstopCacheKeyIncrementWhenOverlimitConfig", perSecond: true, extra: stop},
		{name: "WithoutPerSecondRedisWithLocalCacheAndstopCacheKeyIncrementWhenOverlimitConfig", localCache: 1000, extra: stop},
		{name: "WithPerSecondRedisWithLocalCacheAndstopCacheKeyIncrementWhenOverlimitConfig", perSecond: true, localCache: 1000, extra: stop},
	} {
		t.Run(v.name, func(t *testing.T) {
			beside(t)
			rd := erlStandalone(t, "", false)
			v.run(t, root, rd)
			if len(v.extra) == 1 && v.extra[0] == "CACHE_KEY_PREFIX=prefix:" {
				keys := erlKeys(t, rd.main)
				for _, key := range keys {
					if !strings.HasPrefix(key, "prefix:") {
						t.Errorf("key %q without CACHE_KEY_PREFIX prefix:", key)
					}
				}
				if len(keys) == 0 {
					t.Error("no keys in Redis")
				}
			}
		})
	}
}

// TestEnvoyRLIntegrationBasicAuthConfig translates envoy-rl's
// TestBasicAuthConfig: testBasicConfigAuth, servers that need AUTH
// password123 (REDIS_AUTH, REDIS_PERSECOND_AUTH).
func TestEnvoyRLIntegrationBasicAuthConfig(t *testing.T) {
	t.Parallel() // not beside: its subtests are, each in a place of its own
	root := erlRuntimeRoot(t)
	for _, v := range erlRedisVariants("Auth") {
		t.Run(v.name, func(t *testing.T) {
			beside(t)
			v.run(t, root, erlStandalone(t, erlPassword, false))
		})
	}
}

// TestEnvoyRLIntegrationBasicTLSConfig translates envoy-rl's
// TestBasicTLSConfig (testBasicConfigAuthTLS): servers that speak TLS only
// and need AUTH password123 (REDIS_TLS, REDIS_AUTH and their PERSECOND
// twins; REDIS_TLS_CACERT names the servers' CA). Its fifth case,
// WithoutPerSecondRedisTLSWithClientCert, runs on servers that ask for a
// client certificate (envoy-rl's stunnel with verify level 2; here
// redis-server's tls-auth-clients yes), shown with REDIS_TLS_CLIENT_CERT
// and _KEY.
func TestEnvoyRLIntegrationBasicTLSConfig(t *testing.T) {
	t.Parallel() // not beside: its subtests are, each in a place of its own
	root := erlRuntimeRoot(t)
	for _, v := range erlRedisVariants("TLS") {
		t.Run(v.name, func(t *testing.T) {
			beside(t)
			v.run(t, root, erlStandalone(t, erlPassword, true))
		})
	}
	t.Run("WithoutPerSecondRedisTLSWithClientCert", func(t *testing.T) {
		beside(t)
		rd := erlStandalone(t, erlPassword, true, redistest.WithConfig("tls-auth-clients", "yes"))
		rd.env = append(rd.env, "REDIS_TLS_CLIENT_CERT="+rd.main.CertFile, "REDIS_TLS_CLIENT_KEY="+rd.main.KeyFile)
		erlVariant{name: "WithoutPerSecondRedisTLSWithClientCert"}.run(t, root, rd)
	})
}

// TestEnvoyRLIntegrationBasicAuthConfigWithRedisCluster translates
// envoy-rl's TestBasicAuthConfigWithRedisCluster (configRedisCluster):
// REDIS_TYPE=cluster over three masters that need AUTH password123, the
// pipeline window settings included (named in sluice's start warning).
// envoy-rl's per-second cluster is another cluster; here the per-second
// settings name the same one (sluice reads neither). The four variants
// share the cluster, each under its own --redis-prefix.
func TestEnvoyRLIntegrationBasicAuthConfigWithRedisCluster(t *testing.T) {
	t.Parallel() // not beside: its subtests are, each in a place of its own
	root := erlRuntimeRoot(t)
	c := redistest.Cluster(t, 3, 0, redistest.WithPassword(erlPassword))
	var urls []string
	for _, s := range c.Nodes() {
		urls = append(urls, "localhost:"+strconv.Itoa(s.Port()))
	}
	url := strings.Join(urls, ",")
	for _, v := range erlRedisVariants("Auth") {
		t.Run(v.name, func(t *testing.T) {
			beside(t)
			v.run(t, root, erlRedis{
				env: []string{
					"REDIS_PERSECOND_TYPE=cluster", "REDIS_PERSECOND_URL=" + url,
					"REDIS_TYPE=cluster", "REDIS_URL=" + url,
					"REDIS_AUTH=" + erlPassword, "REDIS_PERSECOND_AUTH=" + erlPassword,
					"REDIS_PERSECOND_PIPELINE_WINDOW=150us", "REDIS_PIPELINE_WINDOW=150us",
				},
				args: []string{"--redis-prefix", t.Name() + ":"},
			})
		})
	}
}

// TestEnvoyRLIntegrationBasicAuthConfigWithRedisSentinel translates
// envoy-rl's TestBasicAuthConfigWithRedisSentinel (configRedisSentinel):
// REDIS_TYPE=sentinel, REDIS_URL=mymaster,<three sentinels>, data servers
// that need AUTH password123, sentinels that need none (as envoy-rl's
// sentinel.conf). The per-second settings name the same setup (sluice
// reads them not); the four variants share it, each under its own
// --redis-prefix.
func TestEnvoyRLIntegrationBasicAuthConfigWithRedisSentinel(t *testing.T) {
	t.Parallel() // not beside: its subtests are, each in a place of its own
	root := erlRuntimeRoot(t)
	s := redistest.Sentinel(t, redistest.WithPassword(erlPassword))
	url := s.MasterName
	for _, sn := range s.Sentinels() {
		url += ",localhost:" + strconv.Itoa(sn.Port())
	}
	for _, v := range erlRedisVariants("Auth") {
		t.Run(v.name, func(t *testing.T) {
			beside(t)
			v.run(t, root, erlRedis{
				env: []string{
					"REDIS_PERSECOND_TYPE=sentinel", "REDIS_PERSECOND_URL=" + url,
					"REDIS_TYPE=sentinel", "REDIS_URL=" + url,
					"REDIS_AUTH=" + erlPassword, "REDIS_PERSECOND_AUTH=" + erlPassword,
				},
				args: []string{"--redis-prefix", t.Name() + ":"},
			})
		})
	}
}

// erlCopyRuntime copies envoy-rl's runtime tree (the directory
// runtime/current holds) into dst, which the reload tests change.
func erlCopyRuntime(t *testing.T, dst string) {
	t.Helper()
	src := erlRuntimeRoot(t)
	err := filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// erlAddReload copies ratelimit/reload.yaml into ratelimit/config under
// root, as envoy-rl's reloadNewConfigFile does.
func erlAddReload(t *testing.T, root string) {
	t.Helper()
	dir := filepath.Join(root, "ratelimit")
	b, err := os.ReadFile(filepath.Join(dir, "reload.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config", "reload.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// erlConfigReload translates envoy-rl's testConfigReload: domain reload is
// unknown (OK, no limit); after reload() config_load_success has grown and
// reload's key1 answers 50 a second, 49 left; restore() is a load again.
func erlConfigReload(t *testing.T, env []string, localCache bool, reload, restore func()) {
	t.Helper()
	k := func(key string) string {
		if localCache {
			return key + "_local"
		}
		return key
	}
	r := erlStart(t, env)
	r.waitRules(env)
	resp, b, a := r.call("reload", desc(k("block"), "foo"))
	r.expect("reload block=foo before the reload", resp, b, a, rlsv3.RateLimitResponse_OK, erlNoLimit)
	before := r.loads()

	reload()
	after := r.reloaded(before)
	resp, b, a = r.call("reload", desc(k("key1"), "foo"))
	r.expect("reload key1=foo after the reload", resp, b, a, rlsv3.RateLimitResponse_OK, erlOK(50, erlSecond, 49))

	// Removing the file (taking the domain away) is a load too.
	restore()
	r.reloaded(after)
}

// TestEnvoyRLIntegrationBasicReloadConfig translates envoy-rl's
// TestBasicReloadConfig: BasicWithoutWatchRoot (testBasicConfig with
// RUNTIME_WATCH_ROOT=false, which sluice names as a setting with no
// effect: it watches the rules directory and the symlinks on its path)
// and ReloadWithoutWatchRoot (testBasicConfigReload: reload.yaml copied
// into ratelimit/config while running, then removed: what envoy-rl's
// directory watcher sees).
//
// ReloadWithWatchRoot is sluice's addition for envoy-rl's default,
// RUNTIME_WATCH_ROOT=true, where envoy-rl reloads when RUNTIME_ROOT, a
// symlink, is swapped to a new tree (its SymlinkRefresher), as a
// deployment publishes rules: runtime/current points to v1; v2 (v1 with
// reload.yaml in config) is put in place by renaming a new symlink over
// it, then v3 (v1 again).
func TestEnvoyRLIntegrationBasicReloadConfig(t *testing.T) {
	t.Parallel() // not beside: its subtests are, each in a place of its own
	t.Run("BasicWithoutWatchRoot", func(t *testing.T) {
		beside(t)
		v := erlVariant{extra: []string{"RUNTIME_WATCH_ROOT=false"}}
		r := v.run(t, erlRuntimeRoot(t), erlStandalone(t, "", false))
		if line := r.p.waitLog("envoyproxy/ratelimit settings with no effect in sluice"); !strings.Contains(line, "RUNTIME_WATCH_ROOT") {
			t.Errorf("the start warning does not name RUNTIME_WATCH_ROOT: %s", line)
		}
	})
	t.Run("ReloadWithoutWatchRoot", func(t *testing.T) {
		beside(t)
		root := filepath.Join(t.TempDir(), "runtime", "current")
		erlCopyRuntime(t, root)
		rd := erlStandalone(t, "", false)
		env := append(append(erlSettings(root, false, 0), rd.env...), "RUNTIME_WATCH_ROOT=false")
		erlConfigReload(t, env, false, func() { erlAddReload(t, root) }, func() {
			if err := os.Remove(filepath.Join(root, "ratelimit", "config", "reload.yaml")); err != nil {
				t.Fatal(err)
			}
		})
	})
	t.Run("ReloadWithWatchRoot", func(t *testing.T) {
		beside(t)
		base := filepath.Join(t.TempDir(), "runtime")
		root := filepath.Join(base, "current")
		swap := func(version string, withReload bool) {
			t.Helper()
			dir := filepath.Join(base, version)
			erlCopyRuntime(t, dir)
			if withReload {
				erlAddReload(t, dir)
			}
			tmp := filepath.Join(base, "tmp-"+version)
			if err := os.Symlink(dir, tmp); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, root); err != nil {
				t.Fatal(err)
			}
		}
		swap("v1", false)
		rd := erlStandalone(t, "", false)
		env := append(erlSettings(root, false, 0), rd.env...)
		erlConfigReload(t, env, false, func() { swap("v2", true) }, func() { swap("v3", false) })
	})
}

// TestEnvoyRLIntegrationShareThreshold translates envoy-rl's
// TestShareThreshold (testShareThreshold, share_threshold.yaml): values
// matching files/* share one counter of 10 an hour, so after 10 requests
// with files/a.pdf one with files/b.csv is OVER_LIMIT; values matching
// files_no_share/* count apart, each with 9 left after its first request.
func TestEnvoyRLIntegrationShareThreshold(t *testing.T) {
	t.Parallel() // not beside: its subtests are, each in a place of its own
	t.Run("WithoutPerSecondRedis", func(t *testing.T) {
		beside(t)
		rd := erlStandalone(t, "", false)
		r := erlStart(t, append(erlSettings(erlRuntimeRoot(t), false, 0), rd.env...))
		const domain = "share-threshold-test"
		erlOneWindow(t, erlHour, func(attempt int, same func(time.Time) bool) bool {
			for i := range 10 {
				resp, _, a := r.call(domain, desc("files", "files/a.pdf"))
				if !same(a) {
					return false
				}
				if c := resp.GetOverallCode(); c != rlsv3.RateLimitResponse_OK && c != rlsv3.RateLimitResponse_OVER_LIMIT {
					t.Errorf("request %d with files/a.pdf: %v, want OK or OVER_LIMIT", i+1, c)
				}
			}
			resp, b, a := r.call(domain, desc("files", "files/b.csv"))
			if !same(a) {
				return false
			}
			r.expect("files/b.csv after 10 of files/a.pdf", resp, b, a, rlsv3.RateLimitResponse_OVER_LIMIT, erlOver(10, erlHour))
			return true
		})
		base := time.Now().UnixNano()
		for i := range 10 {
			v := fmt.Sprintf("files_no_share/%d-%d", base, rand.Int64())
			resp, b, a := r.call(domain, desc("files_no_share", v))
			r.expect(fmt.Sprintf("files_no_share request %d", i+1), resp, b, a, rlsv3.RateLimitResponse_OK, erlOK(10, erlHour, 9))
		}
	})
}

// erlXDSLimit is one descriptor of envoy-rl's xDS test config.
type erlXDSLimit struct {
	key  string
	unit rlconf.RateLimitUnit
	n    uint32
}

func erlXDSDomain(domain string, limits ...erlXDSLimit) *rlconf.RateLimitConfig {
	c := &rlconf.RateLimitConfig{Name: domain, Domain: domain}
	for _, l := range limits {
		c.Descriptors = append(c.Descriptors, &rlconf.RateLimitDescriptor{
			Key: l.key, RateLimit: &rlconf.RateLimitPolicy{Unit: l.unit, RequestsPerUnit: l.n},
		})
	}
	return c
}

// erlXDSInitial is envoy-rl's initialXdsBasicConfig (basic.yaml and
// another.yaml as RateLimitConfig resources); with reload, its
// newConfigWithXdsConfigProvider's (reload.yaml added).
func erlXDSInitial(reload bool) []types.Resource {
	res := []types.Resource{
		erlXDSDomain("basic",
			erlXDSLimit{"key1", rlconf.RateLimitUnit_SECOND, 50},
			erlXDSLimit{"key1_local", rlconf.RateLimitUnit_SECOND, 50},
			erlXDSLimit{"one_per_minute", rlconf.RateLimitUnit_MINUTE, 1}),
		erlXDSDomain("another",
			erlXDSLimit{"key2", rlconf.RateLimitUnit_MINUTE, 20},
			erlXDSLimit{"key3", rlconf.RateLimitUnit_HOUR, 10},
			erlXDSLimit{"key2_local", rlconf.RateLimitUnit_MINUTE, 20},
			erlXDSLimit{"key3_local", rlconf.RateLimitUnit_HOUR, 10},
			erlXDSLimit{"key4", rlconf.RateLimitUnit_DAY, 20},
			erlXDSLimit{"key4_local", rlconf.RateLimitUnit_DAY, 20}),
	}
	if reload {
		res = append(res, erlXDSDomain("reload",
			erlXDSLimit{"key1", rlconf.RateLimitUnit_SECOND, 50},
			erlXDSLimit{"block", rlconf.RateLimitUnit_SECOND, 0},
			erlXDSLimit{"one_per_minute", rlconf.RateLimitUnit_MINUTE, 1}))
	}
	return res
}

// erlXDSSet serves a snapshot of version to envoy-rl's xDS node.
func erlXDSSet(t *testing.T, x *xdsServer, version string, res []types.Resource) {
	t.Helper()
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := x.Cache.SetSnapshot(context.Background(), erlXDSNode, snap); err != nil {
		t.Fatal(err)
	}
}

// erlXDSEnv is envoy-rl's configXdsProvider on the settings of
// makeSimpleRedisSettings. envoy-rl's defaultSettings also set the
// RUNTIME_* layout, which envoy-rl (and sluice) ignore with
// CONFIG_TYPE=GRPC_XDS_SOTW; TestEnvoyRLIntegrationXdsProviderBasicConfig's
// runtime_settings runs with them.
func erlXDSEnv(x *xdsServer, rd erlRedis, perSecond bool, localCacheSize int) []string {
	env := []string{
		"REDIS_PERSECOND_SOCKET_TYPE=tcp", "REDIS_SOCKET_TYPE=tcp",
		"REDIS_PERSECOND=" + strconv.FormatBool(perSecond),
		"LOCAL_CACHE_SIZE_IN_BYTES=" + strconv.Itoa(localCacheSize),
		"BACKEND_TYPE=redis",
		"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_ID=" + erlXDSNode, "CONFIG_GRPC_XDS_SERVER_URL=" + x.Addr,
	}
	return append(env, rd.env...)
}

// TestEnvoyRLIntegrationXdsProviderBasicConfig translates envoy-rl's
// TestXdsProviderBasicConfig (xds_sotw_integration_test.go):
// testBasicBaseConfig with the rules from a real xDS server
// (CONFIG_TYPE=GRPC_XDS_SOTW), each of its four variants. xds_e2e_test.go
// covers xDS loading, updates and NACKs; this asks the answers and stats.
func TestEnvoyRLIntegrationXdsProviderBasicConfig(t *testing.T) {
	t.Parallel() // not beside: its subtests are, each in a place of its own
	x := startXDS(t)
	erlXDSSet(t, x, "1", erlXDSInitial(false))
	for _, v := range erlRedisVariants("") {
		t.Run(v.name, func(t *testing.T) {
			beside(t)
			rd := erlStandalone(t, "", false)
			r := erlBasicBaseConfig(t, erlXDSEnv(x, rd, v.perSecond, v.localCache), nil, v.localCache > 0)
			if v.perSecond {
				erlPerSecond(t, r, rd, v.localCache > 0)
			}
		})
	}
	// envoy-rl's settings in full: its RUNTIME_* layout beside
	// CONFIG_TYPE=GRPC_XDS_SOTW, which envoy-rl (getProviderImpl: FILE or
	// GRPC_XDS_SOTW) and sluice ignore for xDS.
	t.Run("runtime_settings", func(t *testing.T) {
		beside(t)
		rd := erlStandalone(t, "", false)
		env := append(erlXDSEnv(x, rd, false, 0), "RUNTIME_ROOT="+erlRuntimeRoot(t), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_APPDIRECTORY=config")
		erlBasicBaseConfig(t, env, nil, false)
	})
}

// TestEnvoyRLIntegrationXdsProviderBasicConfigReload translates envoy-rl's
// TestXdsProviderBasicConfigReload: testConfigReload with the reload
// domain added by snapshot 2 and taken away by snapshot 3, each counted in
// config_load_success.
func TestEnvoyRLIntegrationXdsProviderBasicConfigReload(t *testing.T) {
	beside(t)
	t.Run("ReloadConfigWithXdsServer", func(t *testing.T) {
		x := startXDS(t)
		erlXDSSet(t, x, "1", erlXDSInitial(false))
		rd := erlStandalone(t, "", false)
		erlConfigReload(t, erlXDSEnv(x, rd, false, 0), false,
			func() { erlXDSSet(t, x, "2", erlXDSInitial(true)) },
			func() { erlXDSSet(t, x, "3", erlXDSInitial(false)) })
	})
}
