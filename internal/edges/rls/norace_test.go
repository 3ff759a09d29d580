//go:build !race

package rls_test

const raceEnabled = false
