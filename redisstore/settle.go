package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
	"github.com/zeebo/xxh3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/algo"
	"github.com/sluicehq/sluice/internal/limits"
)

// Settling a reservation (sluice.Limiter.Settle). The arithmetic is Go's,
// algo.Settle, the one source; Redis only reads and writes the state:
//
//  1. a small script reads the state key's value, Redis TIME and whether
//     the settlement's marker key exists;
//  2. the store decodes the value (take.lua's format), and settles it
//     with algo.Settle at a clock nowC a little ahead of the TIME read;
//  3. a compare-and-set script writes the new state, and the marker, only
//     if the value is still the one read, Redis TIME is still at or
//     before nowC, and the marker does not exist; otherwise the store
//     reads again and retries, settleAttempts times at most.
//
// nowC is ahead of the read so that the write, which comes later, still
// happens at or before the instant the state was computed for. Writing a
// state computed for an instant a little later than the write is on the
// safe side: a bucket's refund is bounded by what of the reservation has
// not drained yet, which only shrinks with time, and a charge from an
// empty bucket starts its debt later, so it lasts longer; a window refunds
// only in the reservation's window, and a window that has ended refunds
// nothing. Two cases would not be: a window (or a discrete bucket's tick)
// that ends between the write and nowC, whose state computed at nowC would
// be the next window's, read as such before it starts; so nowC never
// crosses the end of the window (or tick) of the TIME read; and a bucket
// emptied by a refund at nowC, which algo writes as the fresh state
// (forgetting the level it holds until nowC), so it is written as a state
// empty at nowC instead (settleValue).

// errSettleContended is wrapped by the error of a settlement whose key's
// state changed (or whose Redis clock passed the computed instant) under
// every one of settleAttempts attempts.
var errSettleContended = errors.New("settlement contended: the key's state changed under every attempt")

const (
	// settleAttempts bounds the read and compare-and-set rounds of one
	// settlement.
	settleAttempts = 16
	// settleMargin is how far ahead of the TIME read the first attempt
	// computes the state (nowC); every attempt that finds Redis's clock
	// past it doubles the margin, up to settleMarginMax. It is at most a
	// tenth of the limit's period.
	settleMargin    = 10 * time.Millisecond
	settleMarginMax = 160 * time.Millisecond
	// settleBackoff is the longest random wait before the third attempt
	// of a contended settlement, doubled on each further attempt, up to
	// settleBackoffMax.
	settleBackoff    = 100 * time.Microsecond
	settleBackoffMax = 5 * time.Millisecond
	// markerSlack is how much longer than two periods a settlement's
	// marker outlives it: a caller retries within that.
	markerSlack = time.Minute
	// givenClockSlack is take.lua's TTL_SLACK: with a caller's clock
	// (tests), Redis still expires keys on its own, and an hour more
	// keeps a state alive as long as the caller's clock needs it.
	givenClockSlack = 3600000 // ms
)

// settleRead answers {"1"} when the marker key exists (the settlement was
// applied before), else "0", the state key's value ("" when absent) and
// Redis TIME (seconds, microseconds).
var settleRead = rueidis.NewLuaScript(`if redis.call('EXISTS', KEYS[2]) == 1 then return {'1'} end
local v = redis.call('GET', KEYS[1]) or ''
local t = redis.call('TIME')
return {'0', v, t[1], t[2]}`)

// settleWrite is the compare-and-set: KEYS the state key and the marker;
// ARGV the value read ("" for none), the latest Redis TIME in microseconds
// at which the write may apply ("" for any: a caller's clock), the new
// value ("" to delete the key), "PXAT" or "PX" and its milliseconds, and
// the marker's time to live in milliseconds. It answers {"w"} when it
// wrote, {"1"} when the marker exists (the settlement was applied
// before); when the value changed ("c") or the clock passed the limit
// ("l"), that letter and what settleRead answers, for the next attempt.
var settleWrite = rueidis.NewLuaScript(`if redis.call('EXISTS', KEYS[2]) == 1 then return {'1'} end
local v = redis.call('GET', KEYS[1]) or ''
local t = redis.call('TIME')
if v ~= ARGV[1] then return {'c', v, t[1], t[2]} end
if ARGV[2] ~= '' and tonumber(t[1]) * 1000000 + tonumber(t[2]) > tonumber(ARGV[2]) then
  return {'l', v, t[1], t[2]}
end
if ARGV[3] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[3], ARGV[4], ARGV[5])
end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[6])
return {'w'}`)

// settleLocks serialize the settlements of a key on this node (a key
// hashes to one of them): settlements of a key are rare beside its takes,
// so that they share a lock with other keys costs little.
var settleLocks [256]chan struct{}

func init() {
	for i := range settleLocks {
		settleLocks[i] = make(chan struct{}, 1)
	}
}

// Settle settles a reservation (sluice.Limiter.Settle) on its key's state
// with algo.Settle's arithmetic, at Redis's clock (TIME), exactly once per
// st.ID: a marker key beside the state, kept for two periods and a minute,
// records that the settlement was applied, and a settlement whose marker
// exists returns 0 and changes nothing, so that a retry after a lost reply
// is harmless. The state is read, settled in Go and written back with a
// compare-and-set, retried when another request changed the state
// meanwhile. A bucket's refund is computed for an instant up to a few tens
// of milliseconds after the read, which may refund that much refill less
// than memstore would. Errors are *sluice.StoreError, as Take's, ctx bounds
// only the wait for a slot among the calls in flight, and a failure may
// come after the settlement was applied (its marker then makes a retry
// return 0). The limiter has checked st.
func (s *Store) Settle(ctx context.Context, st *sluice.Settlement) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	h := &st.Hit
	p := limits.Params(h.Limit)
	if !algo.Settles(&p) || st.Spent == h.Cost {
		return 0, nil
	}
	k := keyer{prefix: s.cfg.Prefix, tag: s.tag}
	key := k.stateKey(h, &p)
	marker := key + ":s" + strconv.FormatUint(st.ID, 16)
	// One settlement of a key at a time on this node: racing each
	// other's compare-and-set, all but one would fail every round.
	lock := settleLocks[xxh3.HashString(key)%uint64(len(settleLocks))]
	select {
	case lock <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	defer func() { <-lock }()
	var moved int64
	err := s.guarded(ctx, func(c *conn) error {
		var err error
		moved, err = s.settle(s.ctx, c, st, &p, key, marker)
		return err
	})
	return moved, err
}

// settle runs the read and compare-and-set rounds of a settlement on key,
// whose marker is marker.
func (s *Store) settle(ctx context.Context, c *conn, st *sluice.Settlement, p *algo.Params, key, marker string) (int64, error) {
	keys := []string{key, marker}
	at, reset := st.At.UnixNano(), int64(st.ResetAfter)
	markerTTL := strconv.FormatInt(addSatDur(addSatDur(p.Period, p.Period), addSatDur(p.Interval, int64(markerSlack)))/int64(time.Millisecond), 10)
	late := 0 // attempts that found Redis's clock past nowC
	rd, err := settleRead.Exec(ctx, c.c, keys, nil).AsStrSlice()
	for i := range settleAttempts {
		if err != nil {
			return 0, err
		}
		if len(rd) == 1 && rd[0] == "1" {
			return 0, nil // applied before
		}
		if len(rd) != 4 {
			return 0, fmt.Errorf("settle: script answered %q", rd)
		}
		if rd[0] == "l" {
			late++
		}
		if rd[0] == "c" && i > 1 {
			// Contended: wait a random while, longer each time, so
			// that settlements racing on one key let each other
			// through.
			time.Sleep(rand.N(min(settleBackoff<<(i-2), settleBackoffMax)))
		}
		var nowC int64
		limit := "" // the latest Redis TIME, µs, the write may apply at
		if s.now != nil {
			nowC = s.now().UnixNano()
		} else {
			t, terr := redisTime(rd[2], rd[3])
			if terr != nil {
				return 0, terr
			}
			nowC = settleClock(p, t, settleMarginOf(p, late))
			limit = strconv.FormatInt(nowC/1000, 10)
		}
		cur, derr := decodeState(p.Kind, rd[1], nowC)
		if derr != nil {
			return 0, derr
		}
		next, moved := algo.Settle(p, cur, nowC, at, reset, st.Hit.Cost, st.Spent)
		if moved == 0 {
			return 0, nil // nothing to write, nor to apply twice
		}
		v, mode, exp := settleValue(p, next, nowC, s.now != nil)
		rd, err = settleWrite.Exec(ctx, c.c, keys, []string{rd[1], limit, v, mode, exp, markerTTL}).AsStrSlice()
		if err == nil && len(rd) == 1 && rd[0] == "w" {
			return moved, nil
		}
	}
	if err != nil {
		return 0, err
	}
	return 0, errSettleContended
}

// redisTime is the time of TIME's answer, in ns.
func redisTime(sec, usec string) (int64, error) {
	sv, err1 := strconv.ParseInt(sec, 10, 64)
	uv, err2 := strconv.ParseInt(usec, 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("settle: TIME returned %q %q: %w", sec, usec, err)
	}
	return sv*int64(time.Second) + uv*int64(time.Microsecond), nil
}

// settleMarginOf is the margin of an attempt after late attempts found
// Redis's clock past theirs: settleMargin doubled late times, at most
// settleMarginMax and a tenth of the period, and at least a microsecond
// (TIME's resolution).
func settleMarginOf(p *algo.Params, late int) int64 {
	d := int64(settleMargin) << min(late, 8)
	d = min(d, int64(settleMarginMax), p.Period/10)
	return max(d, int64(time.Microsecond))
}

// settleClock is nowC for a TIME read t and a margin d: t + d, but before
// the end of t's window (fixed and sliding windows) or tick (a discrete
// bucket), so that the state computed at nowC is read the same at any
// instant from t to nowC (see the top of this file).
func settleClock(p *algo.Params, t, d int64) int64 {
	now := t + d
	step, off := int64(0), int64(0)
	switch {
	case p.Kind == algo.FixedWindow:
		step, off = p.Period, p.Offset
	case p.Kind == algo.SlidingWindow:
		step = p.Period
	case p.Kind == algo.TokenBucket && p.Interval > 0:
		step = p.Interval
	}
	if step <= 0 {
		return now
	}
	end := off // the first window, [0, off), is shorter (algo's alignFrom)
	if t >= off {
		end = off + (t-off)/step*step + step
	}
	if end > t && now >= end {
		now = end - 1
	}
	return now
}

// decodeState reads a state value as take.lua's parse_state does: "A B",
// or "A prev curr" for a sliding window (whose algo.State packs prev and
// curr into B); a missing value, or one idle at now, is the fresh state.
// A value in no such format is an error: settling it would overwrite a
// state the store cannot read.
func decodeState(k algo.Kind, v string, now int64) (algo.State, error) {
	if v == "" {
		return algo.State{}, nil
	}
	f := strings.Split(v, " ")
	want := 2
	if k == algo.SlidingWindow {
		want = 3
	}
	bad := func() (algo.State, error) {
		return algo.State{}, fmt.Errorf("settle: a %s state reads %q", k, v)
	}
	if len(f) != want {
		return bad()
	}
	var n [3]uint64
	for i, x := range f {
		if x == "" || x[0] < '0' || x[0] > '9' {
			return bad()
		}
		var err error
		if n[i], err = strconv.ParseUint(x, 10, 63); err != nil {
			return bad()
		}
	}
	st := algo.State{A: int64(n[0]), B: int64(n[1])}
	if k == algo.SlidingWindow {
		if n[1] > 1<<32-1 || n[2] > 1<<32-1 {
			return bad()
		}
		st.B = int64(n[1]<<32 | n[2])
	}
	if st.A <= now {
		return algo.State{}, nil
	}
	return st, nil
}

// encodeState is take.lua's encode_state: the value of state st.
func encodeState(k algo.Kind, st algo.State) string {
	if k == algo.SlidingWindow {
		return fmt.Sprintf("%d %d %d", st.A, uint32(st.B>>32), uint32(st.B))
	}
	return fmt.Sprintf("%d %d", st.A, st.B)
}

// settleValue returns the value, the expiry mode and its milliseconds of
// the state st computed at now: expiring at its idle-at time, as the take
// path writes it (at Redis's clock; with a caller's clock, given, relative
// to now with take.lua's slack), or "" to delete an idle state. A smooth
// bucket that algo emptied is written empty at now instead, when now is
// ahead of Redis's clock: see the top of this file.
func settleValue(p *algo.Params, st algo.State, now int64, given bool) (v, mode, ms string) {
	if st.A <= now {
		smooth := p.Kind == algo.LeakyBucket || p.Kind == algo.GCRA || (p.Kind == algo.TokenBucket && p.Interval == 0)
		if given || !smooth {
			return "", "", ""
		}
		st = algo.State{A: now}
	}
	v = encodeState(p.Kind, st)
	if given {
		return v, "PX", strconv.FormatInt(ceilDiv(st.A-now, int64(time.Millisecond))+givenClockSlack, 10)
	}
	return v, "PXAT", strconv.FormatInt(ceilDiv(st.A, int64(time.Millisecond)), 10)
}

// ceilDiv is ⌈a/b⌉ for a >= 0, b > 0.
func ceilDiv(a, b int64) int64 { return a/b + min(a%b, 1) }

// addSatDur is a + b for durations in ns, cut at a century (a marker's
// time to live in milliseconds then stays far within Redis's range).
func addSatDur(a, b int64) int64 {
	const century = int64(100 * 365 * 24 * time.Hour)
	if a > century || b > century || a+b > century {
		return century
	}
	return a + b
}
