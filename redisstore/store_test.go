package redisstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/fault"
	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/internal/stores/breaker"
	"github.com/sluicehq/sluice/internal/testsupport/redistest"
	"github.com/sluicehq/sluice/internal/vocab/limits"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/storetest"
)

var prefixes atomic.Int64

// newTestStore returns a store on cfg whose keys are in a namespace of
// their own and whose clock, when clock is not nil, is the suite's.
func newTestStore(t testing.TB, cfg Config, clock func() time.Time) *Store {
	t.Helper()
	if cfg.Prefix == "" {
		cfg.Prefix = fmt.Sprintf("t%d:", prefixes.Add(1))
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Timeout == 0 {
		// Generous: the race detector and a busy 2-core machine slow
		// everything down; outage tests set their own.
		cfg.Timeout = 5 * time.Second
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.now = clock
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformanceStandalone(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock) sluice.Store {
		return newTestStore(t, Config{URL: srv.URL()}, clock.Now)
	})
}

func TestConformanceCluster(t *testing.T) {
	t.Parallel()
	c := redistest.Cluster(t, 3, 0)
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock) sluice.Store {
		return newTestStore(t, Config{Addrs: c.Addrs()}, clock.Now)
	})
}

func TestConformanceSentinel(t *testing.T) {
	t.Parallel()
	ss := redistest.Sentinel(t)
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock) sluice.Store {
		return newTestStore(t, Config{Addrs: ss.Addrs(), SentinelMaster: ss.MasterName}, clock.Now)
	})
}

// TestSlotMatchesRedis checks slotOf against CLUSTER KEYSLOT, with and
// without hash tags.
func TestSlotMatchesRedis(t *testing.T) {
	srv := redistest.Standalone(t, redistest.WithConfig("cluster-enabled", "yes"))
	rng := rand.New(rand.NewPCG(1, 2))
	keys := []string{"", "a", "123456789", "{user1000}.following", "foo{}{bar}", "foo{{bar}}zap", "{}x", "x{", "x}{y}"}
	for range 500 {
		b := make([]byte, rng.IntN(40))
		for i := range b {
			b[i] = "ab{}x:"[rng.IntN(6)]
		}
		keys = append(keys, string(b))
	}
	for _, k := range keys {
		want := srv.Cmd("CLUSTER", "KEYSLOT", k).(int64)
		if got := slotOf(k); int64(got) != want {
			t.Errorf("slotOf(%q) = %d, CLUSTER KEYSLOT says %d", k, got, want)
		}
	}
}

// countingProxy forwards TCP connections to addr and counts the commands
// clients send (top-level RESP arrays): the round trips, whatever the
// script then runs inside Redis. Connection setup (HELLO, AUTH, CLIENT
// SETNAME/SETINFO, CLUSTER SLOTS, PING) is recorded apart.
type countingProxy struct {
	ln       net.Listener
	commands atomic.Int64
	fcall    atomic.Int64
	function atomic.Int64
	mu       sync.Mutex
	others   []string // commands other than FCALL and FUNCTION
	setup    []string // connection setup commands, not counted
}

func newCountingProxy(t *testing.T, addr string) *countingProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &countingProxy{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			go func() { io.Copy(c, s); c.Close() }()
			go func() { p.count(c, s); s.Close() }()
		}
	}()
	return p
}

// count copies client to server, counting each array of bulk strings.
func (p *countingProxy) count(client io.Reader, server io.Writer) {
	r := bufio.NewReader(client)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if _, err := io.WriteString(server, line); err != nil {
			return
		}
		if !strings.HasPrefix(line, "*") {
			continue
		}
		n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
		p.commands.Add(1)
		for i := range n {
			hdr, err := r.ReadString('\n')
			if err != nil {
				return
			}
			size, _ := strconv.Atoi(strings.TrimSpace(hdr[1:]))
			body := make([]byte, size+2)
			if _, err := io.ReadFull(r, body); err != nil {
				return
			}
			if i == 0 {
				switch name := strings.ToUpper(string(body[:size])); name {
				case "HELLO", "AUTH", "CLIENT", "SELECT", "CLUSTER", "READONLY", "PING":
					// Connection setup and health checks: rueidis dials
					// some of its pipelined connections lazily.
					p.commands.Add(-1)
					p.mu.Lock()
					p.setup = append(p.setup, name)
					p.mu.Unlock()
				case "FCALL":
					p.fcall.Add(1)
				case "FUNCTION":
					p.function.Add(1)
				default:
					p.mu.Lock()
					p.others = append(p.others, string(body[:size]))
					p.mu.Unlock()
				}
			}
			if _, err := io.WriteString(server, hdr); err != nil {
				return
			}
			if _, err := server.Write(body); err != nil {
				return
			}
		}
	}
}

// TestOneRoundTrip counts the commands a request sends to Redis through a
// proxy: exactly one (an FCALL) per request, whatever the number of limits
// and algorithms; after FUNCTION FLUSH, an FCALL answered "Function not
// found", one FUNCTION LOAD, and the FCALL again.
func TestOneRoundTrip(t *testing.T) {
	srv := redistest.Standalone(t)
	proxy := newCountingProxy(t, srv.Addr())
	// No heartbeat: its calls would count.
	s := newTestStore(t, Config{Addrs: []string{proxy.ln.Addr().String()}, Heartbeat: -1}, nil)
	lim := sluice.NewLimiter(s)
	ctx := context.Background()
	perSecond := &sluice.Limit{Rate: 100, Period: time.Second}
	perDay := &sluice.Limit{Rate: 10000, Period: 24 * time.Hour, Algorithm: sluice.GCRA}
	logLimit := &sluice.Limit{Rate: 100, Period: time.Minute, Algorithm: sluice.SlidingLog}
	sketch := &sluice.Limit{Rate: 100, Period: time.Minute, Algorithm: sluice.Sketch, BlockFor: time.Second}
	hits := []sluice.Hit{
		{Key: "user:1", Limit: perSecond, Cost: 1},
		{Key: "user:1", Limit: perDay, Cost: 1},
		{Key: "ip:1", Limit: logLimit, Cost: 1},
		{Key: "ip:1", Limit: sketch, Cost: 1},
	}
	scratch := make([]sluice.Decision, len(hits))
	if _, err := lim.Take(ctx, hits, scratch); err != nil {
		t.Fatal(err)
	}
	before, fcall := proxy.commands.Load(), proxy.fcall.Load()
	const n = 50
	for i := range n {
		if _, err := lim.Take(ctx, hits[:1+i%len(hits)], scratch); err != nil {
			t.Fatal(err)
		}
	}
	if c, f := proxy.commands.Load()-before, proxy.fcall.Load()-fcall; c != n || f != n {
		t.Errorf("%d commands (%d FCALL) for %d requests, want exactly one FCALL each; others: %q", c, f, n, proxy.others)
	}

	srv.Cmd("FUNCTION", "FLUSH")
	before, fcall, function := proxy.commands.Load(), proxy.fcall.Load(), proxy.function.Load()
	out := make([]sluice.Decision, len(hits[:1]))
	d, err := lim.Take(ctx, hits[:1], out)
	if err != nil || !d.Allowed {
		t.Fatalf("after FUNCTION FLUSH: %+v, %v", d, err)
	}
	c, f, l := proxy.commands.Load()-before, proxy.fcall.Load()-fcall, proxy.function.Load()-function
	if c != 3 || f != 2 || l != 1 {
		t.Errorf("after FUNCTION FLUSH: %d commands, %d FCALL and %d FUNCTION, want 3, 2 and 1", c, f, l)
	}
}

// TestIdleKeysExpire checks that every key the store writes carries a TTL
// that ends no earlier than the state's idle-at time and not much later.
func TestIdleKeysExpire(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{URL: srv.URL(), Prefix: "ttl:"}, nil)
	lim := sluice.NewLimiter(s)
	ctx := context.Background()
	limits := []*sluice.Limit{
		{Rate: 10, Period: 2 * time.Second},
		{Rate: 10, Period: 2 * time.Second, Algorithm: sluice.GCRA},
		{Rate: 10, Period: 2 * time.Second, Algorithm: sluice.TokenBucket, RefillInterval: 200 * time.Millisecond},
		{Rate: 10, Period: 2 * time.Second, Algorithm: sluice.SlidingWindow},
		{Rate: 10, Period: 2 * time.Second, Algorithm: sluice.SlidingLog},
		{Rate: 10, Period: 2 * time.Second, Algorithm: sluice.Sketch},
		{Rate: 1, Period: 2 * time.Second, BlockFor: 3 * time.Second},
	}
	for i, l := range limits {
		for range 2 {
			if _, err := lim.AllowN(ctx, "k"+strconv.Itoa(i), l, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	keys := srv.Cmd("KEYS", "ttl:*").([]any)
	if len(keys) == 0 {
		t.Fatal("no keys written")
	}
	for _, k := range keys {
		ttl := srv.Cmd("PTTL", k).(int64)
		if k == "ttl:nodes" {
			// The node registry: a day after the last call, so that a
			// Redis restored within a day has it (nodes.go).
			if ttl <= 0 || ttl > 24*time.Hour.Milliseconds() {
				t.Errorf("the node registry has PTTL %d ms", ttl)
			}
			continue
		}
		// Windows end within a period (sliding: two), buckets refill
		// within a period, sketches live two periods, blocks 3s. -2: it
		// expired between KEYS and PTTL (a loaded machine), as it should.
		if ttl == -2 {
			continue
		}
		if ttl <= 0 || ttl > 4000 {
			t.Errorf("key %q has PTTL %d ms, want a TTL in (0, 4000]", k, ttl)
		}
	}
}

// TestAuthAndTLS runs requests against servers that need a password, an
// ACL user, and TLS.
func TestAuthAndTLS(t *testing.T) {
	for name, opts := range map[string][]redistest.Option{
		"password": {redistest.WithPassword("s3cret")},
		"acl-user": {redistest.WithUser("sluice", "pw")},
		"tls":      {redistest.WithTLS()},
	} {
		t.Run(name, func(t *testing.T) {
			srv := redistest.Standalone(t, opts...)
			cfg := Config{URL: srv.URL()}
			if srv.TLS != nil {
				cfg.TLS = srv.TLS
			}
			lim := sluice.NewLimiter(newTestStore(t, cfg, nil))
			l := &sluice.Limit{Rate: 2, Period: time.Hour}
			for i, want := range []bool{true, true, false} {
				d, err := lim.Allow(context.Background(), "k", l)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed != want {
					t.Fatalf("request %d: allowed %v, want %v", i, d.Allowed, want)
				}
			}
		})
	}
	t.Run("wrong-password", func(t *testing.T) {
		srv := redistest.Standalone(t, redistest.WithPassword("s3cret"))
		s := newTestStore(t, Config{Addrs: []string{srv.Addr()}, Password: "nope"}, nil)
		if _, err := sluice.NewLimiter(s).Allow(context.Background(), "k", &sluice.Limit{Rate: 1, Period: time.Second}); err == nil {
			t.Fatal("a wrong password decided a request")
		}
	})
}

// aclRules are the ACL rules docs/redis.md gives a user of its own for
// sluice: the key prefix, FCALL, FUNCTION LOAD and every command the
// library calls.
const aclRules = "~sluice:* +fcall +function|load +function|list +time +get +set +del +pexpire +lrange +lset +lrem +ltrim +rpush +bitfield +bitfield_ro +zadd +zrem +zremrangebyscore +zcard +zscore +zrange"

// TestACLUser runs every algorithm, with block_for, on a standalone
// server as a user with only aclRules, and the node registry:
// a command the library calls and the rules lack would fail the call.
// The rules are those of docs/redis.md.
func TestACLUser(t *testing.T) {
	doc, err := os.ReadFile("../docs/redis.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(strings.Fields(string(doc)), " "), aclRules) {
		t.Errorf("docs/redis.md does not give the ACL rules %q", aclRules)
	}
	rules := append([]string{"user", "sluice", "on", ">pw"}, strings.Fields(aclRules)...)
	srv := redistest.Standalone(t, redistest.WithConfig(rules...))
	s := newTestStore(t, Config{URL: srv.URL(), Username: "sluice", Password: "pw", Prefix: "sluice:", Heartbeat: 20 * time.Millisecond}, nil)
	lim := sluice.NewLimiter(s)
	for _, k := range algo.Kinds() {
		l := &sluice.Limit{Algorithm: sluice.Algorithm(k), Rate: 2, Period: time.Minute, BlockFor: time.Second}
		for i, want := range []bool{true, true, false, false} {
			d, err := lim.Allow(context.Background(), "k", l)
			if err != nil {
				t.Fatalf("%s, request %d: %v", k, i, err)
			}
			if d.Allowed != want {
				t.Fatalf("%s, request %d: allowed %v", k, i, d.Allowed)
			}
		}
	}
	redistest.WaitFor(t, "the node registered", func() bool { return s.Nodes() == 1 })
	s.Close()
	// Left: only the record of the registry's last call ("") remains.
	if ids := fmt.Sprint(srv.Cmd("ZRANGE", "sluice:nodes", 0, -1)); ids != "[]" {
		t.Errorf("the node did not leave the registry: %s", ids)
	}
}

// TestDifferentialMemstore runs the same random requests, with several
// hits on all seven algorithms, through memstore and the Redis store on
// one clock, by Take and by TakeEach: every decision must be identical. On
// the cluster, requests span slots, so the refunds of a request denied in
// another slot are exercised too. TakeEach's requests come faster, on
// fewer keys, so that hits often find their limits exhausted, where
// TakeEach differs from Take.
func TestDifferentialMemstore(t *testing.T) {
	for i, each := range []bool{false, true} {
		name := ""
		if each {
			name = "/each"
		}
		t.Run("standalone"+name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Standalone(t)
			differential(t, Config{URL: srv.URL()}, uint64(1+2*i), each)
		})
		t.Run("cluster"+name, func(t *testing.T) {
			t.Parallel()
			c := redistest.Cluster(t, 3, 0)
			differential(t, Config{Addrs: c.Addrs()}, uint64(2+2*i), each)
		})
	}
}

func differential(t *testing.T, cfg Config, seed uint64, each bool) {
	clock := storetest.NewClock(storetest.Start.Add(123456789))
	rs := newTestStore(t, cfg, clock.Now)
	ms := memstore.New(memstore.Config{Now: clock.Now})
	t.Cleanup(func() { ms.Close() })
	rng := rand.New(rand.NewPCG(seed, 99))
	limits := []*sluice.Limit{
		{Name: "fw", Rate: 5, Period: time.Second},
		{Name: "tb", Rate: 3, Period: time.Second, Burst: 6, Algorithm: sluice.TokenBucket},
		{Name: "tbd", Rate: 4, Period: time.Second, Burst: 5, Algorithm: sluice.TokenBucket, RefillInterval: 250 * time.Millisecond},
		{Name: "lb", Rate: 7, Period: 3 * time.Second, Burst: 4, Algorithm: sluice.LeakyBucket},
		{Name: "gcra", Rate: 10, Period: 1500 * time.Millisecond, Algorithm: sluice.GCRA},
		{Name: "sw", Rate: 6, Period: time.Second, Algorithm: sluice.SlidingWindow},
		{Name: "log", Rate: 4, Period: 700 * time.Millisecond, Algorithm: sluice.SlidingLog},
		{Name: "sk", Rate: 6, Period: time.Second, Algorithm: sluice.Sketch},
		{Name: "block", Rate: 2, Period: time.Second, BlockFor: 1500 * time.Millisecond},
		{Name: "shadow", Rate: 1, Period: time.Second, Shadow: true},
		{Name: "soft", Rate: 10, Period: time.Second, SoftPercent: 20, Algorithm: sluice.SlidingWindow},
		{Name: "conc", Rate: 2, Period: 400 * time.Millisecond, Algorithm: sluice.Concurrency},
		{Name: "conc-shadow", Rate: 1, Period: 250*time.Millisecond + 300*time.Microsecond, Algorithm: sluice.Concurrency, Shadow: true},
	}
	keys := []string{"a", "b", "c", strings.Repeat("k", 300)}
	gap := 150 * time.Millisecond
	if each {
		keys, gap = keys[:2], 20*time.Millisecond
	}
	ctx := context.Background()
	const requests = 1500
	for i := range requests {
		n := 1 + rng.IntN(3)
		hits := make([]sluice.Hit, n)
		for j := range hits {
			hits[j] = sluice.Hit{Key: keys[rng.IntN(len(keys))], Limit: limits[rng.IntN(len(limits))], Cost: int64(rng.IntN(4))}
			if rng.IntN(10) == 0 {
				hits[j].Cost = 0
			}
			if hits[j].Limit.Algorithm == sluice.Concurrency {
				hits[j].Cost = int64(rng.IntN(4)+1) / 2 // 0 or 1, mostly 1
				hits[j].Permit = fmt.Sprint("p", rng.IntN(4))
			}
		}
		if rng.IntN(8) == 0 {
			differentialPermits(t, i, ms, rs, hits, rng.IntN(2) == 0)
		}
		want := make([]sluice.Decision, n)
		got := make([]sluice.Decision, n)
		take, takeRedis := ms.Take, rs.Take
		if each {
			take, takeRedis = ms.TakeEach, rs.TakeEach
		}
		if err := take(ctx, hits, want); err != nil {
			t.Fatal(err)
		}
		if err := takeRedis(ctx, hits, got); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		for j := range hits {
			if got[j] != want[j] {
				t.Fatalf("request %d at %v, hit %d (%s key %q cost %d) of %d:\nredis    %+v\nmemstore %+v",
					i, clock.Now().Sub(storetest.Start), j, hits[j].Limit.Name, hits[j].Key[:1], hits[j].Cost, n, got[j], want[j])
			}
		}
		clock.Advance(time.Duration(rng.Int64N(int64(gap))))
	}
	// Both stores drop each expired permit once, where a take, renewal or
	// release first finds it: after a peek of every key's permits at one
	// now, they have counted the same.
	clock.Advance(time.Second)
	for _, l := range limits {
		if l.Algorithm != sluice.Concurrency {
			continue
		}
		for _, k := range keys {
			peek := []sluice.Hit{{Key: k, Limit: l}}
			if err := ms.Take(ctx, peek, make([]sluice.Decision, 1)); err != nil {
				t.Fatal(err)
			}
			if err := rs.Take(ctx, peek, make([]sluice.Decision, 1)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if m, r := ms.Stats().PermitsExpired, rs.Stats().PermitsExpired; m != r || m == 0 {
		t.Fatalf("permits counted expired: memstore %d, redis %d", m, r)
	}
}

// differentialPermits releases or renews the permits of the Concurrency
// hits of hits in memstore and Redis, comparing the decisions (a
// release's: whether the permit was held).
func differentialPermits(t *testing.T, i int, ms *memstore.Store, rs *Store, hits []sluice.Hit, release bool) {
	t.Helper()
	var ph []sluice.Hit
	for _, h := range hits {
		if h.Limit.Algorithm == sluice.Concurrency {
			ph = append(ph, h)
		}
	}
	ctx := context.Background()
	what := map[bool]string{true: "release", false: "renew"}[release]
	want := make([]sluice.Decision, len(ph))
	got := make([]sluice.Decision, len(ph))
	if err := ms.Permits(ctx, ph, want, release); err != nil {
		t.Fatal(err)
	}
	if err := rs.Permits(ctx, ph, got, release); err != nil {
		t.Fatalf("request %d: %s: %v", i, what, err)
	}
	for j := range ph {
		if got[j] != want[j] {
			t.Fatalf("request %d: %s of %s %q:\nredis    %+v\nmemstore %+v", i, what, ph[j].Key[:1], ph[j].Permit, got[j], want[j])
		}
	}
}

// warm makes a first call, which loads the function library; under the
// race detector on a busy machine it may fail a few times.
func warm(t *testing.T, lim *sluice.Limiter, l *sluice.Limit) {
	t.Helper()
	for i := 0; ; i++ {
		_, err := lim.Allow(context.Background(), "warm", l)
		if err == nil {
			return
		}
		if i == 50 {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestSilentRedis checks that a Redis that stops answering (all its
// clients paused, its process stopped, or blocked by a long command) fails
// the calls waiting on it once it has been silent for about the timeout,
// with the reason timeout; that the breaker then fails calls at once
// without asking Redis; and that the store recovers when Redis answers
// again.
func TestSilentRedis(t *testing.T) {
	const timeout = 100 * time.Millisecond
	// A connection's silence is checked every timeout/2, and found once
	// a whole check interval passed without a reply (so within timeout);
	// then a PING has timeout to answer. The slack covers a busy machine
	// and the race detector.
	const most = 2*timeout + 700*time.Millisecond
	for _, c := range []struct {
		name          string
		silence, back func(*redistest.Server)
	}{
		{"client pause", func(s *redistest.Server) { s.Pause(2 * time.Second) }, func(*redistest.Server) {}}, // UNPAUSE would wait too
		{"SIGSTOP", (*redistest.Server).Freeze, (*redistest.Server).Thaw},
		{"DEBUG SLEEP", func(s *redistest.Server) { s.Sleep(2 * time.Second) }, func(*redistest.Server) {}},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := redistest.Standalone(t)
			s := newTestStore(t, Config{URL: srv.URL(), Timeout: timeout, BreakerFailures: 3, BreakerCooldown: 100 * time.Millisecond}, nil)
			lim := sluice.NewLimiter(s)
			l := &sluice.Limit{Rate: 1000, Period: time.Second}
			warm(t, lim, l)
			ctx := context.Background()

			c.silence(srv)
			time.Sleep(10 * time.Millisecond) // DEBUG SLEEP starts on a connection of its own
			// Three calls at once, as a loaded node makes them: each
			// fails, within the bound, with the reason timeout.
			var wg sync.WaitGroup
			for i := range 3 {
				wg.Go(func() {
					start := time.Now()
					_, err := lim.Allow(ctx, "k", l)
					el := time.Since(start)
					switch {
					case err == nil:
						t.Errorf("call %d decided while Redis is silent", i)
					case fault.ReasonOf(err) != fault.Timeout:
						t.Errorf("call %d: %v, reason %s, want timeout", i, err, fault.ReasonOf(err))
					}
					if el > most {
						t.Errorf("call %d took %v with a %v timeout", i, el, timeout)
					}
					t.Logf("call %d failed after %v: %v", i, el.Round(time.Millisecond), err)
				})
			}
			wg.Wait()
			start := time.Now()
			_, err := lim.Allow(ctx, "k", l)
			if !errors.Is(err, ErrUnavailable) || fault.ReasonOf(err) != fault.BreakerOpen {
				t.Fatalf("after 3 failures: %v (reason %s), want ErrUnavailable from the open breaker", err, fault.ReasonOf(err))
			}
			if el := time.Since(start); el > 100*time.Millisecond {
				t.Errorf("an open breaker took %v to answer", el)
			}
			if s.Health() == nil {
				t.Error("Health reports nil while the breaker is open")
			}

			c.back(srv)
			deadline := time.Now().Add(10 * time.Second)
			for {
				d, err := lim.Allow(ctx, "k", l)
				if err == nil && d.Allowed {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no recovery 10s after Redis answered again: %v", err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err := s.Health(); err != nil {
				t.Errorf("Health after recovery: %v", err)
			}
		})
	}
}

// TestSilentRedisQueued checks that calls waiting to go behind a call in
// flight (the store sends one at a time, batching what waits) fail with it
// when it finds Redis silent, rather than go next and wait for Redis to be
// found silent again: no call waits longer than about twice the timeout.
func TestSilentRedisQueued(t *testing.T) {
	// A second call to a silent Redis fails when connecting again does:
	// DialTimeout, here the timeout, later than the first.
	const timeout = time.Second
	// The calls behind the first get their answers when it returns; the
	// slack covers the scheduling of their goroutines on a busy machine
	// under the race detector, and is half what a call of their own would
	// add.
	const slack = timeout / 2
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{URL: srv.URL(), Timeout: timeout}, nil)
	lim := sluice.NewLimiter(s)
	l := &sluice.Limit{Rate: 1000, Period: time.Second}
	warm(t, lim, l)
	srv.Freeze()
	var wg sync.WaitGroup
	done := make([]time.Time, 3)
	for i := range done {
		wg.Go(func() {
			start := time.Now()
			_, err := lim.Allow(context.Background(), "k", l)
			done[i] = time.Now()
			if r := fault.ReasonOf(err); err == nil || r != fault.Timeout {
				t.Errorf("call %d: %v, reason %s, want timeout", i, err, r)
			}
			t.Logf("call %d failed after %v: %v", i, done[i].Sub(start).Round(time.Millisecond), err)
		})
		// The first is in flight when the others come.
		time.Sleep(50 * time.Millisecond)
	}
	wg.Wait()
	for i := 1; i < len(done); i++ {
		if late := done[i].Sub(done[0]); late > slack {
			t.Errorf("call %d, waiting behind call 0, failed %v after it", i, late.Round(time.Millisecond))
		}
	}
	if st := s.br.State(); st != breaker.Closed {
		t.Errorf("breaker %s after 3 failures, want closed (5 open it)", st)
	}
}

// TestDeadRedis checks that a killed Redis fails calls at once with the
// reason unreachable, and that the store recovers when it is back.
func TestDeadRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{URL: srv.URL(), Timeout: 100 * time.Millisecond, BreakerFailures: 3, BreakerCooldown: 100 * time.Millisecond}, nil)
	lim := sluice.NewLimiter(s)
	l := &sluice.Limit{Rate: 1000, Period: time.Second}
	warm(t, lim, l)
	srv.Kill()
	for i := range 3 {
		start := time.Now()
		_, err := lim.Allow(context.Background(), "k", l)
		if err == nil {
			t.Fatalf("call %d decided while Redis is dead", i)
		}
		if r := fault.ReasonOf(err); r != fault.Unreachable && r != fault.BreakerOpen {
			t.Errorf("call %d: %v, reason %s, want unreachable", i, err, r)
		}
		if el := time.Since(start); el > time.Second {
			t.Errorf("call %d took %v against a dead Redis", i, el)
		}
	}
	srv.Restart()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := lim.Allow(context.Background(), "k", l); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no recovery 10s after Redis came back")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBusyRedisIsNotDown checks that a Redis that is slow but not silent
// for its timeout is waited for: calls made while it is blocked for less
// than the timeout all succeed, even those whose caller's deadline passes
// meanwhile (Envoy's is 20ms), and the breaker stays closed.
func TestBusyRedisIsNotDown(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{URL: srv.URL(), Timeout: 2 * time.Second, BreakerFailures: 1}, nil)
	lim := sluice.NewLimiter(s)
	l := &sluice.Limit{Rate: 1000, Period: time.Minute}
	warm(t, lim, l)
	srv.Sleep(400 * time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	var wg sync.WaitGroup
	var allowed atomic.Int64
	for i := range 20 {
		wg.Go(func() {
			// 50 ms, far below Redis's sleep (20 ms failed in a loaded
			// full run: the goroutine was descheduled past its deadline
			// before the call began).
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			start := time.Now()
			d, err := lim.Allow(ctx, "k", l)
			if err != nil {
				t.Errorf("call %d after %v: %v", i, time.Since(start), err)
				return
			}
			if d.Allowed {
				allowed.Add(1)
			}
		})
	}
	wg.Wait()
	if allowed.Load() != 20 {
		t.Errorf("%d of 20 allowed", allowed.Load())
	}
	if err := s.Health(); err != nil {
		t.Errorf("a busy Redis made the store unhealthy: %v", err)
	}
	if st := s.br.State(); st != breaker.Closed {
		t.Errorf("breaker %s after a busy spell", st)
	}
	// The calls were counted once each, in Redis.
	d, err := lim.AllowN(context.Background(), "k", l, 0)
	if err != nil || d.Remaining != 1000-20 {
		t.Errorf("after the spell: %+v, %v; want 980 remaining", d, err)
	}
}

// TestShed checks the bound on calls in flight: beyond MaxInFlight calls
// wait, beyond MaxQueue more they are shed at once with ErrOverload and the
// reason overload, without asking Redis and without counting against it;
// a waiting caller that gives up leaves the queue; and the calls that
// waited are decided once Redis answers.
func TestShed(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{URL: srv.URL(), Timeout: 5 * time.Second, MaxInFlight: 2, MaxQueue: 2, BreakerFailures: 1}, nil)
	lim := sluice.NewLimiter(s)
	l := &sluice.Limit{Rate: 1000, Period: time.Minute}
	warm(t, lim, l)
	srv.Sleep(time.Second)
	time.Sleep(20 * time.Millisecond)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 2 { // in flight
		wg.Go(func() { _, err := lim.Allow(ctx, "k", l); errs <- err })
	}
	redistest.WaitFor(t, "2 calls in flight", func() bool { return s.gate.inFlight() == 2 })
	for range 2 { // queued
		wg.Go(func() { _, err := lim.Allow(ctx, "k", l); errs <- err })
	}
	redistest.WaitFor(t, "2 calls queued", func() bool { return s.gate.queued() == 2 })
	start := time.Now()
	_, err := lim.Allow(ctx, "k", l)
	if !errors.Is(err, ErrOverload) || fault.ReasonOf(err) != fault.Overload {
		t.Fatalf("with 2 in flight and 2 queued: %v (reason %s), want ErrOverload", err, fault.ReasonOf(err))
	}
	if el := time.Since(start); el > 100*time.Millisecond {
		t.Errorf("shedding took %v", el)
	}
	// A caller that gives up while queued leaves the queue (it is full:
	// this one is shed too, so cancel one that fits by making room).
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := lim.Allow(gone, "k", l); !errors.Is(err, context.Canceled) {
		t.Errorf("a canceled caller: %v", err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a call that waited: %v", err)
		}
	}
	if got := s.metrics.shed.Load(); got != 1 {
		t.Errorf("%d calls shed, want 1", got)
	}
	if st := s.br.State(); st != breaker.Closed {
		t.Errorf("shedding changed the breaker: %s", st)
	}
	d, err := lim.AllowN(ctx, "k", l, 0)
	if err != nil || d.Remaining != 1000-4 {
		t.Errorf("after the spell: %+v, %v; want 996 remaining (the shed call not counted)", d, err)
	}
}

// TestNodeRegistry checks that stores sharing a prefix learn how many they
// are, that a closed one leaves at once, and that another prefix is
// another set of nodes.
func TestNodeRegistry(t *testing.T) {
	srv := redistest.Standalone(t)
	open := func(prefix string) *Store {
		return newTestStore(t, Config{URL: srv.URL(), Prefix: prefix, Heartbeat: 50 * time.Millisecond}, nil)
	}
	a, b, c := open("reg:"), open("reg:"), open("reg:")
	other := open("other:")
	redistest.WaitFor(t, "3 nodes on reg:", func() bool { return a.Nodes() == 3 && b.Nodes() == 3 && c.Nodes() == 3 })
	redistest.WaitFor(t, "1 node on other:", func() bool { return other.Nodes() == 1 })
	c.Close()
	redistest.WaitFor(t, "2 nodes after one closed", func() bool { return a.Nodes() == 2 && b.Nodes() == 2 })
	// A node that stops beating without leaving (a crash) is dropped
	// after three heartbeats.
	srv.Cmd("ZADD", "reg:nodes", 0, "crashed") // expired long ago
	redistest.WaitFor(t, "the expired entry dropped", func() bool {
		return srv.Cmd("ZSCORE", "reg:nodes", "crashed") == nil && a.Nodes() == 2
	})
}

// TestStartWithoutRedis checks that New succeeds while Redis is down,
// that calls fail with ErrUnavailable meanwhile, and that the store
// connects once Redis is up.
func TestStartWithoutRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	srv.Kill()
	s := newTestStore(t, Config{URL: srv.URL(), DialTimeout: 200 * time.Millisecond}, nil)
	lim := sluice.NewLimiter(s)
	l := &sluice.Limit{Rate: 10, Period: time.Second}
	if _, err := lim.Allow(context.Background(), "k", l); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("with Redis down: %v, want ErrUnavailable", err)
	}
	if err := s.Health(); !errors.Is(err, fault.ErrNeverConnected) {
		t.Fatalf("health with Redis down since start: %v, want ErrNeverConnected", err)
	}
	srv.Restart()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d, err := lim.Allow(context.Background(), "k", l)
		if err == nil && d.Allowed {
			// Connected once: a later outage is an outage, not a store
			// that was never reached.
			srv.Kill()
			for s.Health() == nil && time.Now().Before(deadline) {
				lim.Allow(context.Background(), "k", l)
				time.Sleep(10 * time.Millisecond)
			}
			if err := s.Health(); err == nil || errors.Is(err, fault.ErrNeverConnected) {
				t.Fatalf("health after an outage that followed a connection: %v", err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not connected 10s after Redis came up: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{},
		{URL: "http://localhost:6379"},
		{URL: "redis://localhost:6379/notadb"},
		{Addrs: []string{" "}},
		{URL: "redis://localhost:6379", Prefix: "app{1}:"},
	} {
		if s, err := New(cfg); err == nil {
			s.Close()
			t.Errorf("New(%+v) accepted a bad configuration", cfg)
		}
	}
}

// TestBadConfigHidesThePassword: the error of a bad URL or address says
// what is wrong without the password it holds.
func TestBadConfigHidesThePassword(t *testing.T) {
	const secret = "S3cr3tPassw0rd"
	for _, cfg := range []Config{
		{URL: "redis://default:" + secret + "@localhost:bad"},
		{URL: "redis://default:" + secret + "%zz@localhost:6379"},
		{URL: "redis://default:" + secret + "@local host:6379"},
		{URL: "redis://default:" + secret + "@localhost:6379/notadb"},
		{URL: "bogus://default:" + secret + "@localhost:6379"},
		{Addrs: []string{"default:" + secret + "@localhost:6379"}},
	} {
		s, err := New(cfg)
		if err == nil {
			s.Close()
			t.Errorf("New(%+v) accepted a bad configuration", cfg)
			continue
		}
		if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), secret[:6]) {
			t.Errorf("New: %v: the password shows", err)
		}
	}
	// A quote in a password, not percent-encoded: the error says how to
	// write it, and shows none of it.
	_, err := New(Config{URL: `redis://:pa"` + secret + `@localhost:6379`})
	if err == nil || !strings.Contains(err.Error(), "percent-encode the password") || strings.Contains(err.Error(), secret[:6]) {
		t.Errorf("a quote in the password: %v; want how to percent-encode it, without the password", err)
	}
}

// TestSentinelFailover checks that the store follows a Sentinel failover:
// the counters replicated to the new master hold, and the function library
// (replicated too) answers there without a reload.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	ss := redistest.Sentinel(t)
	s := newTestStore(t, Config{Addrs: ss.Addrs(), SentinelMaster: ss.MasterName, Timeout: time.Second}, nil)
	lim := sluice.NewLimiter(s)
	l := &sluice.Limit{Rate: 5, Period: time.Hour}
	ctx := context.Background()
	for i := range 3 {
		if d, err := lim.Allow(ctx, "k", l); err != nil || !d.Allowed {
			t.Fatalf("request %d before the failover: %+v, %v", i, d, err)
		}
	}
	// Let the replica catch up before it is promoted.
	old := ss.Master()
	old.Cmd("WAIT", 1, 5000)
	ss.Failover()
	d := allowEventually(t, lim, "k", l)
	if !d.Allowed || d.Remaining != 1 {
		t.Fatalf("first request after the failover: %+v, want allowed with 1 left (3 counted before)", d)
	}
	if d, err := lim.Allow(ctx, "k", l); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("second request after the failover: %+v, %v", d, err)
	}
	if d, err := lim.Allow(ctx, "k", l); err != nil || d.Allowed {
		t.Fatalf("sixth request: %+v, %v; want denied", d, err)
	}
}

// TestClusterFailover kills the master that holds a key in a Cluster with
// one replica per master: the store follows the promoted replica, which
// has the function library by replication, and answers again.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	c := redistest.Cluster(t, 3, 1)
	s := newTestStore(t, Config{Addrs: c.Addrs(), Prefix: "fo:", Timeout: time.Second}, nil)
	lim := sluice.NewLimiter(s)
	l := &sluice.Limit{Rate: 5, Period: time.Hour}
	ctx := context.Background()
	for i := range 3 {
		if d, err := lim.Allow(ctx, "k", l); err != nil || !d.Allowed {
			t.Fatalf("request %d before the failover: %+v, %v", i, d, err)
		}
	}
	var key string
	for _, n := range c.Nodes() {
		if v, err := n.Do("KEYS", "fo:*"); err == nil {
			if ks, _ := v.([]any); len(ks) > 0 {
				key, _ = ks[0].(string)
				break
			}
		}
	}
	if key == "" {
		t.Fatal("no node holds the counter's key")
	}
	owner := c.Owner(key)
	if n := owner.Cmd("WAIT", 1, 5000); n != int64(1) {
		t.Fatalf("WAIT: %v replicas acknowledged the writes, want 1", n)
	}
	owner.Kill()
	c.WaitHealthy()
	d := allowEventually(t, lim, "k", l)
	// Whether the counter survived is Redis's replication, not the
	// store's: in about one run in ten here the promoted replica had
	// lost it although WAIT had acknowledged the write (then 4 are
	// left, a fresh window). Either is a correct answer of the store.
	if !d.Allowed || (d.Remaining != 1 && d.Remaining != 4) {
		t.Fatalf("first request after the failover: %+v, want allowed with 1 left (or 4, the counter lost)", d)
	}
	t.Logf("after the failover: %d left (1: the counter survived)", d.Remaining)
	if c.Owner(key) == owner {
		t.Fatal("the killed node still owns the key's slot")
	}
}

// allowEventually asks for key until the store answers, at most 20s after
// a failover, and returns the first answer.
func allowEventually(t *testing.T, lim *sluice.Limiter, key string, l *sluice.Limit) sluice.Decision {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		d, err := lim.Allow(context.Background(), key, l)
		if err == nil {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer 20s after the failover: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestBatching sends many requests at once from many goroutines: requests
// that arrive while calls are in flight must go together (fewer script
// calls than requests), each still decided on its own, all-or-nothing: a
// limit of 500 admits exactly 500 of 2,000 requests, whatever the batches,
// and a request of two limits, one of which denies, consumes neither.
func TestBatching(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{URL: srv.URL()}, nil)
	lim := sluice.NewLimiter(s)
	shared := &sluice.Limit{Rate: 500, Period: time.Hour}
	other := &sluice.Limit{Rate: 1_000_000, Period: time.Hour, Algorithm: sluice.SlidingLog} // no refill within the test
	warm(t, lim, shared)
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for w := range 64 {
		wg.Go(func() {
			for i := range 2000 / 64 {
				// Each request: the shared limit and one of its own.
				var out [2]sluice.Decision
				d, err := lim.Take(context.Background(), []sluice.Hit{
					{Key: "shared", Limit: shared, Cost: 1},
					{Key: fmt.Sprintf("own:%d:%d", w, i), Limit: other, Cost: 1},
				}, out[:])
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != 500 {
		t.Errorf("%d admitted, want 500", got)
	}
	wentTogether(t, s)
	// Denied requests consumed nothing of their own limits: the own keys
	// consumed are exactly the admitted requests.
	if consumed := ownConsumed(t, lim, other); consumed != 500 {
		t.Errorf("the own limits consumed %d, want 500", consumed)
	}
}

// TestBatchingEach: requests decided one by one (TakeEach, sluice serve's
// default) go together in calls too, mixed with all-or-nothing ones, and
// each keeps its own semantics: 2,000 requests from 64 goroutines, half
// one by one, on a shared limit of 500 admit exactly 500, and overdraw it
// once; the one-by-one
// requests consume their own limits whether the shared limit allows or
// not, the all-or-nothing ones only when it does.
func TestBatchingEach(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{URL: srv.URL()}, nil)
	lim := sluice.NewLimiter(s)
	shared := &sluice.Limit{Rate: 500, Period: time.Hour}
	other := &sluice.Limit{Rate: 1_000_000, Period: time.Hour, Algorithm: sluice.SlidingLog}
	warm(t, lim, shared)
	const per = 2000 / 64
	var wg sync.WaitGroup
	var admitted, admittedAll, overdrawn atomic.Int64
	for w := range 64 {
		wg.Go(func() {
			for i := range per {
				hits := []sluice.Hit{
					{Key: "shared", Limit: shared, Cost: 1},
					{Key: fmt.Sprintf("own:%d:%d", w, i), Limit: other, Cost: 1},
				}
				out := make([]sluice.Decision, 2)
				var d sluice.Decision
				var err error
				if w%2 == 0 {
					d, err = lim.TakeEach(context.Background(), hits, out)
				} else {
					d, err = lim.Take(context.Background(), hits, out)
				}
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
					if w%2 == 1 {
						admittedAll.Add(1)
					}
				}
				if out[0].Overdrawn {
					overdrawn.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != 500 {
		t.Errorf("%d admitted, want 500", got)
	}
	// The first one-by-one hit that found the fixed window exhausted
	// overdrew it by 1 (a fixed window's debt ends with its window); every
	// later one found it in debt and counted nothing.
	if got := overdrawn.Load(); got != 1 {
		t.Errorf("%d hits overdrew the shared limit, want 1", got)
	}
	wentTogether(t, s)
	consumed := ownConsumed(t, lim, other)
	// Every one-by-one request consumed its own limit; of the others,
	// only the admitted.
	if want := int64(32*per) + admittedAll.Load(); consumed != want {
		t.Errorf("the own limits consumed %d, want %d (%d one by one, %d admitted all-or-nothing)", consumed, want, 32*per, admittedAll.Load())
	}
}

// wentTogether fails t unless the requests s served took fewer script
// calls than there were requests.
func wentTogether(t *testing.T, s *Store) {
	t.Helper()
	calls, requests := s.metrics.fcalls.Load(), s.metrics.ok.Load()
	t.Logf("%d requests in %d script calls (%.1f a call)", requests, calls, float64(requests)/float64(calls))
	if calls >= requests {
		t.Errorf("%d script calls for %d requests: none went together", calls, requests)
	}
}

// ownConsumed is what the batching tests' requests consumed of their own
// limits (one own key each, 64 goroutines × 2000/64 requests).
func ownConsumed(t *testing.T, lim *sluice.Limiter, other *sluice.Limit) int64 {
	t.Helper()
	var consumed int64
	for w := range 64 {
		for i := range 2000 / 64 {
			d, err := lim.AllowN(context.Background(), fmt.Sprintf("own:%d:%d", w, i), other, 0)
			if err != nil {
				t.Fatal(err)
			}
			consumed += 1_000_000 - d.Remaining
		}
	}
	return consumed
}

// TestBatchErrorReply: one request of a batched call that Redis refuses
// (its state key holds a list) fails alone, as an error reply
// (fault.Error): the other requests of the batch are decided, each
// counted once, and the breaker stays closed, since Redis answered.
func TestBatchErrorReply(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{URL: srv.URL(), Timeout: 10 * time.Second}, nil)
	l := &sluice.Limit{Rate: 1000, Period: time.Hour}
	lim := sluice.NewLimiter(s)
	warm(t, lim, l)
	k := keyer{prefix: s.cfg.Prefix, tag: s.tag}
	p := limits.Params(l)
	srv.Cmd("RPUSH", k.stateKey(&sluice.Hit{Key: "bad", Limit: l}, &p), "x") // a key of the wrong type
	done := srv.Sleep(time.Second)
	time.Sleep(20 * time.Millisecond)
	fcalls := s.metrics.fcalls.Load()
	const n = 20
	errs := make([]error, n)
	var wg sync.WaitGroup
	key := func(i int) string {
		if i == n/2 {
			return "bad"
		}
		return fmt.Sprint("good", i)
	}
	for i := range n {
		wg.Go(func() {
			out := make([]sluice.Decision, 1)
			errs[i] = s.Take(context.Background(), []sluice.Hit{{Key: key(i), Limit: l, Cost: 1}}, out)
		})
	}
	// All but the call in flight wait to be batched while Redis sleeps.
	redistest.WaitFor(t, "the requests queued", func() bool {
		s.batch.mu.Lock()
		defer s.batch.mu.Unlock()
		return len(s.batch.queue) == n-1
	})
	wg.Wait()
	<-done
	if calls := s.metrics.fcalls.Load() - fcalls; calls > 3 {
		t.Errorf("%d calls for %d requests: not batched", calls, n)
	}
	for i, err := range errs {
		switch {
		case i == n/2 && (err == nil || fault.ReasonOf(err) != fault.Error || !strings.Contains(err.Error(), "WRONGTYPE")):
			t.Errorf("the request on a list: %v (reason %s), want a WRONGTYPE error reply", err, fault.ReasonOf(err))
		case i != n/2 && err != nil:
			t.Errorf("request %d, batched with it: %v", i, err)
		}
	}
	if st := s.br.State(); st != breaker.Closed {
		t.Errorf("breaker %s after an error reply", st)
	}
	for i := range n {
		if i == n/2 {
			continue
		}
		d, err := lim.AllowN(context.Background(), key(i), l, 0)
		if err != nil || d.Remaining != 999 {
			t.Errorf("%s after the batch: %+v, %v; want 999 remaining (counted once)", key(i), d, err)
		}
	}
}

// TestSentinelOwnPassword: Sentinels with a password of their own
// (requirepass) and a master with another, as envoyproxy/ratelimit's
// REDIS_SENTINEL_AUTH and REDIS_AUTH: with SentinelPassword the store
// decides on the master; without it the Sentinels are sent the master's
// password, refuse it, and the store never connects.
func TestSentinelOwnPassword(t *testing.T) {
	t.Parallel()
	ss := redistest.Sentinel(t, redistest.WithPassword("master-pw"), redistest.WithSentinelPassword("sentinel-pw"))
	s := newTestStore(t, Config{Addrs: ss.Addrs(), SentinelMaster: ss.MasterName, Password: "master-pw", SentinelPassword: "sentinel-pw"}, nil)
	lim := sluice.NewLimiter(s)
	l := &sluice.Limit{Rate: 1, Period: time.Hour}
	d := allowEventually(t, lim, "k", l)
	if !d.Allowed {
		t.Fatalf("first request: %+v, want allowed", d)
	}
	if d, err := lim.Allow(context.Background(), "k", l); err != nil || d.Allowed {
		t.Fatalf("second request: %+v, %v; want denied", d, err)
	}
	if keys, _ := ss.Master().Cmd("KEYS", "*").([]any); len(keys) == 0 {
		t.Error("no key on the master: the decisions were not made there")
	}

	wrong := newTestStore(t, Config{Addrs: ss.Addrs(), SentinelMaster: ss.MasterName, Password: "master-pw", Timeout: time.Second}, nil)
	if _, err := sluice.NewLimiter(wrong).Allow(context.Background(), "k", l); err == nil {
		t.Error("the master's password sent to Sentinels with their own: answered")
	}
}
