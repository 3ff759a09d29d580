package decide_test

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

// TestAllOrNothing: a request denied by one descriptor consumes the
// others' limits unless the domain, or the Decider's default, is
// all-or-nothing; the domain's all_or_nothing wins over the default.
func TestAllOrNothing(t *testing.T) {
	const body = `
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: ip
    rate_limit: {unit: day, requests_per_unit: 10}
`
	parse := func(src string) *rules.Domain {
		d, err := rules.Parse("f.yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	cfg, err := rules.NewConfig(parse("domain: plain"+body), parse("domain: each\nall_or_nothing: false"+body), parse("domain: all\nall_or_nothing: true"+body))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		domain     string
		defaultAll bool
		wantAll    bool
	}{
		{"plain", true, true}, {"plain", false, false},
		{"each", true, false}, {"each", false, false},
		{"all", true, true}, {"all", false, true},
	} {
		store := memstore.New(memstore.Config{SweepInterval: -1})
		d, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(store), Rules: cfg, CountEach: !c.defaultAll})
		if err != nil {
			t.Fatal(err)
		}
		if got := d.AllOrNothing(c.domain); got != c.wantAll {
			t.Errorf("%s, default %v: AllOrNothing %v, want %v", c.domain, c.defaultAll, got, c.wantAll)
		}
		descs := []rules.Descriptor{
			{Entries: []rules.Entry{{Key: "user", Value: "u"}}, Cost: 1},
			{Entries: []rules.Entry{{Key: "ip", Value: "1"}}, Cost: 1},
		}
		var o decide.Outcome
		for range 3 {
			if err := d.Decide(context.Background(), &decide.Request{Domain: c.domain, Descriptors: descs}, &o); err != nil {
				t.Fatal(err)
			}
		}
		// Two denied requests after the first: ip has 9 left when they
		// consumed nothing, 7 when each limit counted on its own.
		want := int64(7)
		if c.wantAll {
			want = 9
		}
		if o.Overall.Allowed || o.Descriptors[1].Decision.Remaining != want {
			t.Errorf("%s, default %v: overall %+v, ip remaining %d, want %d", c.domain, c.defaultAll, o.Overall, o.Descriptors[1].Decision.Remaining, want)
		}
		store.Close()
	}
}
