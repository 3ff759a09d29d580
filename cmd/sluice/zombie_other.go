//go:build !linux

package main

// zombie is false where no /proc tells: a zombie then counts as running.
func zombie(int) bool { return false }
