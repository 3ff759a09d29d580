package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/stores/decorator"
)

// permits checks the permits of Concurrency limits (the clause on them of
// sluice.Store's Take, TakeEach and Permits): held up to the limit
// and no more, all or nothing with rates (on the same key, and on other
// keys: other Cluster slots), retries, shadow limits, several permits in
// one request, release, renewal, loss and expiry on the store's clock,
// a key's permits counted as one set whatever the limit's N and TTL, and
// many holders at once. A store without Permits must still
// decide the hits, and Limiter.Acquire must refuse it.
func (s suite) permits(t *testing.T) {
	for _, c := range []struct {
		name string
		f    func(t *testing.T, e *env)
	}{
		{"UpToTheLimit", permitsUpToTheLimit},
		{"AllOrNothing", permitsAllOrNothing},
		{"Each", permitsEach},
		{"ShadowAndPeek", permitsShadowAndPeek},
		{"SeveralInOneRequest", permitsSeveral},
		{"ReleaseAndRenew", permitsReleaseRenew},
		{"HandOver", permitsHandOver},
		{"Expiry", permitsExpiry},
		{"OneSetWhateverTheLimit", permitsOneSet},
		{"ManyHolders", permitsMany},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := s.env(t)
			if _, ok := e.store.(decorator.Permitter); !ok && c.name != "UpToTheLimit" && c.name != "AllOrNothing" {
				_, _, err := e.lim.Acquire(context.Background(), []sluice.Hit{{Key: "k", Limit: concurrencyLimit(1, time.Minute), Cost: 1}}, nil)
				if !errors.Is(err, errors.ErrUnsupported) {
					t.Fatalf("Acquire on a store without Release: %v, want errors.ErrUnsupported", err)
				}
				return
			}
			c.f(t, e)
		})
	}
}

func concurrencyLimit(n int64, ttl time.Duration) *sluice.Limit {
	return &sluice.Limit{Name: "conc", Algorithm: sluice.Concurrency, Rate: n, Period: ttl}
}

func permitHit(key string, l *sluice.Limit, id string) sluice.Hit {
	return sluice.Hit{Key: key, Limit: l, Cost: 1, Permit: id}
}

// wantPermits checks the decision of a Concurrency hit: allowed, the
// permits left, and the durations.
func wantPermits(t *testing.T, what string, d sluice.Decision, allowed bool, left int64, reset, retry time.Duration) {
	t.Helper()
	want(t, what, d, allowed, left)
	if d.ResetAfter != reset || d.RetryAfter != retry {
		t.Fatalf("%s: reset %v retry %v, want %v and %v (decision %+v)", what, d.ResetAfter, d.RetryAfter, reset, retry, d)
	}
}

// permitsUpToTheLimit: permits up to the limit, then denials until the
// earliest expires; a retry of a held ID counts once and is refreshed.
func permitsUpToTheLimit(t *testing.T, e *env) {
	l := concurrencyLimit(3, 10*time.Second)
	for i := range 3 {
		d, _ := e.take(permitHit("k", l, fmt.Sprint("p", i)))
		wantPermits(t, fmt.Sprint("permit ", i), d, true, int64(2-i), 10*time.Second-time.Duration(i)*time.Second, 0)
		if d.Limit != 3 {
			t.Fatalf("Limit %d, want 3", d.Limit)
		}
		e.clock.Advance(time.Second)
	}
	d, _ := e.take(permitHit("k", l, "p3"))
	wantPermits(t, "the fourth", d, false, 0, 7*time.Second, 7*time.Second)
	// A retry of p0: it counts once, and now lives 10 s; p1 is the earliest.
	d, _ = e.take(permitHit("k", l, "p0"))
	wantPermits(t, "a retry", d, true, 0, 7*time.Second, 0)
	d, _ = e.take(permitHit("k", l, "p3"))
	wantPermits(t, "after the retry", d, false, 0, 8*time.Second, 8*time.Second)
	// An ID of the 64 bytes allowed, and one with spaces, are IDs like any.
	zero := concurrencyLimit(0, time.Second)
	d, _ = e.take(permitHit("z", zero, "a b"))
	wantPermits(t, "a zero limit", d, false, 0, 0, sluice.Never)
	e.clock.Advance(9 * time.Second)
	d, _ = e.take(permitHit("k", l, "p 4 "+string(make([]byte, 58))))
	wantPermits(t, "after p1 and p2 expired", d, true, 1, time.Second, 0)
}

// permitsAllOrNothing: a permit denied takes nothing from the rates of
// its request, and a rate denied takes no permit: with the rate on the
// permit's key, and on another key (on a Cluster, another slot).
func permitsAllOrNothing(t *testing.T, e *env) {
	for _, rateKey := range []string{"k", "other"} {
		l := concurrencyLimit(1, time.Minute)
		rate := &sluice.Limit{Name: "rate-" + rateKey, Rate: 2, Period: time.Hour}
		k := "k" // the same key as the rate's, or another
		d, _ := e.take(hit(rateKey, rate, 1), permitHit(k, l, "a"+rateKey))
		if !d.Allowed {
			t.Fatalf("%s: first: %+v", rateKey, d)
		}
		d, per := e.take(hit(rateKey, rate, 1), permitHit(k, l, "b"))
		if d.Allowed || d.Index != 1 {
			t.Fatalf("%s: second: %+v, want denied by the permit", rateKey, d)
		}
		want(t, rateKey+": the rate beside a denied permit", per[0], true, 1)
		want(t, rateKey+": the rate after", e.allow(rateKey, rate, 0), true, 1)
		d, _ = e.take(hit(rateKey, rate, 1), permitHit(k, l, "a"+rateKey))
		want(t, rateKey+": a retry", d, true, 0)
		k2 := "free-" + rateKey
		d, per = e.take(hit(rateKey, rate, 1), permitHit(k2, l, "c"))
		if d.Allowed || d.Index != 0 {
			t.Fatalf("%s: rate spent: %+v, want denied by the rate", rateKey, d)
		}
		wantPermits(t, rateKey+": the permit beside a denied rate", per[1], true, 1, 0, 0)
		wantPermits(t, rateKey+": the permits after", e.allow(k2, l, 0), true, 1, 0, 0)
		if rateKey == "k" {
			e.clock.Advance(time.Minute) // the permit of k expires
		}
	}
}

// permitsEach: decided one by one, a permit is taken when it allows,
// whatever the rate says, and is never overdrawn.
func permitsEach(t *testing.T, e *env) {
	l := concurrencyLimit(1, time.Minute)
	rate := &sluice.Limit{Name: "rate", Rate: 1, Period: time.Hour}
	d, _ := e.each(hit("k", rate, 1), permitHit("k", l, "a"))
	if !d.Allowed {
		t.Fatalf("first: %+v", d)
	}
	d, per := e.each(hit("k", rate, 1), permitHit("k", l, "b"))
	if d.Allowed || per[1].Allowed || per[1].Overdrawn {
		t.Fatalf("second: %+v %+v, want the permit denied, not overdrawn", d, per)
	}
	wantPermits(t, "the permits after", e.allow("k", l, 0), true, 0, time.Minute, 0)
	if got := e.release(permitHit("k", l, "a")); got != "1" {
		t.Fatalf("released %s, want 1", got)
	}
	d, per = e.each(hit("k", rate, 1), permitHit("k", l, "c"))
	if d.Allowed || !per[1].Allowed {
		t.Fatalf("rate spent: %+v %+v, want the rate denied and the permit taken", d, per)
	}
	wantPermits(t, "taken one by one", e.allow("k", l, 0), true, 0, time.Minute, 0)
}

// permitsShadowAndPeek: a shadow limit that would deny lets the request
// through and holds nothing; a peek changes nothing.
func permitsShadowAndPeek(t *testing.T, e *env) {
	l := concurrencyLimit(1, time.Minute)
	l.Shadow = true
	rate := &sluice.Limit{Name: "rate", Rate: 5, Period: time.Hour}
	d, _ := e.take(hit("k", rate, 1), permitHit("k", l, "a"))
	if !d.Allowed || d.Shadow {
		t.Fatalf("first: %+v", d)
	}
	d, per := e.take(hit("k", rate, 1), permitHit("k", l, "b"))
	if !d.Allowed || !d.Shadow || per[1].Allowed {
		t.Fatalf("second: %+v %+v, want allowed, the shadow permit denied", d, per)
	}
	want(t, "the rate", e.allow("k", rate, 0), true, 3)
	wantPermits(t, "a peek", e.allow("k", l, 0), true, 0, time.Minute, 0)
	if got := e.release(permitHit("k", l, "b")); got != "0" {
		t.Fatalf("released %s of a permit never taken, want 0", got)
	}
	wantPermits(t, "b was never held", e.allow("k", l, 0), true, 0, time.Minute, 0)
}

// permitsSeveral: two permits of one key in one request, all or nothing;
// one ID twice counts once.
func permitsSeveral(t *testing.T, e *env) {
	l := concurrencyLimit(3, time.Minute)
	d, per := e.take(permitHit("k", l, "a"), permitHit("k", l, "b"))
	if !d.Allowed || per[0].Remaining != 2 || per[1].Remaining != 1 {
		t.Fatalf("two: %+v %+v", d, per)
	}
	d, per = e.take(permitHit("k", l, "c"), permitHit("k", l, "d"))
	if d.Allowed || !per[0].Allowed || per[0].Remaining != 1 || per[1].Allowed {
		t.Fatalf("two more: %+v %+v, want the second denied and the first to report 1 left", d, per)
	}
	d, per = e.take(permitHit("k", l, "c"), permitHit("k", l, "c"), permitHit("k", l, "a"))
	if !d.Allowed || per[0].Remaining != 0 || per[1].Remaining != 0 || per[2].Remaining != 0 {
		t.Fatalf("c twice and a retry: %+v %+v", d, per)
	}
	wantPermits(t, "after", e.allow("k", l, 0), true, 0, time.Minute, 0)
}

// permitsReleaseRenew: release frees a slot, twice or unknown harmlessly;
// renewal extends a held permit; the renewal of a permit no longer held
// acquires it again when its key has room, and otherwise says it is lost
// and does not add it back.
func permitsReleaseRenew(t *testing.T, e *env) {
	l := concurrencyLimit(2, 10*time.Second)
	e.take(permitHit("k", l, "a"))
	e.clock.Advance(time.Second)
	e.take(permitHit("k", l, "b"))
	for i, want := range []string{"10", "00"} {
		if got := e.release(permitHit("k", l, "a"), permitHit("k", l, "never")); got != want {
			t.Fatalf("release %d: removed %s, want %s (a held, then not; never, never)", i, got, want)
		}
	}
	wantPermits(t, "after a release", e.allow("k", l, 0), true, 1, 10*time.Second, 0)
	e.take(permitHit("k", l, "c"))
	e.clock.Advance(8 * time.Second)
	out := e.renew(permitHit("k", l, "b"), permitHit("k", l, "a"))
	wantPermits(t, "renewed b", out[0], true, 0, 2*time.Second, 0)
	wantPermits(t, "renewed a, released", out[1], false, 0, 2*time.Second, sluice.Never)
	e.clock.Advance(3 * time.Second) // c expires; b lives 7 s more
	out = e.renew(permitHit("k", l, "c"))
	wantPermits(t, "c, expired, with room: held again", out[0], true, 0, 7*time.Second, 0)
	wantPermits(t, "c is back", e.allow("k", l, 0), true, 0, 7*time.Second, 0)
	out = e.renew(permitHit("k", l, "a"))
	wantPermits(t, "a, full: lost", out[0], false, 0, 7*time.Second, sluice.Never)
	wantPermits(t, "a is not back", e.allow("k", l, 0), true, 0, 7*time.Second, 0)
	e.clock.Advance(7 * time.Second)
	wantPermits(t, "b expired in its turn", e.allow("k", l, 0), true, 1, 3*time.Second, 0)
}

// permitsHandOver: a renewal of Cost 1 hands a permit over: held whatever
// the room (added to a full set, renewed if held), then renewed,
// released and counted as any; a newcomer waits until the set is below
// its N; in a call mixed with plain renewals, each is what its Cost says.
func permitsHandOver(t *testing.T, e *env) {
	l := concurrencyLimit(2, 10*time.Second)
	e.take(permitHit("k", l, "a"))
	e.take(permitHit("k", l, "b"))
	out := e.handOver(permitHit("k", l, "h"))
	wantPermits(t, "handed over to a full set", out[0], true, 0, 10*time.Second, 0)
	d, _ := e.take(permitHit("k", l, "new"))
	wantPermits(t, "a newcomer over N", d, false, 0, 10*time.Second, 10*time.Second)
	e.clock.Advance(4 * time.Second)
	out = e.handOver(permitHit("k", l, "h"), permitHit("k", l, "x"))
	wantPermits(t, "handed over again: renewed", out[0], true, 0, 6*time.Second, 0)
	wantPermits(t, "another handed over", out[1], true, 0, 6*time.Second, 0)
	if got := e.release(permitHit("k", l, "a"), permitHit("k", l, "x")); got != "11" {
		t.Fatalf("released %s, want 11", got)
	}
	d, _ = e.take(permitHit("k", l, "new"))
	wantPermits(t, "b and h held of 2", d, false, 0, 6*time.Second, 6*time.Second)
	mixed := []sluice.Hit{permitHit("k", l, "y"), permitHit("k", l, "z")}
	mixed[1].Cost = 0
	out = make([]sluice.Decision, 2)
	if err := e.store.(decorator.Permitter).Permits(context.Background(), mixed, out, false); err != nil {
		t.Fatal(err)
	}
	wantPermits(t, "mixed: the hand-over", out[0], true, 0, 6*time.Second, 0)
	wantPermits(t, "mixed: the renewal of one not held, full", out[1], false, 0, 6*time.Second, sluice.Never)
	e.clock.Advance(6 * time.Second) // b expires
	wantPermits(t, "h and y held", e.allow("k", l, 0), true, 0, 4*time.Second, 0)
}

// permitsExpiry: a holder that never releases blocks until its permit
// expires, on the store's clock, not a moment longer or shorter.
func permitsExpiry(t *testing.T, e *env) {
	l := concurrencyLimit(1, 5*time.Second)
	e.take(permitHit("k", l, "dead"))
	e.clock.Advance(5*time.Second - time.Millisecond)
	d, _ := e.take(permitHit("k", l, "next"))
	wantPermits(t, "a millisecond before", d, false, 0, time.Millisecond, time.Millisecond)
	e.clock.Advance(time.Millisecond)
	d, _ = e.take(permitHit("k", l, "next"))
	wantPermits(t, "at the expiry", d, true, 0, 5*time.Second, 0)
	// A permit of a period that is not whole milliseconds lives to the
	// next whole one.
	odd := concurrencyLimit(1, 1500*time.Microsecond)
	e.take(permitHit("odd", odd, "x"))
	e.clock.Advance(1500 * time.Microsecond)
	d, _ = e.take(permitHit("odd", odd, "y"))
	wantPermits(t, "rounded up", d, false, 0, 500*time.Microsecond, 500*time.Microsecond)
}

// permitsOneSet: the permits of a key are one set whatever the limit's N
// and TTL say (a rules reload that changes them): those held under one
// count under another, keep their own expiries, and are renewed and
// released under any; a new TTL applies to the permits acquired or
// renewed under it. After N is lowered below the permits held, they stay
// held and new ones are refused until fewer are held than the new N.
func permitsOneSet(t *testing.T, e *env) {
	a := concurrencyLimit(2, 10*time.Second)
	e.take(permitHit("k", a, "p0"))
	e.take(permitHit("k", a, "p1"))
	b := concurrencyLimit(3, 20*time.Second) // max and ttl raised
	wantPermits(t, "the permits held under another limit", e.allow("k", b, 0), true, 1, 10*time.Second, 0)
	d, _ := e.take(permitHit("k", b, "p2"))
	wantPermits(t, "one more under the new one", d, true, 0, 10*time.Second, 0)
	d, _ = e.take(permitHit("k", a, "p3"))
	wantPermits(t, "the old limit counts the new permit", d, false, 0, 10*time.Second, 10*time.Second)
	c := concurrencyLimit(1, 5*time.Second) // max and ttl lowered below what is held
	d, _ = e.take(permitHit("k", c, "p3"))
	wantPermits(t, "lowered: refused", d, false, 0, 10*time.Second, 10*time.Second)
	e.clock.Advance(time.Second)
	out := e.renew(permitHit("k", c, "p0"), permitHit("k", b, "p1"))
	wantPermits(t, "p0 renewed under c: never shortened", out[0], true, 0, 10*time.Second-time.Second, 0)
	wantPermits(t, "p1 renewed under b", out[1], true, 0, 9*time.Second, 0)
	if got := e.release(permitHit("k", b, "p0")); got != "1" {
		t.Fatalf("released %s under another limit, want 1", got)
	}
	d, _ = e.take(permitHit("k", c, "p3"))
	wantPermits(t, "two held of one: still refused", d, false, 0, 19*time.Second, 19*time.Second)
	e.clock.Advance(20 * time.Second) // p2 expires at 20 s, p1 (renewed under b) at 21 s
	d, _ = e.take(permitHit("k", c, "p3"))
	wantPermits(t, "below the new N", d, true, 0, 5*time.Second, 0)
}

// permitsMany: 256 goroutines each hold a permit of a limit of 8 on one
// key once, acquiring until admitted (backing off, so that a shared
// store's calls are mostly the holders'): never more than 8 hold one at
// once, and a release twice is harmless. (The root package's and
// redisstore's own tests run 2,000.)
func permitsMany(t *testing.T, e *env) {
	const n, maxHeld = 256, 8
	l := concurrencyLimit(maxHeld, time.Hour)
	ctx := context.Background()
	var held, peak, done atomic.Int64
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for try := 0; ; try++ {
				p, _, err := e.lim.Acquire(ctx, []sluice.Hit{{Key: "hot", Limit: l, Cost: 1}}, nil)
				if err != nil {
					t.Error(err)
					return
				}
				if p == nil {
					// Full jitter, up to 1, 2, 4 ... 64 ms.
					time.Sleep(time.Duration(rng.Int64N(int64(time.Millisecond) << min(try, 6))))
					continue
				}
				h := held.Add(1)
				for pk := peak.Load(); h > pk && !peak.CompareAndSwap(pk, h); pk = peak.Load() {
				}
				time.Sleep(time.Millisecond)
				held.Add(-1)
				for range 2 {
					if err := p.Release(ctx); err != nil {
						t.Error(err)
					}
				}
				done.Add(1)
				return
			}
		})
	}
	wg.Wait()
	if pk := peak.Load(); pk > maxHeld {
		t.Fatalf("%d holders at once, limit %d", pk, maxHeld)
	}
	if got := done.Load(); got != n {
		t.Fatalf("%d of %d held a permit", got, n)
	}
	wantPermits(t, "after all released", e.allow("hot", l, 0), true, maxHeld, 0, 0)
}

// release releases the permits of hits and returns what each release
// reports, "1" for a permit the store held and removed, "0" for one it
// did not hold, checking the decisions' other fields; then releases them
// again with out nil, which finds nothing and must not fail.
func (e *env) release(hits ...sluice.Hit) string {
	e.t.Helper()
	out := make([]sluice.Decision, len(hits))
	if err := e.store.(decorator.Permitter).Permits(context.Background(), hits, out, true); err != nil {
		e.t.Fatalf("Release: %v", err)
	}
	var b strings.Builder
	for i, d := range out {
		wantRetry := time.Duration(0)
		if !d.Allowed {
			wantRetry = sluice.Never
		}
		if d.Limit != hits[i].Limit.Rate || d.Remaining != 0 || d.ResetAfter != 0 || d.RetryAfter != wantRetry {
			e.t.Fatalf("release of %s: %+v, want Limit %d and no count", hits[i].Permit, d, hits[i].Limit.Rate)
		}
		b.WriteByte("01"[boolInt(d.Allowed)])
	}
	if err := e.store.(decorator.Permitter).Permits(context.Background(), hits, nil, true); err != nil {
		e.t.Fatalf("Release, out nil: %v", err)
	}
	return b.String()
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// renew renews the permits of hits and returns their decisions.
func (e *env) renew(hits ...sluice.Hit) []sluice.Decision {
	e.t.Helper()
	for i := range hits {
		hits[i].Cost = 0 // a renewal (Cost 1 hands over)
	}
	out := make([]sluice.Decision, len(hits))
	if err := e.store.(decorator.Permitter).Permits(context.Background(), hits, out, false); err != nil {
		e.t.Fatalf("Renew: %v", err)
	}
	return out
}

// handOver renews hits as hand-overs (Cost 1).
func (e *env) handOver(hits ...sluice.Hit) []sluice.Decision {
	e.t.Helper()
	out := make([]sluice.Decision, len(hits))
	if err := e.store.(decorator.Permitter).Permits(context.Background(), hits, out, false); err != nil {
		e.t.Fatalf("Renew (hand-over): %v", err)
	}
	return out
}
