//go:build race

package localcache_test

// The race detector makes sync.Pool drop items at random and instruments
// atomics: allocation counts mean nothing under it.
const raceEnabled = true
