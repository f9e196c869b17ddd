package restore

import (
	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
)

// SkipIfPresent is the start of a restore with IfNotExists that needs no
// storage: when the target already holds a store it returns the result of
// a restore that does nothing, without any storage call (a bucket outage
// or a refused role must not keep a pod whose store is on its volume from
// starting), and, with localDir, notes in the local dir that the store is
// on this volume (localrecovery.Store.RecordPresent), so that the agent
// there takes the task over as a restoring takeover would. It returns
// nil, nil when the target is absent or empty: the restore must go on.
func SkipIfPresent(job, task, target, localDir string) (*Result, error) {
	if err := manifests.ValidName("job", job); err != nil {
		return nil, err
	}
	if err := manifests.ValidName("task", task); err != nil {
		return nil, err
	}
	o := Options{Job: job, Task: task, Target: target}
	clean, err := prepare(&o)
	if err != nil {
		return nil, err
	}
	skip, err := checkTarget(nil, clean, true)
	if skip == nil || err != nil {
		return nil, err
	}
	if localDir != "" {
		ls, err := localrecovery.Open(localDir, job)
		if err == nil {
			err = ls.RecordPresent(task)
		}
		if err != nil {
			skip.LocalRecordError = err.Error()
		}
	}
	return skip, nil
}
