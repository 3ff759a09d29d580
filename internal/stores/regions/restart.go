package regions

// Restarts: a node, or the region's store, that starts mid-window knows
// nothing of what the region spent of that window before it started.
//
// A node keeps what it learnt of a window in memory (gstate). A node that
// started after a window began has no record of what its earlier self (or
// its region) admitted in it, by the store or by the failure policy, so
// until the store answers it for a key in that window its local failure
// policy may spend nothing of it (Budget, known: blind). Once the store
// answers, the store's count stands, as for any node.
//
// The region's store keeps the window's count, its charge (L − the safe
// share, set at the window's first decision) and the charge's mark
// (settleID). A store that started in a window (restarted empty) has lost
// them all; a node that remembers the window finds out (the charge
// marker, lose), but a node that does not (restarted too, or new) would
// charge it afresh for the safe share and the region would admit its
// share twice. So a node's first charge of a window asks when the store
// started (Config.Started): if in the window, or within startSlack of its
// start, or if the store cannot say, the charge is the whole limit L, as
// if the region had spent all it was allocated so far: from then on it
// admits only what the coordinator grants it later, which the ledger
// counts in its allocation (a grant is refunded from the charge). Every
// node of the region asks the same store, so they charge the same, and
// the charge's settlement ID keeps it once.
//
// The cost: in a window in which its store restarted, a region admits
// only the grants it gets for the keys it had not charged since; in a
// window that began before a node started, the node's failure policy
// admits nothing until its store has answered it for the key.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// startSlack is how much later than a start time as read (to the second,
// by clocks that may differ that much before they are compared) a store
// or a node may have started.
const startSlack = 2 * time.Second

// firstCharge returns what a node's first charge of g's window charges,
// given spent, what it charges a store that kept the window: the whole
// limit when the store may have started in the window (g is then blind).
// The marker is set already: a store that restarts after this call loses
// it, which lose finds.
func (s *Store) firstCharge(ctx context.Context, g *gstate, spent int64) int64 {
	if s.cfg.Started == nil {
		return spent
	}
	at, err := s.cfg.Started(ctx)
	if err == nil && at.Add(startSlack).UnixNano() <= g.window {
		return spent
	}
	s.cfg.Logger.Warn("regions: the region's store may have started after a global key's window began, and lost what the region spent of it; charging the window's whole limit, so that the region admits only what it is granted from now on",
		"limit", g.limit.Name, "started", at, "err", err)
	s.mu.Lock()
	g.blind = true
	s.mu.Unlock()
	return g.limit.Rate
}

// RedisStarted returns a Config.Started for the region's Redis through
// client: the latest start of the servers the client reaches (TIME less
// INFO's uptime_in_seconds, on each server's clock); with Redis Cluster
// every node's, so that any node's restart counts.
func RedisStarted(client func() (rueidis.Client, error)) func(context.Context) (time.Time, error) {
	return func(ctx context.Context) (time.Time, error) {
		c, err := client()
		if err != nil {
			return time.Time{}, err
		}
		var last time.Time
		for addr, n := range c.Nodes() {
			at, err := redisStarted(ctx, n)
			if err != nil {
				return time.Time{}, fmt.Errorf("regions: when %s started: %w", addr, err)
			}
			if at.After(last) {
				last = at
			}
		}
		if last.IsZero() {
			return last, errors.New("regions: no Redis server to ask when it started")
		}
		return last, nil
	}
}

// redisStarted asks one server for its TIME and uptime.
func redisStarted(ctx context.Context, c rueidis.Client) (time.Time, error) {
	rs := c.DoMulti(ctx, c.B().Time().Build().Pin(), c.B().Info().Section("server").Build().Pin())
	now, err := rs[0].AsStrSlice()
	if err != nil {
		return time.Time{}, err
	}
	info, err := rs[1].ToString()
	if err != nil {
		return time.Time{}, err
	}
	if len(now) != 2 {
		return time.Time{}, fmt.Errorf("TIME answered %q", now)
	}
	sec, err := strconv.ParseInt(now[0], 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("TIME answered %q", now)
	}
	for line := range strings.Lines(info) {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "uptime_in_seconds:")
		if !ok {
			continue
		}
		up, err := strconv.ParseInt(v, 10, 64)
		if err != nil || up < 0 {
			return time.Time{}, fmt.Errorf("INFO: uptime_in_seconds %q", v)
		}
		return time.Unix(sec-up, 0), nil
	}
	return time.Time{}, errors.New("INFO: no uptime_in_seconds")
}
