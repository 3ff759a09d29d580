package server_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/edges/server"
)

const permitRules = `
domain: api
descriptors:
  - key: user
    concurrency: {max: 1, ttl: 1m}
`

func permitOf(resp *rlsv3.RateLimitResponse) string {
	return resp.GetDynamicMetadata().GetFields()["sluice_permit"].GetStringValue()
}

// TestPermitTokens: an admission holding a permit carries its token in
// the dynamic metadata, beside envoyproxy/ratelimit's when that is on; a
// denial carries none; the descriptor with the token releases the permit
// and is OK, and the answer does not echo the token. The server counts
// them.
func TestPermitTokens(t *testing.T) {
	for _, md := range []bool{false, true} {
		e := newEnv(t, permitRules, server.Config{DynamicMetadata: md})
		a := e.call(req("api", d("user=a")))
		tok := permitOf(a)
		if codes(a) != "OK: OK" || !strings.HasPrefix(tok, "s") {
			t.Fatalf("metadata %v: %s, token %q", md, codes(a), tok)
		}
		if got := a.GetDynamicMetadata().GetFields()["domain"].GetStringValue(); md != (got == "api") {
			t.Errorf("metadata %v: envoyproxy/ratelimit's domain field %q", md, got)
		}
		b := e.call(req("api", d("user=a")))
		if codes(b) != "OVER_LIMIT: OVER_LIMIT" || permitOf(b) != "" {
			t.Fatalf("metadata %v: at the cap: %s, token %q", md, codes(b), permitOf(b))
		}
		r := e.call(req("api", d("user=a", "sluice_permit="+tok)))
		if codes(r) != "OK: OK" || strings.Contains(r.String(), tok[1:]) {
			t.Fatalf("metadata %v: release: %s %v", md, codes(r), r)
		}
		if c := e.call(req("api", d("user=a"))); codes(c) != "OK: OK" || permitOf(c) == "" {
			t.Fatalf("metadata %v: after the release: %s", md, codes(c))
		}
		e.call(req("api", d("user=a", "sluice_permit=forged")))
		for event, want := range map[string]float64{"issued": 2, "released": 1, "refused": 1, "failed": 0} {
			if got := metric(t, e.reg, "sluice_permit_tokens_total", "event="+event); got != want {
				t.Errorf("metadata %v: %s %v, want %v", md, event, got, want)
			}
		}
	}
}

// TestPermitOfUnansweredRequest: a request admitted with a permit whose
// caller is gone before the answer (Envoy's timeout, a reset) never
// delivers its token, so the server releases the permit at once.
func TestPermitOfUnansweredRequest(t *testing.T) {
	var cancel atomic.Pointer[context.CancelFunc]
	hang := func(context.Context, *decide.Request, *decide.Outcome, error) {
		if c := cancel.Swap(nil); c != nil {
			(*c)()
		}
	}
	e := newEnv(t, permitRules, server.Config{Decide: decide.Config{Hooks: []decide.Hook{hang}}})
	ctx, c := context.WithCancel(context.Background())
	defer c()
	cancel.Store(&c)
	if _, err := e.srv.ShouldRateLimit(ctx, req("api", d("user=a"))); status.Code(err) != grpccodes.Canceled {
		t.Fatalf("a caller gone: %v", err)
	}
	if r := e.call(req("api", d("user=a"))); codes(r) != "OK: OK" || permitOf(r) == "" {
		t.Fatalf("the unanswered request's slot: %s", codes(r))
	}
}
