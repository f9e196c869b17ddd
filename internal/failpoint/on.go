//go:build ckpt_failpoints

package failpoint

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Enabled reports whether this build can arm failpoints.
const Enabled = true

type armed struct {
	action string
	hits   int
}

var (
	once   sync.Once
	mu     sync.Mutex
	points map[string]*armed
	after  int
	jitter time.Duration
)

func load() {
	points = map[string]*armed{}
	for _, spec := range strings.Split(os.Getenv("CKPT_FAILPOINT"), ",") {
		if spec = strings.TrimSpace(spec); spec == "" {
			continue
		}
		name, action, ok := strings.Cut(spec, "=")
		if !ok {
			action = "kill"
		}
		points[name] = &armed{action: action}
	}
	after, _ = strconv.Atoi(os.Getenv("CKPT_FAILPOINT_AFTER"))
	jitter, _ = time.ParseDuration(os.Getenv("CKPT_FAILPOINT_JITTER"))
}

// Reset reads the environment again, forgetting the hits counted so far:
// a test hook for tests that arm failpoints with t.Setenv (the environment
// is otherwise read once per process). Call it after each change of
// CKPT_FAILPOINT*, and again once the test restored the environment.
func Reset() {
	once.Do(func() {})
	mu.Lock()
	defer mu.Unlock()
	load()
}

// fire returns the action armed at name if this hit should act on it.
func fire(name string) string {
	once.Do(load)
	mu.Lock()
	defer mu.Unlock()
	p := points[name]
	if p == nil {
		return ""
	}
	p.hits++
	if p.hits <= after {
		return ""
	}
	return p.action
}

// Hit kills the process if name is armed with "kill" (after the armed
// number of skipped hits and a random jitter).
func Hit(name string) {
	if fire(name) != "kill" {
		return
	}
	if jitter > 0 {
		time.Sleep(rand.N(jitter))
	}
	fmt.Fprintf(os.Stderr, "failpoint %s: killing the process\n", name)
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}

var errnos = map[string]syscall.Errno{"ENOSPC": syscall.ENOSPC, "EIO": syscall.EIO, "EROFS": syscall.EROFS, "EDQUOT": syscall.EDQUOT}

// Error returns the errno armed at name (as a *os.SyscallError naming the
// failpoint), kills the process if it is armed with "kill", and returns
// nil otherwise.
func Error(name string) error {
	action := fire(name)
	switch action {
	case "":
		return nil
	case "kill":
		fmt.Fprintf(os.Stderr, "failpoint %s: killing the process\n", name)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	if e, ok := errnos[action]; ok {
		return os.NewSyscallError("failpoint "+name, e)
	}
	return fmt.Errorf("failpoint %s: unknown action %q", name, action)
}
