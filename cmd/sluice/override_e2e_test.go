package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

// TestServeE2EOverrides: runtime overrides through the real binary: set
// with the CLI against the admin API on its own listener, applied by the
// next decision over gRPC, explained, refused without the token, kept
// across a restart in the overrides file, and gone by themselves when they
// expire.
func TestServeE2EOverrides(t *testing.T) {
	beside(t)
	args, tokens := overridesServe(t, 5)
	wrong := writeFile(t, "wrong", "ops:ffffffffffffffffffffffffffffffff\n")
	p := startSluice(t, nil, args...)
	if admin := p.addr("admin"); !strings.HasPrefix(admin, "127.0.0.1:") {
		t.Fatalf("admin listener: %q", admin)
	}
	cli := func(p *proc, tokenFile string, args ...string) (int, string, string) {
		t.Helper()
		return adminCLI(t, p, tokenFile, args...)
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
	// The override's limit is named by the override.
	if !strings.Contains(out, `"name": "api|tenant=acme"`) || strings.Contains(out, "override.k") {
		t.Errorf("explain: the override's limit is not named by the override:\n%s", out)
	}
	// Envoy sends an empty value (a header present but empty): an
	// override of the empty value applies to it, and to no other value.
	if code, out, errOut := cli(p, tokens, "override", "set", "--domain", "api", "--path", "tenant=", "--limit", `{"blocked":true}`); code != 0 {
		t.Fatalf("set tenant=: exit %d, %s %s", code, out, errOut)
	}
	if got := admitted(p, "", 2); got != 0 {
		t.Errorf("tenant=\"\" under a block of the empty value: %d of 2 admitted", got)
	}
	if got := admitted(p, "fresh", 1); got != 1 {
		t.Errorf("tenant=fresh, under the rules: %d of 1 admitted", got)
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

	// An override that expires goes by itself. It lives long enough for
	// the checks below on a loaded machine (beside the other tests that
	// wait, they outlasted 1.5 s).
	if code, out, errOut := cli(p, tokens, "override", "set", "--domain", "api", "--path", "tenant=temp", "--limit", `{"blocked":true}`, "--ttl", "5s"); code != 0 {
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
	// Not beside the tests that wait: it times a change reaching another node within a second, which their load would stretch.
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

// TestServeE2EOverrideIDs: two overrides whose paths differ only in where
// "/" and "=" fall, [user="q/team=c"] and [user=q, team=c], are two
// overrides through the real admin API of sluice serve: each is listed,
// explained, enforced and deleted on its own, before and after a restart
// from the overrides file, and once both are deleted neither limits.
func TestServeE2EOverrideIDs(t *testing.T) {
	beside(t)
	args, tokens := overridesServe(t, 1000)
	p := startSluice(t, nil, args...)
	cli := func(args ...string) (int, string, string) {
		t.Helper()
		return adminCLI(t, p, tokens, args...)
	}
	// listed returns the listed overrides' limits, by path.
	listed := func() map[string]int {
		t.Helper()
		code, out, errOut := cli("override", "list")
		if code != 0 {
			t.Fatalf("list: exit %d, %s", code, errOut)
		}
		got := map[string]int{}
		for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
			if line == "" {
				continue
			}
			var o struct {
				Path  []struct{ Key, Value string }
				Limit struct {
					RequestsPerUnit int `json:"requests_per_unit"`
				}
			}
			if err := json.Unmarshal([]byte(line), &o); err != nil {
				t.Fatalf("list: %v: %s", err, line)
			}
			var path []string
			for _, e := range o.Path {
				path = append(path, fmt.Sprintf("%s=%q", e.Key, e.Value))
			}
			got[strings.Join(path, ",")] = o.Limit.RequestsPerUnit
		}
		return got
	}
	both := map[string]int{`user="q/team=c"`: 7, `user="q",team="c"`: 9}
	// explained returns the override and the rate explain gives for one
	// descriptor (written as sluice explain reads it).
	explained := func(descriptor string) (string, int) {
		t.Helper()
		code, out, errOut := cli("explain", "--domain", "api", descriptor)
		if code != 0 {
			t.Fatalf("explain %s: exit %d, %s", descriptor, code, errOut)
		}
		var e struct {
			Descriptors []struct {
				Override string
				Limits   []struct{ Rate int }
			}
		}
		if err := json.Unmarshal([]byte(out), &e); err != nil || len(e.Descriptors) != 1 || len(e.Descriptors[0].Limits) != 1 {
			t.Fatalf("explain %s: %v\n%s", descriptor, err, out)
		}
		return e.Descriptors[0].Override, e.Descriptors[0].Limits[0].Rate
	}
	checkBoth := func(when string) {
		t.Helper()
		if got := listed(); !maps.Equal(got, both) {
			t.Errorf("%s: listed %v, want %v", when, got, both)
		}
		// (%3D or =: both read as "=")
		if id, rate := explained(`user=q%2Fteam%3Dc`); rate != 7 || id != `api|user=q%2Fteam=c` {
			t.Errorf("%s: explain user=\"q/team=c\": override %q, rate %d; want api|user=q%%2Fteam=c and 7", when, id, rate)
		}
		if id, rate := explained(`user=q/team=c`); rate != 9 || id != `api|user=q/team=c` {
			t.Errorf("%s: explain user=q, team=c: override %q, rate %d; want api|user=q/team=c and 9", when, id, rate)
		}
	}

	// The first through the API's JSON (a value holding / and =), the
	// second through the CLI's path.
	req, err := http.NewRequest("PUT", "http://"+p.addr("admin")+"/v1/override", strings.NewReader(
		`{"domain":"api","path":[{"key":"user","value":"q/team=c"}],"limit":{"unit":"hour","requests_per_unit":7}}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer 0123456789abcdef0123456789abcdef")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("PUT user=\"q/team=c\": %s", resp.Status)
	}
	if code, out, errOut := cli("override", "set", "--domain", "api", "--path", "user=q/team=c", "--limit", `{"unit":"hour","requests_per_unit":9}`); code != 0 || strings.Contains(out, `"before"`) {
		t.Fatalf("set user=q/team=c: exit %d, %s %s (want a new override, no before)", code, out, errOut)
	}
	checkBoth("after both puts")

	if code := p.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d", code)
	}
	p = startSluice(t, nil, args...)
	checkBoth("after a restart")

	if code, out, errOut := cli("override", "rm", "--domain", "api", "--path", "user=q/team=c"); code != 0 || !strings.Contains(out, `"value": "c"`) {
		t.Fatalf("rm user=q/team=c: exit %d, %s %s", code, out, errOut)
	}
	if got, want := listed(), map[string]int{`user="q/team=c"`: 7}; !maps.Equal(got, want) {
		t.Errorf("after rm user=q/team=c: listed %v, want %v", got, want)
	}
	got := 0
	for range 10 {
		if p.must("api", desc("user", "q/team=c")).GetOverallCode() == rlsv3.RateLimitResponse_OK {
			got++
		}
	}
	if got != 7 {
		t.Errorf("user=\"q/team=c\": %d of 10 admitted, want its override's 7", got)
	}
	if code, out, errOut := cli("override", "rm", "--domain", "api", "--path", "user=q%2Fteam%3Dc"); code != 0 || !strings.Contains(out, `"value": "q/team=c"`) {
		t.Fatalf("rm user=q%%2Fteam%%3Dc: exit %d, %s %s", code, out, errOut)
	}
	for _, when := range []string{"after both rm", "after both rm and a restart"} {
		if got := listed(); len(got) != 0 {
			t.Errorf("%s: listed %v", when, got)
		}
		// Its counter is spent (7 of 7): only a ghost of the override
		// would deny.
		if code := p.must("api", desc("user", "q/team=c")).GetOverallCode(); code != rlsv3.RateLimitResponse_OK {
			t.Errorf("%s: user=\"q/team=c\" %v, want OK under the rules' 1000", when, code)
		}
		if id, _ := explained(`user=q%2Fteam%3Dc`); id != "" {
			t.Errorf("%s: explain names override %q", when, id)
		}
		if when == "after both rm" {
			if code := p.stop(syscall.SIGTERM); code != 0 {
				t.Fatalf("exit %d", code)
			}
			p = startSluice(t, nil, args...)
		}
	}
}

// overridesServe returns the arguments of a sluice serve with an admin API
// and an overrides file, on rules of domain api that limit each tenant and
// each user to perHour requests an hour, and its token file.
func overridesServe(t *testing.T, perHour int) (args []string, tokens string) {
	t.Helper()
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	writeRules(t, rules, fmt.Sprintf(`domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: %d}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: %[1]d}
`, perHour))
	tokens = writeFile(t, "tokens", "ops:0123456789abcdef0123456789abcdef\n")
	return []string{"--config", rules, "--admin-addr", "127.0.0.1:0", "--admin-token-file", tokens, "--overrides-file", filepath.Join(dir, "overrides.jsonl")}, tokens
}

// adminCLI runs a sluice command against p's admin API with the token in
// tokenFile (--server and --token-file after the command, and for
// override after its subcommand).
func adminCLI(t *testing.T, p *proc, tokenFile string, args ...string) (int, string, string) {
	t.Helper()
	n := 1
	if args[0] == "override" {
		n = 2
	}
	all := append(append(append([]string{}, args[:n]...), "--server", "http://"+p.addr("admin"), "--token-file", tokenFile), args[n:]...)
	return runCmd(t, "", all...)
}

// TestAdminTokenFileRefused: sluice serve and sluice proxy refuse to
// start (exit 1) on an admin token file with a line that is not
// name:secret: a bare secret (it was taken under the name "admin") or a
// secret with no name (it answered 401, and nothing said why). The error
// names the file and the line, never the secret.
func TestAdminTokenFileRefused(t *testing.T) {
	beside(t)
	rules := writeFile(t, "rules.yaml", dayRule("api", "tenant", 10))
	overridesFile := filepath.Join(t.TempDir(), "overrides.jsonl")
	for _, c := range []struct{ content, want string }{
		{"ops:0123456789abcdef0123456789abcdef\ntokvalNOCOLONxxxxxxxxxxxxxxxx\n", "line 2: not name:secret"},
		{":tokvalEMPTYNAMExxxxxxxxxxxxx\n", "line 1: a token with no name"},
	} {
		tokens := writeFile(t, "tokens", c.content)
		for _, p := range []*proc{
			launch(t, nil, "--config", rules, "--overrides-file", overridesFile, "--admin-addr", "127.0.0.1:0", "--admin-token-file", tokens),
			launchCommand(t, "proxy", []string{"listen", "admin-listen"}, nil, "--config", rules, "--upstream", "http://127.0.0.1:1", "--admin-token-file", tokens),
		} {
			if code := p.wait(); code != 1 {
				t.Errorf("%q: exit status %d, want 1", c.content, code)
			}
			log := p.log()
			if !strings.Contains(log, tokens+", "+c.want) || strings.Contains(log, "tokval") {
				t.Errorf("%q: want %q, naming the file and never the secret:\n%s", c.content, c.want, log)
			}
		}
	}
}

// TestServeE2EOverridesWrongPassword: sluice serve with overrides in a
// real redis-server that refuses its password logs the lost subscription
// of the overrides once in 3 s, where it logged it 5 times a second.
func TestServeE2EOverridesWrongPassword(t *testing.T) {
	beside(t)
	srv := redistest.Standalone(t, redistest.WithPassword("the-right-password-0123456789"))
	rules := writeFile(t, "rules.yaml", dayRule("api", "tenant", 10))
	tokens := writeFile(t, "tokens", "ops:0123456789abcdef0123456789abcdef\n")
	p := launch(t, nil, "--config", rules, "--store", "redis", "--redis-url", "redis://:a-wrong-password-0123@"+srv.Addr(),
		"--admin-addr", "127.0.0.1:0", "--admin-token-file", tokens)
	p.waitLog("listening", "admin")
	time.Sleep(3 * time.Second)
	log := p.log()
	if n := strings.Count(log, "subscription to Redis lost"); n != 1 {
		t.Errorf("%d lines of a lost subscription in 3 s, want 1:\n%s", n, grepLines(log, "subscription"))
	}
	if strings.Contains(log, "a-wrong-password") {
		t.Error("the password is in the log")
	}
}
