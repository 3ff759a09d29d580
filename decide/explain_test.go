package decide_test

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

// TestExplain: what applies to each descriptor and why, with each
// counter's state read without consuming: explaining a request many times
// changes nothing.
func TestExplain(t *testing.T) {
	cfg := rulestest.Config(t, `
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: free
    rate_limit: {unlimited: true}
`)
	store := memstore.New(memstore.Config{SweepInterval: -1})
	defer store.Close()
	d, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(store), Rules: cfg})
	if err != nil {
		t.Fatal(err)
	}
	descs := []rules.Descriptor{
		{Entries: []rules.Entry{{Key: "tenant", Value: "acme"}}, Cost: 1},
		{Entries: []rules.Entry{{Key: "free", Value: "x"}}, Cost: 1},
		{Entries: []rules.Entry{{Key: "nobody", Value: "x"}}, Cost: 1},
	}
	var o decide.Outcome
	for range 2 {
		if err := d.Decide(context.Background(), &decide.Request{Domain: "api", Descriptors: descs[:1]}, &o); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		e, err := d.Explain(context.Background(), "api", descs)
		if err != nil {
			t.Fatal(err)
		}
		got := e.Descriptors
		if len(got) != 3 || got[0].Source != "rules" || got[0].Status != "limited" || got[0].Rule == "" || len(got[0].Limits) != 1 {
			t.Fatalf("tenant=acme: %+v", got[0])
		}
		st := got[0].Limits[0].State
		if st == nil || st.Remaining != 0 || st.Limit != 2 || st.RetryAfter == "" {
			t.Fatalf("tenant=acme's counter after 2 of 2: %+v, want 0 left and a retry after", st)
		}
		if got[1].Status != "unlimited" || got[2].Status != "no_match" || got[2].Source != "none" {
			t.Fatalf("free and nobody: %+v / %+v", got[1], got[2])
		}
	}
	if _, err := d.Explain(context.Background(), "", descs); err == nil {
		t.Error("an empty domain was explained")
	}
}
