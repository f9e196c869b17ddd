package plugins_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/plugins"
)

// TestPinnedPluginWinsItsScheme: an unpinned binary serving the same
// scheme as a pinned one, and sorting first, is refused with a message
// that says why; the pinned one serves the scheme.
func TestPinnedPluginWinsItsScheme(t *testing.T) {
	dir := install(t, "faulty=aaa", "faulty")
	var log lockedBuffer
	h := discover(t, plugins.Options{Dir: dir, Log: &log,
		Checksums: plugins.Pins{"faulty": sha256Of(t, filepath.Join(dir, "ckpt-plugin-faulty"))}})
	if got := h.Plugins(); len(got) != 1 || got[0].Name != "faulty" {
		t.Fatalf("accepted %+v, want only the pinned ckpt-plugin-faulty (refused %v)", got, h.Refused())
	}
	r := h.Refused()
	if len(r) != 1 || r[0].Path != filepath.Join(dir, "ckpt-plugin-aaa") {
		t.Fatalf("refused %v, want ckpt-plugin-aaa", r)
	}
	for _, want := range []string{"scheme faulty://", "pinned ckpt-plugin-faulty", "not pinned", "remove it"} {
		if !strings.Contains(r[0].Reason, want) {
			t.Errorf("refusal %q does not say %q", r[0].Reason, want)
		}
	}
	s := open(t, h, "faulty://"+t.TempDir())
	if err := s.Put(context.Background(), "served-by", bytes.NewReader([]byte("v")), 1); err != nil {
		t.Fatal(err)
	}
	waitLog(t, &log, "ckpt-plugin-faulty: put served-by")
	if strings.Contains(log.String(), "ckpt-plugin-aaa: put") {
		t.Fatalf("the unpinned plugin served the put:\n%s", log.String())
	}

	// Two unpinned plugins for one scheme: the first by name serves, as
	// before.
	h = discover(t, plugins.Options{Dir: install(t, "faulty=aaa", "faulty"), Log: io.Discard})
	if got := h.Plugins(); len(got) != 1 || got[0].Name != "aaa" || !strings.Contains(h.Refused()[0].Reason, "already served by ckpt-plugin-aaa") {
		t.Fatalf("unpinned pair: accepted %+v, refused %v", got, h.Refused())
	}
}

func waitLog(t *testing.T, log *lockedBuffer, want string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(log.String(), want); {
		if time.Now().After(deadline) {
			t.Fatalf("the host's log lacks %q:\n%s", want, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSwapBetweenHashAndExec: another build takes a pinned binary's path
// after the host checked the binary and before it starts it; the build
// that runs is the pinned one (the host executes the file it hashed).
func TestSwapBetweenHashAndExec(t *testing.T) {
	dir := install(t, "faulty")
	path := filepath.Join(dir, "ckpt-plugin-faulty")
	other := filepath.Join(install(t, "memstore"), "ckpt-plugin-memstore")
	swaps := 0
	defer plugins.SetBeforeExec(func(p string) {
		if p != path || swaps > 0 {
			return
		}
		swaps++
		if err := os.Rename(other, path); err != nil {
			t.Error(err)
		}
	})()
	h := discover(t, plugins.Options{Dir: dir, Log: io.Discard, Checksums: plugins.Pins{"faulty": sha256Of(t, path)}})
	if swaps != 1 {
		t.Fatalf("the hook between check and start ran %d times, want 1", swaps)
	}
	got := h.Plugins()
	if len(got) != 1 || strings.Join(got[0].Schemes, ",") != "faulty" {
		t.Fatalf("after the swap the plugin serves %+v (refused %v), want the pinned build serving faulty://", got, h.Refused())
	}
	s := open(t, h, "faulty://"+t.TempDir())
	if err := s.Put(context.Background(), "k", bytes.NewReader([]byte("v")), 1); err != nil {
		t.Fatal(err)
	}
	// The swapped-in build is on disk now: the next start refuses it.
	if err := s.Put(context.Background(), "kill/k", bytes.NewReader([]byte("v")), 1); err == nil {
		t.Fatal("put that kills the plugin succeeded")
	}
	err := s.Put(context.Background(), "k", bytes.NewReader([]byte("v")), 1)
	if err == nil || !strings.Contains(err.Error(), "checksum mismatch") {
		t.Fatalf("put after the swap: %v, want a checksum mismatch", err)
	}
}

// TestAnInPlaceRewriteBetweenHashAndExecRunsThePinnedBytes: the pinned
// binary's own file is rewritten in place (same inode: by root, or by
// ckpt's own user) after the host hashed it and before it starts it; the
// bytes that run are the ones hashed (the host runs a sealed copy).
func TestAnInPlaceRewriteBetweenHashAndExecRunsThePinnedBytes(t *testing.T) {
	dir := install(t, "faulty")
	path := filepath.Join(dir, "ckpt-plugin-faulty")
	other, err := os.ReadFile(filepath.Join(install(t, "memstore"), "ckpt-plugin-memstore"))
	if err != nil {
		t.Fatal(err)
	}
	pin := sha256Of(t, path)
	rewrites := 0
	defer plugins.SetBeforeExec(func(p string) {
		if p != path || rewrites > 0 {
			return
		}
		rewrites++
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			t.Error(err)
			return
		}
		if _, err := f.Write(other); err != nil {
			t.Error(err)
		}
		f.Close()
	})()
	h := discover(t, plugins.Options{Dir: dir, Log: io.Discard, Checksums: plugins.Pins{"faulty": pin}})
	if rewrites != 1 {
		t.Fatalf("the hook between check and start ran %d times, want 1", rewrites)
	}
	got := h.Plugins()
	if len(got) != 1 || strings.Join(got[0].Schemes, ",") != "faulty" {
		t.Fatalf("after the rewrite the plugin serves %+v (refused %v), want the pinned build serving faulty://", got, h.Refused())
	}
}

// TestRequirePins: with pins required, an unpinned plugin is refused
// before it runs, saying how to pin it; the pinned one is used.
func TestRequirePins(t *testing.T) {
	ran := ranFile(t)
	dir := install(t, "faulty", "faulty=other")
	h := discover(t, plugins.Options{Dir: dir, Log: io.Discard, RequireChecksums: true,
		Checksums: plugins.Pins{"faulty": sha256Of(t, filepath.Join(dir, "ckpt-plugin-faulty"))}})
	if got := h.Plugins(); len(got) != 1 || got[0].Name != "faulty" {
		t.Fatalf("accepted %+v", got)
	}
	r := h.Refused()
	if len(r) != 1 || !strings.HasSuffix(r[0].Path, "ckpt-plugin-other") || !strings.Contains(r[0].Reason, "--require-pins") ||
		!strings.Contains(r[0].Reason, "--plugin-sha256 other=") {
		t.Fatalf("refused %v", r)
	}
	if ran() != "faulty\n" {
		t.Fatalf("starts recorded: %q, want only the pinned plugin", ran())
	}
}

// TestPluginFilesOthersCanWrite: a plugin directory or binary that
// another user could change is refused, saying what to fix; the other
// binaries are still used.
func TestPluginFilesOthersCanWrite(t *testing.T) {
	dir := install(t, "faulty", "memstore")
	for _, mode := range []os.FileMode{0o777, 0o775, 0o1777} {
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		_, err := plugins.Discover(context.Background(), plugins.Options{Dir: dir, Log: io.Discard})
		if err == nil || !strings.Contains(err.Error(), "writable by group or others") || !strings.Contains(err.Error(), "chmod go-w "+dir) {
			t.Fatalf("directory mode %v: discover = %v, want a refusal", mode, err)
		}
	}
	os.Chmod(dir, 0o755)
	faulty := filepath.Join(dir, "ckpt-plugin-faulty")
	for _, mode := range []os.FileMode{0o775, 0o757} {
		os.Chmod(faulty, mode)
		ran := ranFile(t)
		h := discover(t, plugins.Options{Dir: dir, Log: io.Discard})
		r := h.Refused()
		if len(h.Plugins()) != 1 || len(r) != 1 || r[0].Path != faulty || !strings.Contains(r[0].Reason, "writable by group or others") {
			t.Fatalf("binary mode %v: accepted %v, refused %v", mode, h.Plugins(), r)
		}
		if ran() != "" {
			t.Fatalf("binary mode %v: it ran", mode)
		}
	}
	os.Chmod(faulty, 0o755)
	if os.Getuid() == 0 {
		if err := os.Chown(faulty, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		h := discover(t, plugins.Options{Dir: dir, Log: io.Discard})
		if r := h.Refused(); len(r) != 1 || !strings.Contains(r[0].Reason, "owned by uid 65534") {
			t.Fatalf("binary of another user: refused %v", r)
		}
		os.Chown(faulty, 0, 0)
	}
	// Made writable while in use: its next start refuses it.
	h := discover(t, plugins.Options{Dir: dir, Log: io.Discard})
	s := open(t, h, "faulty://"+t.TempDir())
	os.Chmod(faulty, 0o777)
	s.Put(context.Background(), "kill/k", bytes.NewReader([]byte("v")), 1)
	if err := s.Put(context.Background(), "k", bytes.NewReader([]byte("v")), 1); err == nil || !strings.Contains(err.Error(), "writable by group or others") {
		t.Fatalf("restart of a binary made writable: %v", err)
	}
}

// sockets lists the Unix sockets under dir.
func sockets(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type()&fs.ModeSocket != 0 {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// TestKilledPluginSocketsAreRemoved: a plugin killed with SIGKILL leaves
// its socket; the host removes it when it starts the plugin again, and
// removes every socket at Close. A host killed with SIGKILL takes its
// plugins along (Pdeathsig); the next host removes the sockets they
// left, and not those of a host that lives.
func TestKilledPluginSocketsAreRemoved(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	dir := install(t, "faulty")
	// Short: a Unix socket's path has at most 107 bytes.
	tmp, err := os.MkdirTemp("/tmp", "ckpt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	t.Setenv("TMPDIR", tmp)

	h, err := plugins.Discover(context.Background(), plugins.Options{Dir: dir, Log: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	s := open(t, h, "faulty://"+t.TempDir())
	put := func(key string) error { return s.Put(context.Background(), key, bytes.NewReader([]byte("v")), 1) }
	if err := put("k"); err != nil {
		t.Fatal(err)
	}
	if n := sockets(t, tmp); len(n) != 1 {
		t.Fatalf("sockets of one running plugin: %v", n)
	}
	for i := range 3 {
		if err := put("kill/k"); err == nil {
			t.Fatal("put that kills the plugin succeeded")
		}
		if err := put("k"); err != nil {
			t.Fatalf("put after the plugin was killed (%d): %v", i, err)
		}
		if n := sockets(t, tmp); len(n) != 1 {
			t.Fatalf("after %d SIGKILLs and restarts, sockets: %v, want the running plugin's only", i+1, n)
		}
	}
	h.Close()
	if n := sockets(t, tmp); len(n) != 0 {
		t.Fatalf("after Close, sockets: %v", n)
	}

	// A live host and a host killed with SIGKILL, each a process.
	live, _, liveSocks := startHostProcess(t, dir, tmp)
	dead, deadPlugin, deadSocks := startHostProcess(t, dir, tmp)
	dead.Process.Signal(syscall.SIGKILL)
	dead.Wait()
	waitGone(t, deadPlugin) // its plugin dies with it, leaving the socket
	for _, p := range deadSocks {
		if _, err := os.Lstat(p); err != nil {
			t.Fatalf("the killed host's plugin left no socket to clean (%v): the test proves nothing", err)
		}
	}
	discover(t, plugins.Options{Dir: dir, Log: io.Discard})
	for _, p := range deadSocks {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("socket %s of the killed host's plugin is still there", p)
		}
	}
	for _, p := range liveSocks {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("socket %s of the live host's plugin was removed: %v", p, err)
		}
	}
	live.Process.Kill()
	live.Wait()
}

const hostProcessEnv = "CKPT_TEST_PLUGIN_HOST"

// hostProcess is the test binary run as a plugin host: it starts the
// plugins of dir, makes the faulty plugin serve a Put, prints the
// sockets of its plugins and waits to be killed.
func hostProcess(dir string) int {
	h, err := plugins.Discover(context.Background(), plugins.Options{Dir: dir, Log: io.Discard})
	if err == nil {
		var s interface {
			Put(context.Context, string, io.ReadSeeker, int64) error
		}
		s, err = h.OpenStorage(context.Background(), "faulty://"+os.Getenv("CKPT_TEST_STORE_DIR"))
		if err == nil {
			err = s.Put(context.Background(), "k", bytes.NewReader([]byte("v")), 1)
		}
	}
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	pid, err := os.ReadFile(os.Getenv("CKPT_TEST_PID_FILE"))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("pid", string(pid))
	select {}
}

// startHostProcess runs hostProcess in a child and returns it with its
// plugin's pid and sockets (those under tmp that were not there before).
func startHostProcess(t *testing.T, dir, tmp string) (*exec.Cmd, int, []string) {
	t.Helper()
	before := map[string]bool{}
	for _, p := range sockets(t, tmp) {
		before[p] = true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), hostProcessEnv+"="+dir, "CKPT_TEST_STORE_DIR="+t.TempDir(),
		"CKPT_TEST_PID_FILE="+filepath.Join(t.TempDir(), "pid"))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	var pid int
	if _, serr := fmt.Sscanf(line, "pid %d", &pid); serr != nil {
		t.Fatalf("host process: %q, %v", line, err)
	}
	var socks []string
	for _, p := range sockets(t, tmp) {
		if !before[p] {
			socks = append(socks, p)
		}
	}
	if len(socks) == 0 {
		t.Fatal("the host process's plugin has no socket under TMPDIR")
	}
	return cmd, pid, socks
}

// waitGone waits until process pid is gone (or a zombie).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		if _, rest, ok := strings.Cut(string(b), ") "); ok && strings.HasPrefix(rest, "Z") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d still runs", pid)
		}
	}
}
