package rules_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/rules"
)

const concurrencyRules = `
domain: llm
descriptors:
  - key: api_key
    concurrency: {max: 4, ttl: 60s}
    rate_limit: {unit: minute, requests_per_unit: 600}
  - key: export
    concurrency: {max: 1}
  - key: free
    concurrency: {max: 2}
    rate_limit: {unlimited: true}
  - key: tenant
    concurrency: {max: 3}
    rate_limit: {unit: second, requests_per_unit: 5}
    schedules:
      - {tz: UTC, days: [mon, tue, wed, thu, fri, sat, sun], from: "00:00", to: "24:00", rate_limit: {unit: second, requests_per_unit: 50}}
`

// TestConcurrencyRule: a concurrency: block adds a permit hit (cost 1, or
// 0 for a peek) beside the rule's rates, keyed by the request's values;
// alone, under unlimited: true and under a schedule's window alike.
func TestConcurrencyRule(t *testing.T) {
	c := rulestest.Config(t, concurrencyRules)
	permits := func(p *rules.Plan) (out []sluice.Hit) {
		for _, h := range p.Hits {
			if h.Limit.Algorithm == sluice.Concurrency {
				out = append(out, h)
			}
		}
		return out
	}
	for _, tc := range []struct {
		entry      string
		cost       int64
		hits, rate int
		max        int64
		ttl        time.Duration
	}{
		{"api_key=a", 5, 2, 1, 4, time.Minute},
		{"api_key=a", 0, 2, 1, 4, time.Minute},
		{"export=x", 1, 1, 0, 1, 15 * time.Second},
		{"free=x", 1, 1, 0, 2, 15 * time.Second},
		{"tenant=t", 1, 2, 1, 3, 15 * time.Second},
	} {
		d := desc(tc.entry)
		d.Cost = tc.cost
		p := plan(t, c, "llm", d)
		ps := permits(p)
		if len(p.Hits) != tc.hits || len(ps) != 1 || p.Matches[0].Count != tc.hits || p.Matches[0].Status != rules.Limited {
			t.Fatalf("%s: %d hits (%d permits), match %+v", tc.entry, len(p.Hits), len(ps), p.Matches[0])
		}
		if ps[0].Limit.Rate != tc.max || ps[0].Limit.Period != tc.ttl || ps[0].Cost != min(tc.cost, 1) {
			t.Errorf("%s: permit hit %+v of %+v", tc.entry, ps[0], *ps[0].Limit)
		}
		if tc.rate == 1 && p.Hits[0].Key == ps[0].Key {
			t.Errorf("%s: the rate and the permits share the key %q", tc.entry, ps[0].Key)
		}
	}
	// Values have their own permits.
	a, b := plan(t, c, "llm", desc("api_key=a")), plan(t, c, "llm", desc("api_key=b"))
	if permits(a)[0].Key == permits(b)[0].Key {
		t.Error("two api keys share their permits")
	}
}

// TestConcurrencyRuleErrors: what a concurrency block refuses, with the
// line of the problem.
func TestConcurrencyRuleErrors(t *testing.T) {
	for _, tc := range []struct{ block, want string }{
		{"{ttl: 10s}", "concurrency needs max"},
		{"{max: -1}", "concurrency max must be between 0 and 1048576"},
		{"{max: 2000000}", "concurrency max must be between 0 and 1048576"},
		{"{max: 2, ttl: 500ms}", "concurrency ttl must be at least 1s"},
		{"{max: 2, ttl: forever}", "concurrency ttl must be a duration"},
		{"{max: 2, consistency: lease}", "consistency does not apply to concurrency"},
		{"{max: 2, limit: 3}", `unknown key "limit" in concurrency`},
		{"4", "concurrency must be a mapping"},
		// A debit rate beside it (Envoy's stream-done charges would take
		// permits never given back), and in a window of its schedules.
		{"{max: 2}\n    rate_limit: {unit: minute, requests_per_unit: 100, debit: true}", "concurrency cannot share a descriptor with a debit rate"},
		{"{max: 2}\n    rate_limit: {unit: minute, requests_per_unit: 100}\n    schedules: [{from: \"09:00\", to: \"17:00\", tz: UTC, rate_limit: {unit: minute, requests_per_unit: 10, debit: true}}]", "concurrency cannot share a descriptor with a debit rate"},
	} {
		src := "domain: d\ndescriptors:\n  - key: k\n    concurrency: " + tc.block + "\n"
		_, err := rules.Parse("c.yaml", []byte(src))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "c.yaml:4:") {
			t.Errorf("%s: %v, want %q at line 4", tc.block, err, tc.want)
		}
	}
}

// TestConcurrencyKeyOutlivesEdits: the key of a value's permits is the
// same whatever the rule's max and ttl say, so that a reload that changes
// them keeps counting the permits held; the path to the rule and the
// value still tell keys apart.
func TestConcurrencyKeyOutlivesEdits(t *testing.T) {
	key := func(block string) string {
		c := rulestest.Config(t, "domain: llm\ndescriptors:\n  - key: api_key\n    concurrency: "+block+"\n  - key: team\n    concurrency: "+block+"\n")
		p := plan(t, c, "llm", desc("api_key=a"))
		if len(p.Hits) != 1 {
			t.Fatalf("%s: %d hits", block, len(p.Hits))
		}
		return p.Hits[0].Key
	}
	k := key("{max: 4, ttl: 15s}")
	for _, b := range []string{"{max: 4, ttl: 16s}", "{max: 5, ttl: 15s}", "{max: 1}", "{max: 0, ttl: 1h}"} {
		if got := key(b); got != k {
			t.Errorf("%s: key %q, want %q as with {max: 4, ttl: 15s}", b, got, k)
		}
	}
	c := rulestest.Config(t, "domain: llm\ndescriptors:\n  - key: team\n    concurrency: {max: 4}\n")
	if p := plan(t, c, "llm", desc("team=a")); p.Hits[0].Key == k {
		t.Errorf("another descriptor's permits share the key %q", k)
	}
}
