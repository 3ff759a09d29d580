package main

import (
	"strings"
	"testing"
	"time"
)

// TestRegionSettings: the region tier's flags are checked together; a bad
// combination says what is wrong.
func TestRegionSettings(t *testing.T) {
	ok := regionSettings{region: "us", regions: "us=0.5,eu=0.5", coordinator: "redis://c:6379", interval: 200 * time.Millisecond}
	if probs := ok.check("redis"); len(probs) != 0 {
		t.Fatalf("a good setting: %v", probs)
	}
	for _, tc := range []struct {
		name  string
		r     regionSettings
		store string
		want  string
	}{
		{"memory store", ok, "memory", "needs --store redis"},
		{"no coordinator", regionSettings{region: "us", regions: "us,eu", interval: time.Second}, "redis", "needs --coordinator-url"},
		{"region not listed", regionSettings{region: "ap", regions: "us,eu", coordinator: "x", interval: time.Second}, "redis", `must list --region "ap"`},
		{"bad share", regionSettings{region: "us", regions: "us=2,eu", coordinator: "x", interval: time.Second}, "redis", "must be a fraction"},
		{"no region", regionSettings{regions: "us,eu"}, "redis", "need --region"},
		{"interval", regionSettings{region: "us", regions: "us", coordinator: "x"}, "redis", "--region-interval must be positive"},
	} {
		probs := strings.Join(tc.r.check(tc.store), "; ")
		if !strings.Contains(probs, tc.want) {
			t.Errorf("%s: %q, want it to say %q", tc.name, probs, tc.want)
		}
	}
	names, shares, err := ok.parse()
	if err != nil || strings.Join(names, ",") != "us,eu" || len(shares) != 2 || shares[0] != 0.5 {
		t.Fatalf("parse: %v %v %v", names, shares, err)
	}
	if _, shares, _ := (&regionSettings{regions: "a,b,c"}).parse(); shares != nil {
		t.Fatalf("no shares given: %v, want nil (equal shares)", shares)
	}
}
