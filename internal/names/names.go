// Package names checks the names ckpt gives to jobs and tasks and the task
// lists of job-wide checkpoints, in one place for the socket protocol and
// the manifests. It needs nothing but the standard library, so the client
// side of the protocol stays light.
package names

import (
	"fmt"
	"regexp"
)

// re is the pattern of job and task names.
var re = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// Valid checks a job or task name (what says which, for the message):
// [A-Za-z0-9][A-Za-z0-9._-]{0,127}.
func Valid(what, name string) error {
	if !re.MatchString(name) {
		return fmt.Errorf("invalid %s name %q: use 1-128 of A-Z a-z 0-9 . _ - starting with a letter or digit", what, name)
	}
	return nil
}

// MaxTasks bounds the tasks list of a job-wide checkpoint (a request's
// "tasks", a manifest's Tasks). A request line is at most 1 MiB, which
// holds fewer names of the longest kind anyway.
const MaxTasks = 10000

// CheckTasks checks the tasks list of a job-wide checkpoint of task: at
// most MaxTasks entries, every one a valid task name, none twice, and task
// among them. The order does not matter.
func CheckTasks(task string, tasks []string) error {
	if len(tasks) > MaxTasks {
		return fmt.Errorf("tasks lists %d tasks, more than the %d allowed", len(tasks), MaxTasks)
	}
	seen := make(map[string]bool, len(tasks))
	for _, t := range tasks {
		if err := Valid("task", t); err != nil {
			return fmt.Errorf("tasks: %w", err)
		}
		if seen[t] {
			return fmt.Errorf("tasks lists task %q twice", t)
		}
		seen[t] = true
	}
	if !seen[task] {
		return fmt.Errorf("tasks does not list the requesting task %q: it lists every task of the job at this checkpoint", task)
	}
	return nil
}
