package decide_test

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

// BenchmarkDecidePermit: a request holding a permit, decided and released
// on memstore, under failure_policy local (the Permit's copies in the
// node's own store are made, renewed and released with it) and
// fail_closed (none), to measure what the copies cost a decision.
func BenchmarkDecidePermit(b *testing.B) {
	for _, policy := range []string{"local", "fail_closed"} {
		b.Run(policy, func(b *testing.B) {
			store := memstore.New(memstore.Config{})
			local := memstore.New(memstore.Config{})
			defer store.Close()
			defer local.Close()
			dom, err := rules.Parse("api.yaml", []byte("domain: api\nfailure_policy: "+policy+"\ndescriptors:\n  - key: k\n    concurrency: {max: 1000000, ttl: 1m}\n"))
			if err != nil {
				b.Fatal(err)
			}
			cfg, err := rules.NewConfig(dom)
			if err != nil {
				b.Fatal(err)
			}
			d, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(store), Rules: cfg,
				Failover: decide.Failover{Default: rules.FailLocal, Local: sluice.NewLimiter(local), Nodes: 2}})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			r := decide.Request{Domain: "api", Descriptors: []rules.Descriptor{{Entries: []rules.Entry{{Key: "k", Value: "v"}}, Cost: 1}}}
			var o decide.Outcome
			b.ReportAllocs()
			for b.Loop() {
				if err := d.Decide(ctx, &r, &o); err != nil || o.Permit == nil {
					b.Fatalf("%v %+v", err, o.Overall)
				}
				if err := o.Permit.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
