package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ckpt-io/ckpt/client"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage"
)

// storedKeys lists every object in the harness's storage.
func (h *harness) storedKeys() []string {
	var keys []string
	h.store.List(context.Background(), "", func(o storage.ObjectInfo) error { keys = append(keys, o.Key); return nil })
	return keys
}

func TestABadTasksListIsABadRequestAndWritesNothing(t *testing.T) {
	h := start(t, nil, nil)
	r := h.raw()
	dir := h.snapshot("s", map[string]int{"000001.sst": 1000, "CURRENT": 10})
	many := make([]string, manifests.MaxJobTasks+1)
	for i := range many {
		many[i] = fmt.Sprintf("%q", fmt.Sprint("t", i))
	}
	for name, tasks := range map[string]string{
		"without the requesting task": `["t2","t3"]`,
		"empty":                       `[]`,
		"duplicates":                  `["t1","t2","t2"]`,
		"not a task name":             `["t1","../x"]`,
		"too many":                    "[" + strings.Join(many, ",") + "]",
		"not a list":                  `"t1"`,
	} {
		line := fmt.Sprintf(`{"op":"checkpoint","task":"t1","checkpoint":1,"dir":%q,"tasks":%s}`, dir, tasks)
		ev := r.send(line)
		e, _ := ev["error"].(map[string]any)
		if e == nil || e["code"] != "bad_request" {
			t.Errorf("%s: got %v, want bad_request", name, ev)
		}
	}
	if keys := h.storedKeys(); len(keys) != 0 {
		t.Fatalf("a refused request wrote %v", keys)
	}
	if entries, _ := os.ReadDir(filepath.Join(h.local, "job")); len(entries) != 0 {
		t.Fatalf("a refused request left a local copy: %v", entries)
	}
}

// checkpointJob runs checkpoint n of task listing tasks, to completion.
func (h *harness) checkpointJob(c *client.Client, task string, n uint64, tasks ...string) {
	h.t.Helper()
	dir := h.snapshot(fmt.Sprintf("%s-%d", task, n), map[string]int{fmt.Sprintf("%06d.sst", n): 2000 + int(n), "CURRENT": 16})
	p, err := c.Send(ctxT(h.t), client.Request{Task: task, Checkpoint: n, Dir: dir, Tasks: tasks})
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := p.Wait(ctxT(h.t)); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) retained(task string) []uint64 {
	h.t.Helper()
	cat, err := manifests.Scan(context.Background(), h.store, "job", task)
	if err != nil {
		h.t.Fatal(err)
	}
	var out []uint64
	for _, r := range cat.Retained(task) {
		out = append(out, r.Checkpoint)
	}
	return out
}

// With --retain 1, a task keeps its newest job-complete checkpoint while
// newer ones are incomplete, records its tasks list, and a job-consistent
// restore finds it.
func TestRetainOneKeepsTheNewestJobCompleteCheckpoint(t *testing.T) {
	var h *harness
	h = start(t, nil, func(c *Config) {
		c.Retain = 1
		c.GCInterval = -1
		c.Restore = func(ctx context.Context, r RestoreRequest) (*restore.Result, error) {
			return restore.Run(ctx, restore.Options{Store: h.store, Job: "job", Task: r.Task, Checkpoint: r.Checkpoint,
				JobConsistent: r.JobConsistent, Target: r.Target, TargetParent: r.Parent})
		}
	})
	c := h.dial()
	for n := uint64(1); n <= 2; n++ {
		h.checkpointJob(c, "a", n, "b", "a")
		h.checkpointJob(c, "b", n, "a", "b")
	}
	m, err := manifests.Load(context.Background(), h.store, "job", "a", 2)
	if err != nil || !slices.Equal(m.Tasks, []string{"a", "b"}) {
		t.Fatalf("manifest tasks %v %v, want [a b] sorted", m, err)
	}
	// a committed 2 before b did: it kept 1, then job-complete.
	if got := h.retained("a"); fmt.Sprint(got) != "[1 2]" {
		t.Fatalf("a retained %v, want [1 2]", got)
	}
	if got := h.retained("b"); fmt.Sprint(got) != "[2]" {
		t.Fatalf("b retained %v, want [2]", got)
	}
	h.checkpointJob(c, "a", 3, "a", "b")
	h.checkpointJob(c, "a", 4, "a", "b")
	// 2 is the newest job-complete checkpoint; 3 and 4 are job-wide
	// checkpoints b may still complete (manifests.Pending), kept for the
	// pending window whatever --retain says.
	if got := h.retained("a"); fmt.Sprint(got) != "[2 3 4]" {
		t.Fatalf("a retained %v after incomplete 3 and 4, want [2 3 4]", got)
	}
	if got := h.retained("b"); fmt.Sprint(got) != "[2]" {
		t.Fatalf("b retained %v, want [2]", got)
	}
	r := h.raw()
	target := filepath.Join(h.root, "restored")
	ev := r.send(fmt.Sprintf(`{"op":"restore","task":"a","target":%q,"job_consistent":true}`, target))
	if ev["event"] != "restored" || ev["checkpoint"] != float64(2) {
		t.Fatalf("job-consistent restore: %v, want checkpoint 2", ev)
	}
	ev = r.send(fmt.Sprintf(`{"op":"restore","task":"a","target":%q,"job_consistent":true,"checkpoint":2}`, target+"2"))
	if e, _ := ev["error"].(map[string]any); e == nil || e["code"] != "bad_request" {
		t.Fatalf("job_consistent with a checkpoint: %v, want bad_request", ev)
	}
	// b completes 4 (it skipped 3): 4 is job-complete; a's 2 and 3 go at
	// its next commit.
	h.checkpointJob(c, "b", 4, "a", "b")
	if got := h.retained("b"); fmt.Sprint(got) != "[4]" {
		t.Fatalf("b retained %v, want [4]", got)
	}
	h.checkpointJob(c, "a", 5, "a", "b")
	if got := h.retained("a"); fmt.Sprint(got) != "[4 5]" {
		t.Fatalf("a retained %v, want [4 5]", got)
	}
}
