//go:build !race

package rlqs

const raceEnabled = false
