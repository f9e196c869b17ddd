// Package servers installs and locates the real servers that ckpt's tests
// and benchmarks run against: versitygw (an S3 gateway over a directory)
// and fake-gcs-server (the GCS emulator), at pinned versions.
//
// They are Go programs installed with `go install` into <repo root>/.bin
// (ignored by git) the first time they are needed, about a minute cold. A
// file lock keeps parallel processes from installing at once, and a
// version stamp beside each binary makes a new pin reinstall it.
package servers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Pinned server versions.
const (
	VersitygwModule      = "github.com/versity/versitygw/cmd/versitygw"
	VersitygwVersion     = "v1.8.0"
	FakeGCSServerModule  = "github.com/fsouza/fake-gcs-server"
	FakeGCSServerVersion = "v1.56.1"
)

// RepoRoot returns the directory holding go.mod at or above dir.
func RepoRoot(dir string) (string, error) {
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod in the working directory or above it")
		}
		dir = parent
	}
}

// Install returns the path of the named server in <root>/.bin, installing
// module@version there first if it is missing or of another version.
// logf, when set, is told before a (slow) install starts.
func Install(ctx context.Context, root, name, module, version string, logf func(format string, args ...any)) (string, error) {
	bin := filepath.Join(root, ".bin")
	path := filepath.Join(bin, name)
	stamp := filepath.Join(bin, "."+name+".version")
	installed := func() bool {
		v, err := os.ReadFile(stamp)
		if err != nil || strings.TrimSpace(string(v)) != version {
			return false
		}
		fi, err := os.Stat(path)
		return err == nil && fi.Mode()&0o111 != 0
	}
	if installed() {
		return path, nil
	}
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(bin, ".install.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("install lock: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("install lock: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if installed() { // another process installed it while we waited
		return path, nil
	}
	if logf != nil {
		logf("installing %s@%s into %s (once; about a minute)", module, version, bin)
	}
	ictx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ictx, GoTool(), "install", module+"@"+version)
	cmd.Env = append(os.Environ(), "GOBIN="+bin, "GOWORK=off")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install %s@%s failed (%v); the Go module proxy must be reachable:\n%s", module, version, err, tail(out, 2000))
	}
	if err := os.WriteFile(stamp, []byte(version+"\n"), 0o644); err != nil {
		return "", err
	}
	return path, nil
}

// GoTool finds the go command: on PATH, else in GOROOT.
func GoTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if root := os.Getenv("GOROOT"); root != "" {
		return filepath.Join(root, "bin", "go")
	}
	return "go"
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.TrimSpace(b))
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
