package redisstore

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/internal/vocab/limits"
)

// A script call's arguments and answers: a hit's keys, spec and cost
// (encode), the arguments of a group's call (build), and the Decision of a
// hit's answer (decision).

// encode fills o with the keys of hit h and its spec, and for a sketch its
// counters; build writes the hit's "cost prev [counters]" (prev depends on
// the group) and a Concurrency hit's permit ID after it. A Concurrency
// limit's permits are a sorted set at its state key.
func (s *Store) encode(k *keyer, h *sluice.Hit, o *op) {
	o.p = limits.Params(h.Limit)
	p := &o.p
	o.spec = specOf(h.Limit, p)
	o.keys = o.key2[:0]
	if p.Kind == algo.Sketch {
		meta, k0, k1, block := k.sketchKeys(h, p)
		o.state = meta
		o.keys = append(o.keys, meta, k0, k1)
		w, d := limits.SketchDims(h.Limit)
		o.cells = algo.SketchCells(sketchHash(h.Key, p), w, d, o.cells[:0])
		if block != "" {
			o.keys = append(o.keys, block)
		}
	} else {
		o.state = k.stateKey(h, p)
		o.keys = append(o.keys, o.state)
		if h.Limit.BlockFor > 0 {
			o.keys = append(o.keys, o.state+":b")
		}
	}
}

// build sets the script call of g for the given mode; undo holds the undo
// strings of a refund.
func (g *group) build(hits []sluice.Hit, ops []op, now, mode string, undo []string) {
	g.keys = g.keys[:0]
	var head string
	if n := len(g.idx); now == "" && n < len(heads) && len(mode) == 1 && mode[0] >= 'a' && mode[0] <= 'z' {
		head = heads[n][mode[0]-'a']
	} else {
		head = mode + " " + strconv.Itoa(n)
		if now != "" {
			head += " " + now
		}
	}
	g.args = append(g.args[:0], head)
	for j, i := range g.idx {
		o := &ops[i]
		prev := 0
		for jj := j - 1; jj >= 0; jj-- {
			q := &ops[g.idx[jj]]
			if q.state == o.state && (o.p.Kind != algo.Sketch || hits[g.idx[jj]].Key == hits[i].Key) {
				prev = jj + 1
				break
			}
		}
		var req string
		if c := hits[i].Cost; prev == 0 && len(o.cells) == 0 && c >= 0 && c < int64(len(costs)) {
			req = costs[c] // "cost 0", made once
		} else {
			b := strconv.AppendInt(o.req[:0], hits[i].Cost, 10)
			b = append(b, ' ')
			b = strconv.AppendInt(b, int64(prev), 10)
			for _, c := range o.cells {
				b = append(b, ' ')
				b = strconv.AppendUint(b, uint64(c), 10)
			}
			o.req, req = b, string(b)
		}
		g.args = append(g.args, o.spec, req)
		if o.p.Kind == algo.Concurrency {
			g.args = append(g.args, hits[i].Permit)
		}
		g.keys = append(g.keys, o.keys...)
	}
	g.args = append(g.args, undo...)
}

// answer is the script's answer for one hit: allowed (0 or 1), remaining,
// reset, retry, left (ns; left: block time left) and committed (0 or 1),
// and the permits a Concurrency hit dropped on expiry. take.lua sends it
// as six integers; for a hit allowed and committed with retry and left 0
// as two, -1 - remaining and reset; or, when a number is not plain in Lua
// (2^53 and above, or int.NEVER), as one string "allowed remaining reset
// retry left committed [dropped]".
type answer struct {
	v       [6]int64
	dropped int64
}

// parseAnswer reads an answer sent as a string.
func parseAnswer(f string) (answer, error) {
	var a answer
	rest := f
	for i := range 7 {
		tok, tail, _ := strings.Cut(rest, " ")
		if i == 6 && tok == "" {
			break
		}
		v, err := strconv.ParseInt(tok, 10, 64)
		if err != nil || i == 0 && v != 0 && v != 1 {
			return answer{}, fmt.Errorf("script returned %q", f)
		}
		if i < 6 {
			a.v[i] = v
		} else {
			a.dropped = v
		}
		rest = tail
	}
	return a, nil
}

// readAnswers reads the answers of n hits from the front of msgs into dst
// and returns how many messages they took. A request of a batch that
// failed in Redis is answered "!error" for each of its hits: that is a
// *requestError.
func readAnswers(msgs []rueidis.RedisMessage, n int, dst []answer) (int, error) {
	i := 0
	for j := range n {
		if i >= len(msgs) {
			return i, fmt.Errorf("script returned too few values for %d hits", n)
		}
		m := &msgs[i]
		if v, err := m.AsInt64(); err == nil && m.IsInt64() && v < 0 {
			// Allowed and committed: -1 - remaining, reset.
			if i+2 > len(msgs) {
				return i, fmt.Errorf("script returned too few values for %d hits", n)
			}
			reset, err := msgs[i+1].AsInt64()
			if err != nil || !msgs[i+1].IsInt64() {
				return i, fmt.Errorf("script returned a malformed answer: %v", msgs[i+1])
			}
			dst[j] = answer{v: [6]int64{1, -1 - v, reset, 0, 0, 1}}
			i += 2
			continue
		}
		if m.IsInt64() {
			if i+6 > len(msgs) {
				return i, fmt.Errorf("script returned too few values for %d hits", n)
			}
			for k := range 6 {
				v, err := msgs[i+k].AsInt64()
				if err != nil {
					return i, fmt.Errorf("script returned a malformed answer: %w", err)
				}
				dst[j].v[k] = v
			}
			dst[j].dropped = 0
			if a := dst[j].v[0]; a != 0 && a != 1 {
				return i, fmt.Errorf("script returned allowed = %d", a)
			}
			i += 6
			continue
		}
		f, err := m.ToString()
		if err != nil {
			return i, fmt.Errorf("script returned a malformed answer: %w", err)
		}
		if f != "" && f[0] == '!' {
			return i + n - j, &requestError{f[1:]}
		}
		if dst[j], err = parseAnswer(f); err != nil {
			return i, err
		}
		i++
	}
	return i, nil
}

// heads[n][m-'a'] is the header "m n" of a call of n hits in mode m, and
// costs[c] a hit's "c 0" (cost c, no hit before it on its state): the
// common arguments, made once rather than on every request.
var heads, costs = func() ([16][26]string, [16]string) {
	var h [16][26]string
	var c [16]string
	for n := range h {
		for m := range h[n] {
			h[n][m] = string(rune('a'+m)) + " " + strconv.Itoa(n)
		}
		c[n] = strconv.Itoa(n) + " 0"
	}
	return h, c
}()

// decision turns the script's answer for one hit into a Decision, as
// memstore does.
func decision(h *sluice.Hit, p *algo.Params, a answer) sluice.Decision {
	// A hit denied yet committed was overdrawn (mode "e").
	allowed := a.v[0] == 1
	r := algo.Result{Allowed: allowed, Remaining: a.v[1], ResetAfter: a.v[2], RetryAfter: a.v[3], Overdrawn: !allowed && a.v[5] == 1}
	d := limits.Decision(h.Limit, r, p)
	if left := time.Duration(a.v[4]); left > 0 {
		d = limits.Blocked(d, left)
	}
	return d
}
