//go:build unix && !linux

package redistest

import (
	"os"
	"os/exec"
	"syscall"
)

// sysProcAttr puts the server in its own process group, so that killGroup
// reaches any child it forks.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

func killGroup(cmd *exec.Cmd) {
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}

// The signals of Server.Freeze and Server.Thaw.
var stopSignal, contSignal os.Signal = syscall.SIGSTOP, syscall.SIGCONT
