package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

// TestServeE2EDashboardRegion: with --region, the live dashboard, in a
// real headless Chromium, shows a Region panel with this node's figures
// of the region tier. A sluice serve in region a of a and b (safe shares
// of 30% each, so that 40% of the limit is free to grant) on its own
// redis-server, with a second redis-server as the coordinator, answers a
// burst on a global limit: the panel names region a, counts exactly the
// hits the answers admitted and denied, and no failed call to the
// coordinator; then, as the coordinator grants region a more, the grants,
// the time since the last one and the allocation (the safe share plus the
// grants) show without a reload. Every sluice_region_* metric that
// docs/observability.md lists (and the Grafana dashboard and alerts read)
// is on /metrics with the label region="a". (Without --region the panel
// is absent: TestServeE2EDashboard.)
func TestServeE2EDashboardRegion(t *testing.T) {
	beside(t)
	browser := chromium(t)
	coord, region := redistest.Standalone(t), redistest.Standalone(t)
	const limit, share = 10, 3 // a's safe share: ⌊0.3 × 10⌋
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, file, fmt.Sprintf(`domain: global
descriptors:
  - key: tenant
    rate_limit: {algorithm: fixed_window, unit: day, requests_per_unit: %d, global: true}
`, limit))
	const token = "0123456789abcdef0123456789abcdef"
	tokens := writeFile(t, "tokens", "ops:"+token+"\n")
	p := startSluice(t, nil, "--config", file, "--store", "redis", "--redis-url", region.URL(),
		"--region", "a", "--regions", "a=0.3,b=0.3", "--coordinator-url", coord.URL(), "--region-interval", "100ms",
		"--admin-addr", "127.0.0.1:0", "--admin-token-file", tokens)

	// A burst of 8; again until one is admitted: the region's Redis
	// started in this window, so the region has spent its whole safe
	// share as far as it can tell, and admits what the coordinator grants
	// it (docs/regions.md).
	admitted, denied := 0, 0
	for burst := time.Now().Add(30 * time.Second); admitted == 0 && time.Now().Before(burst); time.Sleep(100 * time.Millisecond) {
		for range 8 {
			switch code := p.must("global", desc("tenant", "acme")).GetOverallCode(); code {
			case rlsv3.RateLimitResponse_OK:
				admitted++
			case rlsv3.RateLimitResponse_OVER_LIMIT:
				denied++
			default:
				t.Fatalf("answer %s", code)
			}
		}
	}
	if admitted == 0 || admitted > limit {
		t.Fatalf("%d of 8 admitted, want 1 to %d", admitted, limit)
	}

	_, text := openPage(t, browser, "http://"+p.dbg+"/dashboard")
	figure := func(name string) string { return text(fmt.Sprintf(`#region td[data-figure=%q]`, name)) }
	poll(t, "the Region panel", func() bool { return figure("name") != "" })
	if got := text(`#region h2`); !strings.Contains(got, "Region a") {
		t.Errorf("the panel's heading: %q, want Region a", got)
	}
	for name, want := range map[string]string{"name": "a", "admitted": strconv.Itoa(admitted), "denied": strconv.Itoa(denied), "ledger_errors": "0"} {
		if got := figure(name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}

	// The burst asks for more than a's share: the coordinator grants
	// some of the free 40%, and a later round's allocation counts it (the
	// share, plus the grants, less what the node gave back once its
	// demand faded).
	var granted, given, alloc, last string
	deadline := time.Now().Add(30 * time.Second)
	for {
		granted, given, alloc, last = figure("granted"), figure("given_back"), figure("allocation"), figure("last_grant")
		g, err1 := strconv.Atoi(granted)
		b, err2 := strconv.Atoi(given)
		if err1 == nil && err2 == nil && g > 0 && g <= limit-2*share && alloc == fmt.Sprintf("%d hits", share+g-b) && strings.HasSuffix(last, " ago") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no grant on the panel after 30 s: granted %q, given back %q, allocation %q, last grant %q; the panel: %q", granted, given, alloc, last, text(`#region`))
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The admin API's explain says what the panel says of the limit: the
	// region, its allocation and its safe share.
	code, body := adminDo(t, p, "POST", "/v1/explain", "Bearer "+token, `{"domain":"global","descriptors":[[{"key":"tenant","value":"acme"}]]}`)
	want := fmt.Sprintf(`"global":true,"region":"a","allocation":%s,"safe_share":%d`, strings.TrimSuffix(alloc, " hits"), share)
	if code != 200 || !strings.Contains(body, want) {
		t.Errorf("explain: %d %s, want %s", code, body, want)
	}

	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "observability.md"))
	if err != nil {
		t.Fatal(err)
	}
	code, metrics, _ := p.http("GET", "/metrics", "")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	names := regexp.MustCompile(`sluice_region_[a-z0-9_]+`).FindAllString(string(doc), -1)
	if len(names) < 8 {
		t.Errorf("docs/observability.md lists %d sluice_region_ metrics: %v", len(names), names)
	}
	for _, name := range names {
		if !strings.Contains(metrics, "\n"+name+`{region="a"} `) {
			t.Errorf("%s{region=\"a\"} is not on /metrics:\n%s", name, grepLines(metrics, "sluice_region_"))
		}
	}
}
