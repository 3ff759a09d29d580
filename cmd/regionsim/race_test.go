//go:build race

package main

// raceEnabled: the race detector makes the simulation some 15 times
// slower, so under it the tests run a part of their cases (each says
// which); without it, all of them.
const raceEnabled = true
