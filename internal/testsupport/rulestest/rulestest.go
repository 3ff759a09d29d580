// Package rulestest builds, in tests, rules configurations from YAML and
// the RLS descriptors that they match.
package rulestest

import (
	"fmt"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sluicehq/sluice/rules"
)

// Config parses each YAML source as one domain file and joins them into a
// Config, failing the test on any error. A single source is named
// test.yaml in errors and warnings; several are f0.yaml, f1.yaml, ...
func Config(t testing.TB, srcs ...string) *rules.Config {
	t.Helper()
	var ds []*rules.Domain
	for i, src := range srcs {
		name := "test.yaml"
		if len(srcs) > 1 {
			name = fmt.Sprintf("f%d.yaml", i)
		}
		d, err := rules.Parse(name, []byte(src))
		if err != nil {
			t.Fatalf("Parse: %v", err)
		}
		ds = append(ds, d)
	}
	c, err := rules.NewConfig(ds...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Desc builds an RLS descriptor from "key=value" entries ("key" alone has
// an empty value).
func Desc(entries ...string) *rlv3.RateLimitDescriptor {
	rd := &rlv3.RateLimitDescriptor{}
	for _, s := range entries {
		k, v, _ := strings.Cut(s, "=")
		rd.Entries = append(rd.Entries, &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return rd
}
