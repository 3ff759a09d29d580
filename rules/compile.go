package rules

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/internal/base/yamlwalk"
)

// limitSpec collects the keys of one limit block before compiling it.
type limitSpec struct {
	unit, rpu, mult, period, alg, burst *yaml.Node
	refillInterval, refillAmount        *yaml.Node
	soft, elastic, blockFor, sketch     *yaml.Node
	debit, consistency, overshoot       *yaml.Node
	calendar, global                    *yaml.Node
	cal                                 *calLimit // the calendar, once compiled
}

// limitKey records kv in s if it is a limit key.
func (p *parser) limitKey(s *limitSpec, kv yamlwalk.Pair) bool {
	slot := map[string]**yaml.Node{
		"unit": &s.unit, "requests_per_unit": &s.rpu, "unit_multiplier": &s.mult,
		"period": &s.period, "algorithm": &s.alg, "burst": &s.burst,
		"refill_interval": &s.refillInterval, "refill_amount": &s.refillAmount,
		"soft_percent": &s.soft, "block_for": &s.blockFor, "sketch": &s.sketch,
		"debit": &s.debit, "consistency": &s.consistency, "max_overshoot": &s.overshoot,
		"calendar": &s.calendar, "global": &s.global,
	}[kv.K.Value]
	if slot == nil {
		return false
	}
	*slot = kv.V
	return true
}

// extensions reports the first sluice-only key of s, or nil.
func (s *limitSpec) extension() *yaml.Node {
	for _, n := range []*yaml.Node{s.mult, s.period, s.alg, s.burst, s.refillInterval, s.refillAmount, s.soft, s.elastic, s.blockFor, s.sketch, s.debit, s.consistency, s.overshoot, s.calendar, s.global} {
		if n != nil {
			return n
		}
	}
	return nil
}

// compile turns a limit block into a valid sluice.Limit, reporting every
// problem; at is the block, for problems of the block as a whole.
func (p *parser) compile(at *yaml.Node, s *limitSpec, what string) (*sluice.Limit, bool) {
	before := len(p.Errs)
	l := &sluice.Limit{}
	p.algorithm(l, s)
	p.rate(l, s, at, what)
	p.extras(l, s, before)
	if len(p.Errs) > before {
		return nil, false
	}
	if err := l.Validate(); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			p.Errorf(at, "%s: %s", what, line)
		}
		return nil, false
	}
	if s.calendar != nil {
		if s.cal = p.calendar(l, s); s.cal == nil {
			return nil, false
		}
	}
	return l, true
}

// algorithm reads the spec's algorithm into l.
func (p *parser) algorithm(l *sluice.Limit, s *limitSpec) {
	if s.alg != nil {
		if name, ok := p.str(s.alg, "algorithm"); ok {
			k, err := algo.ParseKind(name)
			if err != nil {
				p.Errorf(p.Deref(s.alg), "%v", err)
			}
			l.Algorithm = sluice.Algorithm(k)
		}
	}
}

// rate reads into l the rate of the spec at (a limit of what): its count
// and period, or its refill amount and interval, and the refill interval
// of a discrete token bucket.
func (p *parser) rate(l *sluice.Limit, s *limitSpec, at *yaml.Node, what string) {
	// The rate: requests_per_unit per unit (times unit_multiplier) or per
	// period, or refill_amount per refill_interval.
	var rpu int64
	if s.rpu != nil {
		rpu, _ = p.integer(s.rpu, "requests_per_unit", 0, sluice.MaxCost)
	}
	var unitNode *yaml.Node
	if s.unit != nil {
		unitNode = p.Deref(s.unit)
	}
	switch {
	case s.refillAmount != nil:
		p.refillRate(l, s)
	case s.period != nil:
		p.periodRate(l, s, rpu, unitNode)
	case s.unit != nil:
		p.unitRate(l, s, rpu, unitNode)
	default:
		p.Errorf(at, "invalid rate limit unit '' (%s needs unit: one of %s, or a period, or unlimited: true)", what, unitNames)
	}
	if s.rpu == nil && s.refillAmount == nil && l.Period > 0 {
		p.Warnf(at, "requests_per_unit is missing, so it is 0 and every request is denied (as in Envoy)")
	}
	p.refillInterval(l, s)
}

// refillRate reads the rate as refill_amount per refill_interval, which
// then is also the refill interval, and allows no other way to state it.
func (p *parser) refillRate(l *sluice.Limit, s *limitSpec) {
	amount, ok := p.integer(s.refillAmount, "refill_amount", 1, sluice.MaxCost)
	for _, other := range []*yaml.Node{s.rpu, s.unit, s.period, s.mult} {
		if other != nil {
			p.Errorf(p.Deref(other), "refill_amount (with refill_interval) states the rate; leave out requests_per_unit, unit, unit_multiplier and period")
			break
		}
	}
	if s.refillInterval == nil {
		p.Errorf(p.Deref(s.refillAmount), "refill_amount needs refill_interval")
	} else if iv, ok2 := p.duration(s.refillInterval, "refill_interval"); ok && ok2 {
		l.Rate, l.Period, l.RefillInterval = amount, iv, iv
	}
}

// periodRate reads the rate as rpu per period, which takes neither unit
// (at unitNode) nor unit_multiplier.
func (p *parser) periodRate(l *sluice.Limit, s *limitSpec, rpu int64, unitNode *yaml.Node) {
	if s.unit != nil {
		p.Errorf(unitNode, "set either unit (with unit_multiplier) or period, not both")
	}
	if s.mult != nil {
		p.Errorf(p.Deref(s.mult), "unit_multiplier goes with unit, not with period")
	}
	if d, ok := p.duration(s.period, "period"); ok {
		l.Period = d
	}
	l.Rate = rpu
}

// unitRate reads the rate as rpu per unit (at unitNode) times
// unit_multiplier; a period that would exceed MaxPeriod is refused.
func (p *parser) unitRate(l *sluice.Limit, s *limitSpec, rpu int64, unitNode *yaml.Node) {
	name, ok := p.str(s.unit, "unit")
	if !ok {
		return
	}
	u, err := ParseUnit(name)
	if err != nil {
		p.Errorf(unitNode, "%v", err)
		return
	}
	mult := int64(1)
	if s.mult != nil {
		maxMult := int64(MaxPeriod / u.Duration())
		m, ok := p.integer(s.mult, "unit_multiplier", 1, maxMult)
		if !ok {
			return
		}
		mult = m
	}
	l.Period = u.Duration() * time.Duration(mult)
	l.Rate = rpu
}

// refillInterval reads the refill interval of a discrete token bucket
// whose rate is stated otherwise (refill_interval without refill_amount),
// and refuses a refill interval on any other algorithm.
func (p *parser) refillInterval(l *sluice.Limit, s *limitSpec) {
	if s.refillInterval != nil && s.refillAmount == nil {
		if d, ok := p.duration(s.refillInterval, "refill_interval"); ok {
			l.RefillInterval = d
		}
	}
	if l.RefillInterval > 0 && l.Algorithm != sluice.TokenBucket {
		p.Errorf(p.Deref(s.refillInterval), "refill_interval needs algorithm: token_bucket, not %s", l.Algorithm)
	}
}

// extras reads into l what the spec adds to its rate: burst, soft and
// elastic margins, block_for, the sketch's size and debit. before is the count of
// problems when the limit's reading began: the elastic ceiling is checked
// against the limit only when the rest read without one.
func (p *parser) extras(l *sluice.Limit, s *limitSpec, before int) {
	if s.burst != nil {
		if b, ok := p.integer(s.burst, "burst", 1, sluice.MaxCost); ok {
			// DESIGN.md's own example sets a burst on a sliding window:
			// it loads, with a warning.
			if l.Algorithm == sluice.TokenBucket || l.Algorithm == sluice.LeakyBucket || l.Algorithm == sluice.GCRA {
				l.Burst = b
			} else {
				p.Warnf(p.Deref(s.burst), "burst has no effect on %s (only on token_bucket, leaky_bucket and gcra) and is ignored", l.Algorithm)
			}
		}
	}
	if s.soft != nil {
		if v, ok := p.integer(s.soft, "soft_percent", 0, algo.MaxSoftPercent); ok {
			l.SoftPercent = int(v)
		}
	}
	if s.elastic != nil {
		if v, ok := p.integer(s.elastic, "elastic_ceiling", 1, sluice.MaxCost); ok {
			l.ElasticCeiling = v
			if len(p.Errs) == before && v < algo.Nominal(algo.Kind(l.Algorithm), l.Rate, l.Burst) {
				p.Errorf(p.Deref(s.elastic), "elastic_ceiling %d is below the limit %d", v, algo.Nominal(algo.Kind(l.Algorithm), l.Rate, l.Burst))
			}
		}
	}
	if s.blockFor != nil {
		if d, ok := p.duration(s.blockFor, "block_for"); ok {
			l.BlockFor = d
		}
	}
	if s.sketch != nil {
		p.sketch(l, s.sketch)
	}
	if s.debit != nil {
		if v, ok := p.boolean(s.debit, "debit"); ok {
			l.Debit = v
		}
	}
	if s.global != nil {
		if v, ok := p.boolean(s.global, "global"); ok && v {
			switch {
			case l.Algorithm != sluice.FixedWindow:
				p.Errorf(p.Deref(s.global), "global applies only to fixed_window, not %s: region allocations are counted per window", l.Algorithm)
			case s.calendar != nil || s.soft != nil || s.elastic != nil:
				p.Errorf(p.Deref(s.global), "global cannot be combined with calendar, soft_percent or elastic_ceiling")
			default:
				l.Global = true
			}
		}
	}
	p.lease(l, s)
}

// DefaultMaxOvershoot is the lease bound of a limit with consistency:
// lease and no max_overshoot: 1% of its rate per period.
const DefaultMaxOvershoot = "1%"

// lease reads the limit's consistency: and max_overshoot: (or the
// domain's): with consistency: lease, the bound in hits
// (sluice.Limit.LeaseOvershoot), from a count or a percentage of the
// rate per period, rounded up.
func (p *parser) lease(l *sluice.Limit, s *limitSpec) {
	cons, ov := s.consistency, s.overshoot
	if cons == nil {
		cons = p.consistency
	}
	if ov == nil {
		ov = p.overshoot
	}
	mode := "exact"
	if cons != nil {
		v, ok := p.str(cons, "consistency")
		if !ok {
			return
		}
		if v != "exact" && v != "lease" {
			p.Errorf(p.Deref(cons), "consistency must be exact or lease, got %q", v)
			return
		}
		mode = v
	}
	if mode == "exact" {
		if s.overshoot != nil {
			p.Warnf(p.Deref(s.overshoot), "max_overshoot has no effect without consistency: lease")
		}
		return
	}
	if l.Algorithm == sluice.SlidingLog || l.Algorithm == sluice.Sketch {
		p.Errorf(p.Deref(cons), "%s cannot lease (a log keeps each hit's time, a sketch no state per key): use consistency: exact", l.Algorithm)
		return
	}
	text := DefaultMaxOvershoot
	at := p.Deref(cons)
	if ov != nil {
		v, ok := p.str(ov, "max_overshoot")
		if !ok {
			return
		}
		text, at = v, p.Deref(ov)
	}
	n, err := overshootHits(text, l.Rate)
	if err != nil {
		p.Errorf(at, "max_overshoot: %v", err)
		return
	}
	if n < 2 {
		p.Warnf(at, "max_overshoot %s of %d is %d hits: too few to lease, so this limit is decided in the store, one call per decision", text, l.Rate, n)
		return
	}
	l.LeaseOvershoot = n
}

// overshootHits reads a max_overshoot: "N%" of rate (N from 0 to 100,
// decimals allowed), rounded up, or a count of hits.
func overshootHits(text string, rate int64) (int64, error) {
	if pct, ok := strings.CutSuffix(strings.TrimSpace(text), "%"); ok {
		f, err := strconv.ParseFloat(strings.TrimSpace(pct), 64)
		if err != nil || f < 0 || f > 100 || math.IsNaN(f) {
			return 0, fmt.Errorf("%q is not a percentage from 0%% to 100%%", text)
		}
		return int64(math.Ceil(f / 100 * float64(rate))), nil
	}
	n, err := strconv.ParseInt(strings.TrimSpace(text), 10, 64)
	if err != nil || n < 0 || n > sluice.MaxCost {
		return 0, fmt.Errorf("%q is neither a percentage (1%%) nor a count of hits from 0 to %d", text, int64(sluice.MaxCost))
	}
	return n, nil
}

func (p *parser) sketch(l *sluice.Limit, n *yaml.Node) {
	pairs, ok := p.Mapping(n, "sketch")
	if !ok {
		return
	}
	if l.Algorithm != sluice.Sketch {
		p.Errorf(p.Deref(n), "sketch settings apply only to algorithm: sketch, not %s", l.Algorithm)
	}
	var w, d int64
	for _, kv := range pairs {
		switch kv.K.Value {
		case "width":
			w, _ = p.integer(kv.V, "sketch width", 1, algo.MaxSketchCells)
		case "depth":
			d, _ = p.integer(kv.V, "sketch depth", 1, 64)
		default:
			p.unknown(kv.K, "sketch", sketchKeys, false)
		}
	}
	l.Sketch = sluice.SketchConfig{Width: int(w), Depth: int(d)}
	ww, dd := algo.SketchDims(l.Sketch.Width, l.Sketch.Depth)
	if ww > 0 && dd > 0 && int64(ww)*int64(dd) > algo.MaxSketchCells {
		p.Errorf(p.Deref(n), "sketch width*depth must be at most %d, got %dx%d", algo.MaxSketchCells, ww, dd)
	}
}
