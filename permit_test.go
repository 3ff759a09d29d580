package sluice_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memstore"
)

func concurrency(n int64, ttl time.Duration) *sluice.Limit {
	return &sluice.Limit{Name: "c", Algorithm: sluice.Concurrency, Rate: n, Period: ttl}
}

// TestConcurrencyValidate: a Concurrency limit refuses every setting of a
// rate's, and bad permits are ErrInvalid and change nothing.
func TestConcurrencyValidate(t *testing.T) {
	if got := sluice.Concurrency.String(); got != "concurrency" {
		t.Errorf("String: %q", got)
	}
	ok := concurrency(4, time.Second)
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	shadow := *ok
	shadow.Shadow = true
	if err := shadow.Validate(); err != nil {
		t.Errorf("shadow: %v", err)
	}
	for name, c := range map[string]struct {
		change func(l *sluice.Limit)
		want   string
	}{
		"burst":          {func(l *sluice.Limit) { l.Burst = 5 }, "burst applies only"},
		"refill":         {func(l *sluice.Limit) { l.RefillInterval = time.Second }, "refill interval applies only"},
		"soft":           {func(l *sluice.Limit) { l.SoftPercent = 10 }, "no a soft percent"},
		"elastic":        {func(l *sluice.Limit) { l.ElasticCeiling = 8 }, "no an elastic ceiling"},
		"block_for":      {func(l *sluice.Limit) { l.BlockFor = time.Minute }, "no block_for"},
		"lease":          {func(l *sluice.Limit) { l.LeaseOvershoot = 2 }, "leases"},
		"debit":          {func(l *sluice.Limit) { l.Debit = true }, "no debit"},
		"global":         {func(l *sluice.Limit) { l.Global = true }, "no global"},
		"offset":         {func(l *sluice.Limit) { l.WindowOffset = time.Millisecond }, "window offset"},
		"sketch":         {func(l *sluice.Limit) { l.Sketch.Width = 8 }, "sketch settings"},
		"no ttl":         {func(l *sluice.Limit) { l.Period = 0 }, "period must be positive"},
		"too many":       {func(l *sluice.Limit) { l.Rate = 1<<20 + 1 }, "at most 1048576 permits"},
		"unknown kind 8": {func(l *sluice.Limit) { l.Algorithm = sluice.Concurrency + 1 }, "unknown algorithm"},
	} {
		l := *ok
		c.change(&l)
		err := l.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, c.want)
		}
	}

	now := epoch
	lim := newLimiter(t, &now)
	ctx := context.Background()
	rate := &sluice.Limit{Rate: 5, Period: time.Minute}
	for _, tc := range []struct {
		name string
		hit  sluice.Hit
		want string
	}{
		{"no permit", sluice.Hit{Key: "k", Limit: ok, Cost: 1}, "needs a permit ID"},
		{"cost 2", sluice.Hit{Key: "k", Limit: ok, Cost: 2, Permit: "a"}, "costs 0 (a peek) or 1"},
		{"long permit", sluice.Hit{Key: "k", Limit: ok, Cost: 1, Permit: strings.Repeat("p", 65)}, "permit ID of 65 bytes"},
	} {
		// With a rate hit first: it must not be consumed either.
		hits := []sluice.Hit{{Key: "k", Limit: rate, Cost: 1}, tc.hit}
		_, err := lim.Take(ctx, hits, make([]sluice.Decision, 2))
		if !errors.Is(err, sluice.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalid with %q", tc.name, err, tc.want)
		}
	}
	if d, err := lim.AllowN(ctx, "k", rate, 0); err != nil || d.Remaining != 5 {
		t.Errorf("the rate after bad permits: %+v %v, want 5 left", d, err)
	}
	// A rate limit ignores Permit.
	if d, err := lim.Take(ctx, []sluice.Hit{{Key: "k", Limit: rate, Cost: 1, Permit: strings.Repeat("p", 100)}}, make([]sluice.Decision, 1)); err != nil || !d.Allowed {
		t.Errorf("a rate hit with a permit: %+v %v", d, err)
	}
	// A permit of 64 bytes is fine.
	if d, err := lim.Take(ctx, []sluice.Hit{{Key: "k", Limit: ok, Cost: 1, Permit: strings.Repeat("p", 64)}}, make([]sluice.Decision, 1)); err != nil || !d.Allowed {
		t.Errorf("a permit of 64 bytes: %+v %v", d, err)
	}
	run := func(context.Context) error { t.Error("fn ran"); return nil }
	if _, err := lim.Hold(ctx, "k", rate, run); !errors.Is(err, sluice.ErrInvalid) {
		t.Errorf("Hold on a rate: %v, want ErrInvalid", err)
	}
	if _, err := lim.Hold(ctx, "k", nil, run); !errors.Is(err, sluice.ErrInvalid) {
		t.Errorf("Hold without a limit: %v, want ErrInvalid", err)
	}
	if _, _, err := lim.Acquire(ctx, []sluice.Hit{{Key: "k", Limit: nil, Cost: 1}}, nil); !errors.Is(err, sluice.ErrInvalid) {
		t.Errorf("Acquire without a limit: %v, want ErrInvalid", err)
	}
}

// TestAcquireAllOrNothing: a request's rates and permits are taken
// together: refused a slot, it takes nothing from its rate; refused by its
// rate, it holds no slot. Without a permit hit, Acquire is Take.
func TestAcquireAllOrNothing(t *testing.T) {
	ctx := context.Background()
	lim := sluice.NewLimiter(memstore.New(memstore.Config{SweepInterval: -1}))
	rate := &sluice.Limit{Rate: 3, Period: time.Hour}
	slots := concurrency(1, time.Hour)
	hits := func() []sluice.Hit {
		return []sluice.Hit{{Key: "r", Limit: rate, Cost: 1}, {Key: "c", Limit: slots, Cost: 1}}
	}
	held, d, err := lim.Acquire(ctx, hits(), nil)
	if err != nil || !d.Allowed || held == nil {
		t.Fatalf("first: %v %+v %v", held, d, err)
	}
	// The slot is taken: refused, and the rate keeps its 2.
	if p, d, err := lim.Acquire(ctx, hits(), nil); err != nil || d.Allowed || p != nil || d.Index != 1 {
		t.Fatalf("without a slot: %v %+v %v", p, d, err)
	}
	if d, _ := lim.AllowN(ctx, "r", rate, 0); d.Remaining != 2 {
		t.Fatalf("a request refused a slot took from its rate: %d left, want 2", d.Remaining)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Spend the rate: a request refused by it holds no slot.
	if _, err := lim.AllowN(ctx, "r", rate, 2); err != nil {
		t.Fatal(err)
	}
	if p, d, err := lim.Acquire(ctx, hits(), nil); err != nil || d.Allowed || p != nil || d.Index != 0 {
		t.Fatalf("without rate: %v %+v %v", p, d, err)
	}
	if d, _ := lim.AllowN(ctx, "c", slots, 0); d.Remaining != 1 {
		t.Fatalf("a request refused by its rate holds a slot: %d free, want 1", d.Remaining)
	}
	// No permit hit: a Take, no Permit.
	if p, d, err := lim.Acquire(ctx, []sluice.Hit{{Key: "r2", Limit: rate, Cost: 1}}, nil); err != nil || !d.Allowed || p != nil {
		t.Fatalf("rates only: %v %+v %v", p, d, err)
	}
	// Released by ID, as a server does for a later request.
	h := hits()[1:]
	p, d, err := lim.Acquire(ctx, h, nil)
	if err != nil || !d.Allowed || p == nil || h[0].Permit == "" {
		t.Fatalf("slot: %v %+v %v %q", p, d, err, h[0].Permit)
	}
	out := make([]sluice.Decision, 1)
	if err := lim.Release(ctx, h, out); err != nil || !out[0].Allowed {
		t.Fatalf("Release by ID: %+v %v, want the permit removed", out[0], err)
	}
	if d, _ := lim.AllowN(ctx, "c", slots, 0); d.Remaining != 1 {
		t.Fatalf("Release by ID left %d free, want 1", d.Remaining)
	}
	if err := lim.Release(ctx, h, out); err != nil || out[0].Allowed {
		t.Fatalf("Release by ID again: %+v %v, want nothing removed", out[0], err)
	}
	if err := lim.Release(ctx, h, nil); err != nil {
		t.Fatal(err)
	}
}

// takeOnly is a store with Take alone: a memstore seen through the
// Store interface, which cannot release permits.
type takeOnly struct{ sluice.Store }

// TestAcquireNeedsRelease: a store that cannot release permits gives none.
func TestAcquireNeedsRelease(t *testing.T) {
	s := memstore.New(memstore.Config{SweepInterval: -1})
	lim := sluice.NewLimiter(takeOnly{s})
	p, _, err := lim.Acquire(context.Background(), []sluice.Hit{{Key: "k", Limit: concurrency(1, time.Second), Cost: 1}}, nil)
	if p != nil || !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Acquire: %v %v, want ErrUnsupported", p, err)
	}
	// Nor does a store that wraps it, though it has the methods.
	p, _, err = sluice.NewLimiter(lease.New(takeOnly{s}, lease.Config{})).Acquire(context.Background(), []sluice.Hit{{Key: "k", Limit: concurrency(1, time.Second), Cost: 1}}, nil)
	if p != nil || !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Acquire through a decorator: %v %v, want ErrUnsupported", p, err)
	}
	if d, err := sluice.NewLimiter(s).AllowN(context.Background(), "k", concurrency(1, time.Second), 0); err != nil || d.Remaining != 1 {
		t.Fatalf("a permit was taken all the same: %+v %v", d, err)
	}
}

// TestAcquire: permits up to the limit, a denial, release frees a slot
// and twice is harmless, renew extends, a lost permit's renew says so.
func TestAcquire(t *testing.T) {
	now := epoch
	lim := newLimiter(t, &now)
	ctx := context.Background()
	l := concurrency(2, 10*time.Second)
	p1, d, err := lim.Acquire(ctx, []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}, nil)
	if err != nil || p1 == nil || d.Remaining != 1 || d.Limit != 2 || d.ResetAfter != 10*time.Second {
		t.Fatalf("first: %v %+v %v", p1, d, err)
	}
	now = now.Add(3 * time.Second)
	p2, _, _ := lim.Acquire(ctx, []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}, nil)
	p3, d, err := lim.Acquire(ctx, []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}, nil)
	if p2 == nil || p3 != nil || err != nil || d.Allowed || d.RetryAfter != 7*time.Second || d.Remaining != 0 {
		t.Fatalf("third: %v %+v %v, want denied until the first expires in 7s", p3, d, err)
	}
	for range 2 {
		if err := p1.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if held, err := p1.Renew(ctx); held || err != nil {
		t.Fatalf("renewing a released permit: %v %v", held, err)
	}
	p3, _, _ = lim.Acquire(ctx, []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}, nil)
	if p3 == nil {
		t.Fatal("no permit after a release")
	}
	if _, d, _ := lim.Acquire(ctx, []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}, nil); d.Allowed {
		t.Fatal("a released permit's slot was given twice")
	}
	// p2 (acquired at 3s) renewed at 9s lives to 19s; p3 (at 3s) not renewed
	// expires at 13s.
	now = now.Add(6 * time.Second)
	if held, err := p2.Renew(ctx); !held || err != nil {
		t.Fatalf("renew: %v %v", held, err)
	}
	// At 14s p3 has expired: its renewal finds room and holds it again,
	// to 24s.
	now = now.Add(5 * time.Second)
	if held, err := p3.Renew(ctx); !held || err != nil {
		t.Fatalf("renewing an expired permit with room: %v %v, want held again", held, err)
	}
	if d, _ := lim.AllowN(ctx, "k", l, 0); d.Remaining != 0 {
		t.Fatalf("after p3 was held again: %+v, want none left", d)
	}
	// At 20s p2 has expired and another takes its slot: p2's renewal
	// finds no room, and it is lost.
	now = now.Add(6 * time.Second)
	p4, _, _ := lim.Acquire(ctx, []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}, nil)
	if p4 == nil {
		t.Fatal("no permit after p2 expired")
	}
	if held, err := p2.Renew(ctx); held || err != nil {
		t.Fatalf("renewing an expired permit of a full key: %v %v, want lost", held, err)
	}
	if d, _ := lim.AllowN(ctx, "k", l, 0); d.Remaining != 0 {
		t.Fatalf("after p2 was lost: %+v, want none left (p3, p4; p2 not added back)", d)
	}
	if err := p2.Release(ctx); err != nil {
		t.Fatalf("releasing an expired permit: %v", err)
	}
	now = now.Add(10 * time.Second)
	if d, _ := lim.AllowN(ctx, "k", l, 0); d.Remaining != 2 {
		t.Fatalf("after every permit expired: %+v", d)
	}
}

// TestConcurrencyAllOrNothing: a permit denied takes nothing from the
// rate of the same request, and a rate denied takes no permit.
func TestConcurrencyAllOrNothing(t *testing.T) {
	s := memstore.New(memstore.Config{SweepInterval: -1})
	defer s.Close()
	lim := sluice.NewLimiter(s)
	ctx := context.Background()
	c := concurrency(1, time.Minute)
	rate := &sluice.Limit{Name: "r", Rate: 2, Period: time.Hour}
	take := func(id string) (sluice.Decision, []sluice.Decision) {
		hits := []sluice.Hit{{Key: "k", Limit: rate, Cost: 1}, {Key: "k", Limit: c, Cost: 1, Permit: id}}
		out := make([]sluice.Decision, 2)
		d, err := lim.Take(ctx, hits, out)
		if err != nil {
			t.Fatal(err)
		}
		return d, out
	}
	if d, _ := take("a"); !d.Allowed {
		t.Fatalf("first: %+v", d)
	}
	d, per := take("b")
	if d.Allowed || d.Index != 1 || per[0].Remaining != 1 {
		t.Fatalf("second: %+v %+v, want denied by the permit, the rate untouched", d, per)
	}
	if d, _ := take("a"); !d.Allowed {
		t.Fatalf("a retry of a: %+v", d)
	}
	if d, _ := lim.AllowN(ctx, "k", rate, 0); d.Remaining != 0 {
		t.Fatalf("rate: %+v, want spent by the two admitted", d)
	}
	// Release a; then a request the rate denies takes no permit.
	if err := s.Permits(ctx, []sluice.Hit{{Key: "k", Limit: c, Permit: "a"}}, nil, true); err != nil {
		t.Fatal(err)
	}
	if d, _ := take("c"); d.Allowed || d.Index != 0 {
		t.Fatalf("rate spent: %+v, want denied by the rate", d)
	}
	if d, _ := lim.AllowN(ctx, "k", c, 0); d.Remaining != 1 {
		t.Fatalf("permits: %+v, want none taken by the denied request", d)
	}
}

// TestHold: fn runs holding the permit, which is released when it returns
// or panics; a denial does not run it.
func TestHold(t *testing.T) {
	now := epoch
	lim := newLimiter(t, &now)
	ctx := context.Background()
	l := concurrency(1, time.Minute)
	left := func() int64 {
		d, _ := lim.AllowN(ctx, "k", l, 0)
		return d.Remaining
	}
	d, err := lim.Hold(ctx, "k", l, func(ctx context.Context) error {
		if left() != 0 {
			t.Error("fn runs without the permit held")
		}
		d, err := lim.Hold(ctx, "k", l, func(context.Context) error {
			t.Error("a second holder ran")
			return nil
		})
		if d.Allowed || err != nil {
			t.Errorf("second Hold: %+v %v, want denied", d, err)
		}
		return errors.New("fn's")
	})
	if !d.Allowed || err == nil || err.Error() != "fn's" {
		t.Fatalf("Hold: %+v %v, want allowed with fn's error", d, err)
	}
	if left() != 1 {
		t.Fatal("not released after fn returned")
	}
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the panic to go on", r)
			}
		}()
		lim.Hold(ctx, "k", l, func(context.Context) error { panic("boom") })
	}()
	if left() != 1 {
		t.Fatal("not released after fn panicked")
	}
	// A caller's context cancelled while fn runs: released all the same.
	cctx, cancel := context.WithCancel(ctx)
	lim.Hold(cctx, "k", l, func(context.Context) error { cancel(); return nil })
	if left() != 1 {
		t.Fatal("not released after the caller's context was cancelled")
	}
}

// TestHoldRenews: Hold renews every third of the period, so that fn may
// run many periods; when the store's clock jumps past the permit's
// expiry, the next renewal finds it gone and holds it again while the
// key has room; when another took the slot meanwhile, the renewal finds
// it lost and cancels fn's context with a cause, and the other holds the
// slot alone.
func TestHoldRenews(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var jump atomic.Int64
		s := memstore.New(memstore.Config{SweepInterval: -1, Now: func() time.Time { return time.Now().Add(time.Duration(jump.Load())) }})
		defer s.Close()
		lim := sluice.NewLimiter(s)
		ctx := context.Background()
		l := concurrency(1, 3*time.Second)
		d, err := lim.Hold(ctx, "k", l, func(ctx context.Context) error {
			time.Sleep(10 * time.Second) // three periods on: renewed
			if ctx.Err() != nil {
				t.Error("cancelled while renewed")
			}
			if _, d, _ := lim.Acquire(ctx, []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}, nil); d.Allowed {
				t.Error("the slot was free while held")
			}
			jump.Store(int64(4 * time.Second)) // the store's clock jumps past the expiry
			time.Sleep(2 * time.Second)        // a renewal holds it again
			if ctx.Err() != nil {
				t.Error("cancelled while the key had room")
			}
			if _, d, _ := lim.Acquire(ctx, []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}, nil); d.Allowed {
				t.Error("the slot was free after the renewal held it again")
			}
			jump.Store(int64(8 * time.Second)) // past the expiry again, and another takes the slot
			other, d, _ := lim.Acquire(context.Background(), []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}, nil)
			if !d.Allowed {
				t.Error("the expired permit's slot is not free")
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Minute):
				t.Error("not cancelled when the permit was lost")
			}
			if c := context.Cause(ctx); c == nil || !strings.Contains(c.Error(), "permit was lost") {
				t.Errorf("cause %v", c)
			}
			if _, d, _ := lim.Acquire(context.Background(), []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}, nil); d.Allowed {
				t.Error("the lost permit was added back beside the slot's new holder")
			}
			if other != nil {
				other.Release(context.Background())
			}
			return ctx.Err()
		})
		if !d.Allowed || !errors.Is(err, context.Canceled) {
			t.Fatalf("Hold: %+v %v", d, err)
		}
	})
}

// TestHoldShadow: a shadow limit's Hold runs fn even when the limit
// would deny, and never cancels it.
func TestHoldShadow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memstore.New(memstore.Config{SweepInterval: -1})
		defer s.Close()
		lim := sluice.NewLimiter(s)
		l := concurrency(0, time.Second)
		l.Shadow = true
		ran := false
		d, err := lim.Hold(context.Background(), "k", l, func(ctx context.Context) error {
			ran = true
			time.Sleep(5 * time.Second)
			return ctx.Err()
		})
		if !ran || !d.Allowed || !d.Shadow || err != nil {
			t.Fatalf("shadow Hold: ran %v %+v %v", ran, d, err)
		}
	})
}

// TestHoldManyGoroutines: 2,000 goroutines Hold one key with a limit of
// 8: never more than 8 run at once, every one runs in the end.
func TestHoldManyGoroutines(t *testing.T) {
	s := memstore.New(memstore.Config{})
	t.Cleanup(func() { s.Close() })
	holdMany(t, sluice.NewLimiter(s), 2000, 8)
}

// holdMany has n goroutines each Hold, retrying after a denial, or
// Acquire and Release (twice) a permit of a limit of max on one key, and
// fails if more than max hold one at once or any never does.
func holdMany(t *testing.T, lim *sluice.Limiter, n int, maxHeld int64) {
	t.Helper()
	l := concurrency(maxHeld, time.Minute)
	var held, peak, done atomic.Int64
	work := func() {
		h := held.Add(1)
		for p := peak.Load(); h > p && !peak.CompareAndSwap(p, h); p = peak.Load() {
		}
		if h > maxHeld {
			t.Errorf("%d holders at once, limit %d", h, maxHeld)
		}
		time.Sleep(100 * time.Microsecond)
		held.Add(-1)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			for try := 0; ; try++ {
				var ok bool
				var err error
				if i%2 == 0 {
					var d sluice.Decision
					d, err = lim.Hold(ctx, "hot", l, func(context.Context) error { work(); return nil })
					ok = d.Allowed
				} else {
					var p *sluice.Permit
					p, _, err = lim.Acquire(ctx, []sluice.Hit{{Key: "hot", Limit: l, Cost: 1}}, nil)
					if p != nil {
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
				time.Sleep(time.Duration(1+try%8) * time.Millisecond)
			}
		})
	}
	wg.Wait()
	if got := done.Load(); got != int64(n) {
		t.Fatalf("%d of %d holders ran", got, n)
	}
	if d, err := lim.AllowN(ctx, "hot", l, 0); err != nil || d.Remaining != maxHeld {
		t.Fatalf("after all released: %+v %v", d, err)
	}
	t.Logf("peak %d holders at once", peak.Load())
}

// BenchmarkAcquireRelease: Acquire then Release of a permit on memstore,
// over 10,000 keys, one at a time and from GOMAXPROCS goroutines.
func BenchmarkAcquireRelease(b *testing.B) {
	s := memstore.New(memstore.Config{SweepInterval: -1})
	defer s.Close()
	lim := sluice.NewLimiter(s)
	l := concurrency(4, 15*time.Second)
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	ctx := context.Background()
	pair := func(i int) {
		p, _, err := lim.Acquire(ctx, []sluice.Hit{{Key: keys[i%len(keys)], Limit: l, Cost: 1}}, nil)
		if err != nil || p == nil {
			b.Fatalf("acquire: %v %v", p, err)
		}
		if err := p.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			pair(i)
			i++
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for i := 0; pb.Next(); i++ {
				pair(i)
			}
		})
	})
}
