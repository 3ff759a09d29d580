// Package rlqstest floods a Rate Limit Quota Service with new buckets, in
// tests: many streams of go-control-plane's client at once, each with one
// report of many buckets, as a client that nothing authenticates may. It
// imports go-control-plane's types and nothing of sluice.
package rlqstest

import (
	"context"
	"fmt"
	"sync"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
)

// Flood is streams that each reported their own new buckets.
type Flood struct {
	Domain    string
	PerStream int
	Streams   []rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	// Held is, for each stream, how many of its buckets were answered.
	Held []int
}

// Start opens n streams on client and sends on each, at once, one report
// of perStream new buckets of domain ({tenant: sKK-IIIII}, K the stream,
// I the bucket), and waits for the answers.
func Start(ctx context.Context, client rlqsv3.RateLimitQuotaServiceClient, domain string, n, perStream int) (*Flood, error) {
	f := &Flood{Domain: domain, PerStream: perStream, Held: make([]int, n)}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for k := range n {
		stream, err := client.StreamRateLimitQuotas(ctx)
		if err != nil {
			return nil, err
		}
		f.Streams = append(f.Streams, stream)
		wg.Go(func() { f.Held[k], errs[k] = f.Send(stream, k) })
	}
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("stream %d: %w", k, err)
		}
	}
	return f, nil
}

// Total is how many buckets were answered in all.
func (f *Flood) Total() int {
	n := 0
	for _, h := range f.Held {
		n += h
	}
	return n
}

// Extremes returns the streams that hold the most and the fewest
// buckets.
func (f *Flood) Extremes() (most, fewest int) {
	for k, h := range f.Held {
		if h > f.Held[most] {
			most = k
		}
		if h < f.Held[fewest] {
			fewest = k
		}
	}
	return most, fewest
}

// Send sends on stream the report of the buckets of stream k (k may be
// past the streams of the flood: new buckets), and returns how many of
// them were answered.
func (f *Flood) Send(stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient, k int) (int, error) {
	rep := &rlqsv3.RateLimitQuotaUsageReports{Domain: f.Domain}
	for i := range f.PerStream {
		rep.BucketQuotaUsages = append(rep.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": fmt.Sprintf("s%02d-%05d", k, i)}}, NumRequestsAllowed: 1})
	}
	if err := stream.Send(rep); err != nil {
		return 0, err
	}
	resp, err := stream.Recv()
	return len(resp.GetBucketAction()), err
}
