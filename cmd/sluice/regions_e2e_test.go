package main

// The region tier end to end: three regions, each with its own
// redis-server and two sluice serve processes, one coordinator
// redis-server, and every node's link to the coordinator through a real
// TCP proxy (toxiproxy, in this process) that adds 50, 100 or 150 ms of
// latency per region and can cut the link. gRPC clients send one global
// limit uneven demand, region a most of it, for six windows; region b is
// cut from the coordinator for a full window and healed, and region c's
// nodes are killed mid-window. Every answer is recorded with its send and
// receive times, and the admissions of each window, over all regions, are
// checked against the limit (exact decisions inside each region: no
// overshoot at all), and from below (the limit is reached, the hot region
// gets most of it, a cut region keeps to its safe share, a dead region's
// share is all it is counted for).

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

const (
	// regionLimit is the global limit L per regionPeriod; each of the
	// three regions' safe share is L/3.
	regionLimit  = 3000
	regionShare  = regionLimit / 3
	regionPeriod = 10 * time.Second
	// regionWindows are the windows of the run after the first (partial)
	// one: normal, b cut, b healed, c killed, c dead.
	regionWindows = 5
	// regionEdgeGap is how long before each window's end the clients
	// stop sending, so that a request's decision falls in the window it
	// was sent in: longer than any request takes on a busy machine (the
	// run logs the slowest). One that straddles an edge all the same is
	// counted in both windows by the checks from above.
	regionEdgeGap = 500 * time.Millisecond
)

var regionNames = []string{"a", "b", "c"}

// regionDemand is what the clients of region r ask per second in window w
// of the run (0: the first, partial, window): a ~90%, b and c ~5% each of
// 600 a second, twice the limit's 300; from the cut on, b asks 200 a
// second, more than its safe share, so that its cap during the cut and
// its grants after it show.
func regionDemand(r, w int) float64 {
	switch {
	case r == 0:
		return 540
	case r == 1 && w >= 2:
		return 200
	default:
		return 30
	}
}

// regionWorkers is how many client goroutines send region r's demand.
var regionWorkers = []int{24, 8, 4}

// regionAnswer is one request as its client saw it.
type regionAnswer struct {
	region     int
	send, recv int64 // Unix ns
	ok         bool  // OK; else OVER_LIMIT (err nil) or failed
	reset      int64 // an OK answer's duration_until_reset, ns (whole seconds, rounded up); 0: none
	err        error
}

// windowsOf returns the first and last window index (Unix ns / period)
// the answer's decision may lie in: the decision was taken by a region
// Redis's clock, this machine's, between send and receive. An admission
// sent in one window and answered in the next (a loaded machine: answers
// took up to 3.4 s) is placed by its reset: its window ends within
// (send + reset - 1s, recv + reset], which holds one window end when the
// answer took less than a period less a second.
func (a regionAnswer) windowsOf() (int64, int64) {
	p, slack := int64(regionPeriod), int64(timingSlack)
	lo, hi := (a.send-slack)/p, (a.recv+slack)/p
	if lo == hi || !a.ok || a.reset <= 0 {
		return lo, hi
	}
	found := int64(-1)
	for w := lo; w <= hi; w++ {
		if end := (w + 1) * p; end > a.send+a.reset-int64(time.Second)-slack && end <= a.recv+a.reset+slack {
			if found >= 0 {
				return lo, hi
			}
			found = w
		}
	}
	if found < 0 {
		return lo, hi
	}
	return found, found
}

// coordinatorProxy starts a toxiproxy proxy on a loopback port in front
// of upstream, with latency added to every answer, and stops it when the
// test ends.
func coordinatorProxy(t *testing.T, srv *toxiproxy.ApiServer, name, upstream string, latency time.Duration) *toxiproxy.Proxy {
	t.Helper()
	p := toxiproxy.NewProxy(srv, name, "127.0.0.1:0", upstream)
	if err := srv.Collection.Add(p, true); err != nil {
		t.Fatalf("toxiproxy %s: %v", name, err)
	}
	t.Cleanup(p.Stop)
	toxic := fmt.Sprintf(`{"name":"latency","type":"latency","stream":"downstream","attributes":{"latency":%d}}`, latency.Milliseconds())
	if _, err := p.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
		t.Fatalf("toxiproxy %s: latency: %v", name, err)
	}
	return p
}

// TestRegionsE2E runs the region tier under uneven demand, a partition
// and a crash, and checks every window's admissions over all regions.
func TestRegionsE2E(t *testing.T) {
	besideFromTheStart(t)
	sluiceBinary(t) // skips under -short
	coord := redistest.Standalone(t)
	tox := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	latency := []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 150 * time.Millisecond}

	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, file, fmt.Sprintf(`domain: global
failure_policy: fail_closed
descriptors:
  - key: tenant
    rate_limit: {algorithm: fixed_window, unit: second, unit_multiplier: %d, requests_per_unit: %d, global: true}
`, int(regionPeriod/time.Second), regionLimit))

	proxies := make([]*toxiproxy.Proxy, len(regionNames))
	nodes := make([][]*proc, len(regionNames))
	for r, name := range regionNames {
		srv := redistest.Standalone(t)
		proxies[r] = coordinatorProxy(t, tox, "coordinator-"+name, coord.Addr(), latency[r])
		// The proxy is in the way: a PING through it takes its latency.
		conn, err := coord.Dialer().Dial(proxies[r].Listen)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if v, err := conn.Do("PING"); err != nil || v != "PONG" {
			t.Fatalf("PING through %s's proxy: %v %v", name, v, err)
		}
		if d := time.Since(start); d < latency[r] {
			t.Errorf("PING through %s's proxy took %s, less than its latency %s", name, d, latency[r])
		}
		conn.Close()
		for range 2 {
			nodes[r] = append(nodes[r], startSluice(t, nil, "--config", file, "--store", "redis",
				"--redis-url", srv.URL(), "--region", name, "--regions", strings.Join(regionNames, ","),
				"--coordinator-url", "redis://"+proxies[r].Listen, "--region-interval", "100ms"))
		}
	}

	// Every node has reached the coordinator before the run: the run
	// cuts a link that was up. (In a full suite run beside a CPU hog,
	// one of c's nodes took 50 s to connect through its proxy's 150 ms,
	// and denied within its region's share meanwhile: a node that starts
	// cut off is not what this test measures.)
	connected := `"msg":"redis: nodes sharing the limits","component":"coordinator"`
	deadline := time.Now().Add(4 * e2eWait)
	for r := range regionNames {
		for _, p := range nodes[r] {
			for i := 0; !strings.Contains(p.log(), connected); i++ {
				if time.Now().After(deadline) {
					t.Fatalf("region %s, node %s: not connected to the coordinator within %s", regionNames[r], p.grpcAddr, 4*e2eWait)
				}
				time.Sleep(pollPause(i))
			}
		}
	}

	req := &rlsv3.RateLimitRequest{Domain: "global", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("tenant", "acme")}}
	conns := make([][]*grpc.ClientConn, len(regionNames))
	for r := range regionNames {
		for _, p := range nodes[r] {
			conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			// Warm the connection up with a request no rule matches.
			if _, err := p.rl("global", desc("warm", "up")); err != nil {
				t.Fatalf("warming up %s: %v", p.grpcAddr, err)
			}
			conns[r] = append(conns[r], conn)
		}
	}

	// The run: the rest of the current window (at least 2 s of it) as
	// window 0, then regionWindows whole windows. Windows are aligned to
	// the Unix epoch.
	p := int64(regionPeriod)
	now := time.Now()
	w0 := now.UnixNano() / p // window 0's index (Unix ns / period)
	if (w0+1)*p-now.UnixNano() < int64(2*time.Second) {
		w0++
	}
	first := time.Unix(0, w0*p)
	startOf := func(w int) time.Time { return first.Add(time.Duration(w) * regionPeriod) }
	end := startOf(regionWindows + 1)

	var (
		stopped = make([]atomic.Bool, len(regionNames))
		groups  = make([]sync.WaitGroup, len(regionNames))
		mu      sync.Mutex
		answers []regionAnswer
	)
	for r := range regionNames {
		for i := range regionWorkers[r] {
			groups[r].Go(func() {
				client := rlsv3.NewRateLimitServiceClient(conns[r][i%len(conns[r])])
				var mine []regionAnswer
				defer func() {
					mu.Lock()
					answers = append(answers, mine...)
					mu.Unlock()
				}()
				// Worker i of n sends every n/rate, its first at i/rate
				// into window 0 or the run, whichever is later.
				n := float64(regionWorkers[r])
				offset := func(w int) time.Duration { return time.Duration(float64(i) / regionDemand(r, w) * 1e9) }
				next := time.Now()
				if next.Before(first) {
					next = first
				}
				next = next.Add(offset(0))
				for {
					time.Sleep(time.Until(next))
					now := time.Now()
					if stopped[r].Load() || !now.Before(end) {
						return
					}
					w := int(now.Sub(first) / regionPeriod)
					if edge := startOf(w + 1); edge.Sub(now) < regionEdgeGap {
						next = edge.Add(2*time.Millisecond + offset(w+1))
						continue
					}
					ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
					send := time.Now()
					resp, err := client.ShouldRateLimit(ctx, req)
					recv := time.Now()
					cancel()
					a := regionAnswer{region: r, send: send.UnixNano(), recv: recv.UnixNano(), err: err}
					if err == nil {
						a.ok = resp.GetOverallCode() == rlsv3.RateLimitResponse_OK
						if st := resp.GetStatuses(); len(st) == 1 && st[0].GetDurationUntilReset() != nil {
							a.reset = st[0].GetDurationUntilReset().AsDuration().Nanoseconds()
						}
					}
					mine = append(mine, a)
					next = next.Add(time.Duration(n / regionDemand(r, w) * 1e9))
					if time.Since(next) > 100*time.Millisecond {
						next = time.Now() // behind: no burst to catch up
					}
				}
			})
		}
	}
	sleepUntil := func(t time.Time) { time.Sleep(time.Until(t)) }
	regionMetric := func(r int, name string) int64 {
		var sum float64
		for _, p := range nodes[r] {
			sum += p.metricSum(name)
		}
		return int64(sum)
	}

	// What a gave back in window 0, its first: from window 1 on, it asks
	// for more than it holds all the time and has nothing to give back.
	sleepUntil(startOf(1).Add(-200 * time.Millisecond))
	givenFirst := regionMetric(0, "sluice_region_given_back_hits_total")

	// The partition: b is cut from the coordinator from just before
	// window 2 until just after window 3 begins: 1.5 s before, since on a
	// busy machine waking up and stopping the proxy took from 300 ms to
	// 1.3 s (the check below). b, quiet in window 1, holds more than it
	// asks there.
	sleepUntil(startOf(2).Add(-1500 * time.Millisecond))
	proxies[1].Stop()
	cut := time.Now()
	t.Logf("b cut from the coordinator at %s", at(cut.UnixNano()))
	if !cut.Before(startOf(2)) {
		t.Errorf("b was cut at %s, after window 2 began", at(cut.UnixNano()))
	}
	grantedBefore := regionMetric(1, "sluice_region_granted_hits_total")
	errorsBefore := regionMetric(1, "sluice_region_ledger_errors_total")
	sleepUntil(startOf(3).Add(-500 * time.Millisecond))
	grantedCut := regionMetric(1, "sluice_region_granted_hits_total")
	errorsCut := regionMetric(1, "sluice_region_ledger_errors_total")
	sleepUntil(startOf(3).Add(100 * time.Millisecond))
	if err := proxies[1].Start(); err != nil {
		t.Fatalf("healing b's link: %v", err)
	}
	t.Logf("b healed at %s", at(time.Now().UnixNano()))

	// The crash: c's clients stop (so that no answer is lost with its
	// decision unknown), then both of c's nodes are killed, mid-window.
	sleepUntil(startOf(4).Add(4 * time.Second))
	grantedHealed := regionMetric(1, "sluice_region_granted_hits_total")
	for _, p := range nodes[2] {
		checkNoStoreFailures(t, "c", p)
	}
	sleepUntil(startOf(4).Add(4800 * time.Millisecond))
	stopped[2].Store(true)
	groups[2].Wait()
	sleepUntil(startOf(4).Add(5 * time.Second))
	for _, p := range nodes[2] {
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range nodes[2] {
		p.wait()
	}
	t.Logf("c's nodes killed at %s", at(time.Now().UnixNano()))

	sleepUntil(end)
	groups[0].Wait()
	groups[1].Wait()
	givenHot := regionMetric(0, "sluice_region_given_back_hits_total") - givenFirst
	for r := range 2 {
		for _, p := range nodes[r] {
			checkNoStoreFailures(t, regionNames[r], p)
		}
		t.Logf("region %s: granted %d, gave back %d, ledger errors %d", regionNames[r], regionMetric(r, "sluice_region_granted_hits_total"),
			regionMetric(r, "sluice_region_given_back_hits_total"), regionMetric(r, "sluice_region_ledger_errors_total"))
	}

	// The coordinator's ledger, per window of the run: what it allocated
	// each region, a region without a field holding its safe share.
	ledger := make([][3]int64, regionWindows+1)
	fields := make([]int, regionWindows+1)
	for w := range ledger {
		ledger[w] = [3]int64{regionShare, regionShare, regionShare}
	}
	keys, err := coord.Do("KEYS", "sluice:regions:{ledger}*")
	if err != nil {
		t.Fatal(err)
	}
	list, _ := keys.([]any)
	for _, k := range list {
		key, _ := k.(string)
		ws, err := strconv.ParseInt(key[strings.LastIndexByte(key, ':')+1:], 10, 64)
		w := int(ws/p - w0)
		if err != nil || w < 0 || w > regionWindows {
			continue
		}
		v, err := coord.Do("HGETALL", key)
		if err != nil {
			t.Fatalf("ledger entry %q: %v", key, err)
		}
		kv, _ := v.([]any)
		for i := 0; i+1 < len(kv); i += 2 {
			f, _ := kv[i].(string)
			x, _ := kv[i+1].(string)
			ri, _ := strconv.Atoi(f)
			n, err := strconv.ParseInt(x, 10, 64)
			if err != nil || ri < 1 || ri > len(regionNames) {
				t.Fatalf("ledger entry %q: field %q = %q", key, f, x)
			}
			ledger[w][ri-1] = n
			fields[w] |= 1 << (ri - 1)
		}
	}

	// Every window's admissions. A check from above counts an admission
	// in every window its interval meets; a check from below counts only
	// those whose interval lies inside the window.
	type counts struct {
		upper, sure, denied [3]int64
	}
	per := make([]counts, regionWindows+1)
	failed, straddling := 0, 0
	var slowest time.Duration
	for _, a := range answers {
		slowest = max(slowest, time.Duration(a.recv-a.send))
		if a.err != nil {
			if failed++; failed <= 5 {
				t.Errorf("region %s: request sent at %s failed: %v", regionNames[a.region], at(a.send), a.err)
			}
			continue
		}
		lo, hi := a.windowsOf()
		if lo != hi {
			straddling++
		}
		for w := lo; w <= hi; w++ {
			i := int(w - w0)
			if i < 0 || i > regionWindows {
				continue
			}
			switch {
			case a.ok:
				per[i].upper[a.region]++
				if lo == hi {
					per[i].sure[a.region]++
				}
			case lo == hi:
				per[i].denied[a.region]++
			}
		}
	}
	if failed > 5 {
		t.Errorf("%d requests failed", failed)
	}
	t.Logf("%d answers; the slowest took %s; %d may have been decided in either of two windows", len(answers), slowest, straddling)
	sum := func(v [3]int64) int64 { return v[0] + v[1] + v[2] }
	what := []string{"first", "normal", "b cut", "b healed", "c killed", "c dead"}
	for w, c := range per {
		t.Logf("window %d (%s, %s): admitted a %d, b %d, c %d: %d of %d (%d more across its edges); denied a %d, b %d, c %d; ledger a %d, b %d, c %d",
			w, what[w], at(startOf(w).UnixNano()), c.sure[0], c.sure[1], c.sure[2], sum(c.sure), regionLimit,
			sum(c.upper)-sum(c.sure), c.denied[0], c.denied[1], c.denied[2], ledger[w][0], ledger[w][1], ledger[w][2])
		// The bound: exact decisions inside the regions, so none above L.
		if total := sum(c.upper); total > regionLimit {
			t.Errorf("window %d (%s): %d admitted over all regions, above the limit %d", w, what[w], total, regionLimit)
		}
		// No region admits more than the ledger allocated it, and the
		// ledger allocates no more than L.
		for r, name := range regionNames {
			if c.upper[r] > ledger[w][r] {
				t.Errorf("window %d (%s): region %s admitted %d, more than the ledger allocated it (%d)", w, what[w], name, c.upper[r], ledger[w][r])
			}
		}
		if s := sum(ledger[w]); s > regionLimit {
			t.Errorf("window %d (%s): the ledger allocated %d, above the limit %d", w, what[w], s, regionLimit)
		}
	}
	// What the tier is for, asserted on what the clients managed to ask
	// (offered: admitted or denied inside the window), not on the
	// machine's speed: a region asking more than its safe share is
	// granted more than it, and denies only what is beyond the limit.
	// How close the total comes to L depends on how fast grants follow
	// demand (measured: 90 to 100% on a quiet machine, about 80% beside
	// two CPU hogs); it is logged, not asserted.
	offered := func(c counts, r int) int64 { return c.sure[r] + c.denied[r] }
	for w := 1; w <= 3; w++ {
		c := per[w]
		total := offered(c, 0) + offered(c, 1) + offered(c, 2)
		t.Logf("window %d (%s): %d offered, %d admitted: %d%% of the limit", w, what[w], total, sum(c.sure), sum(c.sure)*100/regionLimit)
		if total > regionLimit && sum(c.denied) == 0 {
			t.Errorf("window %d (%s): %d asked and nothing denied", w, what[w], total)
		}
		if offered(c, 0) > regionShare*12/10 && c.sure[0] <= regionShare {
			t.Errorf("window %d (%s): region a asked %d and admitted %d, no more than its safe share %d: it was granted nothing", w, what[w], offered(c, 0), c.sure[0], regionShare)
		}
	}
	// Regions give back only what they will not need: the hot one
	// nothing, and a quiet one, asking under a third of its safe share,
	// never so much that it must deny.
	if givenHot != 0 {
		t.Errorf("region a, asking more than it holds in every window, gave back %d from window 1 on", givenHot)
	}
	for w := 1; w <= 4; w++ {
		for r := 1; r <= 2; r++ {
			if quiet := regionDemand(r, w) < regionShare/3/regionPeriod.Seconds(); quiet && per[w].denied[r] != 0 {
				t.Errorf("window %d (%s): region %s denied %d of %d, asking under a third of its safe share %d",
					w, what[w], regionNames[r], per[w].denied[r], per[w].denied[r]+per[w].sure[r], regionShare)
			}
		}
	}

	// Cut off, b keeps to its safe share, which it uses.
	t.Logf("b's grants: %d at the cut, %d at its end, %d a second before c was killed; ledger errors: %d at the cut, %d at its end",
		grantedBefore, grantedCut, grantedHealed, errorsBefore, errorsCut)
	if errorsCut == errorsBefore {
		t.Errorf("b's nodes counted no ledger error while cut off: was the link cut?")
	}
	if grantedCut != grantedBefore {
		t.Errorf("b's nodes were granted %d while cut off", grantedCut-grantedBefore)
	}
	// It admits what it asks up to its safe share, and denies the rest.
	if c := per[2]; c.upper[1] > regionShare || c.sure[1] < min(offered(c, 1), regionShare)*9/10 || offered(c, 1) > regionShare && c.denied[1] == 0 {
		t.Errorf("window 2 (b cut): b asked %d, admitted %d (%d more across the edges) and denied %d; want at most its safe share %d, at least 90%% of what it asked up to that, and denials beyond it",
			offered(c, 1), c.sure[1], c.upper[1]-c.sure[1], c.denied[1], regionShare)
	}
	if fields[2]&2 != 0 {
		t.Errorf("window 2 (b cut): the ledger has an allocation of b's, %d, which b could not ask for", ledger[2][1])
	}
	// Healed, b asks and is granted again: b, asking more than its
	// share, admits more than it. Whether b asked more than its share is
	// read from what its clients managed to send, not from the demand
	// they were set: on a machine busy enough (measured in CI: b's eight
	// clients sent 24 a second of their 200), b asked less than its
	// share, needed no grant, and the check would test the machine.
	if asked := offered(per[3], 1); asked > regionShare*12/10 && grantedHealed <= grantedCut {
		t.Errorf("b asked %d in window 3 (b healed), more than its safe share %d, and was granted nothing from its healing until window 4 was 4 s old (%d at the heal, %d then)",
			asked, regionShare, grantedCut, grantedHealed)
	} else if asked <= regionShare*12/10 {
		t.Logf("b asked %d in window 3 (b healed), within 1.2 times its safe share %d: its grants after healing are not checked at this load", asked, regionShare)
	}
	// c dead: the ledger counts it at its safe share; a and b share the
	// rest, which they use.
	if fields[5]&4 != 0 {
		t.Errorf("window 5 (c dead): the ledger has an allocation of c's, %d", ledger[5][2])
	}
	// Each of a and b has at least its safe share: they admit what they
	// ask up to that, whatever grants do.
	if c := per[5]; c.upper[0]+c.upper[1] > regionLimit-regionShare || c.upper[2] != 0 ||
		c.sure[0]+c.sure[1] < (min(offered(c, 0), regionShare)+min(offered(c, 1), regionShare))*9/10 {
		t.Errorf("window 5 (c dead): a and b asked %d and %d, admitted %d (%d more across the edges), c %d; want at most %d, at least 90%% of what they asked up to their safe shares, and nothing from c",
			offered(c, 0), offered(c, 1), c.sure[0]+c.sure[1], c.upper[0]+c.upper[1]-c.sure[0]-c.sure[1], c.upper[2], regionLimit-regionShare)
	}
}

// checkNoStoreFailures fails t if p's store failed, or a failure policy
// answered, during the run.
func checkNoStoreFailures(t *testing.T, region string, p *proc) {
	t.Helper()
	errs := p.metricSum("sluice_store_errors_total")
	policy := p.metricSum("sluice_failure_policy_total")
	if errs != 0 || policy != 0 {
		t.Errorf("region %s, node %s: %g store errors, %g failure policy answers", region, p.grpcAddr, errs, policy)
	}
}
