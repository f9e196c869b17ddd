package plugins

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin/runner"
)

// beforeExec, when set (tests only), runs after a binary was opened and
// checked and before it is started: the moment another build could take
// its path.
var beforeExec func(path string)

// openBinary opens the plugin's binary once and checks what it opened: a
// regular, executable file, writable by no other user, and, when pinned,
// with the pinned SHA-256. The returned file is what runs (see
// fdRunner): the bytes hashed are the bytes executed, whatever happens
// to the path meanwhile.
func (p *Plugin) openBinary(dir string) (*os.File, string, error) {
	if fi, err := os.Stat(p.info.Path); err != nil {
		return nil, "", err
	} else if !fi.Mode().IsRegular() {
		return nil, "", errors.New("not a regular file") // and not opened: a FIFO would block
	}
	f, err := os.Open(p.info.Path)
	if err != nil {
		return nil, "", err
	}
	fi, err := f.Stat()
	if err == nil {
		switch {
		case !fi.Mode().IsRegular():
			err = errors.New("not a regular file")
		case fi.Mode().Perm()&0o111 == 0:
			err = fmt.Errorf("not executable (mode %v; chmod +x it)", fi.Mode().Perm())
		default:
			err = checkOwner(p.info.Path, fi, "binary")
		}
	}
	if err != nil {
		f.Close()
		return nil, "", err
	}
	run, execPath, err := stage(f, dir)
	if err != nil {
		return nil, "", fmt.Errorf("cannot stage the binary to run it: %v", err)
	}
	fail := func(err error) (*os.File, string, error) {
		run.Close()
		return nil, "", err
	}
	if p.checksum != nil {
		h := sha256.New()
		if _, err := io.Copy(h, run); err != nil {
			return fail(fmt.Errorf("cannot read the binary to check its SHA-256: %v", err))
		}
		if got := h.Sum(nil); !bytes.Equal(got, p.checksum) {
			// Refused before it runs: nothing of this binary is executed.
			return fail(errors.New(mismatch(p.info.Name, p.info.Path, p.checksum, got)))
		}
	}
	return run, execPath, nil
}

// checkOwner refuses a file or directory that another user could change:
// owned by neither this user nor root, or writable by group or others.
// Whoever can write a plugin binary or its directory runs code as ckpt.
func checkOwner(path string, fi os.FileInfo, what string) error {
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("the plugin %s %s is writable by group or others (mode %v), so another user could replace what runs: chmod go-w %s",
			what, path, fi.Mode().Perm(), path)
	}
	if uid, ok := fileOwner(fi); ok && uid != 0 && uid != os.Getuid() {
		return fmt.Errorf("the plugin %s %s is owned by uid %d, neither root nor this process's uid %d, so another user could replace what runs: chown it",
			what, path, uid, os.Getuid())
	}
	return nil
}

// fdRunner is a go-plugin runner that starts the binary openBinary
// checked, through its open file (Linux: /proc/self/fd/3), not by path:
// go-plugin's own runner would start whatever the path names by then.
type fdRunner struct {
	cmd       *exec.Cmd
	bin       *os.File
	path      string
	socketDir string
	stdout    io.ReadCloser
	stderr    io.ReadCloser
	pid       int
}

// newFDRunner runs the checked binary bin (executed as execPath) with
// go-plugin's command settings (environment, stdin); argv[0] stays the
// plugin's path.
func newFDRunner(bin *os.File, execPath, path string, spec *exec.Cmd, socketDir string) (*fdRunner, error) {
	cmd := exec.Command(execPath)
	cmd.Args = []string{path}
	cmd.Env = spec.Env
	cmd.Stdin = spec.Stdin
	cmd.ExtraFiles = []*os.File{bin} // descriptor 3 of the child
	setDeathSignal(cmd)
	r := &fdRunner{cmd: cmd, bin: bin, path: path, socketDir: socketDir}
	var err error
	if r.stdout, err = cmd.StdoutPipe(); err != nil {
		return nil, err
	}
	if r.stderr, err = cmd.StderrPipe(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *fdRunner) Start(context.Context) error {
	if beforeExec != nil {
		beforeExec(r.path)
	}
	err := r.cmd.Start()
	// The child has executed the file (or failed to): the host's
	// descriptor is no longer needed.
	r.bin.Close()
	if err != nil {
		// go-plugin removes the socket directory only of a process
		// that started.
		os.RemoveAll(r.socketDir)
		return err
	}
	r.pid = r.cmd.Process.Pid
	return nil
}

func (r *fdRunner) Wait(context.Context) error { return r.cmd.Wait() }

func (r *fdRunner) Kill(context.Context) error {
	if r.cmd.Process == nil {
		return nil
	}
	if err := r.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

func (r *fdRunner) Stdout() io.ReadCloser { return r.stdout }
func (r *fdRunner) Stderr() io.ReadCloser { return r.stderr }
func (r *fdRunner) Name() string          { return r.path }

func (r *fdRunner) ID() string {
	if r.pid == 0 {
		return ""
	}
	return strconv.Itoa(r.pid)
}

func (r *fdRunner) Diagnose(context.Context) string {
	return "the plugin is not executable by this process, was built for another architecture, " +
		"lacks a dynamic library, or failed go-plugin's handshake"
}

func (r *fdRunner) PluginToHost(n, a string) (string, string, error) { return n, a, nil }
func (r *fdRunner) HostToPlugin(n, a string) (string, string, error) { return n, a, nil }

// runnerFunc is go-plugin's RunnerFunc for the binary bin.
func (p *Plugin) runnerFunc(bin *os.File, execPath string) func(hclog.Logger, *exec.Cmd, string) (runner.Runner, error) {
	return func(_ hclog.Logger, spec *exec.Cmd, socketDir string) (runner.Runner, error) {
		r, err := newFDRunner(bin, execPath, p.info.Path, spec, socketDir)
		if err != nil {
			bin.Close()
			os.RemoveAll(socketDir)
			return nil, err
		}
		return r, nil
	}
}

// runDirPrefix names the host's private directory (in os.TempDir) that
// holds its plugins' sockets.
const runDirPrefix = "ckpt-plugin-run-"

// newRunDir makes the host's private directory for plugin sockets (mode
// 0700) and locks it for the host's lifetime. Directories of hosts that
// died (their lock is free) are removed first, with the sockets their
// plugins left.
func newRunDir() (string, *os.File, error) {
	sweepRunDirs()
	// Made under another name and renamed once locked: a sweep never
	// sees it unlocked.
	tmp, err := os.MkdirTemp("", ".ckpt-plugin-new-")
	if err != nil {
		return "", nil, fmt.Errorf("plugin socket directory: %w", err)
	}
	dir := filepath.Join(filepath.Dir(tmp), runDirPrefix+strings.TrimPrefix(filepath.Base(tmp), ".ckpt-plugin-new-"))
	lock, err := os.OpenFile(filepath.Join(tmp, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err == nil {
		err = lockFile(lock)
	}
	if err == nil {
		err = os.Rename(tmp, dir)
	}
	if err != nil {
		os.RemoveAll(tmp)
		if lock != nil {
			lock.Close()
		}
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("plugin socket directory: %w", err)
	}
	return dir, lock, nil
}

// sweepRunDirs removes the socket directories of hosts that are gone: a
// host killed with SIGKILL takes its plugins along (Pdeathsig) and leaves
// their sockets behind.
func sweepRunDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), runDirPrefix+"*"))
	for _, d := range dirs {
		fi, err := os.Lstat(d)
		if err != nil || !fi.IsDir() {
			continue
		}
		if uid, ok := fileOwner(fi); !ok || uid != os.Getuid() {
			continue
		}
		lock, err := os.OpenFile(filepath.Join(d, "lock"), os.O_RDWR, 0)
		if err != nil {
			continue // no lock yet: a host is making it
		}
		if lockFile(lock) == nil {
			os.RemoveAll(d)
		}
		lock.Close()
	}
}
