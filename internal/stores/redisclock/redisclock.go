// Package redisclock estimates the clock of a Redis server from this
// process, so that what must be chosen before a Redis call (the window of
// a rule's schedules) is chosen by the time Redis keeps, as every decision
// on Redis is. Nodes whose own clocks disagree by seconds then change
// windows within a round trip of one another.
//
// The estimate is the offset of Redis's TIME from this process's clock,
// sampled every Interval: each sample asks TIME and takes the middle of the
// call as the instant Redis read its clock, so a sample is off by at most
// half its round trip. Of the samples of the last Window, the one with the
// shortest round trip is used. Until the first sample, and when Redis has
// not answered for a Window, Now is this process's clock.
package redisclock

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Defaults of Config.
const (
	DefaultInterval = time.Second
	DefaultWindow   = 30 * time.Second
)

// Config configures a Clock.
type Config struct {
	// Time asks Redis for its clock (the TIME command). Required.
	Time func(ctx context.Context) (time.Time, error)

	// Interval between samples; zero means DefaultInterval.
	Interval time.Duration

	// Window is how long a sample is used; zero means DefaultWindow.
	Window time.Duration

	// Logger receives failed samples, at debug level; nil discards.
	Logger *slog.Logger

	// Local is this process's clock; nil means time.Now.
	Local func() time.Time
}

// Clock is the estimate of a Redis server's clock.
type Clock struct {
	cfg     Config
	mu      sync.Mutex
	recent  []sample // oldest first, within Window
	best    sample   // the shortest round trip of recent; zero taken = none
	stop    context.CancelFunc
	started bool // by New: Close waits for done
	done    chan struct{}
}

type sample struct {
	taken  time.Time     // local time of the sample
	offset time.Duration // Redis minus local
	rtt    time.Duration
}

// New takes a first sample before it returns (waiting at most Interval
// for it), then samples in the background, one every Interval until
// Close; until a sample answers, it asks again soon. Until the first
// answers, Now is the local clock and Earliest the zero time.
func New(cfg Config) *Clock {
	c := newClock(cfg)
	ctx, stop := context.WithCancel(context.Background())
	c.stop, c.started = stop, true
	first := c.Sample(ctx)
	go c.loop(ctx, first)
	return c
}

// newClock is a Clock that samples only when told to (Sample).
func newClock(cfg Config) *Clock {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Local == nil {
		cfg.Local = time.Now
	}
	return &Clock{cfg: cfg, stop: func() {}, done: make(chan struct{})}
}

func (c *Clock) loop(ctx context.Context, sampled bool) {
	defer close(c.done)
	// Until a first sample, ask again soon: reservations are not
	// refunded while nothing is known of Redis's clock (Earliest).
	for wait := 50 * time.Millisecond; !sampled && wait < c.cfg.Interval; wait *= 2 {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		sampled = c.Sample(ctx)
	}
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.Sample(ctx)
		}
	}
}

// Sample asks Redis for its time once and records the sample; it reports
// whether Redis answered.
func (c *Clock) Sample(ctx context.Context) bool {
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
	c.recent = append(c.recent, sample{taken: after, offset: rt.Sub(mid), rtt: rtt})
	c.prune(after)
	return true
}

// prune drops the samples older than Window at now and picks the best.
func (c *Clock) prune(now time.Time) {
	keep := c.recent[:0]
	c.best = sample{}
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

// Now is Redis's time as estimated: this process's clock plus the offset
// of the best recent sample.
func (c *Clock) Now() time.Time {
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

// Earliest is a time at or before Redis's TIME now: the estimate less its
// error bound, less the drift of a clock off by 100 parts per million since
// the sample, less a millisecond more. It is the zero time while there is
// no sample: nothing is known of Redis's clock then.
func (c *Clock) Earliest() time.Time {
	now := c.cfg.Local()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.best.taken.IsZero() || now.Sub(c.best.taken) > c.cfg.Window {
		return time.Time{}
	}
	age := max(now.Sub(c.best.taken), 0)
	return now.Add(c.best.offset - c.best.rtt/2 - age/10000 - time.Millisecond)
}

// Error is the bound of the estimate's error now: half the round trip of
// the sample in use, and false when there is none.
func (c *Clock) Error() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.best.taken.IsZero() {
		return 0, false
	}
	return c.best.rtt / 2, true
}

// Close stops sampling.
func (c *Clock) Close() {
	c.stop()
	if c.started {
		<-c.done
	}
}
