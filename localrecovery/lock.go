package localrecovery

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// LockFile is the file in a local dir that an agent holds an exclusive
// flock(2) on for as long as it runs.
const LockFile = ".ckpt-agent.lock"

// Lock takes the local dir dir for one agent: an exclusive, non-blocking
// flock on dir/LockFile, which it creates if needed (and dir with it), and
// which then holds the holder's pid. Two agents on one local dir would
// each take the other's checkpoints in flight for leftovers of a crash and
// remove them; the second gets an error naming dir and the holder's pid.
// The lock goes with the process (a crash releases it); unlock releases it
// earlier and leaves the file.
func Lock(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("local dir: %w (check --local-dir and its permissions)", err)
	}
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("local dir %s: lock: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			holder := "another process"
			if b, rerr := os.ReadFile(path); rerr == nil {
				if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil {
					holder = fmt.Sprintf("pid %d", pid)
				}
			}
			return nil, fmt.Errorf("local dir %s is in use by another ckpt agent (%s holds %s): give each agent its own --local-dir", dir, holder, path)
		}
		return nil, fmt.Errorf("local dir %s: lock %s: %w", dir, path, err)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { f.Close() }, nil
}
