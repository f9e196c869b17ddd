package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/client"
	"github.com/ckpt-io/ckpt/protocol"
)

// fleetSend sends one job-wide checkpoint of a small snapshot and returns
// its end: nil when completed, else the agent's error.
func fleetSend(ctx context.Context, t *testing.T, c *client.Client, root, task string, n uint64, tasks []string) error {
	t.Helper()
	dir := filepath.Join(root, fmt.Sprintf("%s-%d", task, n))
	writeFencingSnapshot(t, dir, n*100+uint64(len(task)))
	p, err := c.Send(ctx, client.Request{Task: task, Checkpoint: n, Dir: dir, Tasks: tasks})
	if err != nil {
		return err
	}
	_, err = p.Wait(ctx)
	return err
}

// An agent that comes back on a node its tasks were moved away from
// (SIGKILLed, then restarted with the same local dir and --node) is the
// old owner's: when the zombie app there sends it a checkpoint, it must
// not take the task back from the new owner, whose checkpoints must go on
// completing.
func TestFleetAgentRevivedAfterATakeoverDoesNotTakeTheTaskBack(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: part of the fleet suite, which runs without -short")
	}
	base := t.TempDir()
	const job, task = "revive", "kv-0"
	tasks := []string{task}
	storageDir := filepath.Join(base, "storage")
	node := func(name string) agentConfig {
		root := filepath.Join(base, name)
		if err := os.MkdirAll(root, 0o755); err != nil {
			t.Fatal(err)
		}
		return agentConfig{Socket: filepath.Join(shortDir(t), "ckpt.sock"), StorageDir: storageDir, Job: job,
			LocalDir: filepath.Join(root, "local"), AllowRoots: []string{root}, Extra: []string{"--node", name}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	n1 := node("node-1")
	old := startAgent(t, "node-1", n1)
	c1, err := client.Dial(ctx, n1.Socket)
	if err != nil {
		t.Fatal(err)
	}
	for n := uint64(1); n <= 2; n++ {
		if err := fleetSend(ctx, t, c1, filepath.Join(base, "node-1"), task, n, tasks); err != nil {
			t.Fatal(err)
		}
	}
	c1.Close()
	old.kill()

	// The task moves to node 4: restore (which takes ownership), then
	// checkpoints there.
	n4 := node("node-4")
	startAgent(t, "node-4", n4)
	if _, err := socketRestore(ctx, n4.Socket, task, filepath.Join(base, "node-4", "store"), true); err != nil {
		t.Fatalf("node-4 restore: %v", err)
	}
	c4, err := client.Dial(ctx, n4.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c4.Close()
	if err := fleetSend(ctx, t, c4, filepath.Join(base, "node-4"), task, 3, tasks); err != nil {
		t.Fatalf("node-4 checkpoint 3: %v", err)
	}

	// Node 1's agent comes back; the zombie app there sends checkpoint 4.
	startAgent(t, "node-1 (revived)", n1)
	c1, err = client.Dial(ctx, n1.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	zerr := fleetSend(ctx, t, c1, filepath.Join(base, "node-1"), task, 4, tasks)
	t.Logf("the revived node-1 agent's checkpoint 4: %v", zerr)
	var pe *protocol.Error
	if zerr == nil || !errors.As(zerr, &pe) || pe.Code != protocol.CodeConflict {
		t.Errorf("the agent revived on node-1 after node-4 took the task over committed checkpoint 4 (%v), want conflict", zerr)
	}
	// The new owner goes on.
	nerr := fleetSend(ctx, t, c4, filepath.Join(base, "node-4"), task, 5, tasks)
	t.Logf("node-4's checkpoint 5 after the revival: %v", nerr)
	if nerr != nil {
		t.Errorf("node-4, the task's new owner, is blocked after node-1's agent was revived: checkpoint 5: %v", nerr)
	}
	var list []fleetListEntry
	ckptJSON(t, &list, "list", "--storage", n1.storageURL(), "--job", job, "--json")
	st := readFleetStorage(t, filepath.Join(storageDir, job))
	for e, r := range st.owners[task] {
		t.Logf("ownership record epoch %d: node %s, after %d", e, r.Node, r.After)
	}
	for _, e := range list {
		t.Logf("listed: checkpoint %d, epoch %d (node %s)", e.Checkpoint, e.Epoch, st.owners[task][e.Epoch].Node)
		if st.owners[task][e.Epoch].Node == "node-1" && e.Checkpoint > 2 {
			t.Errorf("list shows checkpoint %d from node-1 after the task moved to node-4", e.Checkpoint)
		}
	}
}

// A task that lags behind the others by more than --retain checkpoints
// (a slow node, an agent catching up after a restart) still completes
// every job-wide checkpoint in the end, each of them reported completed to
// its app: the job must get a job-complete checkpoint out of it. Retention
// keeps only each task's newest job-complete checkpoint besides the
// --retain newest, so the fast task retires N before the slow one commits
// N, and no N is ever complete for both at once.
func TestFleetATaskLaggingBeyondRetainStillYieldsJobCompleteCheckpoints(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: part of the fleet suite, which runs without -short")
	}
	base := t.TempDir()
	const job = "lag"
	tasks := []string{"fast", "slow"}
	cfg := agentConfig{Socket: filepath.Join(shortDir(t), "ckpt.sock"), StorageDir: filepath.Join(base, "storage"), Job: job,
		LocalDir: filepath.Join(base, "local"), AllowRoots: []string{base}, Extra: []string{"--retain", "2"}}
	startAgent(t, "agent", cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const lag, last = 3, 10
	for n := uint64(1); n <= last; n++ {
		if err := fleetSend(ctx, t, c, base, "fast", n, tasks); err != nil {
			t.Fatalf("fast %d: %v", n, err)
		}
		if n > lag {
			if err := fleetSend(ctx, t, c, base, "slow", n-lag, tasks); err != nil {
				t.Fatalf("slow %d: %v", n-lag, err)
			}
		}
	}
	// Both tasks reported checkpoints 1 to last-lag completed.
	var list []fleetListEntry
	ckptJSON(t, &list, "list", "--storage", cfg.storageURL(), "--job", job, "--json")
	var listed []string
	complete := 0
	for _, e := range list {
		listed = append(listed, fmt.Sprintf("%s/%d(job_complete=%v)", e.Task, e.Checkpoint, e.JobComplete))
		if e.JobComplete {
			complete++
		}
	}
	t.Logf("both tasks completed checkpoints 1..%d (the slow one %d behind); list: %s", last-lag, lag, strings.Join(listed, " "))
	if complete == 0 {
		t.Errorf("every task reported checkpoints 1..%d completed, yet the job has no job-complete checkpoint: "+
			"the fast task retired each N (keeping its %d newest) before the slow task committed N, so restore --job-consistent has nothing to restore", last-lag, 2)
	}
}
