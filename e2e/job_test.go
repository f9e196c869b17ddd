package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/client"
)

// jobListEntry is an element of `ckpt list --json` with the job fields.
type jobListEntry struct {
	Task                string `json:"task"`
	Checkpoint          uint64 `json:"checkpoint"`
	JobComplete         *bool  `json:"job_complete"`
	JobIncompleteReason string `json:"job_incomplete_reason"`
}

// jobDrill is `ckpt drill --job J --json`.
type jobDrill struct {
	Checkpoint *uint64 `json:"checkpoint"`
	Tasks      *int    `json:"tasks"`
	Bytes      *int64  `json:"bytes"`
	DurationMS *int64  `json:"duration_ms"`
	Verified   *bool   `json:"verified"`
}

// One agent serves two tasks of a job; checkpoints 1 and 2 complete for
// both, 3 only for one. list says which are job-complete and why not,
// restore --job-consistent restores 2 (and nothing, successfully, for a
// job without job-wide checkpoints with --if-checkpoint-exists), and
// drill --job restores both tasks of 2.
func TestRestoreJobConsistentPicksTheNewestCheckpointEveryTaskCompleted(t *testing.T) {
	base := t.TempDir()
	storageDir := filepath.Join(base, "storage")
	apps := filepath.Join(base, "apps")
	const job = "jobwide"
	cfg := agentConfig{Socket: filepath.Join(base, "ckpt.sock"), StorageDir: storageDir, Job: job,
		LocalDir: filepath.Join(apps, "local"), AllowRoots: []string{apps}, Extra: []string{"--retain", "1"}}
	if err := os.MkdirAll(apps, 0o755); err != nil {
		t.Fatal(err)
	}
	startAgent(t, "agent", cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tasks := []string{"job-0", "job-1"}
	checkpoint := func(task string, n uint64) {
		t.Helper()
		dir := filepath.Join(apps, fmt.Sprintf("%s-%d", task, n))
		writeFencingSnapshot(t, dir, n*100+uint64(len(task)))
		p, err := c.Send(ctx, client.Request{Task: task, Checkpoint: n, Dir: dir, Tasks: tasks})
		if err != nil {
			t.Fatalf("checkpoint %d of %s: %v", n, task, err)
		}
		if _, err := p.Wait(ctx); err != nil {
			t.Fatalf("checkpoint %d of %s: %v", n, task, err)
		}
	}
	for n := uint64(1); n <= 2; n++ {
		for _, task := range tasks {
			checkpoint(task, n)
		}
	}
	checkpoint("job-0", 3)
	storage := "file://" + storageDir

	var list []jobListEntry
	ckptJSON(t, &list, "list", "--storage", storage, "--job", job, "--json")
	for _, e := range list {
		if e.JobComplete == nil {
			t.Fatalf("list --json entry without job_complete: %+v", e)
		}
		want := e.Checkpoint == 2
		if *e.JobComplete != want {
			t.Errorf("%s checkpoint %d: job_complete %v, want %v", e.Task, e.Checkpoint, *e.JobComplete, want)
		}
		if e.Checkpoint == 3 && !strings.Contains(e.JobIncompleteReason, "job-1") {
			t.Errorf("checkpoint 3's reason %q does not name the task without it", e.JobIncompleteReason)
		}
	}
	if human := runCkpt(t, "list", "--storage", storage, "--job", job); human.Code != 0 || !strings.Contains(string(human.Stdout), "checkpoint 3 is not job-complete") {
		t.Errorf("list: exit %d, no line about checkpoint 3:\n%s", human.Code, human.Stdout)
	}

	for _, task := range tasks {
		var res restoreResult
		target := filepath.Join(base, "restored-"+task)
		ckptJSON(t, &res, "restore", "--storage", storage, "--job", job, "--task", task, "--target", target, "--job-consistent", "--json")
		if !res.Restored || res.Checkpoint != 2 || res.Task != task {
			t.Fatalf("restore --job-consistent of %s: %+v, want checkpoint 2", task, res)
		}
		want := filepath.Join(apps, fmt.Sprintf("%s-%d", task, 2), "CURRENT")
		if a, b := readFile(t, want), readFile(t, filepath.Join(target, "CURRENT")); a != b {
			t.Fatalf("restored CURRENT differs from the snapshot's")
		}
	}
	// Plain restore takes the newest: 3 for job-0.
	var plain restoreResult
	ckptJSON(t, &plain, "restore", "--storage", storage, "--job", job, "--task", "job-0", "--target", filepath.Join(base, "plain"), "--json")
	if plain.Checkpoint != 3 {
		t.Fatalf("plain restore: checkpoint %d, want 3", plain.Checkpoint)
	}
	if r := runCkpt(t, "restore", "--storage", storage, "--job", job, "--task", "job-0", "--target", filepath.Join(base, "x"), "--job-consistent", "--checkpoint", "2"); r.Code != 2 {
		t.Errorf("--job-consistent with --checkpoint: exit %d, want 2", r.Code)
	}

	var drill jobDrill
	ckptJSON(t, &drill, "drill", "--storage", storage, "--job", job, "--json")
	if drill.Checkpoint == nil || *drill.Checkpoint != 2 || drill.Tasks == nil || *drill.Tasks != 2 ||
		drill.Bytes == nil || *drill.Bytes <= 0 || drill.DurationMS == nil || drill.Verified == nil || !*drill.Verified {
		t.Fatalf("drill --job: %+v", drill)
	}

	// A job whose checkpoints list no tasks has no job-complete checkpoint.
	other := agentConfig{Socket: filepath.Join(base, "other.sock"), StorageDir: storageDir, Job: "plain",
		LocalDir: filepath.Join(apps, "local-other"), AllowRoots: []string{apps}}
	startAgent(t, "other", other)
	dir := filepath.Join(apps, "plain-1")
	writeFencingSnapshot(t, dir, 7)
	if out := triggerAsync(other.Socket, "p", 1, dir); out.err != nil || out.code != 0 {
		t.Fatalf("trigger: %+v", out)
	}
	var skipped restoreResult
	ckptJSON(t, &skipped, "restore", "--storage", storage, "--job", "plain", "--task", "p", "--target", filepath.Join(base, "none"),
		"--job-consistent", "--if-checkpoint-exists", "--json")
	if skipped.Restored || skipped.Reason == "" {
		t.Fatalf("restore --job-consistent --if-checkpoint-exists without a job-complete checkpoint: %+v", skipped)
	}
	var plainList []jobListEntry
	ckptJSON(t, &plainList, "list", "--storage", storage, "--job", "plain", "--json")
	if len(plainList) != 1 || plainList[0].JobComplete == nil || *plainList[0].JobComplete {
		t.Fatalf("list of a job without tasks lists: %+v", plainList)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
