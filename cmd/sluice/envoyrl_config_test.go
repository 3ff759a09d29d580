package main

import (
	"net"
	"path/filepath"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/sluicehq/sluice/rules"
)

// TestEnvoyRLBasicConfig translates envoyproxy/ratelimit's TestBasicConfig
// (test/config/config_test.go at f2fb157) to the real binary: the same
// rules (envoy-rl's basic_config.yaml, unchanged, in
// testdata/envoyrl/upstream/test-config), the same descriptors, the
// same expected limit (or none), limit name, unlimited, and stats keys,
// read where envoy-rl writes them: its statsd counters, here from a real
// UDP statsd listener.
func TestEnvoyRLBasicConfig(t *testing.T) {
	beside(t)
	l, addr := udpStatsd(t)
	host, port, _ := net.SplitHostPort(addr)
	p := startSluice(t, []string{"USE_STATSD=true", "STATSD_HOST=" + host, "STATSD_PORT=" + port, "STATS_FLUSH_INTERVAL=50ms"},
		"--config", filepath.Join("testdata", "envoyrl", "upstream", "test-config", "basic_config.yaml"), "--statsd-protocol", "udp")
	for _, c := range []struct {
		entries   []string // key, value, key, value...
		rate      uint32   // 0: no limit
		unit      rlsv3.RateLimitResponse_RateLimit_Unit
		name      string
		unlimited bool
		statKey   string // where its hits are counted; empty: nowhere
	}{
		{entries: []string{"key1", "something"}},
		{entries: []string{"key1", "value1"}},
		{entries: []string{"key2", "value2", "subkey", "subvalue"}},
		{entries: []string{"key5", "value5", "subkey5", "subvalue"}},
		{entries: []string{"key1", "value1", "subkey1", "something"}, rate: 5, unit: rlsv3.RateLimitResponse_RateLimit_SECOND, statKey: "test-domain.key1_value1.subkey1"},
		{entries: []string{"key1", "value1", "subkey1", "subvalue1"}, rate: 10, unit: rlsv3.RateLimitResponse_RateLimit_SECOND, statKey: "test-domain.key1_value1.subkey1_subvalue1"},
		{entries: []string{"key2", "something"}, rate: 20, unit: rlsv3.RateLimitResponse_RateLimit_MINUTE, statKey: "test-domain.key2"},
		{entries: []string{"key2", "value2"}, rate: 30, unit: rlsv3.RateLimitResponse_RateLimit_MINUTE, statKey: "test-domain.key2_value2"},
		{entries: []string{"key2", "value3"}},
		{entries: []string{"key3", "foo"}, rate: 1, unit: rlsv3.RateLimitResponse_RateLimit_HOUR, statKey: "test-domain.key3"},
		{entries: []string{"key4", "foo"}, rate: 1, unit: rlsv3.RateLimitResponse_RateLimit_DAY, name: "key4_rate_limit", statKey: "test-domain.key4"},
		{entries: []string{"key6", "foo"}, unlimited: true},
		{entries: []string{"key7", "unspecified_value"}, rate: 70, unit: rlsv3.RateLimitResponse_RateLimit_MINUTE, statKey: "test-domain.key7_unspecified_value"},
		{entries: []string{"key7", "another_value"}, rate: 70, unit: rlsv3.RateLimitResponse_RateLimit_MINUTE, statKey: "test-domain.key7_another_value"},
	} {
		d := &ratelimitv3.RateLimitDescriptor{}
		for i := 0; i+1 < len(c.entries); i += 2 {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: c.entries[i], Value: c.entries[i+1]})
		}
		st := p.must("test-domain", d).GetStatuses()[0]
		what := strings.Join(c.entries, ",")
		cl := st.GetCurrentLimit()
		switch {
		case c.unlimited:
			if cl != nil || st.GetLimitRemaining() != 4294967295 {
				t.Errorf("%s: %v, want unlimited", what, st)
			}
		case c.rate == 0:
			if cl != nil {
				t.Errorf("%s: limit %v, want none", what, cl)
			}
		case cl.GetRequestsPerUnit() != c.rate || cl.GetUnit() != c.unit || cl.GetName() != c.name:
			t.Errorf("%s: limit %v, want %d per %v named %q", what, cl, c.rate, c.unit, c.name)
		}
		if c.statKey != "" {
			key := "ratelimit.service.rate_limit." + c.statKey + ".total_hits"
			poll(t, key, func() bool { return l.get(key) == 1 })
		}
	}
	// No other stats key got a hit: the statsd names above are all.
	l.mu.Lock()
	defer l.mu.Unlock()
	for name, n := range l.counts {
		if strings.HasSuffix(name, ".total_hits") && n != 1 {
			t.Errorf("%s counted %d", name, n)
		}
	}
}

// TestEnvoyRLConfigErrors translates envoy-rl's tests of configs it
// refuses (test/config/config_test.go at f2fb157): each is refused by
// sluice check too, with envoy-rl's own message.
func TestEnvoyRLConfigErrors(t *testing.T) {
	beside(t)
	for _, c := range []struct{ test, src, want string }{
		{"TestEmptyDomain", "descriptors:\n  - key: k\n", "config file cannot have empty domain"},
		{"TestEmptyKey", "domain: test-domain\ndescriptors:\n  - value: v\n", "descriptor has empty key"},
		{"TestDuplicateKey", "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n  - key: key1\n    value: value1\n", "duplicate descriptor composite key 'test-domain.key1_value1'"},
		{"TestBadLimitUnit", "domain: test-domain\ndescriptors:\n  - key: key1\n    rate_limit: {unit: foo, requests_per_unit: 5}\n", "invalid rate limit unit 'foo'"},
		{"TestReplacesSelf", "domain: test-domain\ndescriptors:\n  - key: key1\n    rate_limit:\n      name: self\n      unit: second\n      requests_per_unit: 5\n      replaces: [{name: self}]\n", "replaces should not contain name of same descriptor"},
		{"TestReplacesEmpty", "domain: test-domain\ndescriptors:\n  - key: key1\n    rate_limit:\n      name: n\n      unit: second\n      requests_per_unit: 5\n      replaces: [{name: \"\"}]\n", "should not have an empty replaces entry"},
		{"TestUnlimitedWithRateLimitUnit", "domain: test-domain\ndescriptors:\n  - key: key1\n    rate_limit: {unlimited: true, unit: second}\n", "should not specify rate limit unit when unlimited"},
		{"TestBadYaml", "domain: test-domain\ndescriptors:\n  - key: key1\n   value: [\n", "invalid YAML"},
		{"TestNonStringKey", "domain: test-domain\ndescriptors:\n  - key: key1\n    rate_limit: {unit: second, requests_per_unit: 5}\n    1: x\n", "key is not a string"},
		{"TestNonMapList", "domain: test-domain\ndescriptors:\n  - a\n", "a descriptor must be a mapping"},
	} {
		t.Run(c.test, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.yaml")
			writeRules(t, path, c.src)
			code, _, errOut := runCmd(t, "", "check", "--config", path)
			if code != 1 || !strings.Contains(errOut, c.want) {
				t.Errorf("sluice check: exit %d, %q; want 1 and %q", code, errOut, c.want)
			}
		})
	}
	// TestDuplicateDomain, and TestDomainMerge / TestDuplicateKeyDomainMerge
	// with MERGE_DOMAIN_CONFIG.
	dir := t.TempDir()
	writeRules(t, filepath.Join(dir, "a.yaml"), "domain: test-domain\ndescriptors:\n  - key: key1\n    rate_limit: {unit: second, requests_per_unit: 5}\n")
	writeRules(t, filepath.Join(dir, "b.yaml"), "domain: test-domain\ndescriptors:\n  - key: key2\n    rate_limit: {unit: second, requests_per_unit: 5}\n")
	if code, _, errOut := runCmd(t, "", "check", "--config", dir); code != 1 || !strings.Contains(errOut, "duplicate domain 'test-domain'") {
		t.Errorf("TestDuplicateDomain: exit %d, %q", code, errOut)
	}
	merged := startSluice(t, []string{"MERGE_DOMAIN_CONFIG=true"}, "--config", dir)
	for _, key := range []string{"key1", "key2"} {
		if st := merged.must("test-domain", desc(key, "v")).GetStatuses()[0]; st.GetCurrentLimit().GetRequestsPerUnit() != 5 {
			t.Errorf("TestDomainMerge: %s: %v", key, st)
		}
	}
	writeRules(t, filepath.Join(dir, "c.yaml"), "domain: test-domain\ndescriptors:\n  - key: key1\n    rate_limit: {unit: second, requests_per_unit: 9}\n")
	// What sluice serve --merge-domains loads, as reload does.
	if _, err := rules.LoadDirWith(dir, rules.LoadOptions{MergeDomains: true}); err == nil || !strings.Contains(err.Error(), "duplicate descriptor composite key 'test-domain.key1'") {
		t.Errorf("TestDuplicateKeyDomainMerge: %v", err)
	}
}

// TestEnvoyRLConfigLimitOverride translates envoy-rl's
// TestConfigLimitOverride: a descriptor's own limit wins over the rules,
// its stats are named by the request's entries, and a changed override
// keeps counting under the same name.
func TestEnvoyRLConfigLimitOverride(t *testing.T) {
	beside(t)
	l, addr := udpStatsd(t)
	host, port, _ := net.SplitHostPort(addr)
	p := startSluice(t, []string{"USE_STATSD=true", "STATSD_HOST=" + host, "STATSD_PORT=" + port, "STATS_FLUSH_INTERVAL=50ms"},
		"--config", filepath.Join("testdata", "envoyrl", "upstream", "test-config", "basic_config.yaml"), "--statsd-protocol", "udp")
	override := func(domain string, n uint32, unit typev3.RateLimitUnit, entries ...string) *rlsv3.RateLimitResponse_DescriptorStatus {
		d := desc(entries...)
		d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: unit}
		return p.must(domain, d).GetStatuses()[0]
	}
	// No matching domain: no limit, override or not.
	if st := override("foo_domain", 10, typev3.RateLimitUnit_DAY, "key1", "value1"); st.GetCurrentLimit() != nil {
		t.Errorf("unknown domain: %v", st)
	}
	const key = "ratelimit.service.rate_limit.test-domain.key1_value1.subkey1_something.total_hits"
	if cl := override("test-domain", 10, typev3.RateLimitUnit_DAY, "key1", "value1", "subkey1", "something").GetCurrentLimit(); cl.GetRequestsPerUnit() != 10 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_DAY {
		t.Errorf("override 10/day: %v", cl)
	}
	poll(t, key+" = 1", func() bool { return l.get(key) == 1 })
	if cl := override("test-domain", 42, typev3.RateLimitUnit_HOUR, "key1", "value1", "subkey1", "something").GetCurrentLimit(); cl.GetRequestsPerUnit() != 42 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR {
		t.Errorf("override 42/hour: %v", cl)
	}
	poll(t, key+" = 2", func() bool { return l.get(key) == 2 })
}

// TestEnvoyRLWildcardConfig translates envoy-rl's TestWildcardConfig: a *
// anywhere in a value matches any run of characters (the empty run
// included), every value it matches shares the rule and its stats key,
// which keeps the *, and a value without the pattern's prefix, suffix or
// middle matches nothing; on envoy-rl's wildcard.yaml, unchanged.
func TestEnvoyRLWildcardConfig(t *testing.T) {
	beside(t)
	l, addr := udpStatsd(t)
	host, port, _ := net.SplitHostPort(addr)
	p := startSluice(t, []string{"USE_STATSD=true", "STATSD_HOST=" + host, "STATSD_PORT=" + port, "STATS_FLUSH_INTERVAL=50ms"},
		"--config", filepath.Join("testdata", "envoyrl", "upstream", "test-config", "wildcard.yaml"), "--statsd-protocol", "udp")
	hits := map[string]uint64{}
	for _, c := range []struct {
		entries []string
		rate    uint32 // 0: no limit
		statKey string
	}{
		{[]string{"noVal", "foo1"}, 20, "test-domain.noVal"},
		{[]string{"noVal", "foo2"}, 20, "test-domain.noVal"},
		{[]string{"wild", "foo1"}, 20, "test-domain.wild_foo*"},
		{[]string{"wild", "foo2"}, 20, "test-domain.wild_foo*"},
		{[]string{"nestedWild", "val1", "wild", "goo2"}, 20, "test-domain.nestedWild_val1.wild_goo*"},
		{[]string{"wild", "bar"}, 0, ""},
		{[]string{"noWild", "foo1"}, 0, ""},
		{[]string{"midWild", "barab"}, 20, "test-domain.midWild_bar*b"},
		{[]string{"midWild", "bar123b"}, 20, "test-domain.midWild_bar*b"},
		{[]string{"midWild", "barb"}, 20, "test-domain.midWild_bar*b"},
		{[]string{"midWild", "bara"}, 0, ""},
		{[]string{"midWild", "xbarb"}, 0, ""},
		{[]string{"multiWild", "foo123bar456baz"}, 10, "test-domain.multiWild_foo*bar*baz"},
		{[]string{"multiWild", "foobarbaz"}, 10, "test-domain.multiWild_foo*bar*baz"},
		{[]string{"multiWild", "foo123baz"}, 0, ""},
		{[]string{"multiWild", "bar456baz"}, 0, ""},
	} {
		st := p.must("test-domain", desc(c.entries...)).GetStatuses()[0]
		if got := st.GetCurrentLimit().GetRequestsPerUnit(); got != c.rate {
			t.Errorf("%v: limit %d, want %d", c.entries, got, c.rate)
		}
		if c.statKey != "" {
			hits[c.statKey]++
		}
	}
	for key, n := range hits {
		name := "ratelimit.service.rate_limit." + key + ".total_hits"
		poll(t, name, func() bool { return l.get(name) == n })
	}
}

// TestEnvoyRLKeyWildcards: a '*' in a descriptor's key is a wildcard, as
// envoy-rl makes it (src/config/config_impl.go at f2fb157: a rule whose
// key_value holds a '*' anywhere is matched against the request entry's
// key_value): "st*r" matches st=abcr, "kk*" with value v matches kkx=v and
// not kkx=w, and such a rule takes share_threshold, whose counter still
// keeps each request key apart (src/limiter/cache_key.go writes the
// entry's key before the pattern). The real envoy-rl binary, built at
// f2fb157, gave these very answers to these requests (2026-11-26).
func TestEnvoyRLKeyWildcards(t *testing.T) {
	beside(t)
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeRules(t, path, `domain: d1
descriptors:
  - key: "st*r"
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: "kk*"
    value: v
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: "sh*"
    value: v
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`)
	if code, _, errOut := runCmd(t, "", "check", "--config", path); code != 0 {
		t.Fatalf("sluice check: exit %d, %s", code, errOut)
	}
	p := startSluice(t, nil, "--config", path)
	for _, c := range []struct {
		key, value string
		want       rlsv3.RateLimitResponse_Code
		limited    bool
	}{
		{"st", "abcr", rlsv3.RateLimitResponse_OK, true},
		{"st", "abcr", rlsv3.RateLimitResponse_OVER_LIMIT, true},
		{"stx", "y", rlsv3.RateLimitResponse_OK, false},
		{"kkx", "v", rlsv3.RateLimitResponse_OK, true},
		{"kkx", "v", rlsv3.RateLimitResponse_OVER_LIMIT, true},
		{"kkx", "w", rlsv3.RateLimitResponse_OK, false},
		{"sha", "v", rlsv3.RateLimitResponse_OK, true},
		{"shb", "v", rlsv3.RateLimitResponse_OK, true}, // its own counter
		{"sha", "v", rlsv3.RateLimitResponse_OVER_LIMIT, true},
	} {
		st := p.must("d1", desc(c.key, c.value)).GetStatuses()[0]
		if st.GetCode() != c.want || (st.GetCurrentLimit() != nil) != c.limited {
			t.Errorf("%s=%s: %v, want %v with a limit %v", c.key, c.value, st, c.want, c.limited)
		}
	}
}
