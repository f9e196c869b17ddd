package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/lab/workload"
)

// waitHeld waits until the local dir holds a complete copy of checkpoint n
// of task (its recorded manifest).
func waitHeld(t *testing.T, localDir, job, task string, n uint64) {
	t.Helper()
	p := filepath.Join(localDir, job, task, fmt.Sprintf("%020d", n)+".manifest")
	for deadline := time.Now().Add(60 * time.Second); ; {
		if _, err := os.Stat(p); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the standby never held checkpoint %d of %s", n, task)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Node A owns a task, node B follows it (--standby-for). A dies; the task
// restores on B from B's warm copy without fetching a byte, and B's agent
// takes it over and checkpoints on incrementally. The same restore on a
// node with no standby fetches everything; both are timed.
func TestAWarmStandbyMakesANodeLossRestoreLocal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	b := newBackend(t, "s3")
	const job, task = "standby", "kv-0"
	opts := workload.Options{Seed: 21, StateBytes: 24 << 20}

	rootA, localA := t.TempDir(), t.TempDir()
	socketA := filepath.Join(shortDir(t), "a.sock")
	nodeA := startAgent(t, "A", b.agentConfig(socketA, job, localA, []string{rootA}, "--node", "node-a"))
	storeA := filepath.Join(rootA, "store")
	w, err := workload.Open(storeA, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	checkpointWorkload(t, ctx, w, storeA, socketA, task, 1, 2)

	rootB, localB := t.TempDir(), t.TempDir()
	socketB := filepath.Join(shortDir(t), "b.sock")
	port := statusPort(t)
	nodeB := startAgent(t, "B", b.agentConfig(socketB, job, localB, []string{rootB}, "--node", "node-b",
		"--standby-for", task, "--standby-interval", "200ms", "--drill-interval", "1h", "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", port)))
	waitHeld(t, localB, job, task, 1)
	exp := checkpointWorkload(t, ctx, w, storeA, socketA, task, 2, 1)
	waitHeld(t, localB, job, task, 2)
	refreshes := waitLogRecords(t, nodeB, "standby refreshed", 2)
	last := refreshes[len(refreshes)-1]
	if last["checkpoint"] != float64(2) || last["bytes_local"] == float64(0) {
		t.Fatalf("the refresh to checkpoint 2 took nothing from the copy of 1: %v", last)
	}
	t.Logf("standby refresh to checkpoint 2: %v B from its copy of 1, %v B from storage", last["bytes_local"], last["bytes_remote"])
	_, metrics := statusGet(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if held, ok := promSample(t, metrics, "ckpt_standby_checkpoint", map[string]string{"job": job, "task": task}); !ok || held != 2 {
		t.Errorf("ckpt_standby_checkpoint = %v (present %v), want 2", held, ok)
	}
	if _, ok := promSample(t, metrics, "ckpt_standby_lag_seconds", map[string]string{"job": job, "task": task}); !ok {
		t.Error("no ckpt_standby_lag_seconds")
	}
	// With --drill-interval the failover restore from the copy is measured.
	fo := waitLogRecords(t, nodeB, "standby failover restore measured", 1)
	if fo[0]["bytes_remote"] != float64(0) || fo[0]["bytes"] == float64(0) {
		t.Fatalf("measured failover restore: %v", fo[0])
	}
	if _, ok := promSample(t, metrics, "ckpt_standby_failover_duration_seconds", map[string]string{"job": job, "task": task}); !ok {
		t.Error("no ckpt_standby_failover_duration_seconds")
	}
	t.Logf("measured failover restore on the standby: %v B in %v ms", fo[0]["bytes"], fo[0]["duration_ms"])

	// Node A is lost.
	nodeA.kill()
	w.Close()

	// The restore on B (its init container) is local.
	storeB := filepath.Join(rootB, "store")
	var onB restoreResult
	b.ckptJSON(t, &onB, "restore", "--storage", b.url, "--job", job, "--task", task, "--target", storeB, "--local-dir", localB, "--json")
	if !onB.Restored || onB.Checkpoint != 2 || onB.BytesRemote != 0 || onB.BytesLocal != onB.Bytes {
		t.Fatalf("restore on the standby's node: %+v", onB)
	}
	// The same restore on a node with no standby.
	var onC restoreResult
	b.ckptJSON(t, &onC, "restore", "--storage", b.url, "--job", job, "--task", task, "--target", filepath.Join(t.TempDir(), "store"),
		"--local-dir", t.TempDir(), "--json")
	if onC.BytesRemote != onC.Bytes {
		t.Fatalf("restore on a node with no standby: %+v", onC)
	}
	t.Logf("failover restore of %d B: %d ms from the warm standby, %d ms on a node with none", onB.Bytes, onB.DurationMS, onC.DurationMS)

	// B takes the task over (epoch 2) and checkpoints on incrementally.
	w2, err := workload.Resume(ctx, storeB, opts, exp)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	checkpointWorkload(t, ctx, w2, storeB, socketB, task, 3, 1)
	done := waitLogRecords(t, nodeB, "checkpoint completed", 1)
	if done[0]["files_reused"] == float64(0) {
		t.Fatalf("B's first checkpoint of the task reused nothing: %v", done[0])
	}
	var list []listEntry
	b.ckptJSON(t, &list, "list", "--storage", b.url, "--job", job, "--json")
	if len(list) == 0 || list[len(list)-1].Checkpoint != 3 || list[len(list)-1].Epoch < 2 {
		t.Fatalf("list after the takeover: %+v", list)
	}
	if strings.Contains(nodeB.stderr.String(), `"level":"ERROR"`) {
		t.Errorf("node B logged errors:\n%s", nodeB.stderr)
	}
}
