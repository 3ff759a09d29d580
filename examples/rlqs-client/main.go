// Command rlqs-client plays Envoy's rate_limit_quota filter against a
// Rate Limit Quota Service (envoy.service.rate_limit_quota.v3), such as
// `sluice serve` on its gRPC port: it opens one StreamRateLimitQuotas
// stream, sends a usage report of its buckets every interval, as Envoy
// does, and prints every assignment it gets back.
//
//	go run ./examples/rlqs-client -addr 127.0.0.1:8081 -domain edge \
//	    -bucket tenant=acme -bucket tenant=blocked -reports 3
//
// Each -bucket is one bucket id (key=value pairs, comma separated). Each
// report says -allowed requests allowed and -denied denied per bucket
// since the last one.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"strings"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
)

// buckets is the repeated -bucket flag.
type buckets []map[string]string

func (b *buckets) String() string { return fmt.Sprint(*b) }

func (b *buckets) Set(s string) error {
	id := map[string]string{}
	for pair := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(pair, "=")
		if !ok || k == "" {
			return fmt.Errorf("%q: want key=value", pair)
		}
		id[k] = v
	}
	*b = append(*b, id)
	return nil
}

func main() {
	var ids buckets
	addr := flag.String("addr", "127.0.0.1:8081", "`host:port` of the quota service (sluice serve's gRPC address)")
	domain := flag.String("domain", "", "the filter's domain: the rules' domain the buckets are matched in")
	flag.Var(&ids, "bucket", "a bucket id as `key=value,...`; repeat for more buckets")
	reports := flag.Int("reports", 3, "how many usage reports to send")
	interval := flag.Duration("interval", time.Second, "time between reports (Envoy's reporting_interval)")
	allowed := flag.Uint64("allowed", 1, "requests reported allowed per bucket in each report")
	denied := flag.Uint64("denied", 0, "requests reported denied per bucket in each report")
	wait := flag.Duration("wait", 5*time.Second, "how long to wait for the answer to a report")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("rlqs-client: ")
	if *domain == "" || len(ids) == 0 {
		log.Fatal("-domain and at least one -bucket are required")
	}

	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		log.Fatal(err)
	}

	answers := make(chan *rlqsv3.RateLimitQuotaResponse)
	failed := make(chan error, 1)
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				failed <- err
				return
			}
			answers <- resp
		}
	}()

	// Envoy reports a new bucket at once, then every reporting_interval;
	// its first report covers no time.
	elapsed := time.Duration(0)
	for i := range *reports {
		if i > 0 {
			time.Sleep(*interval)
			elapsed = *interval
		}
		if err := stream.Send(report(*domain, ids, *allowed, *denied, elapsed)); err != nil {
			log.Fatalf("report %d: %v", i+1, err)
		}
		fmt.Printf("report %d: %d buckets, %d allowed and %d denied each\n", i+1, len(ids), *allowed, *denied)
		select {
		case resp := <-answers:
			var lines []string
			for _, a := range resp.GetBucketAction() {
				lines = append(lines, describe(a))
			}
			slices.Sort(lines)
			fmt.Println(strings.Join(lines, "\n"))
		case err := <-failed:
			log.Fatalf("stream: %v", err)
		case <-time.After(*wait):
			// A service may leave a bucket unanswered (sluice does past
			// its bounds): Envoy then applies no_assignment_behavior.
			fmt.Printf("no answer within %s\n", *wait)
		}
	}
	if err := stream.CloseSend(); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, err)
	}
}

// report is one usage report of every bucket.
func report(domain string, ids buckets, allowed, denied uint64, elapsed time.Duration) *rlqsv3.RateLimitQuotaUsageReports {
	r := &rlqsv3.RateLimitQuotaUsageReports{Domain: domain}
	for _, id := range ids {
		r.BucketQuotaUsages = append(r.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqsv3.BucketId{Bucket: id},
			TimeElapsed:        durationpb.New(elapsed.Truncate(time.Second)), // Envoy sends whole seconds
			NumRequestsAllowed: allowed,
			NumRequestsDenied:  denied,
		})
	}
	return r
}

// describe writes one assignment as a line: the bucket, then what Envoy
// is told to do with its requests, and for how long.
func describe(a *rlqsv3.RateLimitQuotaResponse_BucketAction) string {
	id := a.GetBucketId().GetBucket()
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		keys[i] = k + "=" + id[k]
	}
	line := "bucket " + strings.Join(keys, ",") + ": "
	if a.GetAbandonAction() != nil {
		return line + "abandoned (matches no rule)"
	}
	q := a.GetQuotaAssignmentAction()
	s := q.GetRateLimitStrategy()
	switch st := s.GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		line += strings.ReplaceAll(strings.ToLower(st.BlanketRule.String()), "_", " ")
	case *typev3.RateLimitStrategy_TokenBucket:
		tb := st.TokenBucket
		fill := uint32(1) // Envoy's default
		if tb.GetTokensPerFill() != nil {
			fill = tb.GetTokensPerFill().GetValue()
		}
		line += fmt.Sprintf("token bucket of %d tokens, %d added every %s", tb.GetMaxTokens(), fill, tb.GetFillInterval().AsDuration())
	case *typev3.RateLimitStrategy_RequestsPerTimeUnit_:
		r := st.RequestsPerTimeUnit
		line += fmt.Sprintf("%d requests per %s", r.GetRequestsPerTimeUnit(), strings.ToLower(r.GetTimeUnit().String()))
	default:
		line += fmt.Sprintf("strategy %v", s)
	}
	return line + fmt.Sprintf(", for %s", q.GetAssignmentTimeToLive().AsDuration())
}
