package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

// Against a real redis-server, with this process's clock set 7 s wrong:
// the estimate is Redis's time, within its stated error and the round
// trip of the check.
func TestClockOfRedis(t *testing.T) {
	r := redistest.Standalone(t)
	skew := 7 * time.Second
	local := func() time.Time { return time.Now().Add(skew) }
	ask := func(context.Context) (time.Time, error) { return r.Time() }
	c := startClock(clockConfig{Time: ask, Interval: 20 * time.Millisecond, Local: local})
	defer c.shutdown()
	c.sample(context.Background())
	if _, ok := c.bound(); !ok {
		t.Fatal("no sample after Sample")
	}
	for range 5 {
		before := time.Now()
		est := c.now()
		rt, err := ask(context.Background())
		rtt := time.Since(before)
		if err != nil {
			t.Fatal(err)
		}
		bound, _ := c.bound()
		// Redis's clock has microseconds; the estimate was read before
		// the check's TIME, within its round trip.
		if d := rt.Sub(est); d < -bound-time.Millisecond || d > bound+rtt+time.Millisecond {
			t.Errorf("estimate %v, Redis %v: off by %v (bound %v, check's round trip %v)", est, rt, d, bound, rtt)
		}
		time.Sleep(30 * time.Millisecond)
	}
}

// The sample with the shortest round trip is used, and samples older than
// Window are dropped: with Redis gone, Now falls back to the local clock.
func TestClockSamples(t *testing.T) {
	var now time.Time = time.Unix(1_000_000, 0)
	local := func() time.Time { return now }
	type answer struct {
		offset, rtt time.Duration
		err         error
	}
	var next answer
	ask := func(context.Context) (time.Time, error) {
		if next.err != nil {
			return time.Time{}, next.err
		}
		// Redis reads its clock in the middle of the call.
		at := now.Add(next.rtt / 2).Add(next.offset)
		now = now.Add(next.rtt)
		return at, nil
	}
	next = answer{offset: 3 * time.Second, rtt: 40 * time.Millisecond}
	c := newClock(clockConfig{Time: ask, Window: 10 * time.Second, Local: local})
	c.sample(context.Background())
	if got := c.now().Sub(now); got != 3*time.Second {
		t.Fatalf("offset %v, want 3s", got)
	}
	next = answer{offset: 3*time.Second + 5*time.Millisecond, rtt: 4 * time.Millisecond}
	c.sample(context.Background())
	if got, bound := c.now().Sub(now), 2*time.Millisecond; got != 3*time.Second+5*time.Millisecond {
		t.Errorf("offset %v after a shorter round trip, want 3.005s", got)
	} else if e, _ := c.bound(); e != bound {
		t.Errorf("error bound %v, want %v", e, bound)
	}
	next = answer{offset: time.Hour, rtt: time.Second}
	c.sample(context.Background())
	if got := c.now().Sub(now); got != 3*time.Second+5*time.Millisecond {
		t.Errorf("a longer round trip replaced the best sample: offset %v", got)
	}
	next = answer{err: errors.New("connection refused")}
	now = now.Add(9500 * time.Millisecond) // the best sample is 10.5 s old, the last 9.5 s
	c.sample(context.Background())
	if got := c.now().Sub(now); got != time.Hour {
		t.Errorf("offset %v once the best sample aged out, want the remaining one's 1h", got)
	}
	now = now.Add(20 * time.Second)
	if got := c.now().Sub(now); got != 0 {
		t.Errorf("offset %v with every sample older than Window, want the local clock", got)
	}
	if _, ok := c.bound(); ok {
		t.Error("an error bound without samples")
	}
}

// Earliest is never ahead of Redis's clock, wherever in the round trip
// Redis read it, and is the zero time without a sample.
func TestClockEarliest(t *testing.T) {
	now := time.Unix(2_000_000, 0)
	local := func() time.Time { return now }
	var where time.Duration // when, in the round trip, Redis reads its clock
	const offset, rtt = 7 * time.Second, 10 * time.Millisecond
	ask := func(context.Context) (time.Time, error) {
		at := now.Add(where).Add(offset)
		now = now.Add(rtt)
		return at, nil
	}
	c := newClock(clockConfig{Time: ask, Window: 30 * time.Second, Local: local})
	if !c.earliest().IsZero() {
		t.Fatal("Earliest without a sample")
	}
	for _, w := range []time.Duration{0, rtt / 3, rtt} {
		where = w
		c.prune(now.Add(time.Hour)) // forget the earlier samples
		c.sample(context.Background())
		for _, later := range []time.Duration{0, time.Second, 29 * time.Second} {
			redis := now.Add(later).Add(offset) // Redis's true time then
			now = now.Add(later)
			e := c.earliest()
			now = now.Add(-later)
			if e.After(redis) {
				t.Errorf("Redis read its clock %v into the round trip; %v later Earliest is %v ahead", w, later, e.Sub(redis))
			}
			if slack := redis.Sub(e); slack > rtt+later/10000+time.Millisecond {
				t.Errorf("Earliest %v behind, more than the round trip, drift and a millisecond", slack)
			}
		}
	}
}
