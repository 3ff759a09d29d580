package main

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
)

// TestServeRefusesConcurrency: sluice serve refuses a rule with a
// concurrency limit, naming its file and line and the switch, unless
// --stream-done-release says Envoy gives the permits back at stream done;
// other rules pass either way.
func TestServeRefusesConcurrency(t *testing.T) {
	c := rulestest.Config(t, "domain: llm\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    concurrency: {max: 4}\n")
	off, on := &serveSettings{}, &serveSettings{streamDoneRelease: true}
	err := off.checkRules(c)
	if err == nil || !strings.Contains(err.Error(), ":5: a concurrency limit needs Envoy to release") || !strings.Contains(err.Error(), "--stream-done-release") {
		t.Fatalf("refuseConcurrency: %v", err)
	}
	if err := on.checkRules(c); err != nil {
		t.Fatalf("with --stream-done-release: %v", err)
	}
	plain := rulestest.Config(t, "domain: llm\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	if err := off.checkRules(plain); err != nil {
		t.Fatalf("a config without concurrency: %v", err)
	}
}
