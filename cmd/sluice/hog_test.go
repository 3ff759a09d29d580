package main

import (
	"os/exec"
	"runtime"
	"testing"
	"time"
)

// cpuHog keeps every core busy until the test ends: one process per CPU,
// each a shell spinning in a loop at normal priority, as a build or a noisy
// neighbour would. Overload is not an outage: tests that must hold on a busy
// machine run beside it.
func cpuHog(t *testing.T) {
	t.Helper()
	for range runtime.NumCPU() {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		cmd.SysProcAttr = hogAttr()
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting a CPU hog: %v", err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
		})
	}
	// Let the scheduler see them before the load starts.
	time.Sleep(100 * time.Millisecond)
}
