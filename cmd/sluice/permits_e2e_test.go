package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

const permitRulesE2E = `domain: edge
descriptors:
  - key: api_key
    concurrency: {max: 2, ttl: 30s}
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: export
    concurrency: {max: 1, ttl: 1s}
`

// TestServeE2EPermits: concurrency limits through sluice serve, on the
// embedded store and on Redis, with a gRPC client doing what Envoy does: a
// request admitted holding a permit gets a token in the answer's dynamic
// metadata; one at the cap is denied and gets none; the stream-done
// request, the same descriptor with the token in a sluice_permit entry,
// gives the permit back, and the next request is admitted again. A forged
// token, a release twice, a token replayed with other entries, a
// malformed one and the token of an expired permit release nothing
// another holds, and are counted apart: only a release whose permits the
// store held counts as released (sluice_permit_tokens_total), one it no
// longer held (a replay, an expired permit) as stale. Without
// --stream-done-release such rules are refused.
func TestServeE2EPermits(t *testing.T) {
	beside(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, permitRulesE2E)
	t.Run("refused without the switch", func(t *testing.T) {
		p := launch(t, nil, "--config", rules)
		if code := p.wait(); code != 1 {
			t.Errorf("exit %d, want 1", code)
		}
		if log := p.log(); !strings.Contains(log, "rules.yaml:3") || !strings.Contains(log, "--stream-done-release") {
			t.Errorf("the refusal does not name the rule and the switch:\n%s", log)
		}
	})
	for store, sargs := range storeArgs(t) {
		t.Run(store, func(t *testing.T) {
			p := startSluice(t, nil, append([]string{"--config", rules, "--stream-done-release"}, sargs(t)...)...)
			permitsE2E(t, p)
		})
	}
}

// tokenOf is the permit token of an answer, "" if none.
func tokenOf(r *rlsv3.RateLimitResponse) string {
	return r.GetDynamicMetadata().GetFields()["sluice_permit"].GetStringValue()
}

func permitsE2E(t *testing.T, p *proc) {
	admit := func(kv ...string) string {
		t.Helper()
		r := p.must("edge", desc(kv...))
		if codesOf(r) != "OK:OK" || tokenOf(r) == "" {
			t.Fatalf("%v: %s, token %q; want OK with a token", kv, codesOf(r), tokenOf(r))
		}
		return tokenOf(r)
	}
	denied := func(kv ...string) {
		t.Helper()
		r := p.must("edge", desc(kv...))
		if codesOf(r) != "OVER_LIMIT:OVER_LIMIT" || r.GetDynamicMetadata() != nil {
			t.Fatalf("%v: %s, metadata %v; want OVER_LIMIT and no token", kv, codesOf(r), r.GetDynamicMetadata())
		}
	}
	release := func(token string, kv ...string) {
		t.Helper()
		r := p.must("edge", desc(append(kv, "sluice_permit", token)...))
		if codesOf(r) != "OK:OK" || r.GetDynamicMetadata() != nil {
			t.Fatalf("release of %v: %s, metadata %v; want OK and nothing else", kv, codesOf(r), r.GetDynamicMetadata())
		}
	}

	a := admit("api_key", "k1")
	b := admit("api_key", "k1")
	denied("api_key", "k1")
	release(a, "api_key", "k1")
	c := admit("api_key", "k1")
	// A forged ID with the real tag, a second release, b replayed with
	// another key, a malformed token: none frees b's or c's slot.
	release(a[:9]+strings.Repeat("A", 26), "api_key", "k1")
	release(a, "api_key", "k1")
	release(b, "api_key", "k2")
	release("not-a-token", "api_key", "k1")
	denied("api_key", "k1")
	release(b, "api_key", "k1")
	release(c, "api_key", "k1")
	admit("api_key", "k1")
	admit("api_key", "k1")
	denied("api_key", "k1")

	// An expired permit's token, back after another took the slot.
	e1 := admit("export", "x")
	denied("export", "x")
	var e2 string
	poll(t, "the export permit expires after its ttl of 1s", func() bool {
		r := p.must("edge", desc("export", "x"))
		e2 = tokenOf(r)
		return codesOf(r) == "OK:OK"
	})
	release(e1, "export", "x")
	denied("export", "x")
	release(e2, "export", "x")
	admit("export", "x")

	// Released: a, b, c, e2; stale: the forged ID, a again, e1 (expired).
	for event, want := range map[string]float64{"issued": 8, "released": 4, "stale": 3, "refused": 2, "failed": 0} {
		if got := p.metricSum("sluice_permit_tokens_total", `event="`+event+`"`); got != want {
			t.Errorf("sluice_permit_tokens_total{event=%q} %v, want %v", event, got, want)
		}
	}

	// The HTTP JSON API is the same door.
	type answer struct {
		OverallCode     string
		DynamicMetadata map[string]string
	}
	post := func(entries string) answer {
		t.Helper()
		code, body, _ := p.http("POST", "/json", `{"domain":"edge","descriptors":[{"entries":[`+entries+`]}]}`)
		var ans answer
		if err := json.Unmarshal([]byte(body), &ans); code != 200 || err != nil {
			t.Fatalf("/json: %d %s (%v)", code, body, err)
		}
		return ans
	}
	tok := post(`{"key":"api_key","value":"j"}`).DynamicMetadata["sluice_permit"]
	if tok == "" {
		t.Fatal("/json: no token")
	}
	if ans := post(`{"key":"api_key","value":"j"},{"key":"sluice_permit","value":"` + tok + `"}`); ans.OverallCode != "OK" || ans.DynamicMetadata != nil {
		t.Fatalf("/json release: %+v", ans)
	}
	if got := p.metricSum("sluice_permit_tokens_total", `event="released"`); got != 5 {
		t.Errorf("released after /json: %v, want 5", got)
	}
	for range 3 { // replayed: stale each time, never released again
		post(`{"key":"api_key","value":"j"},{"key":"sluice_permit","value":"` + tok + `"}`)
	}
	if r, s := p.metricSum("sluice_permit_tokens_total", `event="released"`), p.metricSum("sluice_permit_tokens_total", `event="stale"`); r != 5 || s != 6 {
		t.Errorf("after three replays: released %v stale %v, want 5 and 6", r, s)
	}

	// Two tokens in one descriptor: not something Envoy sends.
	_, err := p.rl("edge", desc("api_key", "k1", "sluice_permit", a, "sluice_permit", b))
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("two tokens in a descriptor: %v, want InvalidArgument", err)
	}
}

// TestServeE2EPermitsOutageStart: sluice serve on Redis, failure_policy
// local, N = 2 on one node. Two holders admitted by Redis run when Redis
// dies: the node's share (floor(2/1)) counts them, so the local policy
// admits nobody beside them (before, it admitted 2 more: 2N in flight).
// A holder's stream-done release, which Redis cannot take, still frees
// its place in the share, and the policy admits one in its stead.
func TestServeE2EPermitsOutageStart(t *testing.T) {
	beside(t)
	srv := redistest.Standalone(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, strings.Replace(permitRulesE2E, "domain: edge\n", "domain: edge\nfailure_policy: local\n", 1))
	p := startSluice(t, nil, "--config", rules, "--stream-done-release", "--store", "redis", "--redis-url", srv.URL(), "--redis-prefix", t.Name()+":")
	ask := func() *rlsv3.RateLimitResponse {
		t.Helper()
		return p.must("edge", desc("api_key", "k"))
	}
	tokens := fillFromRedis(t, ask)
	srv.Kill()
	if r := ask(); codesOf(r) != "OVER_LIMIT:OVER_LIMIT" {
		t.Fatalf("Redis down, its 2 holders running, a share of 2: %s, want OVER_LIMIT", codesOf(r))
	}
	p.must("edge", desc("api_key", "k", "sluice_permit", tokens[0]))
	if r := ask(); codesOf(r) != "OK:OK" || !strings.HasPrefix(tokenOf(r), "l1.") {
		t.Fatalf("a holder ended: %s, token %q, want OK from the local policy", codesOf(r), tokenOf(r))
	}
	if r := ask(); codesOf(r) != "OVER_LIMIT:OVER_LIMIT" {
		t.Fatalf("the share full again: %s, want OVER_LIMIT", codesOf(r))
	}
}

// TestServeE2EPermitsRedisRestart: the permits that sluice serve's tokens
// hold in Redis are held there again when Redis comes back empty after an
// outage the node saw (nothing renews a token's permits over RLS): the
// newcomers are refused beside the 2 holders, and the holders' releases
// free their slots. Fails on the code before: 2 more admitted until the
// permits' TTL.
func TestServeE2EPermitsRedisRestart(t *testing.T) {
	beside(t)
	srv, p, ask, tokens := serveHoldingFromRedis(t)
	storeIs := func(state string) func() bool {
		return func() bool {
			_, body, _ := p.http("GET", "/readyz", "")
			return strings.Contains(body, "store: "+state)
		}
	}
	srv.Kill()
	poll(t, "the node sees Redis down", storeIs("down"))
	srv.Restart() // empty: no persistence
	poll(t, "the node sees Redis up", storeIs("up"))
	for i := range 2 {
		if r := ask(); codesOf(r) != "OVER_LIMIT:OK" && codesOf(r) != "OVER_LIMIT:OVER_LIMIT" {
			t.Fatalf("newcomer %d beside the 2 holders after Redis restarted empty: %s, want OVER_LIMIT", i, codesOf(r))
		}
	}
	p.must("edge", desc("api_key", "k", "sluice_permit", tokens[0]))
	if r := ask(); codesOf(r) != "OK:OK" {
		t.Fatalf("a holder ended: %s, want OK", codesOf(r))
	}
	if r := ask(); codesOf(r) == "OK:OK" {
		t.Fatalf("the 2 slots full again: %s, want OVER_LIMIT", codesOf(r))
	}
	p.waitLog("the store holds again what it granted")
}

// serveHoldingFromRedis starts a Redis and a sluice serve on it whose
// api_key=k's 2 slots are held by tokens: it returns them, a request of
// api_key=k and the tokens.
func serveHoldingFromRedis(t *testing.T) (*redistest.Server, *proc, func() *rlsv3.RateLimitResponse, []string) {
	t.Helper()
	srv := redistest.Standalone(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, permitRulesE2E)
	p := startSluice(t, nil, "--config", rules, "--stream-done-release", "--store", "redis", "--redis-url", srv.URL(), "--redis-prefix", t.Name()+":")
	ask := func() *rlsv3.RateLimitResponse {
		t.Helper()
		return p.must("edge", desc("api_key", "k"))
	}
	return srv, p, ask, fillFromRedis(t, ask)
}

// fillFromRedis has ask take api_key=k's 2 slots from Redis, and returns
// their tokens.
func fillFromRedis(t *testing.T, ask func() *rlsv3.RateLimitResponse) []string {
	t.Helper()
	var tokens []string
	for range 2 {
		r := ask()
		if codesOf(r) != "OK:OK" || tokenOf(r) == "" {
			t.Fatalf("from Redis: %s, token %q", codesOf(r), tokenOf(r))
		}
		tokens = append(tokens, tokenOf(r))
	}
	return tokens
}

// TestServeE2EPermitsRedisFlushed: Redis flushed (FLUSHALL, FUNCTION
// FLUSH: what a restart no call or PING met leaves) while 2 of 2 slots
// are held by tokens: the idle node finds the library gone, and holds its
// tokens' permits there again before newcomers come. Fails without the
// library check: nothing failed, so nothing was held again.
func TestServeE2EPermitsRedisFlushed(t *testing.T) {
	beside(t)
	srv, p, ask, tokens := serveHoldingFromRedis(t)
	srv.Cmd("FLUSHALL")
	srv.Cmd("FUNCTION", "FLUSH")
	p.waitLog("the function library is gone")
	p.waitLog("the store holds again what it granted")
	heldAgain(t, p, ask, tokens[1], "after Redis was flushed")
}

// TestServeE2EPermitsFailoverLost: a Sentinel failover that loses the
// latest writes (asynchronous replication): the replica is cut off while 2
// of 2 slots are taken by tokens on the master, the master is killed, and
// the replica, which never got them, is promoted. The node saw the
// outage, and holds its tokens' permits on the new master: newcomers are
// refused beside the 2 holders. Fails without the regrant: 2 more
// admitted until the permits' TTL.
func TestServeE2EPermitsFailoverLost(t *testing.T) {
	beside(t)
	ss := redistest.Sentinel(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rules, permitRulesE2E)
	p := startSluice(t, nil, "--config", rules, "--stream-done-release", "--store", "redis",
		"--redis-url", strings.Join(ss.Addrs(), ","), "--redis-sentinel-master", ss.MasterName, "--redis-prefix", t.Name()+":")
	poll(t, "ready with Redis", func() bool {
		code, _, _ := p.http("GET", "/readyz", "")
		return code == 200
	})
	ask := func() *rlsv3.RateLimitResponse {
		t.Helper()
		return p.must("edge", desc("api_key", "k"))
	}
	master, replica := ss.Master(), ss.Servers()[1]
	if replica == master {
		replica = ss.Servers()[0]
	}
	master.Cmd("WAIT", 1, 5000) // the library and the registry on the replica
	before := map[any]bool{}
	pre, _ := master.Cmd("KEYS", t.Name()+":*").([]any)
	for _, k := range pre {
		before[k] = true
	}
	// The replica stopped, and its link cut from the master's side: what
	// the master takes now, the replica never gets (a frozen replica
	// would read what the master had written to its socket).
	replica.Freeze()
	master.Cmd("CLIENT", "KILL", "TYPE", "replica")
	tokens := fillFromRedis(t, ask)
	var permits []string // the permits' sorted sets
	keys, _ := master.Cmd("KEYS", t.Name()+":*").([]any)
	for _, k := range keys {
		if !before[k] && master.Cmd("TYPE", k) == "zset" {
			permits = append(permits, k.(string))
		}
	}
	if len(permits) == 0 {
		t.Fatalf("no sorted set of permits on the master among %v", keys)
	}
	master.Kill()
	replica.Thaw()
	// Still a replica, of a master gone: what it will be promoted with.
	for _, k := range permits {
		if n, _ := replica.Cmd("EXISTS", k).(int64); n != 0 {
			t.Fatalf("the replica has the permits (%s): a failover would lose nothing", k)
		}
	}
	if got := ss.WaitFailover(master); got != replica {
		t.Fatalf("failed over to %s, want the replica %s", got.Addr(), replica.Addr())
	}
	p.waitLog("the store holds again what it granted")
	heldAgain(t, p, ask, tokens[0], "after a failover that lost their permits")
}

// heldAgain checks that the 2 slots of api_key=k are held again (when):
// a newcomer is refused; once token's holder ends, one is admitted.
func heldAgain(t *testing.T, p *proc, ask func() *rlsv3.RateLimitResponse, token, when string) {
	t.Helper()
	if r := ask(); codesOf(r) == "OK:OK" {
		t.Fatalf("a newcomer beside the 2 holders %s: %s, want OVER_LIMIT", when, codesOf(r))
	}
	p.must("edge", desc("api_key", "k", "sluice_permit", token))
	if r := ask(); codesOf(r) != "OK:OK" {
		t.Fatalf("a holder ended: %s, want OK", codesOf(r))
	}
}
