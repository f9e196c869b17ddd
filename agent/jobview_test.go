package agent

import (
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/statuspage"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/telemetry"
)

// Three agents on three nodes share a job's storage: node-a runs tasks a
// and b, node-b runs c and a task d that takes no part in job-wide
// checkpoints, and node-c takes b over with a restore. node-a's status
// page shows the whole job from storage: the newest job-complete
// checkpoint, the task it leaves behind, how far c lags, and each task's
// owner node and epoch, b's being node-c's.
func TestTheStatusPageShowsTheWholeJobFromStorage(t *testing.T) {
	shared := sharedStore(t)
	useShared := func(storage.Store) storage.Store { return shared }
	tel, err := telemetry.New(context.Background(), telemetry.Options{Job: "job", Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	nodeA := start(t, useShared, func(c *Config) { c.Node, c.Telemetry, c.GCInterval = "node-a", tel, -1 })
	nodeB := start(t, useShared, func(c *Config) { c.Node, c.GCInterval = "node-b", -1 })

	// Before any scan the page has no job section; the first view scans.
	if v := tel.View(); v.JobStatus != nil {
		t.Fatalf("job status before any scan: %+v", v.JobStatus)
	}
	ca, cb := nodeA.dial(), nodeB.dial()
	for n := uint64(1); n <= 2; n++ {
		nodeA.checkpointJob(ca, "a", n, "a", "b", "c")
		nodeA.checkpointJob(ca, "b", n, "a", "b", "c")
		nodeB.checkpointJob(cb, "c", n, "a", "b", "c")
	}
	nodeB.checkpointJob(cb, "d", 1) // lists no tasks: not part of job-wide checkpoint 2
	nodeA.checkpointJob(ca, "a", 3, "a", "b", "c")
	nodeA.checkpointJob(ca, "b", 3, "a", "b", "c")

	nodeC := start(t, useShared, func(c *Config) {
		c.Node, c.GCInterval = "node-c", -1
		c.Restore = func(ctx context.Context, r RestoreRequest) (*restore.Result, error) {
			return restore.Run(ctx, restore.Options{Store: shared, Job: "job", Task: r.Task, Checkpoint: r.Checkpoint,
				JobConsistent: r.JobConsistent, Target: r.Target, TargetParent: r.Parent})
		}
	})
	target := filepath.Join(nodeC.root, "b")
	if ev := nodeC.raw().send(fmt.Sprintf(`{"op":"restore","task":"b","target":%q,"job_consistent":true}`, target)); ev["event"] != "restored" || ev["checkpoint"] != float64(2) {
		t.Fatalf("node-c restores b: %v, want checkpoint 2", ev)
	}

	srv := httptest.NewServer(tel.Handler(telemetry.ServerOptions{Page: statuspage.Render}))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	page := string(body)

	v := tel.View().JobStatus
	if v == nil || v.Error != "" {
		t.Fatalf("job status after the page was served: %+v", v)
	}
	if v.Complete != 2 || fmt.Sprint(v.CompleteTasks) != "[a b c]" || v.Newest != 3 {
		t.Errorf("job status: complete %d of %v, newest %d; want 2 of [a b c], newest 3", v.Complete, v.CompleteTasks, v.Newest)
	}
	want := map[string]telemetry.JobTask{
		"a": {Task: "a", Newest: 3, Node: "node-a", Epoch: 1},
		"b": {Task: "b", Newest: 3, Node: "node-c", Epoch: 2},
		"c": {Task: "c", Newest: 2, Lag: 1, Node: "node-b", Epoch: 1},
		"d": {Task: "d", Newest: 1, Lag: 2, Behind: true, Node: "node-b", Epoch: 1},
	}
	if len(v.Tasks) != len(want) {
		t.Fatalf("job status tasks %+v, want a, b, c, d", v.Tasks)
	}
	for _, jt := range v.Tasks {
		w := want[jt.Task]
		reason := jt.Reason
		jt.Reason = ""
		if jt != w {
			t.Errorf("task %s: %+v, want %+v", jt.Task, jt, w)
		}
		if jt.Behind && !strings.Contains(reason, "older than job-complete checkpoint 2") {
			t.Errorf("task %s is behind for %q, want its newest checkpoint being older than 2", jt.Task, reason)
		}
	}
	for _, s := range []string{
		`id="job-status" data-complete="2" data-newest="3" data-behind="1"`,
		`data-task="b" data-newest="3" data-lag="0" data-node="node-c" data-epoch="2" data-behind="false"`,
		`data-task="d" data-newest="1" data-lag="2" data-node="node-b" data-epoch="1" data-behind="true"`,
	} {
		if !strings.Contains(page, s) {
			t.Errorf("the status page does not hold %q", s)
		}
	}

	// c catches up: 3 is job-complete; b's new owner is still node-c.
	nodeB.checkpointJob(cb, "c", 3, "a", "b", "c")
	tel.RefreshJob(context.Background())
	if v := tel.View().JobStatus; v.Complete != 3 || v.Tasks[2].Lag != 0 {
		t.Errorf("after c's checkpoint 3: complete %d, c's lag %d; want 3 and 0", v.Complete, v.Tasks[2].Lag)
	}
}
