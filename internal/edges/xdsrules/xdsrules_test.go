package xdsrules

import (
	"strings"
	"testing"

	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/rules"
)

func resources(t *testing.T, confs ...*rlconf.RateLimitConfig) []*anypb.Any {
	t.Helper()
	var out []*anypb.Any
	for _, c := range confs {
		a, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, a)
	}
	return out
}

// TestConvert: every field of a RateLimitConfig means in sluice what it
// means in envoy-rl (its config_xds.go), and resources of one domain merge
// only when asked.
func TestConvert(t *testing.T) {
	md, _ := structpb.NewStruct(map[string]any{"tier": "gold"})
	a := &rlconf.RateLimitConfig{Name: "a", Domain: "api", Descriptors: []*rlconf.RateLimitDescriptor{
		{Key: "user", RateLimit: &rlconf.RateLimitPolicy{Unit: rlconf.RateLimitUnit_MINUTE, RequestsPerUnit: 5, Name: "per_user"},
			Descriptors: []*rlconf.RateLimitDescriptor{{Key: "path", Value: "/x", RateLimit: &rlconf.RateLimitPolicy{Unlimited: true}}}},
		{Key: "plan", Value: "gold", QuotaMode: true, ShadowMode: true, DetailedMetric: true, Metadata: md,
			RateLimit: &rlconf.RateLimitPolicy{Unit: rlconf.RateLimitUnit_HOUR, RequestsPerUnit: 9, Replaces: []*rlconf.RateLimitReplace{{Name: "per_user"}}}},
	}}
	b := &rlconf.RateLimitConfig{Name: "b", Domain: "api", Descriptors: []*rlconf.RateLimitDescriptor{
		{Key: "ip", RateLimit: &rlconf.RateLimitPolicy{Unit: rlconf.RateLimitUnit_SECOND, RequestsPerUnit: 2}},
	}}
	c, err := Convert(resources(t, a), rules.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := c.Domain("api")
	if d == nil || len(d.Rules) != 3 {
		t.Fatalf("domain %+v", d)
	}
	user, path, plan := d.Rules[0], d.Rules[1], d.Rules[2]
	if user.Name != "per_user" || user.Limits[0].Rate != 5 || !path.Unlimited || path.Value != "/x" {
		t.Errorf("user %+v, path %+v", user, path)
	}
	if !plan.QuotaMode || !plan.ShadowMode || !plan.DetailedMetric || plan.Metadata["tier"] != "gold" || len(plan.Replaces) != 1 || plan.Limits[0].Rate != 9 {
		t.Errorf("plan %+v", plan)
	}

	if _, err := Convert(resources(t, a, b), rules.LoadOptions{}); err == nil || !strings.Contains(err.Error(), "duplicate domain 'api'") {
		t.Errorf("two resources of one domain: %v", err)
	}
	m, err := Convert(resources(t, a, b), rules.LoadOptions{MergeDomains: true})
	if err != nil || len(m.Domain("api").Rules) != 4 {
		t.Errorf("merged: %v", err)
	}

	bad := &rlconf.RateLimitConfig{Name: "bad", Domain: "", Descriptors: []*rlconf.RateLimitDescriptor{{Key: "k", RateLimit: &rlconf.RateLimitPolicy{}}}}
	_, err = Convert(resources(t, bad), rules.LoadOptions{})
	if err == nil || !strings.Contains(err.Error(), "xds:bad") || !strings.Contains(err.Error(), "config file cannot have empty domain") {
		t.Errorf("bad resource: %v", err)
	}
}
