package main

// A region's Redis failing under the region tier, end to end: three
// regions (us, eu, ap), each with its own redis-server and one sluice
// serve, and a coordinator redis-server behind a TCP proxy adding 50 ms.
// One global limit of outageLimit per outagePeriod, the local failure
// policy, load on every region, and eu's Redis made to fail at the worst
// moments: frozen (SIGSTOP) from just before a window's start until
// 8 s into it; frozen mid-window, after eu gave its share back, until
// 4 s into the next window; and restarted empty mid-window. Every
// window's admissions over all regions must stay within the limit. An
// admission is counted in the window its decision was taken in, which
// the answer tells (the exact reset of sluice's own dialect: the
// decision's time plus its reset is its window's end).

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice/internal/edges/rls"
	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

const (
	outageLimit  = 300
	outagePeriod = 20 * time.Second
	// outageEdgeGap: the clients send nothing in the last moment of a
	// window, so that a request's decision falls in the window it was
	// sent in (an admission is counted in the window of its decision
	// whatever its latency).
	outageEdgeGap = 300 * time.Millisecond
)

var outageRegions = []string{"us", "eu", "ap"}

// The windows of the run after the first (partial) one, and what happens
// to eu's Redis in each.
var outagePhases = []string{
	"normal",
	"eu frozen across the start, until 8 s",
	"eu quiet, then frozen from 8 s",
	"eu frozen until 4 s",
	"eu restarted empty at 8 s",
	"normal",
}

// outageDemand is what region r's clients ask per second at offset into
// window w of the run (0: the first, partial one): us 30, ap 15, eu 15,
// but in window 3, where eu asks almost nothing for 8 s (so that it gives
// its share back to the others, who are short) and then 40 a second while
// its Redis is frozen; and in window 5, where us and ap ask 3 a second,
// under their shares, and eu 4 a second until its Redis restarts empty
// (so that it has most of its allocation left, and nothing is cached as
// over), then 30 a second.
func outageDemand(r, w int, offset time.Duration) float64 {
	switch {
	case w == 5 && r != 1:
		return 3
	case w == 5 && offset < 8*time.Second:
		return 4
	case w == 5:
		return 30
	case r == 0:
		return 30
	case r == 1 && w == 3 && offset < 8*time.Second:
		return 0.5
	case r == 1 && w == 3:
		return 40
	default:
		return 15
	}
}

// TestRegionsRedisOutageE2E checks the global bound of every window while
// eu's Redis fails.
func TestRegionsRedisOutageE2E(t *testing.T) {
	besideFromTheStart(t)
	sluiceBinary(t) // skips under -short
	coord := redistest.Standalone(t)
	tox := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())

	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, file, fmt.Sprintf(`domain: global
failure_policy: local
descriptors:
  - key: tenant
    rate_limit: {algorithm: fixed_window, unit: second, unit_multiplier: %d, requests_per_unit: %d, global: true}
`, int(outagePeriod/time.Second), outageLimit))

	redis := make([]*redistest.Server, len(outageRegions))
	nodes := make([]*proc, len(outageRegions))
	for r, name := range outageRegions {
		redis[r] = redistest.Standalone(t)
		link := coordinatorProxy(t, tox, "coordinator-"+name, coord.Addr(), 50*time.Millisecond)
		nodes[r] = startSluice(t, nil, "--config", file, "--store", "redis",
			"--redis-url", redis[r].URL(), "--redis-timeout", "200ms", "--region", name, "--regions", strings.Join(outageRegions, ","),
			"--coordinator-url", "redis://"+link.Listen, "--region-interval", "100ms")
	}

	req := &rlsv3.RateLimitRequest{Domain: "global", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("tenant", "acme")}}
	conns := make([]*grpc.ClientConn, len(outageRegions))
	for r, p := range nodes {
		conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		if _, err := p.rl("global", desc("warm", "up")); err != nil {
			t.Fatalf("warming up %s: %v", p.grpcAddr, err)
		}
		conns[r] = conn
	}

	p := int64(outagePeriod)
	now := time.Now()
	w0 := now.UnixNano() / p
	if (w0+1)*p-now.UnixNano() < int64(3*time.Second) {
		w0++
	}
	first := time.Unix(0, w0*p)
	startOf := func(w int) time.Time { return first.Add(time.Duration(w) * outagePeriod) }
	end := startOf(len(outagePhases) + 1)

	const workers = 8
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		answers []outageAnswer
	)
	for r := range outageRegions {
		client := rlsv3.NewRateLimitServiceClient(conns[r])
		for i := range workers {
			wg.Go(func() {
				var mine []outageAnswer
				defer func() {
					mu.Lock()
					answers = append(answers, mine...)
					mu.Unlock()
				}()
				next := time.Now()
				if next.Before(first) {
					next = first
				}
				next = next.Add(2*time.Millisecond + time.Duration(i)*7*time.Millisecond)
				for {
					time.Sleep(time.Until(next))
					now := time.Now()
					if !now.Before(end) {
						return
					}
					w := int(now.Sub(first) / outagePeriod)
					off := now.Sub(startOf(w))
					if edge := startOf(w + 1); edge.Sub(now) < outageEdgeGap {
						next = edge.Add(2*time.Millisecond + time.Duration(i)*7*time.Millisecond)
						continue
					}
					ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
					ctx = metadata.AppendToOutgoingContext(ctx, rls.DialectKey, rls.DialectExactValue)
					send := time.Now()
					resp, err := client.ShouldRateLimit(ctx, req)
					recv := time.Now()
					cancel()
					a := outageAnswer{regionAnswer: regionAnswer{region: r, send: send.UnixNano(), recv: recv.UnixNano(), err: err}}
					if err == nil {
						a.ok = resp.GetOverallCode() == rlsv3.RateLimitResponse_OK
						if st := resp.GetStatuses(); len(st) == 1 && st[0].GetDurationUntilReset() != nil {
							a.end = recv.Add(st[0].GetDurationUntilReset().AsDuration()).UnixNano()
						}
					}
					mine = append(mine, a)
					next = next.Add(time.Duration(workers / outageDemand(r, w, off) * 1e9))
					if time.Since(next) > 100*time.Millisecond {
						next = time.Now()
					}
				}
			})
		}
	}

	eu := redis[1]
	sleepUntil := func(t time.Time) { time.Sleep(time.Until(t)) }
	// Window 2: frozen from 0.4 s before its start until 8 s into it.
	sleepUntil(startOf(2).Add(-400 * time.Millisecond))
	eu.Freeze()
	t.Logf("eu frozen at %s", at(time.Now().UnixNano()))
	sleepUntil(startOf(2).Add(8 * time.Second))
	eu.Thaw()
	t.Logf("eu thawed at %s", at(time.Now().UnixNano()))
	// Window 3: frozen from 8 s in until 4 s into window 4.
	sleepUntil(startOf(3).Add(8 * time.Second))
	eu.Freeze()
	t.Logf("eu frozen at %s", at(time.Now().UnixNano()))
	sleepUntil(startOf(4).Add(4 * time.Second))
	eu.Thaw()
	t.Logf("eu thawed at %s", at(time.Now().UnixNano()))
	// Window 5: restarted empty 8 s in.
	sleepUntil(startOf(5).Add(8 * time.Second))
	eu.Restart()
	t.Logf("eu restarted empty at %s", at(time.Now().UnixNano()))

	wg.Wait()
	for r, p := range nodes {
		t.Logf("region %s: granted %g, gave back %g, ledger errors %g, failure policy answers %g, counters lost %g", outageRegions[r],
			p.metricSum("sluice_region_granted_hits_total"), p.metricSum("sluice_region_given_back_hits_total"),
			p.metricSum("sluice_region_ledger_errors_total"), p.metricSum("sluice_failure_policy_total"),
			p.metricSum("sluice_region_counters_lost_total"))
	}
	// The faults happened: eu's failure policy answered, and its node
	// saw the restarted Redis's counters lost.
	if n := nodes[1].metricSum("sluice_failure_policy_total"); n == 0 {
		t.Error("eu's failure policy never answered: was its Redis frozen?")
	}
	if n := nodes[1].metricSum("sluice_region_counters_lost_total"); n == 0 {
		t.Error("eu's node never saw its Redis's counters lost")
	}
	// Every answer in the window of its decision: an admission's window
	// is the one that ends at its reset (the decision's time, between
	// send and receive, plus its reset), which must be one its send and
	// receive times allow; a denial or a failure, where it was sent.
	type counts struct{ admitted, denied, failed [3]int64 }
	per := make([]counts, len(outagePhases)+1)
	for _, a := range answers {
		w := a.send / p
		if a.ok {
			// The window's end, to half a period: the answer's
			// latency is far less.
			w = (a.end+p/2)/p - 1
			if lo, hi := a.windowsIn(outagePeriod); w < lo || w > hi {
				t.Errorf("region %s: an admission sent at %s, answered at %s, resets at %s: not a window it can have been decided in",
					outageRegions[a.region], at(a.send), at(a.recv), at(a.end))
			}
		}
		i := int(w - w0)
		if i < 0 || i >= len(per) {
			continue
		}
		switch {
		case a.err != nil:
			per[i].failed[a.region]++
		case a.ok:
			per[i].admitted[a.region]++
		default:
			per[i].denied[a.region]++
		}
	}
	sum := func(v [3]int64) int64 { return v[0] + v[1] + v[2] }
	for w, c := range per {
		phase := "first"
		if w > 0 {
			phase = outagePhases[w-1]
		}
		t.Logf("window %d (%s): admitted us %d, eu %d, ap %d: %d of %d; denied us %d, eu %d, ap %d; failed %d",
			w, phase, c.admitted[0], c.admitted[1], c.admitted[2], sum(c.admitted), outageLimit,
			c.denied[0], c.denied[1], c.denied[2], sum(c.failed))
		// The bound: one node a region, exact decisions inside regions,
		// so none above L, whatever eu's Redis does.
		if total := sum(c.admitted); total > outageLimit {
			t.Errorf("window %d (%s): %d admitted over all regions, above the limit %d", w, phase, total, outageLimit)
		}
	}
	// Frozen from before a window's start, eu's node knows nothing of
	// the window: its failure policy spends the safe share, no more.
	for _, w := range []int{2, 4} {
		if eu := per[w].admitted[1]; eu > outageLimit/3 {
			t.Errorf("window %d (%s): eu admitted %d, above its safe share %d", w, outagePhases[w-1], eu, outageLimit/3)
		}
	}
}

// outageAnswer is a regionAnswer and, for an answer with a reset, when
// the limit resets (Unix ns: the answer's time plus its reset).
type outageAnswer struct {
	regionAnswer
	end int64
}

// windowsIn is windowsOf for windows of period.
func (a regionAnswer) windowsIn(period time.Duration) (int64, int64) {
	p := int64(period)
	return (a.send - int64(timingSlack)) / p, (a.recv + int64(timingSlack)) / p
}
