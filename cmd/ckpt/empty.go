package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
)

// nothingStored says that job (or task of job, when task is not "") holds
// no checkpoint in st, and names what is there instead: the job's tasks
// that hold checkpoints, else the jobs of the store that do, so that a
// misspelled --job or --task is seen at once. Called only when a scan
// found nothing: it lists the job, and the store (bounded) when the job
// is empty.
func nothingStored(ctx context.Context, st storage.Store, job, task string) (string, error) {
	if task != "" {
		cat, err := manifests.Scan(ctx, st, job, "")
		if err != nil {
			return "", err
		}
		var tasks []string
		for _, r := range cat.Refs {
			if len(tasks) == 0 || tasks[len(tasks)-1] != r.Task {
				tasks = append(tasks, r.Task)
			}
		}
		if len(tasks) > 0 {
			return fmt.Sprintf("task %q of job %q holds no checkpoint in %s; the job's tasks with checkpoints: %s (check --task)",
				task, job, st, strings.Join(tasks, ", ")), nil
		}
	}
	jobs, partial, err := manifests.Jobs(ctx, st, 0)
	if err != nil {
		return "", err
	}
	msg := fmt.Sprintf("job %q holds no checkpoint in %s", job, st)
	switch {
	case len(jobs) == 0 && !partial:
		return msg + "; no job there holds one (check --storage)", nil
	case len(jobs) == 0:
		return msg + fmt.Sprintf("; no job holds one among the first %d objects there (check --storage and --job)", manifests.JobsListLimit), nil
	case partial:
		return msg + fmt.Sprintf("; jobs with checkpoints among the first %d objects there: %s (check --job)", manifests.JobsListLimit, strings.Join(jobs, ", ")), nil
	}
	return msg + "; jobs with checkpoints there: " + strings.Join(jobs, ", ") + " (check --job)", nil
}
