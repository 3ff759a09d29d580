package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// countRules: a per-user limit of 1 a day and a per-ip limit of 10 a day,
// the usual Envoy pair, and a token quota for the debit pattern.
const countRules = `domain: count
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: ip
    rate_limit: {unit: day, requests_per_unit: 10}
  - key: tokens
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: blocked
    rate_limit: {unit: day, requests_per_unit: 0}
`

// storeArgs are the stores the counting tests run on: the embedded one,
// and a real redis-server (the Lua scripts decide there), each test with
// keys of its own (a prefix of its name).
func storeArgs(t *testing.T) map[string]func(t *testing.T) []string {
	t.Helper()
	srv := redistest.Standalone(t)
	return map[string]func(t *testing.T) []string{
		"memory": func(*testing.T) []string { return []string{"--store", "memory"} },
		"redis": func(t *testing.T) []string {
			return []string{"--store", "redis", "--redis-url", srv.URL(), "--redis-prefix", t.Name() + ":"}
		},
	}
}

// remainingOf returns the limit_remaining of descriptor i of r.
func remainingOf(r *rlsv3.RateLimitResponse, i int) uint32 {
	return r.GetStatuses()[i].GetLimitRemaining()
}

// TestServeE2ECountsAsEnvoy: sluice serve counts as envoyproxy/ratelimit
// by default: a request over one descriptor's limit still counts on the
// others, unless STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true (envoy-rl's
// test/integration/integration_test.go, testBasicConfig, "Limit now
// against 2 keys in the same domain": key2's remaining goes on falling, or
// stays with the setting). all_or_nothing: true in the domain, or
// --all-or-nothing, decides every limit together.
func TestServeE2ECountsAsEnvoy(t *testing.T) {
	beside(t)
	for store, sargs := range storeArgs(t) {
		t.Run(store, func(t *testing.T) { countsAsEnvoy(t, sargs) })
	}
}

func countsAsEnvoy(t *testing.T, sargs func(*testing.T) []string) {
	for _, tc := range []struct {
		name   string
		env    []string
		header string // prepended to the rules
		ipLeft []uint32
	}{
		// Envoy's default: the denied requests count on ip (9, 8, 7).
		{name: "default", ipLeft: []uint32{9, 8, 7}},
		{name: "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", env: []string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true"}, ipLeft: []uint32{9, 9, 9}},
		{name: "all_or_nothing in the file", header: "all_or_nothing: true\n", ipLeft: []uint32{9, 9, 9}},
		{name: "all_or_nothing false in the file beats the flag", env: []string{"SLUICE_ALL_OR_NOTHING=true"}, header: "all_or_nothing: false\n", ipLeft: []uint32{9, 8, 7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rules := filepath.Join(t.TempDir(), "rules.yaml")
			writeRules(t, rules, tc.header+countRules)
			p := startSluice(t, tc.env, append([]string{"--config", rules}, sargs(t)...)...)
			for i, want := range tc.ipLeft {
				r := p.must("count", desc("user", "u"), desc("ip", "1.2.3.4"))
				wantCodes := "OVER_LIMIT:OVER_LIMIT,OK"
				if i == 0 {
					wantCodes = "OK:OK,OK"
				}
				if codesOf(r) != wantCodes || remainingOf(r, 1) != want {
					t.Errorf("request %d: %s, ip remaining %d; want %s, %d", i+1, codesOf(r), remainingOf(r, 1), wantCodes, want)
				}
			}
		})
	}
}

// TestServeE2EDebit: Envoy's apply_on_stream_done pattern (LLM token
// quotas): a check with hits_addend 0 before the request, the real cost
// charged when the response ends. The charge that goes over the limit is
// counted, so the next check is OVER_LIMIT, as envoyproxy/ratelimit
// answers; once the limit is exhausted, denied charges count no more.
func TestServeE2EDebit(t *testing.T) {
	beside(t)
	for store, sargs := range storeArgs(t) {
		t.Run(store, func(t *testing.T) { debit(t, sargs) })
	}
}

func debit(t *testing.T, sargs func(*testing.T) []string) {
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, countRules)
	p := startSluice(t, nil, append([]string{"--config", rules}, sargs(t)...)...)
	call := func(cost uint64) *rlsv3.RateLimitResponse {
		t.Helper()
		return charge(t, p, desc("tokens", "team-a"), cost)
	}
	if r := call(0); codesOf(r) != "OK:OK" || remainingOf(r, 0) != 100 {
		t.Fatalf("first check: %s %d", codesOf(r), remainingOf(r, 0))
	}
	if r := call(70); codesOf(r) != "OK:OK" || remainingOf(r, 0) != 30 {
		t.Fatalf("charge of 70: %s %d", codesOf(r), remainingOf(r, 0))
	}
	if r := call(0); codesOf(r) != "OK:OK" {
		t.Fatalf("check with 30 left: %s", codesOf(r))
	}
	// The response used 45 tokens: over the limit, counted all the same.
	if r := call(45); codesOf(r) != "OVER_LIMIT:OVER_LIMIT" || remainingOf(r, 0) != 0 {
		t.Fatalf("charge of 45 with 30 left: %s %d", codesOf(r), remainingOf(r, 0))
	}
	for i := range 3 {
		if r := call(0); codesOf(r) != "OVER_LIMIT:OVER_LIMIT" {
			t.Fatalf("check %d after the overdrawing charge: %s, want OVER_LIMIT", i+1, codesOf(r))
		}
	}
	// A zero limit (requests_per_unit: 0) under the same pattern: the first
	// check passes, the charge is denied and counted, and the checks after
	// it are denied, as envoyproxy/ratelimit answers (its INCRBY counts
	// the denied hit). Before 2026-11-26 the checks after it passed here.
	for i, c := range []struct {
		cost uint64
		want string
	}{{0, "OK:OK"}, {1, "OVER_LIMIT:OVER_LIMIT"}, {0, "OVER_LIMIT:OVER_LIMIT"}, {1, "OVER_LIMIT:OVER_LIMIT"}, {0, "OVER_LIMIT:OVER_LIMIT"}} {
		if r := charge(t, p, desc("blocked", "k"), c.cost); codesOf(r) != c.want {
			t.Fatalf("zero limit, call %d of cost %d: %s, want %s", i, c.cost, codesOf(r), c.want)
		}
	}
}

// charge sends d with hits_addend cost (0: a check).
func charge(t *testing.T, p *proc, d *ratelimitv3.RateLimitDescriptor, cost uint64) *rlsv3.RateLimitResponse {
	t.Helper()
	d.HitsAddend = wrapperspb.UInt64(cost)
	r, err := p.rlReq(&rlsv3.RateLimitRequest{Domain: "count", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
	if err != nil {
		t.Fatalf("cost %d: %v", cost, err)
	}
	return r
}

// TestServeE2EConfigDirectory: envoy-rl's runtime directory settings. With
// FORCE_START_WITHOUT_INITIAL_CONFIG the service starts before its rules
// directory exists; with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED it is not
// ready until rules with a domain load; with MERGE_DOMAIN_CONFIG two files
// (in subdirectories, which are read) define one domain together.
func TestServeE2EConfigDirectory(t *testing.T) {
	beside(t)
	dir := filepath.Join(t.TempDir(), "runtime", "config")
	p := startSluice(t, []string{"FORCE_START_WITHOUT_INITIAL_CONFIG=true", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true", "MERGE_DOMAIN_CONFIG=true"}, "--config", dir)
	if code, body, _ := p.http("GET", "/readyz", ""); code != 503 {
		t.Fatalf("/readyz before any rules: %d %s, want 503", code, body)
	}
	if got := codesOf(p.must("merged", desc("user", "u"))); got != "OK:OK" {
		t.Fatalf("before any rules: %s", got)
	}
	// The directories first, then the files, as a deployment writes them.
	for _, sub := range []string{"team-a", "team-b"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeRules(t, filepath.Join(dir, "team-a", "users.yaml"), "domain: merged\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 1}\n")
	writeRules(t, filepath.Join(dir, "team-b", "ips.yaml"), "domain: merged\ndescriptors:\n  - key: ip\n    rate_limit: {unit: day, requests_per_unit: 1}\n")
	poll(t, "both files loaded", func() bool {
		code, _, _ := p.http("GET", "/readyz", "")
		r, err := p.rl("merged", peek(desc("ip", "x")))
		return code == 200 && err == nil && r.GetStatuses()[0].GetCurrentLimit() != nil
	})
	for i, want := range []string{"OK:OK,OK", "OVER_LIMIT:OVER_LIMIT,OVER_LIMIT"} {
		if got := codesOf(p.must("merged", desc("user", "u"), desc("ip", "1"))); got != want {
			t.Errorf("request %d: %s, want %s", i+1, got, want)
		}
	}
}
