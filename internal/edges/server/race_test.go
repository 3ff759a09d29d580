//go:build race

package server_test

// The race detector makes sync.Pool drop items at random: allocation counts
// mean nothing under it.
const raceEnabled = true
