package restore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
)

// RefreshOptions says which task a warm standby follows, and where.
type RefreshOptions struct {
	Store     storage.Store
	Job, Task string
	// LocalDir is the standby agent's local dir: the copy is kept there,
	// where `ckpt restore --local-dir` on this node finds it.
	LocalDir string
	// Parallelism bounds concurrent file transfers (default 2: a standby
	// yields to the node's own work).
	Parallelism int
	// MeasureFailover, once the copy is current, times the restore a
	// failover on this node would run: from the copy into a scratch
	// directory beside it, every byte verified; the scratch is removed.
	MeasureFailover bool
}

// RefreshResult is what one refresh did.
type RefreshResult struct {
	// Held is the checkpoint the local copy holds after the refresh (0:
	// none); Newest the checkpoint it follows: the task's newest complete
	// one, or its newest job-complete one when that lists its job's tasks.
	Held, Newest uint64
	// Lag is how long ago Newest was committed if the copy does not hold it
	// (the refresh failed or had nothing to hold yet), else 0.
	Lag time.Duration
	// Fetched is the restore that brought the copy up to date; nil when it
	// was already.
	Fetched *Result
	// Failover is the measured failover restore (MeasureFailover), nil
	// when not measured.
	Failover *Result
}

// Refresh brings the local copy of a task this node does not own to the
// newest checkpoint it follows (see RefreshResult.Newest), taking every
// file it already holds from its older copy and fetching only the rest,
// every byte verified as a restore does. It records no takeover: the task
// does not move here until a restore for the app says so; that restore
// then finds the copy and is local.
func Refresh(ctx context.Context, o RefreshOptions) (*RefreshResult, error) {
	if o.Parallelism < 1 {
		o.Parallelism = 2
	}
	ls, err := localrecovery.Open(o.LocalDir, o.Job)
	if err != nil {
		return nil, err
	}
	res := &RefreshResult{}
	if l, err := ls.Latest(o.Task); err == nil && l != nil {
		res.Held = l.Checkpoint
	}
	n, created, err := following(ctx, o.Store, o.Job, o.Task)
	if err != nil || n == 0 {
		return res, err
	}
	res.Newest = n
	if res.Held >= n {
		return res, measure(ctx, o, res)
	}
	res.Lag = max(time.Since(created), 0)
	target := filepath.Join(o.LocalDir, fmt.Sprintf(".standby-%s-%d", o.Task, n))
	if err := os.RemoveAll(target); err != nil {
		return res, fmt.Errorf("standby of %s: %w", o.Task, err)
	}
	r, err := Run(ctx, Options{Store: o.Store, Job: o.Job, Task: o.Task, Checkpoint: n, Target: target,
		LocalDir: o.LocalDir, Parallelism: o.Parallelism, TrustUnchangedLocal: true, Standby: true})
	if r != nil {
		r.Wait()
	}
	// The local copy holds hard links to the shared files and copies of
	// the private ones: the restored tree itself is not needed.
	if rerr := os.RemoveAll(target); rerr != nil && err == nil {
		err = fmt.Errorf("standby of %s: %w", o.Task, rerr)
	}
	if err != nil {
		return res, err
	}
	if r.LocalRecordError != "" {
		return res, fmt.Errorf("standby of %s: %s", o.Task, r.LocalRecordError)
	}
	res.Held, res.Lag, res.Fetched = n, 0, r
	return res, measure(ctx, o, res)
}

// measure runs the failover restore of the held copy into scratch, if
// asked: a restore with the local dir, as the init container's, except
// that it records no move of the task.
func measure(ctx context.Context, o RefreshOptions, res *RefreshResult) error {
	if !o.MeasureFailover || res.Held == 0 {
		return nil
	}
	target := filepath.Join(o.LocalDir, fmt.Sprintf(".failover-%s-%d", o.Task, res.Held))
	if err := os.RemoveAll(target); err != nil {
		return fmt.Errorf("standby of %s: %w", o.Task, err)
	}
	r, err := Run(ctx, Options{Store: o.Store, Job: o.Job, Task: o.Task, Checkpoint: res.Held, Target: target,
		LocalDir: o.LocalDir, Parallelism: 8, Standby: true})
	if r != nil {
		r.Wait()
	}
	if rerr := os.RemoveAll(target); rerr != nil && err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("standby of %s: measure the failover restore: %w", o.Task, err)
	}
	res.Failover = r
	return nil
}

// following returns the checkpoint a standby of task holds: the newest
// complete one, or, when that one lists its job's tasks, the newest
// job-complete one (0: none yet), with its commit time.
func following(ctx context.Context, s storage.Store, job, task string) (uint64, time.Time, error) {
	cat, err := manifests.Scan(ctx, s, job, task)
	if err != nil {
		return 0, time.Time{}, err
	}
	refs := cat.Retained(task)
	if len(refs) == 0 {
		return 0, time.Time{}, nil
	}
	newest := refs[len(refs)-1]
	m, err := manifests.LoadRef(ctx, s, job, newest)
	if err != nil {
		return 0, time.Time{}, err
	}
	if m.Tasks == nil {
		return newest.Checkpoint, m.Created, nil
	}
	n, err := manifests.NewestJobComplete(ctx, s, job, task)
	if err != nil || n == 0 {
		return 0, time.Time{}, err
	}
	for _, r := range refs {
		if r.Checkpoint == n {
			jm, err := manifests.LoadRef(ctx, s, job, r)
			if err != nil {
				return 0, time.Time{}, err
			}
			return n, jm.Created, nil
		}
	}
	return n, newest.Created, nil
}
