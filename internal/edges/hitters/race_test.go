//go:build race

package hitters

// The race detector makes the flood ten times slower: it floods less.
const raceEnabled = true
