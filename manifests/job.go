package manifests

import (
	"context"
	"errors"
	"fmt"
	"github.com/ckpt-io/ckpt/internal/names"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ckpt-io/ckpt/storage"
)

// MaxJobTasks bounds the tasks list of a job-wide checkpoint.
const MaxJobTasks = names.MaxTasks

// CheckTasks checks the tasks list of a job-wide checkpoint of task (see
// names.CheckTasks).
func CheckTasks(task string, tasks []string) error { return names.CheckTasks(task, tasks) }

// JobPendingWindow is how long retention keeps a job-wide checkpoint newer
// than the task's newest job-complete one, whatever --retain says: a task
// that lags behind the others (a slow node, an agent catching up after a
// restart) can still complete it, so the job gets its next job-complete
// checkpoint. It plays the part of Flink's checkpoint timeout.
const JobPendingWindow = 10 * time.Minute

// Pending returns the checkpoints of ms (one task's retained manifests)
// that retention keeps while the job may still complete them: those that
// list tasks, are newer than newestComplete (the task's newest job-complete
// checkpoint known, 0 for none) and were created less than
// JobPendingWindow before now.
func Pending(ms []*Manifest, newestComplete uint64, now time.Time) []uint64 {
	var out []uint64
	for _, m := range ms {
		if m.Tasks != nil && m.Checkpoint > newestComplete && now.Sub(m.Created) < JobPendingWindow {
			out = append(out, m.Checkpoint)
		}
	}
	return out
}

// SortedTasks returns a sorted copy of tasks (nil stays nil).
func SortedTasks(tasks []string) []string {
	if tasks == nil {
		return nil
	}
	out := slices.Clone(tasks)
	sort.Strings(out)
	return out
}

// JobStatus says whether checkpoint N of a job is job-complete: every task
// its manifests list has a complete, retained manifest N, and all of them
// list the same tasks. It is derived from the manifests, never counted.
type JobStatus struct {
	Checkpoint uint64
	// Tasks is the tasks list the manifests N give (the first one's, in
	// task order, when they disagree); nil when none lists tasks.
	Tasks    []string
	Complete bool
	// Reason says why the checkpoint is not job-complete.
	Reason string
}

// Includes reports whether task is one of the checkpoint's tasks.
func (s JobStatus) Includes(task string) bool {
	_, ok := slices.BinarySearch(s.Tasks, task)
	return ok
}

// JobCheckpointStatus is the pure job-completeness decision for checkpoint
// n. lists holds one entry per task with a complete, retained manifest n:
// that manifest's Tasks (nil when it lists none).
//
// The first manifest in task order that lists tasks gives the job's tasks
// S. Checkpoint n is job-complete when every task of S has a manifest n,
// and every manifest n that lists tasks lists S, and every task of S lists
// tasks. A manifest n of a task outside S that lists none is ignored (a
// task that takes no part in job-wide checkpoints).
func JobCheckpointStatus(n uint64, lists map[string][]string) JobStatus {
	names := make([]string, 0, len(lists))
	for t := range lists {
		names = append(names, t)
	}
	sort.Strings(names)
	st := JobStatus{Checkpoint: n}
	first := ""
	for _, t := range names {
		if lists[t] != nil {
			first, st.Tasks = t, lists[t]
			break
		}
	}
	if st.Tasks == nil {
		st.Reason = fmt.Sprintf("checkpoint %d lists no tasks: not a job-wide checkpoint", n)
		return st
	}
	if r := missingReason(n, st.Tasks, func(t string) bool { _, ok := lists[t]; return ok }); r != "" {
		st.Reason = r
		return st
	}
	for _, t := range names {
		l := lists[t]
		switch {
		case l == nil && st.Includes(t):
			st.Reason = fmt.Sprintf("tasks disagree at checkpoint %d: %s lists %d tasks, %s lists none", n, first, len(st.Tasks), t)
			return st
		case l != nil && !slices.Equal(l, st.Tasks):
			st.Reason = fmt.Sprintf("tasks disagree at checkpoint %d: %s lists %s, %s lists %s", n, first, brief(st.Tasks), t, brief(l))
			return st
		}
	}
	st.Complete = true
	return st
}

// missingReason names the tasks of tasks without a manifest n ("" if none).
func missingReason(n uint64, tasks []string, has func(string) bool) string {
	var missing []string
	for _, t := range tasks {
		if !has(t) {
			missing = append(missing, t)
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf("%d of %d tasks have no complete checkpoint %d: %s", len(missing), len(tasks), n, brief(missing))
}

// brief shows a list of task names, at most a few of them.
func brief(tasks []string) string {
	const show = 5
	if len(tasks) <= show {
		return "[" + strings.Join(tasks, " ") + "]"
	}
	return fmt.Sprintf("[%s ... %d more]", strings.Join(tasks[:show], " "), len(tasks)-show)
}

// JobReader answers job completeness from a scan of a whole job (Scan with
// task ""), reading each manifest it needs at most once and only the
// manifests of the checkpoint numbers it is asked about. It is not safe for
// concurrent use.
type JobReader struct {
	s     storage.Store
	job   string
	cat   *Catalog
	byN   map[uint64][]string // sorted tasks with a retained manifest n
	lists map[Ref][]string    // manifests read: their Tasks
	bad   map[Ref]string      // manifests that could not be used
	done  map[uint64]JobStatus
}

// NewJobReader prepares a JobReader over cat, a scan of the whole job.
func NewJobReader(s storage.Store, cat *Catalog) *JobReader {
	r := &JobReader{s: s, job: cat.Job, cat: cat, byN: map[uint64][]string{}, lists: map[Ref][]string{},
		bad: map[Ref]string{}, done: map[uint64]JobStatus{}}
	for _, ref := range cat.Retained("") {
		r.byN[ref.Checkpoint] = append(r.byN[ref.Checkpoint], ref.Task) // refs are sorted by task
	}
	return r
}

// Add gives the reader a manifest already read, so that it is not read
// again (it must be one of the catalog's retained manifests).
func (r *JobReader) Add(m *Manifest) {
	r.lists[Ref{Task: m.Task, Checkpoint: m.Checkpoint}] = m.Tasks
}

// Has reports whether task has a retained manifest n in the catalog.
func (r *JobReader) Has(task string, n uint64) bool {
	_, ok := slices.BinarySearch(r.byN[n], task)
	return ok
}

// list returns the Tasks of task's manifest n; ok is false when the
// manifest is gone since the scan, and a non-empty problem names an
// unusable manifest.
func (r *JobReader) list(ctx context.Context, task string, n uint64) (tasks []string, ok bool, problem string, err error) {
	key := Ref{Task: task, Checkpoint: n}
	if l, ok := r.lists[key]; ok {
		return l, true, "", nil
	}
	if p, ok := r.bad[key]; ok {
		return nil, p != "", p, nil
	}
	// The scan already applied the fencing rule: read the valid manifest
	// it found, without listing the task again.
	ref, err := r.cat.Find(task, n)
	var m *Manifest
	if err == nil {
		m, _, err = WalkRef(ctx, r.s, r.job, ref, nil) // the tasks list is in the header
	}
	var unreadable *UnreadableError
	switch {
	case errors.As(err, &unreadable):
		r.bad[key] = unreadable.Error()
		return nil, true, unreadable.Error(), nil
	case errors.Is(err, storage.ErrNotFound):
		r.bad[key] = ""
		return nil, false, "", nil
	case err != nil:
		return nil, false, "", err
	}
	r.lists[key] = m.Tasks
	return m.Tasks, true, "", nil
}

// Status is JobCheckpointStatus for checkpoint n, from the manifests in
// storage. It stops reading as soon as the answer is known: once the first
// manifest (in task order) that lists tasks is read, a listed task without
// a manifest n makes n incomplete without reading the others.
func (r *JobReader) Status(ctx context.Context, n uint64) (JobStatus, error) {
	if st, ok := r.done[n]; ok {
		return st, nil
	}
	lists := map[string][]string{}
	var first []string
	for _, t := range r.byN[n] {
		l, ok, problem, err := r.list(ctx, t, n)
		if err != nil {
			return JobStatus{}, err
		}
		if problem != "" {
			st := JobStatus{Checkpoint: n, Reason: fmt.Sprintf("task %s's checkpoint %d cannot be used: %s", t, n, problem)}
			r.done[n] = st
			return st, nil
		}
		if !ok {
			continue
		}
		lists[t] = l
		if first == nil && l != nil {
			first = l
			if reason := missingReason(n, first, func(t string) bool { return r.Has(t, n) }); reason != "" {
				st := JobStatus{Checkpoint: n, Tasks: first, Reason: reason}
				r.done[n] = st
				return st, nil
			}
		}
	}
	st := JobCheckpointStatus(n, lists)
	r.done[n] = st
	return st, nil
}

// NewestComplete returns the newest job-complete checkpoint that includes
// task, among task's retained checkpoints, or 0 when there is none.
func (r *JobReader) NewestComplete(ctx context.Context, task string) (uint64, error) {
	var ns []uint64
	for n, tasks := range r.byN {
		if _, ok := slices.BinarySearch(tasks, task); ok {
			ns = append(ns, n)
		}
	}
	sort.Slice(ns, func(i, j int) bool { return ns[i] > ns[j] })
	for _, n := range ns {
		st, err := r.Status(ctx, n)
		if err != nil {
			return 0, err
		}
		if st.Complete && st.Includes(task) {
			return n, nil
		}
	}
	return 0, nil
}

// PendingRefs is Pending for refs, one task's retained checkpoints,
// reading the tasks lists of those young enough and newer than
// newestComplete.
func (r *JobReader) PendingRefs(ctx context.Context, refs []Ref, newestComplete uint64, now time.Time) ([]uint64, error) {
	var out []uint64
	for _, ref := range refs {
		if ref.Checkpoint <= newestComplete || now.Sub(ref.Created) >= JobPendingWindow {
			continue
		}
		tasks, _, _, err := r.list(ctx, ref.Task, ref.Checkpoint)
		if err != nil {
			return nil, err
		}
		if tasks != nil {
			out = append(out, ref.Checkpoint)
		}
	}
	return out, nil
}

// NewestJobCheckpoint returns the status of the newest job-complete
// checkpoint of the whole job (ok false when there is none).
func (r *JobReader) NewestJobCheckpoint(ctx context.Context) (st JobStatus, ok bool, err error) {
	ns := make([]uint64, 0, len(r.byN))
	for n := range r.byN {
		ns = append(ns, n)
	}
	sort.Slice(ns, func(i, j int) bool { return ns[i] > ns[j] })
	for _, n := range ns {
		st, err := r.Status(ctx, n)
		if err != nil {
			return JobStatus{}, false, err
		}
		if st.Complete {
			return st, true, nil
		}
	}
	return JobStatus{}, false, nil
}

// NewestJobComplete scans the whole job and returns the newest job-complete
// checkpoint that includes task (0 when there is none).
func NewestJobComplete(ctx context.Context, s storage.Store, job, task string) (uint64, error) {
	cat, err := Scan(ctx, s, job, "")
	if err != nil {
		return 0, err
	}
	return NewJobReader(s, cat).NewestComplete(ctx, task)
}
