// Package testpart is the one rule for tests that need a real part of
// the world (redis-server, Chromium, promtool): when the part is missing,
// the test fails if the environment variable CI is true (CI must never
// skip silently) and skips otherwise, saying how to install it.
package testpart

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// Missing fails t under CI and skips it elsewhere, with msg.
func Missing(t testing.TB, msg string) {
	t.Helper()
	if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
		t.Fatal(msg)
		return
	}
	t.Skip(msg)
}

// Program returns the path of the first of names found on PATH, or calls
// Missing with the install command.
func Program(t testing.TB, install string, names ...string) string {
	t.Helper()
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	Missing(t, names[0]+" not found on PATH; install with: "+install+" (scripts/test does)")
	return ""
}
