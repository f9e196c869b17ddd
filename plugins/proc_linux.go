package plugins

import (
	"os/exec"
	"syscall"
)

// setDeathSignal kills the plugin if the host dies without stopping it.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
