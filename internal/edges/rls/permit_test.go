package rls_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/edges/rls"
	"github.com/sluicehq/sluice/rules"
)

func entries(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// TestPermitEntry: the codec takes a descriptor's sluice_permit entry out
// of its entries, wherever it stands, into Request.Release, and puts it
// back for a remote; a request without one has no Release; two in one
// descriptor, or an empty one, are refused. A token in an outcome goes
// into the answer's dynamic metadata, and envoyproxy/ratelimit's metadata
// never repeats the token a descriptor carried; PermitToken reads it
// back from either.
func TestPermitEntry(t *testing.T) {
	var r decide.Request
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{
		entries("user", "a"),
		entries("sluice_permit", "TOKEN", "user", "b", "path", "/x"),
	}}
	if err := rls.Request(req, &r); err != nil {
		t.Fatal(err)
	}
	want := []rules.Entry{{Key: "user", Value: "b"}, {Key: "path", Value: "/x"}}
	if !slices.Equal(r.Release, []string{"", "TOKEN"}) || !slices.Equal(r.Descriptors[1].Entries, want) || len(r.Descriptors[0].Entries) != 1 {
		t.Fatalf("converted: %+v release %q", r.Descriptors, r.Release)
	}
	back, err := rls.RateLimitRequest(&r)
	if err != nil {
		t.Fatal(err)
	}
	if e := back.Descriptors[1].Entries; len(e) != 3 || e[2].Key != rls.PermitKey || e[2].Value != "TOKEN" || len(back.Descriptors[0].Entries) != 1 {
		t.Fatalf("for a remote: %v", back)
	}
	// The same storage, a request without tokens: no Release.
	if err := rls.Request(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{entries("user", "a")}}, &r); err != nil || len(r.Release) != 0 {
		t.Fatalf("no token: %v, release %q", err, r.Release)
	}
	for _, bad := range []*rlv3.RateLimitDescriptor{
		entries("user", "a", "sluice_permit", "T1", "sluice_permit", "T2"),
		entries("user", "a", "sluice_permit", ""),
	} {
		err := rls.Request(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{bad}}, &r)
		if !errors.Is(err, sluice.ErrInvalid) || strings.Contains(err.Error(), "T1") {
			t.Errorf("%v: %v, want ErrInvalid without the token", bad, err)
		}
	}

	o := &decide.Outcome{Overall: sluice.Decision{Allowed: true}, Descriptors: []decide.DescriptorOutcome{{}, {Release: true}}, PermitToken: "sTOKEN"}
	if got := rls.PermitToken(rls.Response(o, false)); got != "sTOKEN" {
		t.Errorf("the answer's token: %q", got)
	}
	md := rls.DynamicMetadata(req, o)
	if got := md.GetFields()[rls.PermitKey].GetStringValue(); got != "sTOKEN" {
		t.Errorf("envoyproxy/ratelimit's metadata lacks the token: %v", md)
	}
	if s := md.GetFields()["descriptors"].String(); strings.Contains(s, "TOKEN") || !strings.Contains(s, "user=b") {
		t.Errorf("the descriptors of the metadata: %s", s)
	}
	if got := rls.PermitToken(&rlsv3.RateLimitResponse{DynamicMetadata: md}); got != "sTOKEN" {
		t.Errorf("the token of an answer with envoyproxy/ratelimit's metadata: %q", got)
	}
	if o.PermitToken = ""; rls.Response(o, false).GetDynamicMetadata() != nil || rls.PermitToken(rls.Response(o, false)) != "" {
		t.Error("an answer without a token has dynamic metadata")
	}
}
