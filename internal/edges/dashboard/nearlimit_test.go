package dashboard

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/edges/hitters"
	"github.com/sluicehq/sluice/rules"
)

// TestNearLimitReadsKeysBack: the near-limit list asks about the entries
// the tracker was given, a path with its slashes among them; a key the
// tracker kept cut short is not asked about.
func TestNearLimitReadsKeysBack(t *testing.T) {
	top := hitters.New(hitters.Config{})
	defer top.Close()
	key := func(entries ...string) string {
		var b []byte
		for i := 0; i < len(entries); i += 2 {
			b = hitters.AppendEntry(b, i/2, entries[i], entries[i+1])
		}
		return string(b)
	}
	add := func(k string) {
		top.Add("api.tenant_acme.path", uint64(hitters.NewKeyHash.Entry("key", k)), hitters.Allowed, func(b []byte) []byte { return append(b, k...) })
	}
	add(key("tenant", "acme", "path", "/v1/users"))
	add(key("tenant", "acme", "path", strings.Repeat("/long", 40)))
	var asked [][]rules.Entry
	mux := http.NewServeMux()
	Register(mux, Config{Tracker: top, Explain: func(_ context.Context, domain string, descs []rules.Descriptor) (int64, int64, bool) {
		if domain != "api" || len(descs) != 1 {
			t.Errorf("asked about domain %q, %d descriptors", domain, len(descs))
		}
		asked = append(asked, descs[0].Entries)
		return 1, 10, true
	}})
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("GET", "/dashboard/data", nil))
	var d data
	if err := json.Unmarshal(rec.Body.Bytes(), &d); err != nil {
		t.Fatal(err)
	}
	want := []rules.Entry{{Key: "tenant", Value: "acme"}, {Key: "path", Value: "/v1/users"}}
	if len(asked) != 1 || !slices.Equal(asked[0], want) {
		t.Errorf("asked about %q, want only %q", asked, want)
	}
	if len(d.Rules) != 1 || len(d.Rules[0].NearLimit) != 1 || d.Rules[0].NearLimit[0].Key != key("tenant", "acme", "path", "/v1/users") {
		t.Errorf("near their limit: %+v", d.Rules)
	}
}

// TestNearLimitDomainWithDots: a rule of the domain "edge.api" is
// explained in that domain, not in "edge", which is a domain too.
func TestNearLimitDomainWithDots(t *testing.T) {
	top := hitters.New(hitters.Config{})
	defer top.Close()
	top.Add("edge.api.tenant", 1, hitters.Allowed, func(b []byte) []byte { return append(b, "tenant=acme"...) })
	for _, c := range []struct {
		domains func() []string
		want    string
	}{
		{func() []string { return []string{"edge", "edge.api", "edge.ap"} }, "edge.api"},
		{nil, "edge"}, // without the domains, the first dot
	} {
		var asked []string
		mux := http.NewServeMux()
		Register(mux, Config{Tracker: top, Domains: c.domains, Explain: func(_ context.Context, domain string, _ []rules.Descriptor) (int64, int64, bool) {
			asked = append(asked, domain)
			return 0, 0, false
		}})
		mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/dashboard/data", nil))
		if !slices.Equal(asked, []string{c.want}) {
			t.Errorf("explained in %q, want %q", asked, c.want)
		}
	}
}
