package xdsrules

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/testsupport/logtest"
	"github.com/sluicehq/sluice/internal/testsupport/xdstest"
)

// set serves version to node "sluice": one domain "xds" with a limit of
// n a unit on key.
func set(t *testing.T, m *xdstest.Server, version, key string, n uint32, unit rlconf.RateLimitUnit) {
	t.Helper()
	m.Set(t, "sluice", version, &rlconf.RateLimitConfig{Name: "xds-rules", Domain: "xds", Descriptors: []*rlconf.RateLimitDescriptor{
		{Key: key, RateLimit: &rlconf.RateLimitPolicy{Unit: unit, RequestsPerUnit: n}},
	}})
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 15s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRefusedVersionOnce: against go-control-plane's snapshot cache,
// which sends a refused version again in answer to every NACK, a
// snapshot the rules refuse is logged once, with its version and its
// problem, and reported to OnError once; it is still NACKed every time it
// comes, with the problem in the error detail and the version in force,
// but at the pace of NackInterval, not as fast as both ends can go; the
// rules in force stay; and the next good snapshot is put in force.
func TestRefusedVersionOnce(t *testing.T) {
	m := xdstest.Start(t)
	var logs logtest.Buffer
	var errs atomic.Int32
	const interval = 200 * time.Millisecond
	c, err := New(Config{
		Target:       m.Addr,
		DialOptions:  []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		Node:         &corev3.Node{Id: "sluice"},
		OnError:      func(error) { errs.Add(1) },
		Logger:       logs.Logger(),
		NackInterval: interval,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	set(t, m, "1", "user", 5, rlconf.RateLimitUnit_MINUTE)
	<-c.First()
	good := c.Current()
	if d := good.Domain("xds"); d == nil || d.Rules[0].Limits[0].Rate != 5 {
		t.Fatalf("version 1 not in force: %+v", d)
	}

	set(t, m, "2", "user", 7, rlconf.RateLimitUnit_UNKNOWN)
	waitFor(t, "a NACK", func() bool { nacks, _ := m.NACKs(); return len(nacks) > 0 })
	start := time.Now()
	time.Sleep(10 * interval)
	nacks, answered := m.NACKs()
	elapsed := time.Since(start)

	t.Logf("%d NACKs of version 2 in %v", len(nacks), elapsed.Round(time.Millisecond))
	refusals := strings.Count(logs.String(), "level=ERROR")
	if refusals != 1 || !strings.Contains(logs.String(), "version=2") || !strings.Contains(logs.String(), "invalid rate limit unit") {
		t.Errorf("%d ERROR lines, want one naming version 2 and its problem:\n%s", refusals, logs.String())
	}
	if n := errs.Load(); n != 1 {
		t.Errorf("OnError called %d times, want once", n)
	}
	// NACKed again each time it comes, paced: the first at once, then one
	// an interval at most.
	if most := int(elapsed/interval) + 2; len(nacks) < 2 || len(nacks) > most {
		t.Errorf("%d NACKs in %v, want at least 2 and at most %d (one each %v)", len(nacks), elapsed.Round(time.Millisecond), most, interval)
	}
	for i, n := range nacks {
		d := n.GetErrorDetail()
		if n.GetVersionInfo() != "1" || answered[i] != "2" || d.GetCode() != int32(codes.InvalidArgument) ||
			!strings.Contains(d.GetMessage(), "xds:xds-rules") || !strings.Contains(d.GetMessage(), "invalid rate limit unit") {
			t.Errorf("NACK %d: version %q answering version %q, detail %v: want the version in force, 1, answering 2, InvalidArgument with the problem",
				i+1, n.GetVersionInfo(), answered[i], d)
			break
		}
	}
	if c.Current() != good {
		t.Error("the rules in force changed with a refused version")
	}

	set(t, m, "3", "user", 9, rlconf.RateLimitUnit_MINUTE)
	waitFor(t, "version 3 in force", func() bool {
		d := c.Current().Domain("xds")
		return d != nil && d.Rules[0].Limits[0].Rate == 9
	})
	// Version 2 refused again after 3 was taken is news: logged again.
	set(t, m, "2", "user", 7, rlconf.RateLimitUnit_UNKNOWN)
	waitFor(t, "version 2 refused again", func() bool { return strings.Count(logs.String(), "level=ERROR") == 2 })
}
