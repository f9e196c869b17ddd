package telemetry

import (
	"context"
	"sync"
	"time"
)

// JobView is the whole job as storage shows it, every task included (not
// only this agent's): the newest job-complete checkpoint, which tasks are
// behind it, and who owns each task. It comes from a scan of the job's
// checkpoints and ownership records (a JobSource), made at ScannedAt.
type JobView struct {
	ScannedAt time.Time `json:"scanned_at"`
	// Error says why the scan failed; the rest is then empty.
	Error string `json:"error,omitempty"`
	// Complete is the newest job-complete checkpoint (0: none), and
	// CompleteTasks the tasks it lists.
	Complete      uint64   `json:"complete"`
	CompleteTasks []string `json:"complete_tasks,omitempty"`
	// Newest is the newest checkpoint any task has complete.
	Newest uint64    `json:"newest"`
	Tasks  []JobTask `json:"tasks"` // by name
}

// JobTask is one task of a JobView.
type JobTask struct {
	Task string `json:"task"`
	// Newest is the task's newest complete checkpoint (0: none).
	Newest uint64 `json:"newest"`
	// Lag is how many checkpoint numbers Newest is below the job's newest.
	Lag uint64 `json:"lag"`
	// Behind is set for a task the newest job-complete checkpoint leaves
	// out: its newest checkpoint is older, or the checkpoint does not list
	// it. Reason says which.
	Behind bool   `json:"behind"`
	Reason string `json:"reason,omitempty"`
	// Node and Epoch name the task's owner: its newest ownership record
	// (Epoch 0: none yet). Problem says why the records cannot be read.
	Node    string `json:"node,omitempty"`
	Epoch   uint64 `json:"epoch"`
	Problem string `json:"problem,omitempty"`
}

// BehindCount is the number of tasks behind the newest job-complete
// checkpoint.
func (v *JobView) BehindCount() int {
	n := 0
	for _, t := range v.Tasks {
		if t.Behind {
			n++
		}
	}
	return n
}

// JobSource computes a JobView from storage.
type JobSource func(ctx context.Context) JobView

// jobFirstWait bounds how long the status page waits for the first scan.
const jobFirstWait = 3 * time.Second

// jobScanTimeout bounds one scan made for the status page.
const jobScanTimeout = 30 * time.Second

// jobState keeps the newest JobView and decides when to compute the next:
// only when the status page is served, at most once per every, one scan
// at a time.
type jobState struct {
	mu      sync.Mutex
	src     JobSource
	every   time.Duration
	last    *JobView
	running chan struct{} // closed when the running scan ends; nil if none
	wg      sync.WaitGroup
}

// SetJobSource installs the source of the status page's job view: the
// page then shows the newest view computed, and starts a new computation
// in the background when that one is older than every. A page never viewed
// never scans; one viewed often scans at most once per every. nil
// uninstalls the source (the page keeps no stale view). Nil-safe.
func (t *Telemetry) SetJobSource(every time.Duration, src JobSource) {
	if t == nil {
		return
	}
	t.jobView.mu.Lock()
	defer t.jobView.mu.Unlock()
	t.jobView.src, t.jobView.every = src, every
	if src == nil {
		t.jobView.last = nil
	}
}

// RefreshJob computes the job view now, waits for it and keeps it (a scan
// already running is waited for instead). Nil-safe.
func (t *Telemetry) RefreshJob(ctx context.Context) {
	if t == nil {
		return
	}
	if done := t.jobView.start(); done != nil {
		select {
		case <-done:
		case <-ctx.Done():
		}
	}
}

// refreshJobForPage is what serving the status page does before View: a
// scan in the background when the view is stale, and a short wait when
// there is none yet.
func (t *Telemetry) refreshJobForPage(ctx context.Context) {
	if t == nil {
		return
	}
	t.jobView.mu.Lock()
	stale := t.jobView.src != nil && (t.jobView.last == nil || time.Since(t.jobView.last.ScannedAt) >= t.jobView.every)
	first := t.jobView.last == nil
	t.jobView.mu.Unlock()
	if !stale {
		return
	}
	done := t.jobView.start()
	if first && done != nil {
		wait, cancel := context.WithTimeout(ctx, jobFirstWait)
		defer cancel()
		select {
		case <-done:
		case <-wait.Done():
		}
	}
}

// start begins a scan unless one runs, and returns the channel closed when
// the running scan ends (nil without a source).
func (j *jobState) start() <-chan struct{} {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.src == nil {
		return nil
	}
	if j.running != nil {
		return j.running
	}
	done := make(chan struct{})
	j.running = done
	src := j.src
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), jobScanTimeout)
		v := src(ctx)
		cancel()
		if v.ScannedAt.IsZero() {
			v.ScannedAt = time.Now()
		}
		j.mu.Lock()
		if j.src != nil {
			j.last = &v
		}
		j.running = nil
		j.mu.Unlock()
		close(done)
	}()
	return done
}

// view returns a copy of the newest job view (nil: none).
func (j *jobState) view() *JobView {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.last == nil {
		return nil
	}
	v := *j.last
	v.CompleteTasks = append([]string(nil), j.last.CompleteTasks...)
	v.Tasks = append([]JobTask(nil), j.last.Tasks...)
	return &v
}

// wait waits for a scan in flight to end, or for ctx.
func (j *jobState) wait(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		j.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}
