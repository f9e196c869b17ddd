package localrecovery

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// The ids the uid tests run the app and the agent as: two users that are
// not root and not each other.
const (
	appUID   = 4242
	agentUID = 4343
)

// takeResult is what the child agent reports of one Take and Inspect.
type takeResult struct {
	Copied, CopiedNotPermitted int
	Error                      string
	NotPermitted               bool // the error is a *LinkNotPermittedError
	Files                      map[string]string
}

// TestTakeChild is the agent side of TestTakeAsAnotherUser, run in a child
// process as agentUID: it takes the snapshot dir into the local store and
// prints the outcome as JSON.
func TestTakeChild(t *testing.T) {
	args := os.Getenv("CKPT_TEST_TAKE_CHILD")
	if args == "" {
		t.Skip("the child of TestTakeAsAnotherUser")
	}
	local, snap, _ := strings.Cut(args, ",")
	var res takeResult
	s, err := Open(local, "job")
	if err == nil {
		var sn *Snapshot
		if sn, err = link(t, s, "t", 1, snap); err == nil {
			res.Copied, res.CopiedNotPermitted = sn.Copied, sn.CopiedNotPermitted
			res.Files = map[string]string{}
			for _, f := range sn.Files {
				b, err := os.ReadFile(sn.Path(f.Name))
				if err != nil {
					t.Fatal(err)
				}
				res.Files[f.Name] = string(b)
			}
		}
	}
	if err != nil {
		res.Error = err.Error()
		var np *LinkNotPermittedError
		res.NotPermitted = errors.As(err, &np)
	}
	json.NewEncoder(os.Stdout).Encode(res)
}

// TestTakeAsAnotherUser: an agent running as another uid than the app
// cannot hard-link the app's files (fs.protected_hardlinks), so it copies
// the files it can read, counts them, and for a file it cannot read fails
// with an error that says why and what to do. The agent side runs as a
// non-root uid in a child process (root may link anything).
func TestTakeAsAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the agent and own the snapshot as two other users")
	}
	if b, err := os.ReadFile("/proc/sys/fs/protected_hardlinks"); err != nil || strings.TrimSpace(string(b)) != "1" {
		t.Skip("fs.protected_hardlinks is not 1 here: links across users are allowed")
	}
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The test binary, where the agent's uid may run it.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(base, "localrecovery.test")
	copyTo(t, self, bin, 0o755)

	take := func(t *testing.T, mode os.FileMode) takeResult {
		dir := t.TempDir()
		for _, d := range []string{filepath.Dir(dir), dir} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		snap, local := filepath.Join(dir, "snap"), filepath.Join(dir, "local")
		write(t, snap, map[string]string{"000001.sst": "sst", "CURRENT": "cur"})
		for _, p := range []string{snap, filepath.Join(snap, "000001.sst"), filepath.Join(snap, "CURRENT")} {
			if err := os.Chown(p, appUID, appUID); err != nil {
				t.Fatal(err)
			}
		}
		for _, name := range []string{"000001.sst", "CURRENT"} {
			if err := os.Chmod(filepath.Join(snap, name), mode); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Mkdir(local, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(local, agentUID, agentUID); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "-test.run=^TestTakeChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "CKPT_TEST_TAKE_CHILD="+local+","+snap)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: agentUID, Gid: agentUID}}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("the agent as uid %d: %v\n%s", agentUID, err, out)
		}
		var res takeResult
		line, _, _ := strings.Cut(string(out), "\n")
		if err := json.Unmarshal([]byte(line), &res); err != nil {
			t.Fatalf("the agent as uid %d printed %q: %v", agentUID, out, err)
		}
		return res
	}

	t.Run("files the agent can read are copied and counted", func(t *testing.T) {
		res := take(t, 0o644)
		if res.Error != "" {
			t.Fatalf("take as uid %d of uid %d's snapshot: %s", agentUID, appUID, res.Error)
		}
		if res.CopiedNotPermitted != 2 || res.Copied != 2 {
			t.Errorf("copied %d files, %d of them because links were not permitted; want 2 and 2", res.Copied, res.CopiedNotPermitted)
		}
		if res.Files["000001.sst"] != "sst" || res.Files["CURRENT"] != "cur" {
			t.Errorf("the local copy holds %v", res.Files)
		}
	})
	t.Run("a file the agent cannot read fails with the reason", func(t *testing.T) {
		res := take(t, 0o600)
		if !res.NotPermitted {
			t.Fatalf("take of files the agent cannot read: error %q, want a *LinkNotPermittedError", res.Error)
		}
		for _, w := range []string{"operation not permitted", "fs.protected_hardlinks", "permission denied", "app's uid"} {
			if !strings.Contains(res.Error, w) {
				t.Errorf("the error does not say %q: %s", w, res.Error)
			}
		}
	})
}

func copyTo(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
