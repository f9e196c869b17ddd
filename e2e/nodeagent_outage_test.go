package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/lab/testservers"
)

// triggerAsGID runs `ckpt trigger` as a process of group gid (uid root), a
// peer the node agent matches to the tenant of that gid.
func triggerAsGID(t *testing.T, gid uint32, socket, task string, n uint64, dir string) (map[string]any, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, ckptBin, "trigger", "--socket", socket, "--task", task, "--checkpoint", fmt.Sprint(n), "--dir", dir, "--json")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 0, Gid: gid}}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.Run() // a failed checkpoint exits non-zero; its event says why
	var ev map[string]any
	if err := json.Unmarshal(out.Bytes(), &ev); err != nil {
		t.Fatalf("trigger as gid %d: stdout is not one JSON event: %v: %q (stderr %q)", gid, err, out.Bytes(), errb.Bytes())
	}
	return ev, errb.String()
}

// A node agent one of whose two tenants has its S3 endpoint down at start
// (nothing listens on the port: connections are refused) starts anyway:
// the healthy tenant checkpoints to its storage, and the other tenant's
// checkpoint answers unavailable, naming the refused connection.
func TestTheNodeAgentStartsWithOneTenantsStorageDown(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the ckpt binary against versitygw")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to connect under the tenants' gids")
	}
	srv := testservers.S3(t)
	srv.CreateBucket(t, "tenants")
	down := fmt.Sprintf("s3://tenants/beta?path_style=true&endpoint=http://127.0.0.1:%d&region=%s", freePort(t), srv.Region)
	base := t.TempDir()
	rootA, rootB := filepath.Join(base, "alpha"), filepath.Join(base, "beta")
	os.MkdirAll(rootA, 0o755)
	os.MkdirAll(rootB, 0o755)
	tenants := filepath.Join(base, "tenants.yaml")
	writeFile(t, tenants, fmt.Appendf(nil, `tenants:
- {name: alpha, gid: 2001, job: alpha, storage: %q, allow_roots: [%s], tasks: "a-*"}
- {name: beta, gid: 2002, job: beta, storage: %q, allow_roots: [%s], tasks: "b-*"}
`, srv.URL("tenants", "alpha"), rootA, down, rootB))
	socket := filepath.Join(shortDir(t), "s")
	cmd := exec.Command(ckptBin, "agent", "--tenants", tenants, "--socket", socket, "--local-dir", filepath.Join(base, "local"), "--log-level", "debug")
	cmd.Env = append(os.Environ(), srv.Env()...)
	stderr := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	for deadline := time.Now().Add(20 * time.Second); ; {
		select {
		case <-exited:
			t.Fatalf("the node agent exited at start with one tenant's storage down:\n%s", stderr)
		default:
		}
		if _, err := os.Stat(socket); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node agent does not listen on %s after 20s:\n%s", socket, stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}

	snapA, snapB := filepath.Join(rootA, "snap"), filepath.Join(rootB, "snap")
	writeFencingSnapshot(t, snapA, 1)
	writeFencingSnapshot(t, snapB, 2)
	if ev, errs := triggerAsGID(t, 2001, socket, "a-0", 1, snapA); ev["event"] != "completed" {
		t.Fatalf("the healthy tenant's checkpoint: %v (%s)\n%s", ev, errs, stderr)
	}
	ev, errs := triggerAsGID(t, 2002, socket, "b-0", 1, snapB)
	e, _ := ev["error"].(map[string]any)
	if ev["event"] != "failed" || e == nil || e["code"] != "unavailable" || !strings.Contains(fmt.Sprint(e["message"]), "refused") {
		t.Fatalf("the checkpoint of the tenant whose storage is down: %v (%s), want failed unavailable naming the refused connection", ev, errs)
	}
	// The healthy tenant's checkpoint is in its storage.
	out := runCkptEnv(t, srv.Env(), "list", "--storage", srv.URL("tenants", "alpha"), "--job", "alpha", "--json")
	if out.Code != 0 || !bytes.Contains(out.Stdout, []byte(`"a-0"`)) {
		t.Fatalf("ckpt list of the healthy tenant: exit %d %s %s", out.Code, out.Stdout, out.Stderr)
	}
}
