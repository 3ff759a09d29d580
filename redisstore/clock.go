package redisstore

// The estimate of Redis's clock (Store.Now, Store.Earliest): what must be
// chosen before a Redis call (the window of a rule's schedules, the time a
// reservation is noted at) is chosen by the time Redis keeps, as every
// decision on Redis is. Nodes whose own clocks disagree by seconds then
// change windows within a round trip of one another.
//
// The estimate is the offset of Redis's TIME from this process's clock,
// sampled every clockInterval: each sample asks TIME and takes the middle
// of the call as the instant Redis read its clock, so a sample is off by
// at most half its round trip. Of the samples of the last clockWindow, the
// one with the shortest round trip is used. Until the first sample, and
// when Redis has not answered for a clockWindow, Now is this process's
// clock. With Redis Cluster, TIME comes from whichever node the client
// picks; the nodes' clocks are as close as their time service keeps them.

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"
)

// Defaults of clockConfig.
const (
	clockInterval = time.Second
	clockWindow   = 30 * time.Second
)

// clockConfig configures a clock.
type clockConfig struct {
	// Time asks Redis for its clock (the TIME command). Required.
	Time func(ctx context.Context) (time.Time, error)

	// Interval between samples; zero means clockInterval.
	Interval time.Duration

	// Window is how long a sample is used; zero means clockWindow.
	Window time.Duration

	// Logger receives failed samples, at debug level; nil discards.
	Logger *slog.Logger

	// Local is this process's clock; nil means time.Now.
	Local func() time.Time
}

// clock is the estimate of a Redis server's clock.
type clock struct {
	cfg     clockConfig
	mu      sync.Mutex
	recent  []clockSample // oldest first, within Window
	best    clockSample   // the shortest round trip of recent; zero taken = none
	stop    context.CancelFunc
	started bool // by startClock: shutdown waits for done
	done    chan struct{}
}

type clockSample struct {
	taken  time.Time     // local time of the sample
	offset time.Duration // Redis minus local
	rtt    time.Duration
}

// startClock takes a first sample before it returns (waiting at most
// Interval for it), then samples in the background, one every Interval
// until shutdown; until a sample answers, it asks again soon. Until the
// first answers, now is the local clock and earliest the zero time.
func startClock(cfg clockConfig) *clock {
	c := newClock(cfg)
	ctx, stop := context.WithCancel(context.Background())
	c.stop, c.started = stop, true
	first := c.sample(ctx)
	go c.loop(ctx, first)
	return c
}

// newClock is a clock that samples only when told to (sample).
func newClock(cfg clockConfig) *clock {
	if cfg.Interval <= 0 {
		cfg.Interval = clockInterval
	}
	if cfg.Window <= 0 {
		cfg.Window = clockWindow
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Local == nil {
		cfg.Local = time.Now
	}
	return &clock{cfg: cfg, stop: func() {}, done: make(chan struct{})}
}

func (c *clock) loop(ctx context.Context, sampled bool) {
	defer close(c.done)
	// Until a first sample, ask again soon: reservations are not
	// refunded while nothing is known of Redis's clock (Earliest).
	for wait := 50 * time.Millisecond; !sampled && wait < c.cfg.Interval; wait *= 2 {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		sampled = c.sample(ctx)
	}
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.sample(ctx)
		}
	}
}

// sample asks Redis for its time once and records the sample; it reports
// whether Redis answered.
func (c *clock) sample(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Interval)
	defer cancel()
	before := c.cfg.Local()
	rt, err := c.cfg.Time(ctx)
	after := c.cfg.Local()
	if err != nil {
		c.cfg.Logger.Debug("Redis TIME for the clock of schedules", "err", err)
		return false
	}
	rtt := after.Sub(before)
	mid := before.Add(rtt / 2)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recent = append(c.recent, clockSample{taken: after, offset: rt.Sub(mid), rtt: rtt})
	c.prune(after)
	return true
}

// prune drops the samples older than Window at now and picks the best.
func (c *clock) prune(now time.Time) {
	keep := c.recent[:0]
	c.best = clockSample{}
	for _, s := range c.recent {
		if now.Sub(s.taken) > c.cfg.Window {
			continue
		}
		keep = append(keep, s)
		if c.best.taken.IsZero() || s.rtt < c.best.rtt {
			c.best = s
		}
	}
	c.recent = keep
}

// now is Redis's time as estimated: this process's clock plus the offset
// of the best recent sample.
func (c *clock) now() time.Time {
	now := c.cfg.Local()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.best.taken.IsZero() {
		return now
	}
	if now.Sub(c.best.taken) > c.cfg.Window {
		c.prune(now)
		if c.best.taken.IsZero() {
			return now
		}
	}
	return now.Add(c.best.offset)
}

// earliest is a time at or before Redis's TIME now: the estimate less its
// error bound, less the drift of a clock off by 100 parts per million since
// the sample, less a millisecond more. It is the zero time while there is
// no sample: nothing is known of Redis's clock then.
func (c *clock) earliest() time.Time {
	now := c.cfg.Local()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.best.taken.IsZero() || now.Sub(c.best.taken) > c.cfg.Window {
		return time.Time{}
	}
	age := max(now.Sub(c.best.taken), 0)
	return now.Add(c.best.offset - c.best.rtt/2 - age/10000 - time.Millisecond)
}

// bound is the bound of the estimate's error now: half the round trip of
// the sample in use, and false when there is none.
func (c *clock) bound() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.best.taken.IsZero() {
		return 0, false
	}
	return c.best.rtt / 2, true
}

// shutdown stops sampling.
func (c *clock) shutdown() {
	c.stop()
	if c.started {
		<-c.done
	}
}

// Now is Redis's clock as this process estimates it: this process's clock
// plus the offset from Redis's TIME of the best recent sample (the
// shortest round trip of the last 30 s, sampled every second). It is this
// process's clock until Redis first answers, and again when Redis has not
// answered for 30 s. It is the clock to choose what must be chosen before
// a call (decide.Config.Now: the window of rules with schedules), so that
// nodes whose clocks disagree change windows together.
func (s *Store) Now() time.Time { return s.clock.now() }

// Earliest is a time at or before Redis's TIME now: Now less the bound of
// its error (half the sample's round trip), less the drift of a clock off
// by 100 parts per million since the sample, less a millisecond. It is the
// zero time while nothing is known of Redis's clock. It is the clock a
// reservation is noted at (decide.Config.Earliest), so that a refund never
// returns more than the reservation still holds.
func (s *Store) Earliest() time.Time { return s.clock.earliest() }

// ClockError is the bound of Now's error: half the round trip of the
// sample in use, and false when there is none.
func (s *Store) ClockError() (time.Duration, bool) { return s.clock.bound() }

// redisTime asks Redis for its clock (TIME).
func (s *Store) redisTime(ctx context.Context) (time.Time, error) {
	client, err := s.Client()
	if err != nil {
		return time.Time{}, err
	}
	v, err := client.Do(ctx, client.B().Time().Build().Pin()).AsStrSlice()
	if err != nil {
		return time.Time{}, err
	}
	if len(v) != 2 {
		return time.Time{}, fmt.Errorf("TIME answered %d values", len(v))
	}
	sec, err := strconv.ParseInt(v[0], 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("TIME seconds %q: %w", v[0], err)
	}
	usec, err := strconv.ParseInt(v[1], 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("TIME microseconds %q: %w", v[1], err)
	}
	return time.Unix(sec, usec*1000), nil
}
