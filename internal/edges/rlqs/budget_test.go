package rlqs

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/rules"
)

// wholePools gives every participant all of its pool, and keeps nothing:
// pools kept outside the process, as in Redis.
type wholePools struct{}

func (wholePools) Assign(_ context.Context, _ []Ask, out []Share) error {
	for i := range out {
		out[i] = Share{Share: 1, Fair: 1}
	}
	return nil
}

// liveHeap is the heap's live bytes, after collecting the garbage.
func liveHeap() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestBucketBytes measures the heap that buckets hold, with the pools in
// memory and elsewhere, for ids of one short entry, one long value, many
// entries, and no limit (unlimited), and holds the estimate that
// Config.MaxBytes counts (bucketBytes) to at least what they hold, and
// at most twice it.
//
// The race detector changes what the heap holds (the buckets of 20
// entries measure 2,052 bytes under it, 1,811 without), and it has
// nothing to check in a test of one goroutine: under it, the test
// measures the first and the last shape only, as a check that it runs;
// the test suite measures all of them in its step without the detector.
func TestBucketBytes(t *testing.T) {
	// A chain e00 -> e01 -> ... -> e19 of unlimited rules, for ids of
	// many entries.
	chain := ""
	for j := 19; j >= 0; j-- {
		inner := ""
		if chain != "" {
			inner = ", descriptors: [" + chain + "]"
		}
		chain = fmt.Sprintf("{key: e%02d, rate_limit: {unlimited: true}%s}", j, inner)
	}
	cfg := rulestest.Config(t, "domain: edge\ndescriptors: [{key: tenant, rate_limit: {unit: second, requests_per_unit: 1000}}, "+
		"{key: plan, rate_limits: [{unit: second, requests_per_unit: 10}, {unit: day, requests_per_unit: 1000}]}, "+chain+"]\n")
	entries := func(k int) func(int) map[string]string {
		return func(i int) map[string]string {
			m := map[string]string{"e00": fmt.Sprintf("t%07d", i)}
			for j := 1; j < k; j++ {
				m[fmt.Sprintf("e%02d", j)] = "v"
			}
			return m
		}
	}
	shapes := []struct {
		name string
		id   func(i int) map[string]string
	}{
		{"short", func(i int) map[string]string { return map[string]string{"tenant": fmt.Sprintf("t%07d", i)} }},
		{"1 KiB value", func(i int) map[string]string {
			return map[string]string{"tenant": fmt.Sprintf("t%07d", i) + strings.Repeat("x", 1016)}
		}},
		{"100 B value", func(i int) map[string]string {
			return map[string]string{"tenant": fmt.Sprintf("t%07d", i) + strings.Repeat("x", 92)}
		}},
		{"600 B value", func(i int) map[string]string {
			return map[string]string{"tenant": fmt.Sprintf("t%07d", i) + strings.Repeat("x", 592)}
		}},
		{"two limits", func(i int) map[string]string { return map[string]string{"plan": fmt.Sprintf("t%07d", i)} }},
		{"unlimited, 1 entry", entries(1)},
		{"unlimited, 8 entries", entries(8)},
		{"unlimited, 9 entries", entries(9)},
		{"unlimited, 20 entries", entries(20)},
	}
	if raceEnabled {
		shapes = append(shapes[:1], shapes[len(shapes)-1])
	}
	const n = 5000
	for _, shape := range shapes {
		for _, inMemory := range []bool{true, false} {
			var pools Pools = wholePools{}
			if inMemory {
				pools = NewMemPools(PolicyDefaults(Policy{}), nil)
			}
			s, err := New(Config{Rules: func() *rules.Config { return cfg }, Pools: pools, MaxBuckets: n, MaxBytes: 1 << 40})
			if err != nil {
				t.Fatal(err)
			}
			before := liveHeap()
			// The reports as they come from gRPC: the server keeps their
			// bucket ids.
			var reps []*rlqsv3.RateLimitQuotaUsageReports
			for k := 0; k < n; k += 500 {
				rep := &rlqsv3.RateLimitQuotaUsageReports{Domain: "edge"}
				for i := k; i < k+500; i++ {
					rep.BucketQuotaUsages = append(rep.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
						BucketId: &rlqsv3.BucketId{Bucket: shape.id(i)}, NumRequestsAllowed: 1})
				}
				reps = append(reps, rep)
			}
			st := s.NewStream()
			for _, rep := range reps {
				resp, err := s.Report(context.Background(), st, rep)
				if err != nil || len(resp.BucketAction) != len(rep.BucketQuotaUsages) {
					t.Fatalf("%s: %v, %d actions", shape.name, err, len(resp.GetBucketAction()))
				}
			}
			reps = nil
			held := float64(liveHeap()-before) / n
			estimate := float64(s.BucketBytes()) / n
			runtime.KeepAlive(st)
			runtime.KeepAlive(pools)
			if len(st.buckets) != n {
				t.Fatalf("%s: %d buckets kept, want %d", shape.name, len(st.buckets), n)
			}
			t.Logf("%s, pools in memory %v: %.0f bytes a bucket, estimated %.0f", shape.name, inMemory, held, estimate)
			if estimate < held || estimate > 2*held {
				t.Errorf("%s, pools in memory %v: %.0f bytes a bucket held, estimated %.0f: want at least that, at most twice", shape.name, inMemory, held, estimate)
			}
		}
	}
}

// TestBudgetRefunds: bytes given back now count no more at once, those
// given back later from then on, whatever the order given.
func TestBudgetRefunds(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	m := budget{max: 100}
	if !m.take(60, t0) || m.take(41, t0) || !m.take(40, t0) {
		t.Fatal("take: 60 and 40 fit in 100, 41 more does not")
	}
	m.give(30, t0.Add(2*time.Second))
	m.give(20, t0.Add(time.Second)) // the clock stepped back: waits for the one before
	m.give(10, t0)
	if got := m.bytes(t0); got != 100 {
		t.Errorf("at t0: %d held, want 100 (the refund of now waits behind the later ones)", got)
	}
	if got := m.bytes(t0.Add(2 * time.Second)); got != 40 {
		t.Errorf("at t0+2s: %d held, want 40", got)
	}
	m.resize(70)
	if got := m.bytes(t0.Add(2 * time.Second)); got != 110 || m.take(1, t0.Add(3*time.Second)) {
		t.Errorf("after growing past the cap: %d held, and a new take must fail", got)
	}
}
