package sluice_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/vocab/permitfunc"
	"github.com/sluicehq/sluice/internal/vocab/permittrace"
	"github.com/sluicehq/sluice/memstore"
)

// traced counts what a permittrace.Trace is told.
type traced struct {
	mu                                               sync.Mutex
	acquired, denied, renewed, lost, released, fails int
}

func (c *traced) trace() *permittrace.Trace {
	add := func(p *int) func(int) {
		return func(n int) {
			c.mu.Lock()
			*p += n
			c.mu.Unlock()
		}
	}
	return &permittrace.Trace{
		Acquired: add(&c.acquired), Denied: add(&c.denied), Renewed: add(&c.renewed), Lost: add(&c.lost),
		Released: func(n int, err error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			if err != nil {
				c.fails += n
			} else {
				c.released += n
			}
		},
	}
}

// counts returns acquired, denied, renewed, lost, released and failed
// releases.
func (c *traced) counts() [6]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return [6]int{c.acquired, c.denied, c.renewed, c.lost, c.released, c.fails}
}

// failingPermits is a store whose releases and renewals fail while down.
type failingPermits struct {
	*memstore.Store
	down atomic.Bool
}

func (s *failingPermits) Permits(ctx context.Context, hits []sluice.Hit, out []sluice.Decision, release bool) error {
	if s.down.Load() {
		return errors.New("down")
	}
	return s.Store.Permits(ctx, hits, out, release)
}

// TestPermitTrace: a Trace in the context is told of each permit taken,
// refused a slot, renewed, found lost (once) and released (or not), and
// the store counts the permits it drops on expiry, a late release's
// included, never a released one.
func TestPermitTrace(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	ms := memstore.New(memstore.Config{SweepInterval: -1, Now: func() time.Time { return time.Unix(0, now.Load()) }})
	defer ms.Close()
	s := &failingPermits{Store: ms}
	lim := sluice.NewLimiter(s)
	var c traced
	ctx := permittrace.With(context.Background(), c.trace())
	l := concurrency(2, 3*time.Second)
	acquire := func(hits ...sluice.Hit) *sluice.Permit {
		t.Helper()
		p, _, err := lim.Acquire(ctx, hits, nil)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	hit := func(key string, l *sluice.Limit) sluice.Hit { return sluice.Hit{Key: key, Limit: l, Cost: 1} }
	want := func(w [6]int) {
		t.Helper()
		if got := c.counts(); got != w {
			t.Fatalf("acquired, denied, renewed, lost, released, failed: %v, want %v", got, w)
		}
	}
	p1, p2 := acquire(hit("k", l)), acquire(hit("k", l))
	if p := acquire(hit("k", l)); p != nil {
		t.Fatal("a third permit of 2")
	}
	// Refused by a rate: no permit refused a slot.
	if p := acquire(hit("j", l), sluice.Hit{Key: "j", Limit: &sluice.Limit{Rate: 0, Period: time.Second}, Cost: 1}); p != nil {
		t.Fatal("admitted past a zero rate")
	}
	p3 := acquire(hit("x", l), hit("y", l))
	want([6]int{4, 1, 0, 0, 0, 0})

	now.Add(int64(2 * time.Second))
	if held, err := p1.Renew(ctx); !held || err != nil {
		t.Fatalf("renew: %v %v", held, err)
	}
	want([6]int{4, 1, 1, 0, 0, 0})
	now.Add(int64(2 * time.Second)) // p2 and p3 expired, p1 held
	p4 := acquire(hit("k", l))      // p2's slot taken: its renewal finds no room
	want([6]int{5, 1, 1, 0, 0, 0})
	for range 2 {
		if held, err := p2.Renew(ctx); held || err != nil {
			t.Fatalf("renew of an expired permit: %v %v", held, err)
		}
	}
	want([6]int{5, 1, 1, 1, 0, 0}) // lost once
	if n := ms.Stats().PermitsExpired; n != 1 {
		t.Fatalf("the store dropped %d permits on expiry, want 1 (p2's)", n)
	}
	if err := p1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p2.Release(ctx); err != nil { // nothing to release: it was lost
		t.Fatal(err)
	}
	if err := p4.Release(ctx); err != nil {
		t.Fatal(err)
	}
	want([6]int{5, 1, 1, 1, 2, 0})
	s.down.Store(true)
	if err := p3.Release(ctx); err == nil {
		t.Fatal("a release through a store that is down")
	}
	want([6]int{5, 1, 1, 1, 2, 2})
	s.down.Store(false)
	// Released after their expiry: too late, the store counts them as
	// expired; the Trace, as released by their holder.
	if err := p3.Release(ctx); err != nil {
		t.Fatal(err)
	}
	want([6]int{5, 1, 1, 1, 4, 2})
	if n := ms.Stats().PermitsExpired; n != 3 {
		t.Fatalf("the store dropped %d permits on expiry, want 3", n)
	}
	// A released permit never expires; a context without a Trace counts
	// nothing.
	p := acquire(hit("z", l))
	if err := p.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	now.Add(int64(time.Hour))
	ms.Sweep()
	if n := ms.Stats().PermitsExpired; n != 3 {
		t.Fatalf("the store dropped %d permits on expiry after a release, want 3", n)
	}
	want([6]int{6, 1, 1, 1, 4, 2})
	// A permit never released expires, counted by the sweep.
	acquire(hit("w", l))
	now.Add(int64(time.Hour))
	ms.Sweep()
	if n := ms.Stats().PermitsExpired; n != 4 {
		t.Fatalf("the sweep counted %d permits expired, want 4", n)
	}
}

// tracedLimiter returns a limiter over a memstore on the wall clock (a
// synctest bubble's), closed with the test, and a context whose Trace
// counts into c.
func tracedLimiter(t *testing.T, c *traced) (*sluice.Limiter, *memstore.Store, context.Context) {
	ms := memstore.New(memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { ms.Close() })
	return sluice.NewLimiter(ms), ms, permittrace.With(context.Background(), c.trace())
}

// TestPermitTraceKeep: Hold's renewals and its release are told to the
// Trace in its context, and a permit whose holder stopped renewing is
// dropped by the store when another asks for its slot.
func TestPermitTraceKeep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c traced
		lim, ms, ctx := tracedLimiter(t, &c)
		l := concurrency(1, 3*time.Second)
		d, err := lim.Hold(ctx, "k", l, func(context.Context) error {
			time.Sleep(10*time.Second + time.Millisecond/2) // renewed at 1, 2, ... 10 s
			return nil
		})
		if !d.Allowed || err != nil {
			t.Fatalf("Hold: %+v %v", d, err)
		}
		if got := c.counts(); got != [6]int{1, 0, 10, 0, 1, 0} {
			t.Fatalf("acquired, denied, renewed, lost, released, failed: %v", got)
		}
		// A holder that never releases nor renews: its slot is refused
		// until its permit expires, then dropped and counted.
		if p, _, err := lim.Acquire(ctx, []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}, nil); p == nil || err != nil {
			t.Fatalf("Acquire: %v %v", p, err)
		}
		if p, _, _ := lim.Acquire(ctx, []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}, nil); p != nil {
			t.Fatal("a second permit of 1")
		}
		time.Sleep(3*time.Second + time.Millisecond) // expiries are whole milliseconds, rounded up
		if p, _, _ := lim.Acquire(ctx, []sluice.Hit{{Key: "k", Limit: l, Cost: 1}}, nil); p == nil {
			t.Fatal("the abandoned permit's slot is not free at its expiry")
		}
		if n := ms.Stats().PermitsExpired; n != 1 {
			t.Fatalf("%d permits expired, want 1", n)
		}
		if got := c.counts(); got != [6]int{3, 1, 10, 0, 1, 0} {
			t.Fatalf("acquired, denied, renewed, lost, released, failed: %v", got)
		}
	})
}

// TestAcquireShadowRefused: a request admitted with an enforced permit
// and a Shadow limit's that would have been denied holds only the first:
// its renewals find nothing lost, and the holder is never cancelled.
func TestAcquireShadowRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c traced
		lim, _, ctx := tracedLimiter(t, &c)
		shadow := concurrency(0, 3*time.Second)
		shadow.Shadow = true
		p, d, err := lim.Acquire(ctx, []sluice.Hit{{Key: "k", Limit: concurrency(1, 3*time.Second), Cost: 1}, {Key: "k", Limit: shadow, Cost: 1}}, nil)
		if p == nil || !d.Allowed || !d.Shadow || err != nil {
			t.Fatalf("Acquire: %v %+v %v", p, d, err)
		}
		kctx, stop := p.Keep(ctx)
		time.Sleep(5*time.Second + time.Second/2) // renewed at 1, 2, ... 5 s
		if kctx.Err() != nil {
			t.Fatalf("cancelled: %v", context.Cause(kctx))
		}
		stop()
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if got := c.counts(); got != [6]int{1, 0, 5, 0, 1, 0} {
			t.Fatalf("acquired, denied, renewed, lost, released, failed: %v", got)
		}
		// Only the Shadow limit's, refused: nothing is held, and Hold
		// runs its function all the same.
		ran := false
		if d, err := lim.Hold(ctx, "k", shadow, func(context.Context) error { ran = true; return nil }); !ran || !d.Allowed || err != nil {
			t.Fatalf("Hold of a refused shadow permit: ran %v %+v %v", ran, d, err)
		}
	})
}

// TestPermitElsewhere: a Permit of permits another service holds
// (internal/vocab/permitfunc, what sluice proxy --store remote keeps for
// a request a remote sluice serve admitted) tells the Trace of its
// acquisition; its Release calls the release function until one
// succeeds, then never again, and tells the Trace of each attempt; Keep
// renews nothing and cancels nothing but by stop; Renew fails.
func TestPermitElsewhere(t *testing.T) {
	var c traced
	ctx := permittrace.With(context.Background(), c.trace())
	var calls atomic.Int32
	var fail atomic.Bool
	fail.Store(true)
	release := func(context.Context) error {
		calls.Add(1)
		if fail.Load() {
			return errors.New("remote down")
		}
		return nil
	}
	p := permitfunc.New(ctx, 3, release).(*sluice.Permit)
	if got := c.counts(); got != [6]int{3, 0, 0, 0, 0, 0} {
		t.Fatalf("after New: %v, want 3 acquired", got)
	}
	synctest.Test(t, func(t *testing.T) {
		kctx, stop := p.Keep(ctx)
		time.Sleep(time.Hour)
		if kctx.Err() != nil {
			t.Fatal("Keep's context ended by itself")
		}
		stop()
		if kctx.Err() == nil {
			t.Fatal("stop did not end Keep's context")
		}
	})
	if held, err := p.Renew(ctx); held || !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Renew: %v %v, want false and ErrUnsupported", held, err)
	}
	if err := p.Release(ctx); err == nil {
		t.Fatal("a failing release returned nil")
	}
	fail.Store(false)
	for range 2 {
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("release called %d times, want 2 (a failure, then a success, then nothing)", n)
	}
	if got := c.counts(); got != [6]int{3, 0, 0, 0, 3, 3} {
		t.Errorf("counts %v, want 3 acquired, 3 released, 3 failed", got)
	}
}
