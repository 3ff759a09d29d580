package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/internal/vocab/limits"
)

// markerSlack is how much longer than two periods a settlement's marker
// outlives it: a caller retries within that.
const markerSlack = time.Minute

// Settle settles a reservation (sluice.Limiter.Settle) on its key's state
// with algo.Settle's arithmetic, at Redis's clock (TIME), exactly once per
// st.ID, in one call of the store's function (take.lua's settle, whose
// algo.settle mirrors algo.Settle): it reads the state, settles it and
// writes it back atomically, as a take does. A marker key beside the
// state, kept for two periods and a minute, records that the settlement
// was applied, and a settlement whose marker exists returns 0 and changes
// nothing, so that a retry after a lost reply is harmless. Errors are
// *fault.StoreError, as Take's, ctx bounds only the wait for a slot among
// the calls in flight, and a failure may come after the settlement was
// applied (its marker then makes a retry return 0). The limiter has
// checked st.
func (s *Store) Settle(ctx context.Context, st *sluice.Settlement) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	h := &st.Hit
	p := limits.Params(h.Limit)
	if !algo.Settles(&p) || st.Spent == h.Cost {
		return 0, nil
	}
	var kb [128]byte
	k := keyer{prefix: s.cfg.Prefix, tag: s.tag, buf: kb[:0]}
	key := k.stateKey(h, &p)
	keys := []string{key, key + ":s" + strconv.FormatUint(st.ID, 16)}
	args := settleArgs(st, &p, specOf(h.Limit, &p), s.now)
	var moved int64
	err := s.guarded(ctx, func(c *conn) error {
		v, err := s.fcall(s.ctx, c, fnName, keys, args).ToString()
		if err != nil {
			return err
		}
		moved, err = parseMoved(v)
		return err
	})
	return moved, err
}

// settleArgs returns the ARGV of take.lua's settle for st, a reservation
// of a limit whose Params are p and spec spec: "s 1" (and now, from the
// caller's clock now, when set), the spec, and "at reset reserved spent
// marker_ttl" (ns, and the marker's time to live in ms: two periods, the
// refill interval and markerSlack).
func settleArgs(st *sluice.Settlement, p *algo.Params, spec string, now func() time.Time) []string {
	head := "s 1"
	if now != nil {
		head += " " + strconv.FormatInt(max(now().UnixNano(), 0), 10)
	}
	ttl := addSatDur(addSatDur(p.Period, p.Period), addSatDur(p.Interval, int64(markerSlack))) / int64(time.Millisecond)
	b := make([]byte, 0, 64)
	for _, v := range []int64{st.At.UnixNano(), int64(st.ResetAfter), st.Hit.Cost, st.Spent, ttl} {
		b = strconv.AppendInt(b, max(v, 0), 10)
		b = append(b, ' ')
	}
	return []string{head, spec, string(b[:len(b)-1])}
}

// parseMoved reads settle's answer: the hits charged, or "-" and the hits
// refunded.
func parseMoved(v string) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("settle: script answered %q", v)
	}
	return n, nil
}

// addSatDur is a + b for durations in ns, cut at a century (a marker's
// time to live in milliseconds then stays far within Redis's range).
func addSatDur(a, b int64) int64 {
	const century = int64(100 * 365 * 24 * time.Hour)
	if a > century || b > century || a+b > century {
		return century
	}
	return a + b
}
