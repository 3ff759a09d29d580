package main

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
)

// TestServeRefusesConcurrency: sluice serve refuses a rule with a
// concurrency limit, naming its file and line, since nothing in Envoy's
// RLS protocol tells it when a request ends; other rules pass.
func TestServeRefusesConcurrency(t *testing.T) {
	c := rulestest.Config(t, "domain: llm\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    concurrency: {max: 4}\n")
	err := refuseConcurrency(c)
	if err == nil || !strings.Contains(err.Error(), ":5: concurrency limits need a front door") {
		t.Fatalf("refuseConcurrency: %v", err)
	}
	if err := refuseConcurrency(rulestest.Config(t, "domain: llm\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n")); err != nil {
		t.Fatalf("a config without concurrency: %v", err)
	}
}
