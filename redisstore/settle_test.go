package redisstore

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/algo"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/redistest"
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
	st, err := decodeState(p.Kind, raw, 0)
	if err != nil {
		t.Fatal(err)
	}
	return st
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
	var se *sluice.StoreError
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
	if moved, err := lim.Settle(ctx, st); err != nil || moved != 0 {
		t.Fatalf("settling again: moved %d, %v; want 0", moved, err)
	}
	if got := rawState(t, srv, s, "k", l); got.B != 20 {
		t.Fatalf("after the settlement: count %d, want 20", got.B)
	}
}

// TestSettleClock: the instant a state is settled for stays before the
// end of the window (or tick) of the Redis time read, whatever the margin.
func TestSettleClock(t *testing.T) {
	sec, ms := int64(time.Second), int64(time.Millisecond)
	t0 := 1_700_000_000 * sec // a whole second
	for _, c := range []struct {
		name string
		p    algo.Params
		t, d int64
		want int64
	}{
		{"fixed, mid-window", algo.Params{Kind: algo.FixedWindow, Period: sec}, t0 + 100*ms, 50 * ms, t0 + 150*ms},
		{"fixed, at the end", algo.Params{Kind: algo.FixedWindow, Period: sec}, t0 + 980*ms, 50 * ms, t0 + sec - 1},
		{"fixed, offset", algo.Params{Kind: algo.FixedWindow, Period: sec, Offset: 300 * ms}, t0 + 280*ms, 50 * ms, t0 + 300*ms - 1},
		{"fixed, offset, after", algo.Params{Kind: algo.FixedWindow, Period: sec, Offset: 300 * ms}, t0 + 320*ms, 50 * ms, t0 + 370*ms},
		{"sliding", algo.Params{Kind: algo.SlidingWindow, Period: sec}, t0 + 990*ms, 50 * ms, t0 + sec - 1},
		{"discrete tick", algo.Params{Kind: algo.TokenBucket, Period: sec, Interval: 100 * ms}, t0 + 90*ms, 50 * ms, t0 + 100*ms - 1},
		{"smooth bucket", algo.Params{Kind: algo.TokenBucket, Period: sec}, t0 + 990*ms, 50 * ms, t0 + 1040*ms},
		{"gcra", algo.Params{Kind: algo.GCRA, Period: sec}, t0 + 990*ms, 50 * ms, t0 + 1040*ms},
	} {
		if got := settleClock(&c.p, c.t, c.d); got != c.want {
			t.Errorf("%s: nowC %d, want %d", c.name, got-t0, c.want-t0)
		}
	}
}

// TestSettleValue: a bucket a refund empties is written empty at nowC
// (which is ahead of Redis's clock), not deleted; with a caller's clock
// it is deleted, as memstore forgets it.
func TestSettleValue(t *testing.T) {
	p := algo.Params{Kind: algo.GCRA, Rate: 10, Period: int64(time.Second), Capacity: 10}
	now := int64(1_700_000_000_123_456_789)
	if v, mode, ms := settleValue(&p, algo.State{}, now, false); v != "1700000000123456789 0" || mode != "PXAT" || ms != "1700000000124" {
		t.Errorf("an emptied bucket on Redis's clock: %q %s %s", v, mode, ms)
	}
	if v, _, _ := settleValue(&p, algo.State{}, now, true); v != "" {
		t.Errorf("an emptied bucket on a caller's clock: %q, want deleted", v)
	}
	w := algo.Params{Kind: algo.FixedWindow, Rate: 10, Period: int64(time.Second), Capacity: 10}
	if v, _, _ := settleValue(&w, algo.State{}, now, false); v != "" {
		t.Errorf("an idle window: %q, want deleted", v)
	}
	sw := algo.Params{Kind: algo.SlidingWindow, Rate: 10, Period: int64(time.Second), Capacity: 10}
	st := algo.State{A: now + int64(time.Second), B: 3<<32 | 4}
	v, mode, _ := settleValue(&sw, st, now, false)
	if got, err := decodeState(sw.Kind, v, now); err != nil || got != st || mode != "PXAT" {
		t.Errorf("a sliding window's state %+v written as %q reads %+v, %v", st, v, got, err)
	}
}

// TestSettleWriteChecks: the compare-and-set writes only while the value
// is the one read, Redis's clock has not passed the limit, and the
// marker does not exist; and it sets the marker with its time to live.
func TestSettleWriteChecks(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{URL: srv.URL()}, nil)
	l := &sluice.Limit{Rate: 10, Period: time.Second}
	warm(t, sluice.NewLimiter(s), l)
	c := s.client.Load()
	ctx := context.Background()
	keys := []string{"t:{x}state", "t:{x}state:s1"}
	srv.Cmd("SET", keys[0], "old")
	now, err := srv.Time()
	if err != nil {
		t.Fatal(err)
	}
	future := strconv.FormatInt(now.Add(time.Hour).UnixMicro(), 10)
	past := strconv.FormatInt(now.Add(-time.Second).UnixMicro(), 10)
	for _, c2 := range []struct {
		read, limit, want, value string
	}{
		{"other", future, "c", "old"},
		{"old", past, "l", "old"},
		{"old", future, "w", "new"},
		{"new", future, "1", "new"},
	} {
		rd, err := settleWrite.Exec(ctx, c.c, keys, []string{c2.read, c2.limit, "new", "PX", "60000", "90000"}).AsStrSlice()
		if err != nil || rd[0] != c2.want {
			t.Fatalf("read %q, limit %s: answered %q, %v; want %s", c2.read, c2.limit, rd, err, c2.want)
		}
		if v := srv.Cmd("GET", keys[0]); v != c2.value {
			t.Errorf("read %q, limit %s: the state is %v, want %s", c2.read, c2.limit, v, c2.value)
		}
	}
	if ttl, _ := srv.Cmd("PTTL", keys[1]).(int64); ttl <= 60000 || ttl > 90000 {
		t.Errorf("the marker's time to live: %v ms, want 90000", srv.Cmd("PTTL", keys[1]))
	}
}
