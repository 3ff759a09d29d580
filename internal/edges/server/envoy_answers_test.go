package server_test

import (
	"context"
	"math"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/edges/rls"
	"github.com/sluicehq/sluice/internal/edges/server"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/storetest"
)

const envoyAnswerRules = `
domain: api
descriptors:
  - key: named
    rate_limit: {unit: minute, requests_per_unit: 3, name: per_user}
  - key: anon
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: free
    rate_limit: {unlimited: true}
`

// TestEnvoyAnswers: with no dialect asked, the service answers as
// envoyproxy/ratelimit does (its test/service/ratelimit_test.go and
// test/integration/integration_test.go): a limit's name only when the rule
// sets name:, the reset in whole seconds rounded up, unlimited descriptors
// with 4294967295 remaining. sluice's own client asks for the exact dialect
// and gets its names and nanoseconds.
func TestEnvoyAnswers(t *testing.T) {
	e := newEnv(t, envoyAnswerRules, server.Config{})
	e.clock.Advance(1500 * time.Millisecond) // 1.5 s into the minute

	resp := e.call(req("api", d("named=a"), d("anon=b"), d("free=c")))
	named, anon, free := resp.Statuses[0], resp.Statuses[1], resp.Statuses[2]
	if got := named.GetCurrentLimit().GetName(); got != "per_user" {
		t.Errorf("named rule: name %q, want per_user", got)
	}
	if got := anon.GetCurrentLimit().GetName(); got != "" {
		t.Errorf("rule without name: name %q, want empty (envoy-rl sends none)", got)
	}
	// 58.5 s left in the minute: 59 whole seconds; 0.5 s in the second: 1.
	if d := named.GetDurationUntilReset(); d.GetSeconds() != 59 || d.GetNanos() != 0 {
		t.Errorf("minute reset %v, want 59s", d)
	}
	if d := anon.GetDurationUntilReset(); d.GetSeconds() != 1 || d.GetNanos() != 0 {
		t.Errorf("second reset %v, want 1s", d)
	}
	if free.GetCode() != rlsv3.RateLimitResponse_OK || free.GetLimitRemaining() != math.MaxUint32 || free.GetCurrentLimit() != nil {
		t.Errorf("unlimited: %v, want OK with 4294967295 remaining and no limit", free)
	}

	// The same request in the exact dialect, as rlsclient asks.
	ctx := metadata.NewOutgoingContext(context.Background(), metadata.Pairs(rls.DialectKey, rls.DialectExactValue))
	resp, err := e.rls.ShouldRateLimit(ctx, req("api", d("named=a"), d("anon=b")))
	if err != nil {
		t.Fatal(err)
	}
	named, anon = resp.Statuses[0], resp.Statuses[1]
	if got := anon.GetCurrentLimit().GetName(); got != "api.anon" {
		t.Errorf("exact dialect: name %q, want the stats key api.anon", got)
	}
	if d := named.GetDurationUntilReset().AsDuration(); d != 58500*time.Millisecond {
		t.Errorf("exact dialect: minute reset %v, want 58.5s", d)
	}
	if d := anon.GetDurationUntilReset().AsDuration(); d != 500*time.Millisecond {
		t.Errorf("exact dialect: second reset %v, want 500ms", d)
	}
}

func TestWholeSeconds(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int64
	}{
		{-time.Second, 0}, {0, 0}, {1, 1}, {time.Second, 1}, {time.Second + 1, 2},
		{59*time.Second + 500*time.Millisecond, 60}, {math.MaxInt64, math.MaxInt64/int64(time.Second) + 1},
	} {
		if got := rls.WholeSeconds(c.d); got != c.want {
			t.Errorf("WholeSeconds(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

// TestClientPreference: a client may state its own default of
// all_or_nothing (sluice proxy's rlsclient says true) for domains whose
// rules set none: Envoy's requests, which say nothing, count Envoy's way
// on the same server; a domain's all_or_nothing: wins over both.
func TestClientPreference(t *testing.T) {
	const rules = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 1}\n  - key: ip\n    rate_limit: {unit: day, requests_per_unit: 10}\n"
	clock := storetest.NewClock(epoch)
	store := memstore.New(memstore.Config{Now: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	e := newEnvStore(t, rules, server.Config{Decide: decide.Config{Limiter: sluice.NewLimiter(store), CountEach: true}}, store) // sluice serve's default
	ipLeft := func(ctx context.Context, user, ip string) uint32 {
		t.Helper()
		resp, err := e.rls.ShouldRateLimit(ctx, req("d", d("user="+user), d("ip="+ip)))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Statuses[1].GetLimitRemaining()
	}
	// Envoy's way: the denied requests count on ip.
	for i, want := range []uint32{9, 8, 7} {
		if got := ipLeft(context.Background(), "a", "1"); got != want {
			t.Errorf("Envoy request %d: ip remaining %d, want %d", i+1, got, want)
		}
	}
	// The proxy's preference: the denied requests count nothing.
	ctx := metadata.NewOutgoingContext(context.Background(), metadata.Pairs(rls.AllOrNothingKey, "true"))
	for i, want := range []uint32{9, 9, 9} {
		if got := ipLeft(ctx, "b", "2"); got != want {
			t.Errorf("all-or-nothing request %d: ip remaining %d, want %d", i+1, got, want)
		}
	}
}
