package rules

import (
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/internal/base/yamlwalk"
)

// DefaultPermitTTL is the life of a concurrency permit whose rule names no
// ttl: a holder renews it every third of that while its request runs, and
// a holder that dies frees its slot by then.
const defaultPermitTTL = 15 * time.Second

var concurrencyKeys = []string{"max", "ttl"}

// concurrency reads a descriptor's `concurrency: {max: N, ttl: D}`: at most
// N requests in flight per descriptor value, each holding a permit that
// lives ttl unless renewed. It is kept apart from the rule's rate limits:
// schedules, runtime overrides and calendars change the rates, never the
// cap on what is in flight. The domain's consistency: lease does not apply
// (a permit is always exact: a node's lease of slots would be slots no other
// node could take), and a consistency key here is refused.
func (p *parser) concurrency(r *Rule, n *yaml.Node) {
	pairs, ok := p.Mapping(n, "concurrency")
	if !ok {
		return
	}
	n = p.Deref(n)
	var maxNode *yaml.Node
	ttl := defaultPermitTTL
	valid := true
	for _, kv := range pairs {
		switch kv.K.Value {
		case "max":
			maxNode = kv.V
		case "ttl":
			d, ok := p.duration(kv.V, "concurrency ttl")
			if ok && d < time.Second {
				p.Errorf(kv.V, "concurrency ttl must be at least 1s (holders renew every third of it), got %s", kv.V.Value)
				ok = false
			}
			ttl, valid = d, valid && ok
		case "consistency", "max_overshoot":
			p.Errorf(kv.K, "%s does not apply to concurrency: permits are always counted exactly in the store", kv.K.Value)
			valid = false
		default:
			p.Errorf(kv.K, "unknown key %q in concurrency (expected one of %v)", kv.K.Value, concurrencyKeys)
			valid = false
		}
	}
	if maxNode == nil {
		p.Errorf(n, "concurrency needs max: the most requests in flight per descriptor value, got %s", yamlwalk.Describe(n))
		return
	}
	limit, ok := p.integer(maxNode, "concurrency max", 0, algo.MaxPermits)
	if !ok || !valid {
		return
	}
	base := r.Name
	if base == "" {
		base = r.StatKey
	}
	r.Concurrency = &sluice.Limit{
		Name:      base + "#concurrency",
		Algorithm: sluice.Concurrency,
		Rate:      limit,
		Period:    ttl,
		Shadow:    r.ShadowMode,
	}
	if err := r.Concurrency.Validate(); err != nil {
		p.Errorf(n, "concurrency: %v", err)
		r.Concurrency = nil
		return
	}
	r.limited = true
}

// checkDebits refuses a concurrency limit of r (its block n) beside a
// debit rate, r's or a window's of its schedules: a debit is charged after
// the answer (Envoy's stream-done hits_addend), where a permit would be
// taken and never given back.
func (p *parser) checkDebits(r *Rule, n *yaml.Node) {
	if r.Concurrency != nil && debits(r) {
		p.Errorf(n, "concurrency cannot share a descriptor with a debit rate: a debit is charged after the answer (Envoy's stream-done hits_addend), where a permit would be taken and never given back; put the concurrency limit on a descriptor of its own")
	}
}

// debits reports whether a limit of r, or of a window of its schedules,
// is a debit rate (charged after the answer).
func debits(r *Rule) bool {
	for _, l := range r.set.limits {
		if l.Debit {
			return true
		}
	}
	for _, s := range r.Schedules {
		for _, l := range s.Limits {
			if l.Debit {
				return true
			}
		}
	}
	return false
}

// concurrencyTag is the key tag of a rule's permits: the permits of a
// descriptor value are one set whatever the rule's max and ttl say, so
// that a reload that changes them keeps counting the permits held (each
// carries its own expiry; the store's identity of a Concurrency limit
// leaves N and the TTL out too: algo.Params.IdentityCounts).
const concurrencyTag = "#c"

// permitCost is the cost of a descriptor's permit hit: one permit a
// request, whatever its hits_addend; none for a peek (cost 0).
func permitCost(cost int64) int64 { return min(cost, 1) }
