package redisstore

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testsupport/redistest"
	"github.com/sluicehq/sluice/internal/vocab/limits"
)

func concurrency(n int64, ttl time.Duration) *sluice.Limit {
	return &sluice.Limit{Name: "conc", Algorithm: sluice.Concurrency, Rate: n, Period: ttl}
}

// held returns the permits key holds in s, by a peek.
func held(t *testing.T, s *Store, key string, l *sluice.Limit) int64 {
	t.Helper()
	d, err := sluice.NewLimiter(s).AllowN(context.Background(), key, l, 0)
	if err != nil {
		t.Fatal(err)
	}
	return l.Rate - d.Remaining
}

// TestPermitReleaseByID: a permit is released by its ID alone. A release
// of an ID not held, guessed, forged or replayed after its slot was taken
// again by another, changes nothing; nor does a renewal of one.
func TestPermitReleaseByID(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{URL: srv.URL()}, nil)
	ctx := context.Background()
	l := concurrency(2, time.Minute)
	take := func(id string) sluice.Decision {
		out := make([]sluice.Decision, 1)
		if err := s.Take(ctx, []sluice.Hit{{Key: "k", Limit: l, Cost: 1, Permit: id}}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	p, _, err := sluice.NewLimiter(s).Acquire(ctx, []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}, nil) // a random ID, never shown
	if err != nil || p == nil {
		t.Fatalf("Acquire: %v %v", p, err)
	}
	take("x")
	rel := make([]sluice.Decision, 3)
	if err := s.Permits(ctx, []sluice.Hit{{Key: "k", Limit: l, Permit: "x"}}, rel, true); err != nil || !rel[0].Allowed {
		t.Fatalf("release of x: %+v %v, want it removed", rel[0], err)
	}
	take("y") // x's slot, taken again
	forged := []sluice.Hit{{Key: "k", Limit: l, Permit: "x"}, {Key: "k", Limit: l, Permit: rand.Text()}, {Key: "k", Limit: l, Permit: "k"}}
	if err := s.Permits(ctx, forged, rel, true); err != nil {
		t.Fatal(err)
	}
	for i, d := range rel {
		if d.Allowed || d.RetryAfter != sluice.Never {
			t.Errorf("release of %q, not held: %+v, want none removed", forged[i].Permit, d)
		}
	}
	out := make([]sluice.Decision, len(forged))
	if err := s.Permits(ctx, forged, out, false); err != nil {
		t.Fatal(err)
	}
	for i, d := range out {
		if d.Allowed {
			t.Errorf("renewal of %q, not held: %+v", forged[i].Permit, d)
		}
	}
	if n := held(t, s, "k", l); n != 2 {
		t.Fatalf("%d permits held after forged releases and renewals, want 2", n)
	}
	if d := take("z"); d.Allowed {
		t.Fatal("a third permit")
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := held(t, s, "k", l); n != 1 {
		t.Fatalf("%d permits held after the Permit's release, want 1", n)
	}
}

// holderEnv names, in a child process of TestPermitCrashedHolder, the
// Redis and the prefix of the permit it holds.
const holderEnv = "SLUICE_TEST_PERMIT_HOLDER"

// TestPermitCrashedHolder: a process that holds a permit (Limiter.Hold,
// renewing) is killed with SIGKILL. Its permit counts until it expires,
// a TTL at most after the process's last renewal, on Redis's clock: a
// holder that dies blocks, never over-admits, and its slot is free at
// that expiry, when the request that takes it counts the dead holder's
// permit as expired; its key lives a TTL more, so that a request in that
// time finds the expired permit and counts it.
func TestPermitCrashedHolder(t *testing.T) {
	const ttl = 2 * time.Second
	l := concurrency(1, ttl)
	if env := os.Getenv(holderEnv); env != "" {
		url, prefix, _ := strings.Cut(env, " ")
		s := newTestStore(t, Config{URL: url, Prefix: prefix}, nil)
		sluice.NewLimiter(s).Hold(context.Background(), "k", l, func(context.Context) error {
			fmt.Println("held")
			select {} // until killed
		})
		t.Fatal("the holder could not hold the permit")
	}
	srv := redistest.Standalone(t)
	prefix := fmt.Sprintf("crash%d:", prefixes.Add(1))
	s := newTestStore(t, Config{URL: srv.URL(), Prefix: prefix}, nil)
	cmd := exec.Command(os.Args[0], "-test.run=^TestPermitCrashedHolder$")
	cmd.Env = append(os.Environ(), holderEnv+"="+srv.URL()+" "+prefix)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines, found := bufio.NewScanner(out), false
	for !found && lines.Scan() {
		found = lines.Text() == "held"
	}
	if !found {
		t.Fatalf("the holder never held the permit: %v", lines.Err())
	}
	time.Sleep(ttl) // renewed on the way
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	killed, err := srv.Time()
	if err != nil {
		t.Fatal(err)
	}
	lim := sluice.NewLimiter(s)
	ctx := context.Background()
	if p, d, err := lim.Acquire(ctx, []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}, nil); p != nil || err != nil || d.RetryAfter > ttl {
		t.Fatalf("right after the kill: %v %+v %v, want denied for at most the TTL", p, d, err)
	}
	// The dead holder's permit expires at most a TTL after its last
	// renewal, before the kill.
	p := limits.Params(l)
	key := (&keyer{prefix: prefix, tag: wholeKey}).stateKey(&sluice.Hit{Key: "k", Limit: l}, &p)
	sc, err := srv.Do("ZRANGE", key, 0, -1, "WITHSCORES")
	scores, _ := sc.([]any)
	if err != nil || len(scores) != 2 {
		t.Fatalf("the permits of %s: %v %v, want one", key, sc, err)
	}
	ms, _ := strconv.ParseInt(fmt.Sprint(scores[1]), 10, 64)
	expiry := time.UnixMilli(ms)
	if expiry.After(killed.Add(ttl)) {
		t.Fatalf("the permit expires %v after the kill, more than the TTL", expiry.Sub(killed))
	}
	// PEXPIRE is in whole milliseconds, rounded up: the permit's expiry
	// and a TTL.
	if pttl, err := srv.Do("PTTL", key); err != nil || pttl.(int64) > 2*ttl.Milliseconds()+1 || pttl.(int64) <= 0 {
		t.Fatalf("the key's TTL %v ms (%v), want the permit's and a TTL more", pttl, err)
	}
	if n := s.Stats().PermitsExpired; n != 0 {
		t.Fatalf("%d permits expired while the dead holder's is held", n)
	}
	for {
		now, err := srv.Time()
		if err != nil {
			t.Fatal(err)
		}
		if !now.Before(expiry) {
			break
		}
		time.Sleep(expiry.Sub(now) + time.Millisecond)
	}
	if p, d, err := lim.Acquire(ctx, []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}, nil); p == nil || err != nil {
		t.Fatalf("at the dead holder's expiry: %+v %v, want the slot free", d, err)
	}
	if n := s.Stats().PermitsExpired; n != 1 {
		t.Fatalf("%d permits counted expired, want the dead holder's", n)
	}
}

// TestPermitClockJump: Redis's clock (here the store's test clock) jumps
// forward past a held permit's expiry: the permit is held no more, a
// second holder is admitted (the documented cost of a jump), and the
// first holder's next renewal finds its permit lost and cancels its work.
func TestPermitClockJump(t *testing.T) {
	srv := redistest.Standalone(t)
	var jump atomic.Int64
	s := newTestStore(t, Config{URL: srv.URL()}, func() time.Time { return time.Now().Add(time.Duration(jump.Load())) })
	lim := sluice.NewLimiter(s)
	ctx := context.Background()
	l := concurrency(1, 3*time.Second)
	d, err := lim.Hold(ctx, "k", l, func(hctx context.Context) error {
		jump.Store(int64(4 * time.Second))
		if p, d, err := lim.Acquire(ctx, []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}, nil); p == nil || err != nil {
			t.Errorf("after the jump: %+v %v, want the expired permit's slot", d, err)
		}
		select {
		case <-hctx.Done():
		case <-time.After(30 * time.Second):
			t.Error("the holder was not told its permit was lost")
		}
		if c := context.Cause(hctx); c == nil || !strings.Contains(c.Error(), "permit was lost") {
			t.Errorf("cause %v", c)
		}
		return hctx.Err()
	})
	if !d.Allowed || !errors.Is(err, context.Canceled) {
		t.Fatalf("Hold: %+v %v", d, err)
	}
}

// TestPermitKeyExpires: a permit's key lives a TTL longer than its
// latest permit, longer after a renewal, and is gone once its last permit
// is released.
func TestPermitKeyExpires(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{URL: srv.URL()}, nil)
	ctx := context.Background()
	l := concurrency(3, 10*time.Second)
	p := limits.Params(l)
	key := (&keyer{prefix: s.cfg.Prefix, tag: wholeKey}).stateKey(&sluice.Hit{Key: "k", Limit: l}, &p)
	hits := []sluice.Hit{{Key: "k", Limit: l, Cost: 1, Permit: "a"}}
	if _, err := sluice.NewLimiter(s).Take(ctx, hits, make([]sluice.Decision, 1)); err != nil {
		t.Fatal(err)
	}
	pttl := func() int64 {
		v, err := srv.Do("PTTL", key)
		if err != nil {
			t.Fatal(err)
		}
		return v.(int64)
	}
	// The permit lives 10 s from a now that is not a whole millisecond:
	// its expiry is rounded up, and PEXPIRE's milliseconds too; the key
	// 10 s more.
	first := pttl()
	if first <= 19_000 || first > 20_001 {
		t.Fatalf("PTTL %d ms, want the permit's 10 s and 10 s more", first)
	}
	time.Sleep(50 * time.Millisecond)
	out := make([]sluice.Decision, 1)
	if err := s.Permits(ctx, hits, out, false); err != nil || !out[0].Allowed {
		t.Fatalf("renew: %+v %v", out[0], err)
	}
	if ms := pttl(); ms <= 0 || ms > 20_001 || ms < first-10 {
		t.Fatalf("PTTL %d ms after a renewal, %d before", ms, first)
	}
	if err := s.Permits(ctx, hits, nil, true); err != nil {
		t.Fatal(err)
	}
	if ms := pttl(); ms != -2 {
		t.Fatalf("PTTL %d after the last release, want -2 (no key)", ms)
	}
}

// TestPermitManyHolders: 2,000 goroutines each hold a permit of a limit of
// 8 on one key of a real Redis once, half by Hold and half by Acquire and
// Release (twice), acquiring until admitted with backoff: never more than
// 8 hold one at once, and every one holds one in the end.
func TestPermitManyHolders(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{URL: srv.URL()}, nil)
	lim := sluice.NewLimiter(s)
	const n, maxHeld = 2000, 8
	l := concurrency(maxHeld, time.Minute)
	ctx := context.Background()
	var holders, peak, done atomic.Int64
	work := func() {
		h := holders.Add(1)
		for p := peak.Load(); h > p && !peak.CompareAndSwap(p, h); p = peak.Load() {
		}
		time.Sleep(time.Millisecond)
		holders.Add(-1)
	}
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			rng := mrand.New(mrand.NewPCG(uint64(g), 2))
			for try := 0; ; try++ {
				ok := false
				var err error
				if g%2 == 0 {
					var d sluice.Decision
					d, err = lim.Hold(ctx, "hot", l, func(context.Context) error { work(); return nil })
					ok = d.Allowed
				} else {
					var p *sluice.Permit
					if p, _, err = lim.Acquire(ctx, []sluice.Hit{{Key: "hot", Limit: l, Cost: 1}}, nil); p != nil {
						ok = true
						work()
						if err = p.Release(ctx); err == nil {
							err = p.Release(ctx)
						}
					}
				}
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					done.Add(1)
					return
				}
				time.Sleep(time.Duration(rng.Int64N(int64(time.Millisecond) << min(try, 7))))
			}
		})
	}
	wg.Wait()
	if p := peak.Load(); p > maxHeld {
		t.Fatalf("%d holders at once, limit %d", p, maxHeld)
	}
	if got := done.Load(); got != n {
		t.Fatalf("%d of %d held a permit", got, n)
	}
	if got := held(t, s, "hot", l); got != 0 {
		t.Fatalf("%d permits held after every holder released", got)
	}
	t.Logf("peak %d holders at once", peak.Load())
}

// TestPermitsExpiredCounted: the store counts the permits Redis drops on
// expiry, as its scripts report them: found by a take (alone, or in a
// batch of concurrent requests), a renewal or a release (a release after
// the expiry is too late: the permit counts as expired), each once, and
// never a permit released in time. Run on a standalone server and on a
// Cluster, where a request's hits on keys of other slots are other calls.
func TestPermitsExpiredCounted(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		permitsExpiredCounted(t, Config{URL: redistest.Standalone(t).URL()})
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		permitsExpiredCounted(t, Config{Addrs: redistest.Cluster(t, 3, 0).Addrs()})
	})
}

func permitsExpiredCounted(t *testing.T, cfg Config) {
	var now atomic.Int64
	now.Store(time.Date(2026, 12, 1, 12, 0, 0, 123456, time.UTC).UnixNano())
	s := newTestStore(t, cfg, func() time.Time { return time.Unix(0, now.Load()) })
	lim := sluice.NewLimiter(s)
	ctx := context.Background()
	l := concurrency(8, time.Second)
	hit := func(key string) sluice.Hit { return sluice.Hit{Key: key, Limit: l, Cost: 1} }
	acquire := func(hits ...sluice.Hit) *sluice.Permit {
		t.Helper()
		p, d, err := lim.Acquire(ctx, hits, nil)
		if p == nil || err != nil {
			t.Fatalf("Acquire: %+v %v", d, err)
		}
		return p
	}
	expired := func(want int64) {
		t.Helper()
		if n := s.Stats().PermitsExpired; n != want {
			t.Fatalf("%d permits counted expired, want %d", n, want)
		}
	}
	// Three on k, one released in time; two on each of k2 and k3 (keys
	// in other slots on a Cluster, in one request); one on k4, then one
	// on each of 20 keys.
	a, _, rel := acquire(hit("k")), acquire(hit("k")), acquire(hit("k"))
	if err := rel.Release(ctx); err != nil {
		t.Fatal(err)
	}
	acquire(hit("k2"), hit("k3"))
	acquire(hit("k2"), hit("k3"))
	late := acquire(hit("k4"))
	for i := range 20 {
		acquire(hit("b" + strconv.Itoa(i)))
	}
	expired(0)
	now.Add(int64(time.Second + 2*time.Millisecond)) // past the expiries, whole milliseconds rounded up
	// A take finds the two unreleased permits of k expired (and takes a
	// slot); a renewal of one of them finds it gone, and holds it again
	// (k has room): it was counted expired once.
	acquire(hit("k"))
	expired(2)
	if held, err := a.Renew(ctx); !held || err != nil {
		t.Fatalf("renewal of an expired permit with room: %v %v", held, err)
	}
	expired(2)
	// One request on k2 and k3: each key's expired permits, once.
	acquire(hit("k2"), hit("k3"), hit("k2"))
	expired(6)
	// A release after the expiry.
	if err := late.Release(ctx); err != nil {
		t.Fatal(err)
	}
	expired(7)
	// Concurrent requests, which the store batches into calls.
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			if _, _, err := lim.Acquire(ctx, []sluice.Hit{hit("b" + strconv.Itoa(i))}, nil); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	expired(27)
	// A renewal finds the expired permits of its key too.
	p := acquire(hit("r"))
	acquire(hit("r"))
	now.Add(int64(700 * time.Millisecond))
	if held, err := p.Renew(ctx); !held || err != nil {
		t.Fatalf("renewal: %v %v", held, err)
	}
	now.Add(int64(700 * time.Millisecond))
	if held, err := p.Renew(ctx); !held || err != nil {
		t.Fatalf("renewal: %v %v", held, err)
	}
	expired(28)
}
