package rlqs_test

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	rlqfv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sluicehq/sluice/internal/edges/rlqs"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/rules"
)

// docBlocks returns the two YAML blocks that follow the rlqs-filter marker
// in docs/leases.md: Envoy's filter and sluice's rules.
func docBlocks(t *testing.T) (filter, rulesSrc string) {
	t.Helper()
	doc, err := os.ReadFile("../../../docs/leases.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "<!-- rlqs-filter -->")
	if !ok {
		t.Fatal("docs/leases.md has no <!-- rlqs-filter --> marker")
	}
	var blocks []string
	for len(blocks) < 2 {
		_, after, ok := strings.Cut(rest, "```yaml")
		if !ok {
			t.Fatal("docs/leases.md: fewer than two yaml blocks after the marker")
		}
		_, after, _ = strings.Cut(after, "\n") // the rest of the info string (envoy=...)
		block, after2, ok := strings.Cut(after, "```")
		if !ok {
			t.Fatal("docs/leases.md: unterminated yaml block")
		}
		blocks = append(blocks, block)
		rest = after2
	}
	return blocks[0], blocks[1]
}

// unmarshalAny decodes a into m and validates it with go-control-plane's
// rules (protoc-gen-validate).
func unmarshalAny(t *testing.T, a *anypb.Any, m interface {
	proto.Message
	ValidateAll() error
}) {
	t.Helper()
	if err := a.UnmarshalTo(m); err != nil {
		t.Fatalf("%s: %v", a.GetTypeUrl(), err)
	}
	if err := m.ValidateAll(); err != nil {
		t.Fatalf("%s: %v", a.GetTypeUrl(), err)
	}
}

// TestDocEnvoyConfig: the Envoy filter that docs/leases.md gives to copy
// is a valid rate_limit_quota filter (go-control-plane's protos and
// validation, each typed config in it included), and the bucket ids it
// builds, with the rules the doc gives beside it, get a token bucket from
// the server.
func TestDocEnvoyConfig(t *testing.T) {
	filterSrc, rulesSrc := docBlocks(t)
	var tree any
	if err := yaml.Unmarshal([]byte(filterSrc), &tree); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(tree)
	if err != nil {
		t.Fatal(err)
	}
	var hf hcmv3.HttpFilter
	if err := protojson.Unmarshal(js, &hf); err != nil {
		t.Fatalf("the filter: %v", err)
	}
	if err := hf.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	var fc rlqfv3.RateLimitQuotaFilterConfig
	unmarshalAny(t, hf.GetTypedConfig(), &fc)
	matchers := fc.GetBucketMatchers().GetMatcherList().GetMatchers()
	if len(matchers) == 0 {
		t.Fatal("the filter has no bucket matchers")
	}
	var keys []string
	for _, m := range matchers {
		var in matcherv3.HttpRequestHeaderMatchInput
		unmarshalAny(t, m.GetPredicate().GetSinglePredicate().GetInput().GetTypedConfig(), &in)
		var bs rlqfv3.RateLimitQuotaBucketSettings
		unmarshalAny(t, m.GetOnMatch().GetAction().GetTypedConfig(), &bs)
		for k, v := range bs.GetBucketIdBuilder().GetBucketIdBuilder() {
			keys = append(keys, k)
			if cv := v.GetCustomValue(); cv != nil {
				var hin matcherv3.HttpRequestHeaderMatchInput
				unmarshalAny(t, cv.GetTypedConfig(), &hin)
			}
		}
		if bs.GetNoAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule().String() != "DENY_ALL" ||
			bs.GetExpiredAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule().String() != "DENY_ALL" {
			t.Errorf("the doc's buckets must deny without an assignment and after one expires (the bound's assumptions): %v", &bs)
		}
	}
	cfg := rulestest.Config(t, rulesSrc)
	client := serve(t, rlqs.Config{Rules: func() *rules.Config { return cfg }})
	stream, err := client.StreamRateLimitQuotas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	bucket := map[string]string{}
	for _, k := range keys {
		bucket[k] = "acme"
	}
	if err := stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: fc.GetDomain(),
		BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(bucket, 1, 0, 0)}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got := describe(resp.BucketAction[0]); !strings.HasPrefix(got, "token_bucket ") {
		t.Fatalf("bucket %v of domain %q: %s, want a token bucket", bucket, fc.GetDomain(), got)
	}
}
