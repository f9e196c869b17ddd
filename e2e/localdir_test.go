package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Two agents on one --local-dir would remove each other's checkpoints in
// flight: the second exits 1 naming the dir and the first one's pid.
func TestASecondAgentOnTheSameLocalDirExits1(t *testing.T) {
	storageDir, localDir, root := t.TempDir(), t.TempDir(), t.TempDir()
	cfg := func(socket string) agentConfig {
		return agentConfig{Socket: socket, StorageDir: storageDir, Job: "lock", LocalDir: localDir, AllowRoots: []string{root}}
	}
	first := startAgent(t, "first", cfg(filepath.Join(shortDir(t), "a.sock")))
	second := launchAgent(t, "second", cfg(filepath.Join(shortDir(t), "b.sock")))
	if code := second.waitExit(20 * time.Second); code != 1 {
		t.Fatalf("a second agent on the same local dir exited %d, want 1:\n%s", code, second.stderr)
	}
	msg := second.stderr.String()
	if !strings.Contains(msg, localDir) || !strings.Contains(msg, fmt.Sprintf("pid %d", first.cmd.Process.Pid)) {
		t.Errorf("the refusal does not name %s and pid %d:\n%s", localDir, first.cmd.Process.Pid, msg)
	}
}
