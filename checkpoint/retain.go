package checkpoint

import (
	"context"
	"slices"
	"sort"
	"time"

	"github.com/ckpt-io/ckpt/internal/failpoint"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/uploader"
)

// committed updates the task after its manifest was written: local copy,
// retained set, and retention of older manifests. Failures here are logged;
// the checkpoint is complete whatever happens to its local copy.
//
// Retirement is fenced like a commit: it is written in the name of owner
// (retired.e<epoch>), and only after a look at the task's ownership
// records shows owner still the newest; a fenced owner retires nothing. (A
// takeover between that look and the writes is covered by the readers'
// rule, manifests.markerCounts.)
func (c *Committer) committed(ctx context.Context, t *task, owner manifests.Owner, m *manifests.Manifest, encoded []byte, req Request) {
	var prev *uploader.Previous
	if l, err := c.cfg.Local.CompleteInspected(t.name, m.Checkpoint, m, encoded, req.Snapshot.Files); err != nil {
		c.cfg.Log.Warn("keep local copy", "task", t.name, "checkpoint", m.Checkpoint, "err", err)
	} else {
		prev = &uploader.Previous{Files: m.Files, IDs: l.IDs()}
	}
	t.retainMu.Lock()
	defer t.retainMu.Unlock()
	c.mu.Lock()
	t.retained = append(t.retained, m)
	sort.Slice(t.retained, func(i, j int) bool { return t.retained[i].Checkpoint < t.retained[j].Checkpoint })
	own := slices.Clone(t.retained)
	if m.Checkpoint > t.lastCompleted {
		t.lastCompleted, t.lastSize, t.lastFull = m.Checkpoint, m.CheckpointSize, m.FullSize
		// The next checkpoint knows its unchanged files from this one's
		// local copy; without one (it could not be kept, and the older
		// copies may be gone), it hashes them.
		t.prev, t.prevM, t.hashes = prev, m, nil
	}
	c.mu.Unlock()
	// The newest job-complete checkpoint of the task is never retired; it
	// takes the other tasks' manifests to know it (I/O, without the lock).
	protect, ok := c.jobProtect(ctx, t, own)
	c.mu.Lock()
	refs := make([]manifests.Ref, len(t.retained))
	for i, r := range t.retained {
		refs[i] = manifests.RefOf(r)
	}
	var retire []manifests.Ref
	if ok {
		t.jobComplete = max(t.jobComplete, protect)
		// Job-wide checkpoints the job may still complete stay too.
		keep := append(manifests.Pending(t.retained, t.jobComplete, time.Now()), protect)
		_, retire = manifests.Retention(refs, c.cfg.Retain, keep...)
	}
	c.mu.Unlock()
	if len(retire) == 0 {
		return
	}
	// Still the owner? A superseded owner's view of the task is stale: the
	// checkpoints it would retire may be the ones its successor resumed
	// from. Not retired, they stay in the retained set.
	if err := manifests.CheckOwner(ctx, c.cfg.Store, c.cfg.Job, owner); err != nil {
		c.fence(t, err)
		c.cfg.Log.Warn("retention skipped: cannot confirm this agent still owns the task", "task", t.name, "checkpoint", m.Checkpoint, "err", err)
		return
	}
	c.mu.Lock()
	t.retained = slices.DeleteFunc(t.retained, func(r *manifests.Manifest) bool {
		return slices.ContainsFunc(retire, func(old manifests.Ref) bool { return old.Checkpoint == r.Checkpoint })
	})
	c.mu.Unlock()
	// A task retires older manifests only after a newer one is complete.
	for _, old := range retire {
		failpoint.Hit(failpoint.MidRetire) // before each retirement: with AFTER=k, k retired, the rest not
		if err := manifests.RetireAt(ctx, c.cfg.Store, c.cfg.Job, t.name, old.Checkpoint, owner.Epoch); err != nil {
			c.cfg.Log.Warn("retire", "task", t.name, "checkpoint", old.Checkpoint, "err", err)
		}
	}
}

// jobProtect returns the newest job-complete checkpoint of t among own (its
// retained manifests, oldest first) when it matters to retention, else 0.
// ok is false when it could not be known (storage unreachable): then the
// caller retires nothing this time.
//
// The work is bounded: nothing is read unless a manifest that retention
// would retire lists tasks; then one listing of the job's tasks prefix
// shows which of t's checkpoints have a manifest for every listed task,
// and manifests of other tasks are read only when such a checkpoint would
// be retired (the newest first, each read at most once).
func (c *Committer) jobProtect(ctx context.Context, t *task, own []*manifests.Manifest) (protect uint64, ok bool) {
	refs := make([]manifests.Ref, len(own))
	for i, m := range own {
		refs[i] = manifests.RefOf(m)
	}
	kept, retire := manifests.Retention(refs, c.cfg.Retain)
	byN := map[uint64]*manifests.Manifest{}
	for _, m := range own {
		byN[m.Checkpoint] = m
	}
	if !slices.ContainsFunc(retire, func(r manifests.Ref) bool { return byN[r.Checkpoint].Tasks != nil }) {
		return 0, true
	}
	cat, err := manifests.Scan(ctx, c.cfg.Store, c.cfg.Job, "")
	if err != nil {
		c.cfg.Log.Warn("retention postponed: cannot list the job's checkpoints to find its newest job-complete one", "task", t.name, "err", err)
		return 0, false
	}
	jobs := manifests.NewJobReader(c.cfg.Store, cat)
	var candidates []uint64 // newest first: every listed task has a manifest
	wouldRetire := false
	for i := len(own) - 1; i >= 0; i-- {
		m := own[i]
		if m.Tasks == nil || !jobs.Has(t.name, m.Checkpoint) {
			continue
		}
		if slices.ContainsFunc(m.Tasks, func(task string) bool { return !jobs.Has(task, m.Checkpoint) }) {
			continue
		}
		candidates = append(candidates, m.Checkpoint)
		jobs.Add(m)
		if !slices.ContainsFunc(kept, func(r manifests.Ref) bool { return r.Checkpoint == m.Checkpoint }) {
			wouldRetire = true
		}
	}
	if !wouldRetire {
		return 0, true // whichever is the newest job-complete one, it is kept
	}
	for _, n := range candidates {
		st, err := jobs.Status(ctx, n)
		if err != nil {
			c.cfg.Log.Warn("retention postponed: cannot read the job's manifests to find its newest job-complete checkpoint", "task", t.name, "err", err)
			return 0, false
		}
		if st.Complete && st.Includes(t.name) {
			return n, true
		}
	}
	return 0, true
}
