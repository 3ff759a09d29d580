//go:build race

package memstore

// raceEnabled: the race detector makes the stress tests' decisions some
// 10 times slower, so under it they run fewer rounds (each says how many
// and why); without it, all of them.
const raceEnabled = true
