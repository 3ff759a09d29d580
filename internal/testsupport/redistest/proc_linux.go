package redistest

import (
	"os"
	"os/exec"
	"syscall"
)

// sysProcAttr puts the server in its own process group, so that killGroup
// reaches any child it forks, and has the kernel kill it if the test binary
// dies without running its cleanups (a test timeout, a SIGKILL).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

func killGroup(cmd *exec.Cmd) {
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}

// The signals of Server.Freeze and Server.Thaw.
var stopSignal, contSignal os.Signal = syscall.SIGSTOP, syscall.SIGCONT
