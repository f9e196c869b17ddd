//go:build !linux

package plugins

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
)

func setDeathSignal(*exec.Cmd) {}

// stage takes the opened binary f and returns the file to check and run
// and the path to execute it by: without /proc/self/fd, a private copy
// in dir (the host's 0700 directory), which no other user can change.
func stage(f *os.File, dir string) (*os.File, string, error) {
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, "", err
	}
	c, err := os.CreateTemp(dir, "bin-")
	if err != nil {
		return nil, "", err
	}
	path := c.Name()
	_, err = io.Copy(c, f)
	if err == nil {
		err = c.Chmod(fi.Mode().Perm() &^ 0o022)
	}
	if cerr := c.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return nil, "", err
	}
	run, err := os.Open(path)
	if err != nil {
		return nil, "", err
	}
	return run, filepath.Clean(path), nil
}

func fileOwner(os.FileInfo) (int, bool) { return 0, false }

func lockFile(*os.File) error { return errors.New("no file locks on this system") }
