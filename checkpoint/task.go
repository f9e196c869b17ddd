package checkpoint

import (
	"context"
	"sync"

	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/uploader"
)

// task is what the Committer knows of one task. Fields are guarded by
// Committer.mu except those noted.
type task struct {
	name string
	// resumed is the WAL position the next takeover records (see
	// OwnForRestore), under Committer.mu.
	resumed *manifests.WALResumed

	loadMu sync.Mutex // serialises loading from storage (held without Committer.mu)
	loaded bool

	lastCompleted      uint64
	lastSize, lastFull int64
	// retained holds the task's complete, retained manifests, oldest first:
	// the only objects a new checkpoint may reuse (invariant 3).
	retained []*manifests.Manifest
	// prev is the newest checkpoint this agent completed, as its local
	// copy recorded it (its manifest is prevM); hashes maps inode
	// identities of the newest local copy found at load to their hashes.
	prev   *uploader.Previous
	prevM  *manifests.Manifest
	hashes map[localrecovery.Identity]string
	// jobComplete is the newest job-complete checkpoint of the task that
	// retention found (0: none yet); the job-wide checkpoints above it stay
	// retained for manifests.JobPendingWindow (manifests.Pending).
	jobComplete uint64
	// problems names the task's unreadable manifests found by load.
	problems []string
	// retainMu serialises retention after commits (held without
	// Committer.mu, across the reads that find the newest job-complete
	// checkpoint).
	retainMu sync.Mutex

	ownMu sync.Mutex // serialises taking ownership (held without Committer.mu)
	// owner is this agent's ownership record of the task, once taken;
	// fenced is set for good once a newer owner is seen (a *FencedError).
	owner  *manifests.Owner
	fenced error
}

func (c *Committer) taskLocked(name string) *task {
	t := c.tasks[name]
	if t == nil {
		t = &task{name: name}
		c.tasks[name] = t
	}
	return t
}

func (c *Committer) task(name string) *task {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.taskLocked(name)
}

// Status is what the Committer knows of a task now.
type Status struct {
	LastCompleted      uint64
	LastSize, LastFull int64
	Problems           []string // the task's unreadable manifests
	// Fenced is the error of a newer owner's fence (nil: not fenced).
	Fenced error
}

// Status returns what the Committer knows of task (zero if nothing).
func (c *Committer) Status(name string) Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.tasks[name]
	if t == nil {
		return Status{}
	}
	return Status{LastCompleted: t.lastCompleted, LastSize: t.lastSize, LastFull: t.lastFull, Problems: t.problems, Fenced: t.fenced}
}

// Recovered records the newest local copy of task found after a restart,
// known without the network: checkpoints at or below it are refused.
func (c *Committer) Recovered(name string, l *localrecovery.Local) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.taskLocked(name)
	t.lastCompleted, t.lastSize, t.lastFull = l.Checkpoint, l.Manifest.CheckpointSize, l.Manifest.FullSize
}

// load reads the task's retained manifests from storage, once: the live set
// is always derived from the manifests in storage, never from counters.
func (c *Committer) load(ctx context.Context, t *task) error {
	t.loadMu.Lock()
	defer t.loadMu.Unlock()
	c.mu.Lock()
	loaded := t.loaded
	c.mu.Unlock()
	if loaded {
		return nil
	}
	cat, err := manifests.Scan(ctx, c.cfg.Store, c.cfg.Job, t.name)
	if err != nil {
		return err
	}
	// An unreadable manifest is a problem to report, not an outage: its
	// objects are simply not reused (invariant 3 allows fewer reuses).
	retained, problems, err := manifests.LoadRetained(ctx, c.cfg.Store, c.cfg.Job, cat.Retained(t.name))
	if err != nil {
		return err
	}
	for _, p := range problems {
		c.cfg.Log.Warn("unreadable manifest: not reused; GC stops until it is fixed or removed", "task", t.name, "checkpoint", p.Checkpoint, "key", p.Key, "err", p.Problem)
	}
	latest, err := c.cfg.Local.Latest(t.name)
	if err != nil {
		c.cfg.Log.Warn("read local copy", "task", t.name, "err", err)
	}
	hashes := localrecovery.HashIndex(latest)
	c.mu.Lock()
	defer c.mu.Unlock()
	t.retained = retained
	t.hashes = hashes
	t.prev, t.prevM = nil, nil
	t.problems = nil
	for _, p := range problems {
		t.problems = append(t.problems, p.Problem)
	}
	if n := len(retained); n > 0 && retained[n-1].Checkpoint >= t.lastCompleted {
		last := retained[n-1]
		t.lastCompleted, t.lastSize, t.lastFull = last.Checkpoint, last.CheckpointSize, last.FullSize
	}
	t.loaded = true
	return nil
}
