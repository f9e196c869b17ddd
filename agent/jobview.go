package agent

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/telemetry"
)

// JobViewInterval is the least time between two scans of the job for the
// status page (telemetry.SetJobSource): the page is drawn from the last
// scan, and scans only while someone looks at it.
const JobViewInterval = 10 * time.Second

// ownerCache keeps the ownership records the job view has read: records
// are created once and never rewritten, so each is read at most once.
type ownerCache struct {
	mu   sync.Mutex
	recs map[manifests.Ref]manifests.Owner // Task and Checkpoint (= epoch) only
}

// jobView scans the whole job, every task included, and says what the
// status page shows of it: the newest job-complete checkpoint, the tasks
// it leaves behind, each task's newest checkpoint and its owner (node and
// epoch). The cost is one listing of the job's tasks prefix, the
// manifests the job-completeness decision needs (newest first, stopping
// at the first job-complete checkpoint), and the ownership records the
// listing does not already give, each read once per agent.
func (a *Agent) jobView(ctx context.Context) telemetry.JobView {
	v := telemetry.JobView{ScannedAt: time.Now()}
	cat, err := manifests.Scan(ctx, a.cfg.Store, a.cfg.Job, "")
	if err != nil {
		v.Error = err.Error()
		return v
	}
	st, complete, err := manifests.NewJobReader(a.cfg.Store, cat).NewestJobCheckpoint(ctx)
	if err != nil {
		v.Error = fmt.Sprintf("find the newest job-complete checkpoint: %v", err)
		return v
	}
	if complete {
		v.Complete, v.CompleteTasks = st.Checkpoint, st.Tasks
	}
	newest := map[string]uint64{}
	for _, r := range cat.Retained("") {
		newest[r.Task] = max(newest[r.Task], r.Checkpoint)
		v.Newest = max(v.Newest, r.Checkpoint)
	}
	names := map[string]bool{}
	for t := range newest {
		names[t] = true
	}
	for t := range cat.Owners {
		names[t] = true
	}
	for t := range cat.OwnerProblems {
		names[t] = true
	}
	for _, t := range v.CompleteTasks {
		names[t] = true
	}
	for t := range names {
		jt := telemetry.JobTask{Task: t, Newest: newest[t], Lag: v.Newest - newest[t]}
		if complete {
			switch {
			case !st.Includes(t) && jt.Newest < v.Complete:
				jt.Behind = true
				jt.Reason = fmt.Sprintf("its newest checkpoint %d is older than job-complete checkpoint %d", jt.Newest, v.Complete)
				if jt.Newest == 0 {
					jt.Reason = fmt.Sprintf("no complete checkpoint; job-complete checkpoint %d does not list it", v.Complete)
				}
			case !st.Includes(t):
				jt.Behind = true
				jt.Reason = fmt.Sprintf("job-complete checkpoint %d does not list it", v.Complete)
			}
		}
		if p := cat.OwnerProblems[t]; p != nil {
			jt.Problem = p.Error()
		} else if ow := cat.Owners[t]; ow.Latest() > 0 {
			jt.Epoch = ow.Latest()
			rec, err := a.owner(ctx, ow, jt.Epoch)
			if err != nil {
				jt.Problem = err.Error()
			}
			jt.Node = rec.Node
		}
		v.Tasks = append(v.Tasks, jt)
	}
	sort.Slice(v.Tasks, func(i, j int) bool { return v.Tasks[i].Task < v.Tasks[j].Task })
	return v
}

// owner returns the ownership record of epoch of ow's task: from the scan
// when it read it, else from the cache, else read once.
func (a *Agent) owner(ctx context.Context, ow *manifests.Owners, epoch uint64) (manifests.Owner, error) {
	if r, ok := ow.Records[epoch]; ok {
		return r, nil
	}
	key := manifests.Ref{Task: ow.Task, Checkpoint: epoch}
	c := &a.owners
	c.mu.Lock()
	r, ok := c.recs[key]
	c.mu.Unlock()
	if ok {
		return r, nil
	}
	r, err := manifests.ReadOwner(ctx, a.cfg.Store, a.cfg.Job, ow.Task, epoch)
	if err != nil {
		return manifests.Owner{}, err
	}
	c.mu.Lock()
	if c.recs == nil {
		c.recs = map[manifests.Ref]manifests.Owner{}
	}
	c.recs[key] = r
	c.mu.Unlock()
	return r, nil
}
