package main

import (
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestServeE2EOverrides: runtime overrides through the real binary: set
// with the CLI against the admin API on its own listener, applied by the
// next decision over gRPC, explained, refused without the token, kept
// across a restart in the overrides file, and gone by themselves when they
// expire.
func TestServeE2EOverrides(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	writeRules(t, rules, `domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 5}
`)
	tokens := writeFile(t, "tokens", "ops:0123456789abcdef0123456789abcdef\n")
	wrong := writeFile(t, "wrong", "ops:ffffffffffffffffffffffffffffffff\n")
	store := filepath.Join(dir, "overrides.jsonl")
	args := []string{"--config", rules, "--admin-addr", "127.0.0.1:0", "--admin-token-file", tokens, "--overrides-file", store}
	p := startSluice(t, nil, args...)
	admin := func(p *proc) string { return "http://" + p.addr("admin") }
	if !strings.HasPrefix(admin(p), "http://127.0.0.1:") {
		t.Fatalf("admin listener: %q", admin(p))
	}
	cli := func(p *proc, tokenFile string, args ...string) (int, string, string) {
		t.Helper()
		n := 1 // the command, and for override its subcommand
		if args[0] == "override" {
			n = 2
		}
		all := append(append(append([]string{}, args[:n]...), "--server", admin(p), "--token-file", tokenFile), args[n:]...)
		return runCmd(t, "", all...)
	}
	admitted := func(p *proc, tenant string, n int) int {
		t.Helper()
		got := 0
		for range n {
			r, err := p.rl("api", desc("tenant", tenant))
			if err != nil {
				t.Fatal(err)
			}
			if r.GetOverallCode() == rlsv3.RateLimitResponse_OK {
				got++
			}
		}
		return got
	}

	if code, _, errOut := cli(p, wrong, "override", "set", "--domain", "api", "--path", "tenant=acme", "--limit", `{"unit":"hour","requests_per_unit":2}`); code != 1 || !strings.Contains(errOut, "bearer token") {
		t.Fatalf("a wrong token: exit %d, %q", code, errOut)
	}
	if code, out, errOut := cli(p, tokens, "override", "set", "--domain", "api", "--path", "tenant=acme", "--limit", `{"unit":"hour","requests_per_unit":2}`, "--note", "trial"); code != 0 {
		t.Fatalf("set: exit %d, %s %s", code, out, errOut)
	}
	if code, _, errOut := cli(p, tokens, "override", "set", "--domain", "api", "--path", "tenant=x", "--limit", `{"unit":"hour","requests_per_unit":-2}`); code != 1 || !strings.Contains(errOut, "requests_per_unit") {
		t.Fatalf("a bad limit: exit %d, %q, want the field named", code, errOut)
	}
	if got := admitted(p, "acme", 4); got != 2 {
		t.Errorf("tenant=acme under its override of 2 an hour: %d of 4 admitted", got)
	}
	if got := admitted(p, "other", 7); got != 5 {
		t.Errorf("tenant=other under the rules' 5 an hour: %d of 7 admitted", got)
	}
	code, out, _ := cli(p, tokens, "explain", "--domain", "api", "tenant=acme", "tenant=other")
	if code != 0 || !strings.Contains(out, `"override": "api|tenant=acme"`) || !strings.Contains(out, `"source": "rules"`) {
		t.Fatalf("explain: exit %d\n%s", code, out)
	}
	if code, out, _ := cli(p, tokens, "override", "list"); code != 0 || !strings.Contains(out, `"note":"trial"`) {
		t.Fatalf("list: exit %d\n%s", code, out)
	}

	// A restart keeps the override.
	if code := p.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d", code)
	}
	p = startSluice(t, nil, args...)
	if got := admitted(p, "acme", 4); got != 2 {
		t.Errorf("after a restart, tenant=acme: %d of 4 admitted, want its override's 2", got)
	}

	// An override that expires goes by itself.
	if code, out, errOut := cli(p, tokens, "override", "set", "--domain", "api", "--path", "tenant=temp", "--limit", `{"blocked":true}`, "--ttl", "1500ms"); code != 0 {
		t.Fatalf("set with --ttl: exit %d, %s %s", code, out, errOut)
	}
	if got := admitted(p, "temp", 2); got != 0 {
		t.Errorf("tenant=temp, blocked: %d of 2 admitted", got)
	}
	// The Rate Limit Quota Service applies it too: its bucket is denied,
	// another tenant's gets a share of the rules' limit.
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(p.conn).StreamRateLimitQuotas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rep := &rlqsv3.RateLimitQuotaUsageReports{Domain: "api"}
	for _, tenant := range []string{"temp", "other"} {
		rep.BucketQuotaUsages = append(rep.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": tenant}}, NumRequestsAllowed: 1})
	}
	if err := stream.Send(rep); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range resp.BucketAction {
		rule := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule()
		denied := a.GetQuotaAssignmentAction() != nil && rule == typev3.RateLimitStrategy_DENY_ALL
		if tenant := a.BucketId.Bucket["tenant"]; denied != (tenant == "temp") {
			t.Errorf("RLQS bucket tenant=%s: %v", tenant, a)
		}
	}
	if len(resp.BucketAction) != 2 {
		t.Errorf("RLQS: %d actions for 2 buckets", len(resp.BucketAction))
	}
	stream.CloseSend()
	deadline := time.Now().Add(10 * time.Second)
	for admitted(p, "temp", 1) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("tenant=temp still blocked 10 s after its override expired")
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.waitLog("override expired")
	if code, _, _ := cli(p, tokens, "override", "get", "--domain", "api", "--path", "tenant=temp"); code != 1 {
		t.Errorf("the expired override is still listed")
	}
	if code, out, _ := cli(p, tokens, "override", "rm", "--domain", "api", "--path", "tenant=acme"); code != 0 || !strings.Contains(out, `"op": "delete"`) {
		t.Fatalf("rm: exit %d\n%s", code, out)
	}
	if got := admitted(p, "acme", 7); got != 5 {
		t.Errorf("tenant=acme after rm: %d of 7 admitted, want the rules' 5 (its own counter of the rules is fresh)", got)
	}
	log := p.log()
	if !strings.Contains(log, `"msg":"override changed"`) || !strings.Contains(log, `"who":"ops"`) {
		t.Errorf("no audit line with who in the log")
	}
}

// TestServeE2EOverridesRedis: two serve nodes on one real redis-server; an
// override set through the first node's admin API is applied by the
// second within a second, and so is its removal.
func TestServeE2EOverridesRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	writeRules(t, rules, `domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 1000}
`)
	tokens := writeFile(t, "tokens", "ops:0123456789abcdef0123456789abcdef\n")
	base := []string{"--config", rules, "--store", "redis", "--redis-url", srv.URL(), "--redis-prefix", t.Name() + ":"}
	a := startSluice(t, nil, append(base, "--admin-addr", "127.0.0.1:0", "--admin-token-file", tokens)...)
	b := startSluice(t, nil, base...)
	server := "http://" + a.addr("admin")
	allowed := func(p *proc) bool {
		r, err := p.rl("api", desc("tenant", "acme"))
		if err != nil {
			t.Fatal(err)
		}
		return r.GetOverallCode() == rlsv3.RateLimitResponse_OK
	}
	// until polls node b until want, and returns how long it took.
	until := func(what string, want bool) time.Duration {
		t.Helper()
		start := time.Now()
		for allowed(b) != want {
			if time.Since(start) > time.Second {
				t.Fatalf("%s: node b did not apply it within 1 s", what)
			}
			// Each try spends one of the tenant's 1,000 an hour.
			time.Sleep(5 * time.Millisecond)
		}
		return time.Since(start)
	}
	if !allowed(b) {
		t.Fatal("tenant=acme denied before any override")
	}
	if code, out, errOut := runCmd(t, "", "override", "set", "--server", server, "--token-file", tokens, "--domain", "api", "--path", "tenant=acme", "--limit", `{"blocked":true}`); code != 0 {
		t.Fatalf("set on node a: exit %d, %s %s", code, out, errOut)
	}
	t.Logf("the block set on node a applied by node b after %v", until("the block", false))
	if code, out, errOut := runCmd(t, "", "override", "rm", "--server", server, "--token-file", tokens, "--domain", "api", "--path", "tenant=acme"); code != 0 {
		t.Fatalf("rm on node a: exit %d, %s %s", code, out, errOut)
	}
	t.Logf("its removal applied by node b after %v", until("the removal", true))
}
