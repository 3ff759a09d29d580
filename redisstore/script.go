package redisstore

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/internal/vocab/limits"
)

// A script call's arguments and answers: a hit's keys, spec and cost
// (encode), the arguments of a group's call (build), and the Decision of a
// hit's answer (decision).

// encode fills o with the keys of hit h and its spec; its cost, and for a
// sketch its counters, go in req (prev, which depends on the group, is
// added by build, and a Concurrency hit's permit ID after it). A
// Concurrency limit's permits are a sorted set at its state key.
func (s *Store) encode(k *keyer, h *sluice.Hit, o *op) {
	o.p = limits.Params(h.Limit)
	p := &o.p
	o.spec = specOf(h.Limit, p)
	o.req = strconv.AppendInt(o.req[:0], h.Cost, 10)
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
	head := mode + " " + strconv.Itoa(len(g.idx))
	if now != "" {
		head += " " + now
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
		req := append(o.req, ' ')
		req = strconv.AppendInt(req, int64(prev), 10)
		for _, c := range o.cells {
			req = append(req, ' ')
			req = strconv.AppendUint(req, uint64(c), 10)
		}
		g.args = append(g.args, o.spec, string(req))
		if o.p.Kind == algo.Concurrency {
			g.args = append(g.args, hits[i].Permit)
		}
		g.keys = append(g.keys, o.keys...)
	}
	g.args = append(g.args, undo...)
}

// decision turns the script's answer for one hit, "allowed remaining
// reset retry left committed" (ns; left: block time left), into a
// Decision, as memstore does.
func decision(h *sluice.Hit, p *algo.Params, f string) (sluice.Decision, error) {
	var n [5]int64
	rest := f
	if len(rest) < 2 || rest[1] != ' ' {
		return sluice.Decision{}, fmt.Errorf("script returned %q", f)
	}
	allowed := rest[0] == '1'
	rest = rest[2:]
	for i := range n {
		tok, tail, _ := strings.Cut(rest, " ")
		v, err := strconv.ParseInt(tok, 10, 64)
		if err != nil {
			return sluice.Decision{}, fmt.Errorf("script returned %q: %w", f, err)
		}
		n[i], rest = v, tail
	}
	// A hit denied yet committed was overdrawn (mode "e").
	r := algo.Result{Allowed: allowed, Remaining: n[0], ResetAfter: n[1], RetryAfter: n[2], Overdrawn: !allowed && n[4] == 1}
	d := limits.Decision(h.Limit, r, p)
	if left := time.Duration(n[3]); left > 0 {
		d = limits.Blocked(d, left)
	}
	return d, nil
}

// field returns the i-th space-separated field of a hit's answer.
func field(f string, i int) string {
	for ; i > 0; i-- {
		_, f, _ = strings.Cut(f, " ")
	}
	tok, _, _ := strings.Cut(f, " ")
	return tok
}
