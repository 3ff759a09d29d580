//go:build race

package rlqs

// raceEnabled: the race detector changes what the heap holds, so the
// tests that measure it measure a part of their cases under it (each says
// which); without it, all of them.
const raceEnabled = true
