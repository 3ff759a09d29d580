//go:build race

package httpretry_test

// Allocation counts may differ under the race detector: the allocation
// test skips there and runs in scripts/test's run without it.
const raceEnabled = true
