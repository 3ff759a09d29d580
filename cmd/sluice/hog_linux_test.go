package main

import "syscall"

// hogAttr has the kernel kill a hog if the test binary dies without its
// cleanups (a timeout, a SIGKILL).
func hogAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
