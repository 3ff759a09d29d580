package rules_test

import (
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

// TestReplacesKeepsSlots: `replaces` drops the named rate of a rule, not
// its concurrency limit: a client that sends the replacing descriptor
// (a tier header, say) still holds a slot. Before, the whole rule was
// replaced and the request held none (5 in flight for a cap of 2).
func TestReplacesKeepsSlots(t *testing.T) {
	dom, err := rules.Parse("api.yaml", []byte(`domain: api
descriptors:
  - key: user
    concurrency: {max: 2, ttl: 6s}
    rate_limit: {unit: minute, requests_per_unit: 100, name: user_rate}
  - key: tier
    value: gold
    rate_limit: {unit: minute, requests_per_unit: 1000, replaces: [{name: user_rate}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.NewConfig(dom)
	if err != nil {
		t.Fatal(err)
	}
	var p rules.Plan
	err = cfg.Plan("api", []rules.Descriptor{
		{Entries: []rules.Entry{{Key: "user", Value: "u"}}, Cost: 1},
		{Entries: []rules.Entry{{Key: "tier", Value: "gold"}}, Cost: 1},
	}, &p)
	if err != nil {
		t.Fatal(err)
	}
	m := p.Matches[0]
	if m.Status != rules.Limited || m.Count != 1 {
		t.Fatalf("user's match: %v with %d limits, want limited by its concurrency limit alone", m.Status, m.Count)
	}
	if h := p.Hits[m.First]; h.Limit.Algorithm != sluice.Concurrency || h.Cost != 1 {
		t.Fatalf("user's limit: %v of cost %d, want its concurrency limit, a permit", h.Limit.Algorithm, h.Cost)
	}
	if g := p.Matches[1]; g.Status != rules.Limited || g.Count != 1 || p.Hits[g.First].Limit.Rate != 1000 {
		t.Fatalf("gold's match: %v, %d limits", g.Status, g.Count)
	}
}
