package rlqs

import (
	"context"
	"fmt"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/redis/rueidis"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/internal/decision/overrides"
	"github.com/sluicehq/sluice/internal/testsupport/redistest"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/rules"
)

// BenchmarkReport measures the server's work for one usage report of n
// buckets of one stream, each a share of its own pool: matching (once per
// bucket, then cached), the shares (in memory, or one pipelined round trip
// to a real redis-server), and the response. ns/op is per report.
func BenchmarkReport(b *testing.B) {
	cfg := rulestest.Config(b, "domain: edge\ndescriptors: [{key: tenant, rate_limit: {unit: second, requests_per_unit: 1000}}]\n")
	for _, where := range []string{"memory", "redis"} {
		var client rueidis.Client
		if where == "redis" {
			// Only the redis sub-benchmarks need (or skip without) a server.
			srv := redistest.Standalone(b)
			var err error
			client, err = rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
			if err != nil {
				b.Fatal(err)
			}
			defer client.Close()
		}
		for _, n := range []int{1, 100} {
			b.Run(fmt.Sprintf("%s/buckets=%d", where, n), func(b *testing.B) {
				policy := PolicyDefaults(Policy{})
				var pools Pools = NewMemPools(policy, nil)
				if where == "redis" {
					pools = NewRedisPools(policy, func() (rueidis.Client, error) { return client, nil }, fmt.Sprintf("bench%d:", time.Now().UnixNano()))
				}
				s, err := New(Config{Rules: func() *rules.Config { return cfg }, Pools: pools})
				if err != nil {
					b.Fatal(err)
				}
				rep := benchReport(n)
				st := s.NewStream()
				ctx := context.Background()
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					resp, err := s.Report(ctx, st, rep)
					if err != nil || len(resp.BucketAction) != n {
						b.Fatalf("%v, %d actions", err, len(resp.GetBucketAction()))
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/bucket")
			})
		}
	}
}

// benchReport is a usage report of n buckets of domain edge, tenants t0
// to tn-1, a second each.
func benchReport(n int) *rlqsv3.RateLimitQuotaUsageReports {
	rep := &rlqsv3.RateLimitQuotaUsageReports{Domain: "edge"}
	for i := range n {
		rep.BucketQuotaUsages = append(rep.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:    &rlqsv3.BucketId{Bucket: map[string]string{"tenant": fmt.Sprint("t", i)}},
			TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 100, NumRequestsDenied: 3,
		})
	}
	return rep
}

// BenchmarkReportOverrides is BenchmarkReport's memory/buckets=100 with
// runtime overrides configured, a report a second on the server's clock:
// with an index of 1,000 overrides of other tenants that does not
// change, a bucket is not matched again (overrides.Index.Generation),
// and a report costs what it costs without overrides.
func BenchmarkReportOverrides(b *testing.B) {
	cfg := rulestest.Config(b, "domain: edge\ndescriptors: [{key: tenant, rate_limit: {unit: second, requests_per_unit: 1000}}]\n")
	idx := overrides.NewIndex(nil)
	for i := range 1000 {
		o := &overrides.Override{Domain: "edge", Path: []overrides.Entry{{Key: "tenant", Value: fmt.Sprint("x", i)}}, Limit: []byte(`{"unit":"second","requests_per_unit":5}`)}
		if err := o.Compile(); err != nil {
			b.Fatal(err)
		}
		idx.Put(o)
	}
	for _, runtime := range []bool{false, true} {
		b.Run(fmt.Sprintf("overrides=%v", runtime), func(b *testing.B) {
			var clock time.Time
			c := Config{Rules: func() *rules.Config { return cfg }, Now: func() time.Time { return clock }}
			if runtime {
				c.Runtime = func() rules.Runtime { return idx }
			}
			s, err := New(c)
			if err != nil {
				b.Fatal(err)
			}
			rep := benchReport(100)
			st := s.NewStream()
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				clock = clock.Add(time.Second)
				if resp, err := s.Report(ctx, st, rep); err != nil || len(resp.BucketAction) != 100 {
					b.Fatalf("%v, %d actions", err, len(resp.GetBucketAction()))
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/100, "ns/bucket")
		})
	}
}
