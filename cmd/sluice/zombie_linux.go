package main

import (
	"bytes"
	"os"
	"strconv"
)

// zombie reports whether pid has exited and waits for its parent to reap
// it: /proc/PID/stat's state is Z. Its parent may be a program that
// never waits (or a container's PID 1 that does not reap), and a signal
// 0 still reaches a zombie.
func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}
