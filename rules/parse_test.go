package rules_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

func mustParse(t *testing.T, src string) *rules.Domain {
	t.Helper()
	d, err := rules.Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return d
}

// rule returns the rule with the given stats key.
func rule(t *testing.T, d *rules.Domain, stat string) *rules.Rule {
	t.Helper()
	for _, r := range d.Rules {
		if r.StatKey == stat {
			return r
		}
	}
	t.Fatalf("no rule %q", stat)
	return nil
}

func oneLimit(t *testing.T, r *rules.Rule) *sluice.Limit {
	t.Helper()
	if len(r.Limits) != 1 {
		t.Fatalf("%s: %d limits, want 1", r.StatKey, len(r.Limits))
	}
	return r.Limits[0]
}

// example7 is Example 7 of envoyproxy/ratelimit's README: replaces.
const example7 = `
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
`

// The examples of envoyproxy/ratelimit's README.
func TestEnvoyReadmeExamples(t *testing.T) {
	t.Run("database", func(t *testing.T) {
		d := mustParse(t, `
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
`)
		if d.Name != "mongo_cps" || len(d.Rules) != 2 {
			t.Fatalf("got %q with %d rules", d.Name, len(d.Rules))
		}
		l := oneLimit(t, rule(t, d, "mongo_cps.database_users"))
		if l.Rate != 500 || l.Period != time.Second || l.Algorithm != sluice.FixedWindow {
			t.Errorf("limit %+v", l)
		}
	})
	t.Run("messaging", func(t *testing.T) {
		d := mustParse(t, `
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
`)
		placeholder := rule(t, d, "messaging.message_type_marketing")
		if placeholder.HasRateLimit() || len(placeholder.Limits) != 0 {
			t.Errorf("placeholder has a limit")
		}
		nested := rule(t, d, "messaging.message_type_marketing.to_number")
		if nested.Parent != placeholder || nested.Line != 8 {
			t.Errorf("nested: parent %v line %d", nested.Parent, nested.Line)
		}
		if l := oneLimit(t, nested); l.Rate != 5 || l.Period != 24*time.Hour {
			t.Errorf("limit %+v", l)
		}
	})
	t.Run("auth blacklist", func(t *testing.T) {
		d := mustParse(t, `
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
`)
		if l := oneLimit(t, rule(t, d, "edge_proxy_per_ip.remote_address_50.0.0.5")); l.Rate != 0 {
			t.Errorf("blacklist rate %d", l.Rate)
		}
		if len(d.Warnings) != 0 {
			t.Errorf("warnings: %v", d.Warnings)
		}
	})
	t.Run("unlimited", func(t *testing.T) {
		d := mustParse(t, `
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
`)
		ldap := rule(t, d, "internal.ldap")
		if !ldap.Unlimited || !ldap.HasRateLimit() || len(ldap.Limits) != 0 {
			t.Errorf("ldap: %+v", ldap)
		}
	})
	t.Run("shadow mode", func(t *testing.T) {
		d := mustParse(t, `
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
`)
		a := rule(t, d, "example6.service.user_user-a")
		if !a.ShadowMode || !oneLimit(t, a).Shadow {
			t.Errorf("user-a not shadow")
		}
		if oneLimit(t, rule(t, d, "example6.service.user_user-b")).Shadow {
			t.Errorf("user-b shadow")
		}
	})
	t.Run("replaces", func(t *testing.T) {
		d := mustParse(t, example7)
		if r := rule(t, d, "example7.key_1_value_1.user_bkthomps"); r.Name != "specific_limit" || oneLimit(t, r).Name != "specific_limit" {
			t.Errorf("name %q", r.Name)
		}
		if r := rule(t, d, "example7.key_2_value_2.user_bkthomps"); len(r.Replaces) != 1 || r.Replaces[0] != "specific_limit" {
			t.Errorf("replaces %v", r.Replaces)
		}
	})
	t.Run("detailed metric and wildcard", func(t *testing.T) {
		d := mustParse(t, `
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: key2
    value: value*
    share_threshold: true
    value_to_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 20
`)
		if !rule(t, d, "example8.key1").DetailedMetric {
			t.Error("detailed_metric lost")
		}
		w := rule(t, d, "example8.key2_value*")
		if !w.ShareThreshold || !w.ValueToMetric || w.Value != "value*" {
			t.Errorf("wildcard %+v", w)
		}
	})
}

// Every unit Envoy accepts, in any case, with Envoy's lengths.
func TestUnits(t *testing.T) {
	for _, tc := range []struct {
		unit string
		want time.Duration
	}{
		{"second", time.Second}, {"MINUTE", time.Minute}, {"Hour", time.Hour},
		{"day", 24 * time.Hour}, {"week", 7 * 24 * time.Hour},
		{"month", 30 * 24 * time.Hour}, {"year", 365 * 24 * time.Hour},
	} {
		d := mustParse(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: "+tc.unit+", requests_per_unit: 1}\n")
		if got := d.Rules[0].Limits[0].Period; got != tc.want {
			t.Errorf("%s: period %s, want %s", tc.unit, got, tc.want)
		}
	}
}

// The sluice extensions: DESIGN.md's example and more.
func TestExtensions(t *testing.T) {
	d := mustParse(t, designExample+`
  - key: report2
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 3}
  - key: otp
    rate_limit:
      algorithm: token_bucket
      refill_amount: 2
      refill_interval: 10m
      burst: 5
  - key: gcra
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: gcra, burst: 20}
`)
	c := d.Capacity
	if c == nil || c.Rate != 5000 || c.Period != time.Second || c.Name != "api.capacity" {
		t.Fatalf("capacity %+v", c)
	}
	if l := oneLimit(t, rule(t, d, "api.user")); l.Algorithm != sluice.FixedWindow || l.Rate != 100 {
		t.Errorf("user %+v", l)
	}
	if l := oneLimit(t, rule(t, d, "api.user_premium")); l.Algorithm != sluice.SlidingWindow || l.SoftPercent != 10 || l.ElasticCeiling != 2000 {
		t.Errorf("premium %+v", l)
	}
	if l := oneLimit(t, rule(t, d, "api.login")); l.Algorithm != sluice.TokenBucket || l.Burst != 10 || l.RefillInterval != time.Hour || l.BlockFor != 15*time.Minute || l.Rate != 1 || l.Period != time.Hour {
		t.Errorf("login %+v", l)
	}
	post := rule(t, d, "api.post")
	if len(post.Limits) != 2 || post.Limits[0].Period != time.Second || post.Limits[1].Rate != 150 || post.Limits[1].Name != "api.post#1" {
		t.Errorf("post %+v %+v", post.Limits[0], post.Limits[1])
	}
	if l := oneLimit(t, rule(t, d, "api.report")); l.Period != 90*time.Second || l.Rate != 3 {
		t.Errorf("report %+v", l)
	}
	if l := oneLimit(t, rule(t, d, "api.report2")); l.Period != 5*time.Minute {
		t.Errorf("report2 %+v", l)
	}
	if l := oneLimit(t, rule(t, d, "api.remote_address")); l.Algorithm != sluice.Sketch || l.Sketch.Width != 4096 || l.Sketch.Depth != 4 {
		t.Errorf("sketch %+v", l)
	}
	if l := oneLimit(t, rule(t, d, "api.otp")); l.Rate != 2 || l.Period != 10*time.Minute || l.RefillInterval != 10*time.Minute || l.Burst != 5 {
		t.Errorf("otp %+v", l)
	}
	for _, r := range d.Rules {
		for _, l := range r.Limits {
			if err := l.Validate(); err != nil {
				t.Errorf("%s: %v", r.StatKey, err)
			}
		}
	}
}

// designExample is the extension example of DESIGN.md, verbatim: the
// extension keys are a contract.
const designExample = `
domain: api
capacity:                         # domain-wide limit over all requests (server-level)
  unit: second
  requests_per_unit: 5000
descriptors:
  - key: user                     # plain Envoy form: fixed_window by default
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: user
    value: premium
    rate_limit:
      unit: minute
      requests_per_unit: 1000
      algorithm: sliding_window   # token_bucket | leaky_bucket | gcra | fixed_window
                                  # | sliding_log | sliding_window | sketch
      burst: 200                  # capacity of token_bucket, leaky_bucket, gcra (default: requests_per_unit)
      soft_percent: 10            # soft limit: admit up to 10% over
      elastic_ceiling: 2000       # may exceed the limit up to this while the domain capacity has room
  - key: login
    rate_limit:
      unit: hour
      requests_per_unit: 1        # refill rate: 1 per hour ...
      burst: 10                   # ... into a bucket of 10
      algorithm: token_bucket
      refill_interval: 1h         # discrete refill (rate x interval tokens per step); absent = smooth
      block_for: 15m              # after a denial, deny this key for 15 minutes
  - key: post
    rate_limits:                  # several limits; all must pass; decided together
      - {unit: second, requests_per_unit: 1}
      - {unit: day, requests_per_unit: 150}
  - key: report
    rate_limit: {period: 90s, requests_per_unit: 3}   # any period (or unit + unit_multiplier)
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 600
      algorithm: sketch
      sketch: {width: 4096, depth: 4}
`

func TestDesignExample(t *testing.T) {
	d := mustParse(t, designExample)
	if len(d.Rules) != 6 || d.Capacity == nil {
		t.Fatalf("%d rules, capacity %v", len(d.Rules), d.Capacity)
	}
	premium := oneLimit(t, rule(t, d, "api.user_premium"))
	if premium.Burst != 0 || premium.Algorithm != sluice.SlidingWindow {
		t.Errorf("premium %+v", premium)
	}
	if len(d.Warnings) != 1 || d.Warnings[0].Line != 16 || !strings.Contains(d.Warnings[0].Msg, "burst has no effect on sliding_window") {
		t.Errorf("warnings %v", d.Warnings)
	}
}

// What yaml.v2, and so Envoy, accepts: YAML 1.1 booleans, numbers in other
// bases, scalars of any type as strings, anchors and merge keys.
func TestYAMLCompat(t *testing.T) {
	d := mustParse(t, `
domain: 42
descriptors:
  - key: a
    value: 1.5
    shadow_mode: yes
    rate_limit: &base {unit: minute, requests_per_unit: 0x10}
  - key: b
    detailed_metric: On
    rate_limit:
      <<: *base
      requests_per_unit: 1_000
  - key: c
    value: ~
    rate_limit: {unit: second, requests_per_unit: 010}
`)
	if d.Name != "42" {
		t.Errorf("domain %q", d.Name)
	}
	a := rule(t, d, "42.a_1.5")
	if !a.ShadowMode || oneLimit(t, a).Rate != 16 {
		t.Errorf("a: shadow %v limit %+v", a.ShadowMode, a.Limits[0])
	}
	b := rule(t, d, "42.b")
	if !b.DetailedMetric || oneLimit(t, b).Rate != 1000 || b.Limits[0].Period != time.Minute {
		t.Errorf("b %+v", b.Limits[0])
	}
	if l := oneLimit(t, rule(t, d, "42.c")); l.Rate != 8 {
		t.Errorf("c rate %d", l.Rate)
	}
	if len(d.Warnings) != 0 {
		t.Errorf("warnings %v", d.Warnings)
	}
}

// Files that load in Envoy load here, with warnings for what has no effect.
func TestWarnings(t *testing.T) {
	d := mustParse(t, `domain: w
descriptors:
  - key: a
    unit: second
    rate_limit:
      unlimited: true
      requests_per_unit: 5
  - key: b
    rate_limit:
      unit: second
  - key: c
    rate_limit:
  - key: d
    rate_limit:
      unit: minute
      requests_per_unit: 1
      replaces: [{name: nobody}]
      shadow_mode: true
`)
	want := []string{
		`4:5: "unit" has no effect in a descriptor`,
		`7:26: requests_per_unit is ignored when unlimited`,
		`10:7: requests_per_unit is missing`,
		`12:16: rate_limit is empty`,
		`17:25: replaces names "nobody"`,
		`18:7: "shadow_mode" has no effect in rate_limit`,
	}
	var got []string
	for _, w := range d.Warnings {
		got = append(got, w.String())
	}
	all := strings.Join(got, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("missing warning %q in\n%s", w, all)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d warnings, want %d:\n%s", len(got), len(want), all)
	}
}

// Every error, with its line and column.
func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		want      []string // "line:col: message" substrings, in order
	}{
		{"empty file", ``, []string{"1:1: config file cannot have empty domain"}},
		{"no domain", "descriptors: []\n", []string{"1:1: config file cannot have empty domain"}},
		{"empty domain", "domain: \"\"\n", []string{"1:9: config file cannot have empty domain"}},
		{"domain list", "domain: [a]\n", []string{"1:9: domain must be a string, got a list"}},
		{"not a mapping", "- a\n", []string{"1:1: a rules file must be a mapping, got a list"}},
		{"bad yaml", "domain: a\ndescriptors:\n  - key: a\n   bad\n", []string{"test.yaml:4: invalid YAML: did not find expected '-' indicator"}},
		{"unclosed flow", "domain: a\ndescriptors:\n  - key: a\n    rate_limit: {unit: second\n  - key: b\n", []string{"test.yaml:4: invalid YAML: did not find expected ',' or '}'"}},
		{"first line yaml", "domain: a: b\n", []string{"test.yaml:1: invalid YAML: mapping values are not allowed in this context"}},
		{"tab yaml", "domain: a\n\tdescriptors: []\n", []string{"test.yaml:2: invalid YAML:"}},
		{"unknown top key", "domain: a\ndescriptor: []\n", []string{`2:1: unknown key "descriptor" in the file's top level`}},
		{"repeated key", "domain: a\ndomain: b\n", []string{`2:1: key "domain" repeated (first at line 1)`}},
		{"non-string key", "domain: a\n1: b\n", []string{`2:1: key is not a string: "1"`}},
		{"descriptors scalar", "domain: a\ndescriptors: x\n", []string{"2:14: descriptors must be a list, got the string"}},
		{"descriptor scalar", "domain: a\ndescriptors: [x]\n", []string{"2:15: a descriptor must be a mapping"}},
		{"empty key", "domain: a\ndescriptors:\n  - value: x\n", []string{"3:5: descriptor has empty key"}},
		{"duplicate", "domain: a\ndescriptors:\n  - key: k\n  - key: k\n", []string{"4:5: duplicate descriptor composite key 'a.k' (first at line 3)"}},
		{"duplicate composite", "domain: a\ndescriptors:\n  - key: k_v\n  - key: k\n    value: v\n", []string{"4:5: duplicate descriptor composite key 'a.k_v'"}},
		{"nested duplicate", "domain: a\ndescriptors:\n  - key: k\n    descriptors:\n      - {key: x, value: '1'}\n      - {key: x, value: '1'}\n", []string{"6:9: duplicate descriptor composite key 'a.k.x_1' (first at line 5)"}},
		{"bad unit", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", []string{"4:24: invalid rate limit unit 'fortnight'"}},
		{"unknown unit", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: unknown, requests_per_unit: 1}\n", []string{"4:24: invalid rate limit unit 'unknown'"}},
		{"no unit", "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 1\n", []string{"5:7: invalid rate limit unit ''"}},
		{"unlimited with unit", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n", []string{"4:41: should not specify rate limit unit when unlimited"}},
		{"unlimited with algorithm", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, algorithm: gcra}\n", []string{"4:46: an unlimited rate_limit takes no other settings"}},
		{"unlimited string", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: 'true'}\n", []string{"4:29: unlimited must be true or false"}},
		{"negative rpu", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n", []string{"4:51: requests_per_unit must be between 0 and"}},
		{"huge rpu", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 99999999999999999999}\n", []string{"4:51: requests_per_unit 99999999999999999999 is out of range"}},
		{"float rpu", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n", []string{"4:51: requests_per_unit must be a whole number"}},
		{"quoted rpu", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: '5'}\n", []string{"4:51: requests_per_unit must be a whole number"}},
		{"replaces empty", "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces: [{name: ''}]\n", []string{"7:18: should not have an empty replaces entry"}},
		{"replaces self", "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      name: me\n      unit: second\n      requests_per_unit: 1\n      replaces: [{name: me}]\n", []string{"8:25: replaces should not contain name of same descriptor"}},
		{"replaces scalar item", "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces: [other]\n", []string{"7:18: replaces entries must be mappings"}},
		{"share threshold without wildcard", "domain: a\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n", []string{"4:12: share_threshold can only be used with wildcard values"}},
		{"unknown algorithm", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: magic}\n", []string{`4:65: unknown algorithm "magic"`}},
		{"bad period", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {period: 90, requests_per_unit: 1}\n", []string{`4:26: period must be a duration such as 90s or 1h30m, got "90"`}},
		{"negative period", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {period: -1s, requests_per_unit: 1}\n", []string{"4:26: period must be positive"}},
		{"absurd period", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {period: 1000000h, requests_per_unit: 1}\n", []string{"4:26: period must be positive and at most"}},
		{"unit and period", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, period: 1s, requests_per_unit: 1}\n", []string{"4:24: set either unit (with unit_multiplier) or period, not both"}},
		{"zero multiplier", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, unit_multiplier: 0, requests_per_unit: 1}\n", []string{"4:49: unit_multiplier must be between 1 and"}},
		{"absurd multiplier", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, unit_multiplier: 1000, requests_per_unit: 1}\n", []string{"4:47: unit_multiplier must be between 1 and 100,"}},
		{"zero burst", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcra, burst: 0}\n", []string{"4:78: burst must be between 1 and"}},
		{"refill on window", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1, refill_interval: 1h}\n", []string{"4:69: refill_interval needs algorithm: token_bucket"}},
		{"refill fraction", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket, refill_interval: 1m}\n", []string{"4:17: rate_limit: discrete refill needs a whole number of tokens"}},
		{"refill amount without interval", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: token_bucket, refill_amount: 2}\n", []string{"4:58: refill_amount needs refill_interval"}},
		{"refill amount and rpu", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: token_bucket, refill_amount: 2, refill_interval: 1s, requests_per_unit: 1}\n", []string{"4:101: refill_amount (with refill_interval) states the rate"}},
		{"soft percent", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, soft_percent: 5000}\n", []string{"4:68: soft_percent must be between 0 and 1000"}},
		{"elastic without capacity", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10, elastic_ceiling: 20}\n", []string{"4:72: elastic_ceiling needs a domain capacity"}},
		{"elastic below limit", "domain: a\ncapacity: {unit: second, requests_per_unit: 100}\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10, elastic_ceiling: 5}\n", []string{"5:72: elastic_ceiling 5 is below the limit 10"}},
		{"block_for", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, block_for: soon}\n", []string{`4:65: block_for must be a duration such as 90s or 1h30m, got "soon"`}},
		{"sketch without algorithm", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, sketch: {width: 10}}\n", []string{"4:62: sketch settings apply only to algorithm: sketch"}},
		{"sketch too big", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: sketch, sketch: {width: 16777216, depth: 4}}\n", []string{"4:81: sketch width*depth must be at most"}},
		{"sketch key", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: sketch, sketch: {size: 1}}\n", []string{`4:82: unknown key "size" in sketch`}},
		{"unknown rate_limit key", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burts: 3}\n", []string{`4:54: unknown key "burts" in rate_limit`}},
		{"rate_limit and rate_limits", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limits: []\n", []string{"5:18: rate_limits and rate_limit cannot both be set"}},
		{"empty rate_limits", "domain: a\ndescriptors:\n  - key: k\n    rate_limits: []\n", []string{"4:18: rate_limits is empty"}},
		{"unlimited in rate_limits", "domain: a\ndescriptors:\n  - key: k\n    rate_limits: [{unlimited: true}]\n", []string{"4:20: unlimited is not allowed in rate_limits", "4:19: invalid rate limit unit ''"}},
		{"two names", "domain: a\ndescriptors:\n  - key: k\n    rate_limits:\n      - {name: x, unit: second, requests_per_unit: 1}\n      - {name: y, unit: day, requests_per_unit: 1}\n", []string{`6:16: the limits of one descriptor share one name: "x" and "y" differ`}},
		{"capacity elastic", "domain: a\ncapacity: {unit: second, requests_per_unit: 1, elastic_ceiling: 3}\n", []string{`2:48: unknown key "elastic_ceiling" in capacity`}},
		{"capacity envoy key", "domain: a\ncapacity: {unit: second, requests_per_unit: 1, name: x}\n", []string{`2:48: unknown key "name" in capacity`}},
		{"unknown failure_policy", "domain: a\nfailure_policy: fail_sometimes\n", []string{`2:17: unknown failure_policy "fail_sometimes" (want one of fail_open, fail_closed, local)`}},
		{"failure_policy case", "domain: a\nfailure_policy: Fail_Open\n", []string{`2:17: unknown failure_policy "Fail_Open"`}},
		{"failure_policy default", "domain: a\nfailure_policy: default\n", []string{`2:17: unknown failure_policy "default"`}},
		{"failure_policy empty", "domain: a\nfailure_policy:\n", []string{`2:16: unknown failure_policy ""`}},
		{"failure_policy list", "domain: a\nfailure_policy: [local]\n", []string{"2:17: failure_policy must be a string, got a list"}},
		{"failure_policy in descriptor", "domain: a\ndescriptors:\n  - key: k\n    failure_policy: local\n", []string{`4:5: unknown key "failure_policy" in a descriptor`}},
		{"alias loop", "domain: a\ndescriptors: &x\n  - key: k\n    descriptors: *x\n", []string{"descriptors nested deeper than 64 levels"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := rules.Parse("test.yaml", []byte(tc.src))
			var re *rules.Error
			if !errors.As(err, &re) {
				t.Fatalf("err = %v, want *rules.Error", err)
			}
			msg := err.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error\n%s\ndoes not contain %q", msg, w)
				}
			}
			if len(re.Problems) != len(tc.want) {
				t.Errorf("%d problems, want %d:\n%s", len(re.Problems), len(tc.want), msg)
			}
		})
	}
}

// Every problem of a file is reported, one per line, in file order.
func TestAllErrorsReported(t *testing.T) {
	src := `domain: many
descriptors:
  - key: a
    rate_limit: {unit: fortnight, requests_per_unit: 1}
  - value: orphan
    descriptors:
      - key: inner
        rate_limit: {unit: second, requests_per_unit: -3}
  - key: a
  - key: b
    bogus: 1
    rate_limit:
      unit: second
      requests_per_unit: 1
      algorithm: nope
      block_for: 5
`
	_, err := rules.Parse("many.yaml", []byte(src))
	if err == nil {
		t.Fatal("no error")
	}
	lines := strings.Split(err.Error(), "\n")
	want := []string{
		"many.yaml:4:24: invalid rate limit unit 'fortnight'",
		"many.yaml:5:5: descriptor has empty key",
		"many.yaml:8:55: requests_per_unit must be between 0 and",
		"many.yaml:9:5: duplicate descriptor composite key 'many.a' (first at line 3)",
		`many.yaml:11:5: unknown key "bogus" in a descriptor`,
		`many.yaml:15:18: unknown algorithm "nope"`,
		"many.yaml:16:18: block_for must be a duration",
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%s", len(lines), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("problem %d = %q, want prefix %q", i, lines[i], w)
		}
	}
}

// Envoy reads only the first YAML document of a file.
func TestSecondDocument(t *testing.T) {
	for _, src := range []string{"domain: a\n---\ndomain: b\n", "domain: a\n---\n[broken\n"} {
		d := mustParse(t, src)
		if d.Name != "a" || len(d.Warnings) != 1 || !strings.Contains(d.Warnings[0].String(), "test.yaml:2: a second YAML document is ignored") {
			t.Errorf("%q: domain %q warnings %v", src, d.Name, d.Warnings)
		}
	}
}

func TestProblemString(t *testing.T) {
	for _, tc := range []struct {
		p    rules.Problem
		want string
	}{
		{rules.Problem{File: "f.yaml", Line: 3, Column: 7, Msg: "m"}, "f.yaml:3:7: m"},
		{rules.Problem{File: "f.yaml", Line: 3, Msg: "m"}, "f.yaml:3: m"},
		{rules.Problem{File: "f.yaml", Msg: "m"}, "f.yaml: m"},
		{rules.Problem{Msg: "m"}, "m"},
	} {
		if got := tc.p.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.p, got, tc.want)
		}
	}
}

func TestFailurePolicy(t *testing.T) {
	for _, tc := range []struct {
		src  string
		want rules.FailurePolicy
	}{
		{"domain: a\n", rules.FailDefault},
		{"domain: a\nfailure_policy: fail_open\n", rules.FailOpen},
		{"domain: a\nfailure_policy: fail_closed\n", rules.FailClosed},
		{"domain: a\nfailure_policy: 'local'\ndescriptors: []\n", rules.FailLocal},
	} {
		d, err := rules.Parse("test.yaml", []byte(tc.src))
		if err != nil {
			t.Errorf("%q: %v", tc.src, err)
			continue
		}
		if d.FailurePolicy != tc.want {
			t.Errorf("%q: %v, want %v", tc.src, d.FailurePolicy, tc.want)
		}
	}
	for _, p := range []rules.FailurePolicy{rules.FailOpen, rules.FailClosed, rules.FailLocal} {
		got, err := rules.ParseFailurePolicy(p.String())
		if err != nil || got != p {
			t.Errorf("ParseFailurePolicy(%q) = %v, %v", p.String(), got, err)
		}
		var q rules.FailurePolicy
		b, err := p.MarshalText()
		if err != nil || q.UnmarshalText(b) != nil || q != p {
			t.Errorf("%v: text round trip gave %v (%v)", p, q, err)
		}
	}
	if s := rules.FailDefault.String(); s != "default" {
		t.Errorf("FailDefault is %q", s)
	}
	if _, err := rules.FailurePolicy(9).MarshalText(); err == nil || rules.FailurePolicy(9).String() != "rules.FailurePolicy(9)" {
		t.Errorf("FailurePolicy(9): %q, %v", rules.FailurePolicy(9), err)
	}
}

// The http section belongs to the HTTP front doors: the rules accept it,
// whatever it holds, without a warning, and read the rest as without it.
func TestHTTPSectionIgnored(t *testing.T) {
	plain := "domain: api\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"
	with := "domain: api\nhttp:\n  routes:\n    - pattern: \"POST /login\"\n      anything: [1, 2]\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"
	a, b := mustParse(t, plain), mustParse(t, with)
	if len(b.Warnings) != 0 {
		t.Errorf("warnings: %v", b.Warnings)
	}
	if len(a.Rules) != 1 || len(b.Rules) != 1 || a.Rules[0].StatKey != b.Rules[0].StatKey || b.Rules[0].Limits[0].Rate != 3 {
		t.Errorf("rules differ: %+v and %+v", a.Rules, b.Rules)
	}
	// The hash covers the whole file, so that a reload sees a change of
	// the http section alone.
	ca, err := rules.NewConfig(a)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := rules.NewConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	if ca.Hash() == cb.Hash() {
		t.Error("the http section does not change the hash")
	}
	// Nested, it is still an unknown key.
	_, err = rules.Parse("test.yaml", []byte("domain: api\ndescriptors:\n  - key: k\n    http: {}\n"))
	if err == nil || !strings.Contains(err.Error(), `unknown key "http" in a descriptor`) {
		t.Errorf("nested http: %v", err)
	}
}

// TestDebit: a limit charged after the fact says debit: true (any YAML
// boolean, as Envoy's keys); anything else is an error naming it.
func TestDebit(t *testing.T) {
	d := mustParse(t, `
domain: llm
descriptors:
  - key: tokens
    rate_limit: {unit: minute, requests_per_unit: 1000, algorithm: token_bucket, debit: true}
  - key: calls
    rate_limit: {unit: minute, requests_per_unit: 10, debit: no}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 10}
`)
	for key, want := range map[string]bool{"llm.tokens": true, "llm.calls": false, "llm.plain": false} {
		if got := oneLimit(t, rule(t, d, key)).Debit; got != want {
			t.Errorf("%s: Debit %v, want %v", key, got, want)
		}
	}
	_, err := rules.Parse("r.yaml", []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, debit: later}\n"))
	if err == nil || !strings.Contains(err.Error(), "4:") || !strings.Contains(err.Error(), "debit") {
		t.Errorf("debit: later: %v, want an error at line 4 naming debit", err)
	}
}

// TestLeaseKeys: consistency: lease (per limit, or the domain's default)
// sets the lease bound from max_overshoot, a percentage of the rate per
// period (1% by default, rounded up) or a count; consistency: exact, or
// none, leases nothing; what cannot lease is an error or, for a bound too
// small to lease, a warning.
func TestLeaseKeys(t *testing.T) {
	d := mustParse(t, `
domain: api
consistency: lease
descriptors:
  - key: default
    rate_limit: {unit: minute, requests_per_unit: 60000}
  - key: count
    rate_limit: {unit: minute, requests_per_unit: 60000, max_overshoot: 250}
  - key: pct
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: gcra, max_overshoot: 2.5%}
  - key: exact
    rate_limit: {unit: minute, requests_per_unit: 60000, consistency: exact}
  - key: small
    rate_limit: {unit: second, requests_per_unit: 100}
`)
	for key, want := range map[string]int64{"api.default": 600, "api.count": 250, "api.pct": 25, "api.exact": 0, "api.small": 0} {
		if got := oneLimit(t, rule(t, d, key)).LeaseOvershoot; got != want {
			t.Errorf("%s: LeaseOvershoot %d, want %d", key, got, want)
		}
	}
	if len(d.Warnings) != 1 || !strings.Contains(d.Warnings[0].Msg, "too few to lease") {
		t.Errorf("warnings %v, want one: the small limit's bound", d.Warnings)
	}
	plain := mustParse(t, "domain: p\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 60000}\n")
	if got := oneLimit(t, rule(t, plain, "p.k")).LeaseOvershoot; got != 0 {
		t.Errorf("no consistency: LeaseOvershoot %d, want 0", got)
	}
	for _, c := range []struct{ src, want string }{
		{"consistency: maybe", "consistency must be exact or lease"},
		{"consistency: lease, max_overshoot: 150%", "is not a percentage"},
		{"consistency: lease, max_overshoot: lots", "neither a percentage"},
		{"consistency: lease, algorithm: sketch", "sketch cannot lease"},
		{"consistency: lease, algorithm: sliding_log", "sliding_log cannot lease"},
	} {
		_, err := rules.Parse("r.yaml", []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 600, "+c.src+"}\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "4:") {
			t.Errorf("%s: %v, want an error at line 4 saying %q", c.src, err, c.want)
		}
	}
}
