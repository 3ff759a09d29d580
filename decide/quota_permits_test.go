package decide_test

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

// TestPermitsNotQuotas: a request that holds permits is all or nothing,
// whatever quota mode says: a concurrency limit at its cap denies it
// though another quota descriptor has room. Quota mode (the Decider's,
// as --quota-mode sets it, or the concurrency rule's own quota_mode)
// let the third of a cap of 2 through with no permit before.
func TestPermitsNotQuotas(t *testing.T) {
	for name, c := range map[string]struct {
		global bool
		yaml   string
	}{
		"--quota-mode": {true, "  - key: user\n    concurrency: {max: 2, ttl: 6s}\n"},
		"the rule's":   {false, "  - key: user\n    quota_mode: true\n    concurrency: {max: 2, ttl: 6s}\n    rate_limit: {unit: second, requests_per_unit: 100000}\n"},
	} {
		t.Run(name, func(t *testing.T) {
			dom, err := rules.Parse("a.yaml", []byte("domain: api\ndescriptors:\n"+c.yaml+
				"  - key: plain\n    quota_mode: true\n    rate_limit: {unit: second, requests_per_unit: 100000}\n"))
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := rules.NewConfig(dom)
			if err != nil {
				t.Fatal(err)
			}
			mem := memstore.New(memstore.Config{})
			t.Cleanup(func() { mem.Close() })
			d, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(mem), Rules: cfg, QuotaMode: c.global})
			if err != nil {
				t.Fatal(err)
			}
			for i, want := range []bool{true, true, false, false} {
				var o decide.Outcome
				r := decide.Request{Domain: "api", Descriptors: []rules.Descriptor{
					{Entries: []rules.Entry{{Key: "user", Value: "u"}}, Cost: 1},
					{Entries: []rules.Entry{{Key: "plain", Value: "x"}}, Cost: 1},
				}}
				if err := d.Decide(context.Background(), &r, &o); err != nil {
					t.Fatal(err)
				}
				if o.Overall.Allowed != want || want != (o.Permit != nil) {
					t.Fatalf("request %d: allowed %v with a permit %v, want %v (a cap of 2)", i, o.Overall.Allowed, o.Permit != nil, want)
				}
			}
		})
	}
}
