package plugins

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// setDeathSignal kills the plugin if the host dies without stopping it.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// stage takes the opened binary f and returns the file to check and run
// and the path to execute it by: on Linux a sealed in-memory copy of f
// (memfd, no write, grow or shrink possible, by anyone), which the child
// receives as descriptor 3 (fdRunner) and executes through
// /proc/self/fd/3. So the bytes checked are the bytes run, even if the
// binary's file is rewritten in place between the check and the start (by
// root or by ckpt's own user), and a script's interpreter can open it too.
// Where the kernel has no memfd or forbids executing one
// (vm.memfd_noexec=2), f itself is run the same way: a swap of the path is
// still harmless, an in-place rewrite of the file is not.
func stage(f *os.File, _ string) (*os.File, string, error) {
	m, err := sealedCopy(f)
	if err != nil {
		if _, serr := f.Seek(0, io.SeekStart); serr != nil {
			return nil, "", serr
		}
		return f, "/proc/self/fd/3", nil
	}
	f.Close()
	return m, "/proc/self/fd/3", nil
}

// sealedCopy copies f into a new memfd and seals it against every change.
func sealedCopy(f *os.File) (*os.File, error) {
	fd, err := unix.MemfdCreate("ckpt-plugin", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) { // a kernel older than MFD_EXEC (6.3): executable by default
		fd, err = unix.MemfdCreate("ckpt-plugin", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	m := os.NewFile(uintptr(fd), "ckpt-plugin")
	fail := func(err error) (*os.File, error) {
		m.Close()
		return nil, err
	}
	if _, err := io.Copy(m, f); err != nil {
		return fail(fmt.Errorf("copy the binary: %w", err))
	}
	if _, err := unix.FcntlInt(m.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE); err != nil {
		return fail(fmt.Errorf("seal the copy: %w", err))
	}
	if _, err := m.Seek(0, io.SeekStart); err != nil {
		return fail(err)
	}
	return m, nil
}

// fileOwner returns the uid owning fi.
func fileOwner(fi os.FileInfo) (int, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}

// lockFile takes f's exclusive lock without waiting.
func lockFile(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
}
