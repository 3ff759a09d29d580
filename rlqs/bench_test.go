package rlqs

import (
	"context"
	"fmt"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/redis/rueidis"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/rulestest"
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
				rep := &rlqsv3.RateLimitQuotaUsageReports{Domain: "edge"}
				for i := range n {
					rep.BucketQuotaUsages = append(rep.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
						BucketId:    &rlqsv3.BucketId{Bucket: map[string]string{"tenant": fmt.Sprint("t", i)}},
						TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 100, NumRequestsDenied: 3,
					})
				}
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
