package rules_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/rules"
)

// TestQuotaModeAndMetadata: the quota_mode and metadata keys of
// envoyproxy/ratelimit (its examples/ratelimit/config/example.yaml
// declares the services below so) load with their meaning.
func TestQuotaModeAndMetadata(t *testing.T) {
	const src = `domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
    metadata:
      service_with_quota:
        name: "service_1"
  - key: service
    value: service_2
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
    metadata:
      service_with_quota:
        name: "service_2"
        weight: 2
        tags: [a, 1.5, true, null]
`
	d, err := rules.Parse("example.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Warnings) != 0 {
		t.Errorf("warnings %v", d.Warnings)
	}
	if len(d.Rules) != 2 || !d.Rules[0].QuotaMode || !d.Rules[1].QuotaMode {
		t.Fatalf("rules %+v", d.Rules)
	}
	want := map[string]any{"service_with_quota": map[string]any{
		"name": "service_2", "weight": float64(2), "tags": []any{"a", 1.5, true, nil},
	}}
	if !reflect.DeepEqual(d.Rules[1].Metadata, want) {
		t.Errorf("metadata %#v, want %#v", d.Rules[1].Metadata, want)
	}

	for _, c := range []struct{ src, want string }{
		{"domain: a\ndescriptors:\n  - key: k\n    metadata: [1, 2]\n", "4:15: metadata must be a mapping, got a list"},
		{"domain: a\ndescriptors:\n  - key: k\n    quota_mode: sure\n", `4:17: quota_mode must be true or false, got the string "sure"`},
	} {
		_, err := rules.Parse("f.yaml", []byte(c.src))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %s", c.src, err, c.want)
		}
	}
}
