package redisstore

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/fault"
	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/internal/testsupport/redistest"
	"github.com/sluicehq/sluice/internal/vocab/limits"
	"github.com/sluicehq/sluice/storetest"
)

// rawState reads the state of key under limit l straight from Redis.
func rawState(t *testing.T, srv *redistest.Server, s *Store, key string, l *sluice.Limit) algo.State {
	t.Helper()
	p := limits.Params(l)
	k := keyer{prefix: s.cfg.Prefix, tag: s.tag}
	h := sluice.Hit{Key: key, Limit: l}
	v, err := srv.Do("GET", k.stateKey(&h, &p))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := v.(string)
	if raw == "" {
		return algo.State{}
	}
	var n [3]int64
	f := strings.Fields(raw)
	if len(f) > len(n) {
		t.Fatalf("state %q", raw)
	}
	for i := range f {
		if n[i], err = strconv.ParseInt(f[i], 10, 64); err != nil {
			t.Fatalf("state %q: %v", raw, err)
		}
	}
	if p.Kind == algo.SlidingWindow {
		return algo.State{A: n[0], B: n[1]<<32 | n[2]}
	}
	return algo.State{A: n[0], B: n[1]}
}

// TestSettleOnce: a settlement sent twice with the same ID (a retry after
// a lost reply) is applied once, a refund as a charge; another ID is
// another settlement.
func TestSettleOnce(t *testing.T) {
	srv := redistest.Standalone(t)
	clock := storetest.NewClock(storetest.Start)
	s := newTestStore(t, Config{URL: srv.URL()}, clock.Now)
	lim := sluice.NewLimiter(s)
	ctx := context.Background()
	l := &sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 100, Period: time.Minute}

	settle := func(key string, cost, spent int64, id uint64, want ...int64) {
		t.Helper()
		at := clock.Now()
		h := sluice.Hit{Key: key, Limit: l, Cost: cost}
		d, err := lim.Take(ctx, []sluice.Hit{h}, make([]sluice.Decision, 1))
		if err != nil || !d.Allowed {
			t.Fatalf("reserving %d: %+v, %v", cost, d, err)
		}
		st := &sluice.Settlement{Hit: h, Spent: spent, ResetAfter: d.ResetAfter, At: at, ID: id}
		for i, w := range want {
			moved, err := lim.Settle(ctx, st)
			if err != nil || moved != w {
				t.Fatalf("settling %d of %d, call %d: moved %d, %v; want %d", spent, cost, i+1, moved, err, w)
			}
		}
	}
	settle("refund", 60, 20, 7, -40, 0, 0)
	if st := rawState(t, srv, s, "refund", l); st.B != 20 {
		t.Errorf("after a refund settled three times: count %d, want 20", st.B)
	}
	settle("charge", 30, 90, 7, 60, 0)
	if st := rawState(t, srv, s, "charge", l); st.B != 90 {
		t.Errorf("after a charge settled twice: count %d, want 90", st.B)
	}
	// The same ID on another reservation of the key is another marker's
	// business only if the ID differs: a caller gives each its own.
	settle("charge", 10, 0, 8, -10, 0)
	if st := rawState(t, srv, s, "charge", l); st.B != 90 {
		t.Errorf("after a second settlement: count %d, want 90", st.B)
	}
}

// TestSettleRacesTakes settles reservations on one key from 16
// goroutines while they take on it too, on Redis's own clock: no update
// is lost, so the key counts exactly what was taken plus what the
// settlements report they charged, minus what they report refunded.
func TestSettleRacesTakes(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{URL: srv.URL()}, nil)
	lim := sluice.NewLimiter(s)
	ctx := context.Background()
	now, err := srv.Time()
	if err != nil {
		t.Fatal(err)
	}
	// A day-long window whose end is half a day away, and a bucket that
	// refills one token a day: neither moves while the test runs.
	day := 24 * time.Hour
	off := time.Duration((now.UnixNano() + int64(day/2)) % int64(day))
	for _, l := range []*sluice.Limit{
		{Name: "fw", Algorithm: sluice.FixedWindow, Rate: 1 << 40, Period: day, WindowOffset: off},
		{Name: "tb", Algorithm: sluice.TokenBucket, Rate: 1, Period: day, Burst: 1 << 40},
	} {
		t.Run(l.Name, func(t *testing.T) {
			var total atomic.Int64 // taken + charged − refunded
			var wg sync.WaitGroup
			for g := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(g), 1))
					for i := range 25 {
						at := time.Now().Add(-time.Millisecond)
						h := sluice.Hit{Key: "hot", Limit: l, Cost: 1 + rng.Int64N(50)}
						d, err := lim.Take(ctx, []sluice.Hit{h}, make([]sluice.Decision, 1))
						if err != nil || !d.Allowed {
							t.Errorf("taking %d: %+v, %v", h.Cost, d, err)
							return
						}
						total.Add(h.Cost)
						if i%3 == 2 {
							continue // a plain take, not settled
						}
						spent := rng.Int64N(2*h.Cost + 1)
						st := &sluice.Settlement{Hit: h, Spent: spent, ResetAfter: d.ResetAfter, At: at, ID: uint64(g<<16 | i + 1)}
						moved, err := lim.Settle(ctx, st)
						if err != nil {
							t.Errorf("settling %d of %d: %v", spent, h.Cost, err)
							return
						}
						if l.Algorithm == sluice.FixedWindow && moved != spent-h.Cost {
							t.Errorf("settling %d of %d in its window: moved %d", spent, h.Cost, moved)
						}
						if l.Algorithm == sluice.TokenBucket && (moved > 0 && moved != spent-h.Cost || moved < 0 && moved < spent-h.Cost) {
							t.Errorf("settling %d of %d: moved %d", spent, h.Cost, moved)
						}
						total.Add(moved)
					}
				}()
			}
			wg.Wait()
			d, err := lim.AllowN(ctx, "hot", l, 0)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := d.Remaining, int64(1<<40)-total.Load(); got != want {
				t.Errorf("remaining %d, want %d (the limit less %d taken and settled)", got, want, total.Load())
			}
		})
	}
}

// TestSettleRedisDown: a settlement while Redis is down fails with a
// StoreError and changes nothing; once Redis is back, the same settlement
// is applied, once.
func TestSettleRedisDown(t *testing.T) {
	// Persisted on every write, so that the state survives the crash.
	srv := redistest.Standalone(t, redistest.WithConfig("appendonly", "yes"), redistest.WithConfig("appendfsync", "always"))
	clock := storetest.NewClock(storetest.Start)
	s := newTestStore(t, Config{URL: srv.URL(), Timeout: 100 * time.Millisecond, BreakerCooldown: 50 * time.Millisecond}, clock.Now)
	lim := sluice.NewLimiter(s)
	ctx := context.Background()
	l := &sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 100, Period: time.Minute}
	warm(t, lim, l) // connected: a short Timeout bounds the first dial too
	at := clock.Now()
	h := sluice.Hit{Key: "k", Limit: l, Cost: 60}
	d, err := lim.Take(ctx, []sluice.Hit{h}, make([]sluice.Decision, 1))
	if err != nil || !d.Allowed {
		t.Fatalf("reserving: %+v, %v", d, err)
	}
	st := &sluice.Settlement{Hit: h, Spent: 20, ResetAfter: d.ResetAfter, At: at, ID: 1}

	srv.Kill()
	moved, err := lim.Settle(ctx, st)
	var se *fault.StoreError
	if !errors.As(err, &se) || moved != 0 {
		t.Fatalf("settling while Redis is down: moved %d, %v; want a StoreError", moved, err)
	}
	srv.Restart()
	if got := rawState(t, srv, s, "k", l); got.B != 60 {
		t.Fatalf("after a failed settlement: count %d, want 60", got.B)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		moved, err = lim.Settle(ctx, st)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no settlement 10s after Redis came back: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if moved != -40 {
		t.Fatalf("settling once Redis is back: moved %d, want -40", moved)
	}
	// Again: nothing moves. A connection of the client's pool that was
	// open to the killed server fails its first call (EOF, seen in a
	// full run): a store error, after which the call is made again.
	for {
		moved, err = lim.Settle(ctx, st)
		if err == nil {
			break
		}
		if !errors.As(err, &se) || time.Now().After(deadline) {
			t.Fatalf("settling again: moved %d, %v; want 0", moved, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if moved != 0 {
		t.Fatalf("settling again: moved %d; want 0", moved)
	}
	if got := rawState(t, srv, s, "k", l); got.B != 20 {
		t.Fatalf("after the settlement: count %d, want 20", got.B)
	}
}

// TestSettleMarker: on Redis's own clock, a settlement writes its
// marker with a time to live of two periods and a minute, and the state
// with its window's; the marker alone keeps a second call from applying
// it again. A refund that leaves a bucket full deletes its state.
func TestSettleMarker(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{URL: srv.URL()}, nil)
	lim := sluice.NewLimiter(s)
	ctx := context.Background()
	k := keyer{prefix: s.cfg.Prefix, tag: s.tag}
	reserve := func(key string, l *sluice.Limit, cost, spent int64) (*sluice.Settlement, string) {
		t.Helper()
		now, err := srv.Time()
		if err != nil {
			t.Fatal(err)
		}
		h := sluice.Hit{Key: key, Limit: l, Cost: cost}
		d, err := lim.Take(ctx, []sluice.Hit{h}, make([]sluice.Decision, 1))
		if err != nil || !d.Allowed {
			t.Fatalf("reserving %d: %+v, %v", cost, d, err)
		}
		p := limits.Params(l)
		return &sluice.Settlement{Hit: h, Spent: spent, ResetAfter: d.ResetAfter, At: now, ID: 0xbeef}, k.stateKey(&h, &p)
	}

	// A day-long window whose end is half a day away: the state's TTL.
	day := 24 * time.Hour
	now, err := srv.Time()
	if err != nil {
		t.Fatal(err)
	}
	off := time.Duration((now.UnixNano() + int64(day/2)) % int64(day))
	w := &sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 100, Period: day, WindowOffset: off}
	st, key := reserve("w", w, 60, 20)
	if moved, err := lim.Settle(ctx, st); err != nil || moved != -40 {
		t.Fatalf("settling 20 of 60: moved %d, %v; want -40", moved, err)
	}
	marker := key + ":sbeef"
	if ttl, _ := srv.Cmd("PTTL", marker).(int64); ttl <= int64((2*day+time.Minute-10*time.Second)/time.Millisecond) || ttl > int64((2*day+time.Minute)/time.Millisecond) {
		t.Errorf("the marker's time to live: %v ms, want two days and a minute", srv.Cmd("PTTL", marker))
	}
	if ttl, _ := srv.Cmd("PTTL", key).(int64); ttl < int64(day/2/time.Millisecond)-10000 || ttl > int64(day/2/time.Millisecond)+10000 {
		t.Errorf("the state's time to live: %v ms, want half a day (the window's end)", srv.Cmd("PTTL", key))
	}
	if moved, err := lim.Settle(ctx, st); err != nil || moved != 0 {
		t.Fatalf("settling again: moved %d, %v; want 0", moved, err)
	}
	srv.Cmd("DEL", marker)
	if moved, err := lim.Settle(ctx, st); err != nil || moved != -20 {
		t.Fatalf("settling again without the marker: moved %d, %v; want the 20 left refunded", moved, err)
	}
	if got := rawState(t, srv, s, "w", w); got.B != 0 {
		t.Errorf("after the refunds: count %d, want 0", got.B)
	}

	// A bucket settled at the instant it was reserved (a caller's clock):
	// the whole reservation comes back, and the bucket, full again, has
	// no state.
	clock := storetest.NewClock(storetest.Start)
	s2 := newTestStore(t, Config{URL: srv.URL()}, clock.Now)
	lim2 := sluice.NewLimiter(s2)
	b := &sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 1, Period: day, Burst: 100}
	h := sluice.Hit{Key: "b", Limit: b, Cost: 50}
	d, err := lim2.Take(ctx, []sluice.Hit{h}, make([]sluice.Decision, 1))
	if err != nil || !d.Allowed {
		t.Fatalf("reserving 50: %+v, %v", d, err)
	}
	p := limits.Params(b)
	k2 := keyer{prefix: s2.cfg.Prefix, tag: s2.tag}
	key = k2.stateKey(&h, &p)
	if n, _ := srv.Cmd("EXISTS", key).(int64); n != 1 {
		t.Fatalf("no state after the reservation")
	}
	st = &sluice.Settlement{Hit: h, Spent: 0, ResetAfter: d.ResetAfter, At: clock.Now(), ID: 0xbeef}
	if moved, err := lim2.Settle(ctx, st); err != nil || moved != -50 {
		t.Fatalf("settling 0 of 50: moved %d, %v; want -50", moved, err)
	}
	if n, _ := srv.Cmd("EXISTS", key).(int64); n != 0 {
		t.Errorf("a full bucket's state is still there: %v", srv.Cmd("GET", key))
	}
	if n, _ := srv.Cmd("EXISTS", key+":sbeef").(int64); n != 1 {
		t.Errorf("no marker after the refund")
	}
}

// TestSettleWrongType: a settlement whose state key holds another type
// fails with a StoreError of Redis's refusal, and changes nothing.
func TestSettleWrongType(t *testing.T) {
	srv := redistest.Standalone(t)
	clock := storetest.NewClock(storetest.Start)
	s := newTestStore(t, Config{URL: srv.URL()}, clock.Now)
	lim := sluice.NewLimiter(s)
	l := &sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 100, Period: time.Minute}
	h := sluice.Hit{Key: "k", Limit: l, Cost: 10}
	p := limits.Params(l)
	k := keyer{prefix: s.cfg.Prefix, tag: s.tag}
	key := k.stateKey(&h, &p)
	srv.Cmd("RPUSH", key, "x")
	st := &sluice.Settlement{Hit: h, Spent: 30, ResetAfter: time.Minute, At: clock.Now(), ID: 1}
	moved, err := lim.Settle(context.Background(), st)
	var se *fault.StoreError
	if !errors.As(err, &se) || se.Reason != fault.Error || moved != 0 {
		t.Fatalf("settling on a list: moved %d, %v; want a StoreError (%s)", moved, err, fault.Error)
	}
	if n, _ := srv.Cmd("EXISTS", key+":s1").(int64); n != 0 {
		t.Errorf("a failed settlement left its marker")
	}
}
