//go:build !unix

package redistest

import (
	"os"
	"os/exec"
	"syscall"
)

func sysProcAttr() *syscall.SysProcAttr { return nil }

func killGroup(cmd *exec.Cmd) { cmd.Process.Kill() }

// The signals of Server.Freeze and Server.Thaw: none here; Freeze fails.
var stopSignal, contSignal os.Signal = unsupported{}, unsupported{}

type unsupported struct{}

func (unsupported) String() string { return "unsupported" }
func (unsupported) Signal()        {}
