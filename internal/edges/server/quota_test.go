package server_test

import (
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/edges/server"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/storetest"
)

const quotaRules = `
domain: quota-domain
descriptors:
  - key: regular
    rate_limit: {unit: minute, requests_per_unit: 5}
    metadata: {name: service_1}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
    metadata: {name: service_2}
  - key: quota2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5}
    metadata: {some_other_name: service_3, nested: {a: 1, list: [x, true]}}
`

// quotaEnv is a server of quotaRules whose decider answers with quota
// mode for every descriptor (QUOTA_MODE) when global, and with dynamic
// metadata (RESPONSE_DYNAMIC_METADATA) when metadata.
func quotaEnv(t *testing.T, yaml string, cfg server.Config, global, metadata bool) *env {
	clock := storetest.NewClock(epoch)
	store := memstore.New(memstore.Config{Now: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	// Each limit on its own: sluice serve's default.
	cfg.Decide = decide.Config{Limiter: sluice.NewLimiter(store), CountEach: true, QuotaMode: global}
	cfg.DynamicMetadata = metadata
	e := newEnvStore(t, yaml, cfg, store)
	e.clock = clock
	return e
}

// over spends the whole limit of descriptor (key, value), so that the next
// hit on it is over.
func (e *env) over(key, value string, limit int) {
	e.t.Helper()
	r := req("quota-domain", d(key+"="+value))
	r.HitsAddend = uint32(limit)
	e.call(r)
}

// TestQuotaMode translates envoyproxy/ratelimit's quota mode tests
// (test/service/ratelimit_test.go at f2fb157) to real rules and a real
// store: quota descriptors deny the request only when all of them are
// over their limits; any other descriptor over its limit denies it; each
// descriptor keeps its own code.
func TestQuotaMode(t *testing.T) {
	for _, c := range []struct {
		name   string // the envoy-rl test
		global bool   // QUOTA_MODE
		cfg    server.Config
		over   [][2]string // (key, value) pairs spent first
		descs  []*rlv3.RateLimitDescriptor
		want   string
	}{
		{"TestServicePerDescriptorQuotaMode", false, server.Config{}, [][2]string{{"regular", "a"}},
			[]*rlv3.RateLimitDescriptor{d("regular=a"), d("quota=a")}, "OVER_LIMIT: OVER_LIMIT OK"},
		{"TestServiceMixedPerDescriptorModes", false, server.Config{}, [][2]string{{"quota", "b"}},
			[]*rlv3.RateLimitDescriptor{d("regular=b"), d("quota=b")}, "OVER_LIMIT: OK OVER_LIMIT"},
		{"TestServiceQuotaModeOnlyAllOverTheLimit", false, server.Config{}, [][2]string{{"quota", "c"}, {"quota2", "c"}},
			[]*rlv3.RateLimitDescriptor{d("quota=c"), d("quota2=c")}, "OVER_LIMIT: OVER_LIMIT OVER_LIMIT"},
		{"TestServiceQuotaModeOnlySomeOverTheLimit", false, server.Config{}, [][2]string{{"quota", "d"}},
			[]*rlv3.RateLimitDescriptor{d("quota=d"), d("quota2=d")}, "OK: OVER_LIMIT OK"},
		{"TestServiceQuotaModeWithShadowMode", false, server.Config{ShadowMode: true}, [][2]string{{"quota", "e"}, {"quota2", "e"}},
			[]*rlv3.RateLimitDescriptor{d("quota=e"), d("quota2=e")}, "OK: OVER_LIMIT OVER_LIMIT"},
		{"TestServiceGlobalQuotaMode", true, server.Config{}, [][2]string{{"regular", "f"}, {"quota", "f"}},
			[]*rlv3.RateLimitDescriptor{d("regular=f"), d("quota=f")}, "OVER_LIMIT: OVER_LIMIT OVER_LIMIT"},
		{"TestMetadataReturnedForPassedDescriptors (QUOTA_MODE)", true, server.Config{}, [][2]string{{"quota", "g"}},
			[]*rlv3.RateLimitDescriptor{d("regular=g"), d("quota=g")}, "OK: OK OVER_LIMIT"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := quotaEnv(t, quotaRules, c.cfg, c.global, false)
			limits := map[string]int{"regular": 5, "quota": 3, "quota2": 5}
			for _, o := range c.over {
				e.over(o[0], o[1], limits[o[0]])
			}
			if got := codes(e.call(req("quota-domain", c.descs...))); got != c.want {
				t.Errorf("%s, want %s", got, c.want)
			}
		})
	}
}

// TestDynamicMetadata: with RESPONSE_DYNAMIC_METADATA, the response tells
// the domain, the descriptors and the merged metadata of the rules of the
// descriptors that passed; overlapping keys keep the first value (envoy-rl's
// TestMetadataReturnedForPassedDescriptors,
// TestMetadataReturnedForAllPassedDescriptors and
// TestOverlappingMetadataReturnsTheFirstValue).
func TestDynamicMetadata(t *testing.T) {
	e := quotaEnv(t, quotaRules, server.Config{}, true, true)
	e.over("quota", "h", 3)
	r := req("quota-domain", d("regular=h"), d("quota=h"), d("quota2=h"))
	r.HitsAddend = 1
	resp := e.call(r)
	if codes(resp) != "OK: OK OVER_LIMIT OK" {
		t.Fatalf("codes %s", codes(resp))
	}
	md := resp.GetDynamicMetadata().AsMap()
	if md["domain"] != "quota-domain" || md["hitsAddend"] != float64(1) {
		t.Errorf("domain and hitsAddend: %v", md)
	}
	descs, _ := md["descriptors"].([]any)
	if len(descs) != 3 {
		t.Fatalf("descriptors %v", md["descriptors"])
	}
	if entries := descs[1].(map[string]any)["entries"].([]any); len(entries) != 1 || entries[0] != "quota=h" {
		t.Errorf("second descriptor's entries %v", entries)
	}
	passed, _ := md["metadata"].(map[string]any)
	// regular and quota2 passed; quota, over its limit, did not.
	if passed["name"] != "service_1" || passed["some_other_name"] != "service_3" {
		t.Errorf("passed metadata %v, want service_1's and service_3's", passed)
	}
	nested, _ := passed["nested"].(map[string]any)
	if nested["a"] != float64(1) || len(nested["list"].([]any)) != 2 {
		t.Errorf("nested metadata %v", nested)
	}

	// Two passing descriptors with the same key: the first one's value.
	const overlap = "domain: m\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 5}\n    metadata: {name: first}\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 5}\n    metadata: {name: second}\n"
	e2 := quotaEnv(t, overlap, server.Config{}, false, true)
	resp = e2.call(req("m", d("a=1"), d("b=1")))
	if got := resp.GetDynamicMetadata().AsMap()["metadata"].(map[string]any)["name"]; got != "first" {
		t.Errorf("overlapping metadata: %v, want first", got)
	}
	// Without the setting, no metadata.
	e3 := quotaEnv(t, quotaRules, server.Config{}, false, false)
	if resp := e3.call(req("quota-domain", d("regular=1"))); resp.GetDynamicMetadata() != nil {
		t.Errorf("dynamic metadata without the setting: %v", resp.GetDynamicMetadata())
	}
}
