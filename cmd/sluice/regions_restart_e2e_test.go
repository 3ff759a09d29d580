package main

// A region's node restarted mid-window, end to end: two regions (us, eu),
// one sluice serve and one redis-server each, a coordinator redis-server,
// one global limit of restartLimit per restartPeriod, the local failure
// policy. In each case us spends its safe share and what eu gave back
// (most of the limit), then:
//
//  1. us's Redis is frozen (SIGSTOP) and us's node is killed and started
//     again: the new node knows nothing of the window, its Redis cannot
//     tell it; later its Redis thaws;
//  2. us's Redis is restarted empty and us's node is killed and started
//     again: nobody in us remembers the window.
//
// After each, the new node and eu are asked more than the limit, and every
// window's admissions over both regions must stay within it. An admission
// is counted in the window its decision was taken in (the answer's exact
// reset tells).

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/edges/rls"
	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

const (
	restartLimit  = 100
	restartPeriod = 20 * time.Second
)

// restartTally counts admissions by the window of their decision.
type restartTally struct {
	mu       sync.Mutex
	admitted map[int64]map[string]int
}

// ask sends n requests to node (of region) from 10 clients at once, and
// tallies what it admits.
func (c *restartTally) ask(t *testing.T, region string, node *proc, n int) {
	t.Helper()
	conn, err := grpc.NewClient(node.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "global", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("tenant", "acme")}}
	p := int64(restartPeriod)
	var wg sync.WaitGroup
	for w := range 10 {
		wg.Go(func() {
			for i := w; i < n; i += 10 {
				ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
				ctx = metadata.AppendToOutgoingContext(ctx, rls.DialectKey, rls.DialectExactValue)
				resp, err := client.ShouldRateLimit(ctx, req)
				recv := time.Now()
				cancel()
				if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					continue
				}
				st := resp.GetStatuses()
				if len(st) != 1 || st[0].GetDurationUntilReset() == nil {
					t.Errorf("%s: an admission without a reset: %v", region, resp)
					continue
				}
				// The window that ends at the reset, to half a period.
				end := recv.Add(st[0].GetDurationUntilReset().AsDuration()).UnixNano()
				win := (end+p/2)/p - 1
				c.mu.Lock()
				if c.admitted[win] == nil {
					c.admitted[win] = map[string]int{}
				}
				c.admitted[win][region]++
				c.mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// count is what region's nodes admitted in window win so far.
func (c *restartTally) count(win int64, region string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.admitted[win][region]
}

// TestRegionsRestartE2E checks the global bound of the windows in which
// us's node restarts while its Redis is frozen, and while its Redis
// restarted empty.
func TestRegionsRestartE2E(t *testing.T) {
	besideFromTheStart(t)
	sluiceBinary(t) // skips under -short
	coord := redistest.Standalone(t)
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, file, fmt.Sprintf(`domain: global
failure_policy: local
descriptors:
  - key: tenant
    rate_limit: {algorithm: fixed_window, unit: second, unit_multiplier: %d, requests_per_unit: %d, global: true}
`, int(restartPeriod/time.Second), restartLimit))
	usRedis, euRedis := redistest.Standalone(t), redistest.Standalone(t)
	node := func(name string, r *redistest.Server) *proc {
		return startSluice(t, nil, "--config", file, "--store", "redis",
			"--redis-url", r.URL(), "--redis-timeout", "200ms", "--region", name, "--regions", "us,eu",
			"--coordinator-url", coord.URL(), "--region-interval", "100ms")
	}
	us, eu := node("us", usRedis), node("eu", euRedis)
	tally := &restartTally{admitted: map[int64]map[string]int{}}
	p := int64(restartPeriod)

	// A store that started within a few seconds of a window's start (its
	// start is read to the second) has the region charge that window's
	// whole limit (regions' startSlack): the first window asked must
	// begin well after the Redis servers started.
	settled := time.Now().Add(4 * time.Second)
	// nextWindow waits for the next window's start after settled and
	// returns its index.
	nextWindow := func() int64 {
		w := max(time.Now().UnixNano(), settled.UnixNano())/p + 1
		time.Sleep(time.Until(time.Unix(0, w*p).Add(100 * time.Millisecond)))
		return w
	}
	// spend has us spend its share and what eu gives back in window w:
	// us asks, eu is quiet, for 6 s; and, where the machine is too busy
	// for us's asks to reach its share by then, until they have (at most
	// 12 s into the window): each case starts from a us that spent its
	// share (checked below).
	spend := func(w int64) {
		late := time.Unix(0, w*p).Add(12 * time.Second)
		for deadline := time.Now().Add(6 * time.Second); time.Now().Before(deadline) ||
			tally.count(w, "us") < restartLimit/2 && time.Now().Before(late); {
			tally.ask(t, "us", us, 10)
			time.Sleep(100 * time.Millisecond)
		}
	}
	// restartUS kills us's node and starts another.
	restartUS := func() {
		if err := us.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		us.wait()
		us = node("us", usRedis)
	}
	type phase struct {
		window int64
		what   string
	}
	var phases []phase

	// Case 1: us's Redis frozen, us's node restarted.
	w := nextWindow()
	spend(w)
	t.Logf("window %d: us admitted %d before its Redis froze", w, tally.admitted[w]["us"])
	usRedis.Freeze()
	restartUS()
	tally.ask(t, "us", us, restartLimit)
	tally.ask(t, "eu", eu, 10)
	usRedis.Thaw()
	tally.ask(t, "us", us, 20)
	phases = append(phases, phase{w, "us's node restarted while its Redis was frozen"})
	if fp := us.metricSum("sluice_failure_policy_total"); fp == 0 {
		t.Error("the new us node's failure policy never answered: was its Redis frozen?")
	}

	// Case 2: us's Redis restarted empty, us's node restarted.
	w = nextWindow()
	spend(w)
	t.Logf("window %d: us admitted %d before its Redis restarted", w, tally.admitted[w]["us"])
	usRedis.Restart()
	restartUS()
	tally.ask(t, "us", us, restartLimit)
	tally.ask(t, "eu", eu, 10)
	phases = append(phases, phase{w, "us's Redis restarted empty and its node restarted"})

	for _, ph := range phases {
		a := tally.admitted[ph.window]
		t.Logf("window %d (%s): admitted us %d, eu %d: %d of %d", ph.window, ph.what, a["us"], a["eu"], a["us"]+a["eu"], restartLimit)
		if a["us"] < restartLimit/2 {
			t.Errorf("window %d: us admitted only %d; it did not spend its share", ph.window, a["us"])
		}
	}
	for win, a := range tally.admitted {
		if total := a["us"] + a["eu"]; total > restartLimit {
			t.Errorf("window %d: %d admitted over both regions (us %d, eu %d), above the limit %d", win, total, a["us"], a["eu"], restartLimit)
		}
	}
}
