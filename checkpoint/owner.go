package checkpoint

import (
	"context"
	"errors"
	"fmt"

	"github.com/ckpt-io/ckpt/manifests"
)

// OwnForRestore takes the task's ownership for a restore, the first thing a
// task's new home does: it takes the ownership (or, if this agent holds it,
// checks it still does; if a newer owner fenced it, takes the task back at
// a new epoch: a task may move A -> B -> A). Errors are as Run's ownership
// errors: an *OwnershipError.
//
// resumed, when not nil, is where in the old owner's write-ahead log the
// restore that follows will end (restore.ResumePoint): a takeover records
// it, so that later restores use the old owner's WAL up to there and no
// further.
func (c *Committer) OwnForRestore(ctx context.Context, name string, resumed *manifests.WALResumed) (manifests.Owner, error) {
	t := c.task(name)
	c.mu.Lock()
	t.resumed = resumed
	c.mu.Unlock()
	return c.own(ctx, t, true, true)
}

// own returns this agent's ownership of t, taking it on the first call
// (epoch one above the last, by conditional create) and caching it. With
// recheck, a cached ownership is checked against storage first. A fenced
// agent gets its *manifests.FencedError, until a restore (restoring) takes
// the task back at a new epoch. Errors are *OwnershipError.
//
// Taking a task from an owner on another node is a move, and a task moves
// by a restore: the restore op (restoring), or `ckpt restore --local-dir`
// into this agent's local dir that saw that very owner as the newest
// (localrecovery's takeover note). Any other first request for such a task
// gets ErrOwnedElsewhere: an agent revived on a node the task has left (a
// zombie after a partition) must not take the task back from its new home.
func (c *Committer) own(ctx context.Context, t *task, recheck, restoring bool) (manifests.Owner, error) {
	o, err := c.ownLocked(ctx, t, recheck, restoring)
	if err != nil {
		return manifests.Owner{}, &OwnershipError{Err: err}
	}
	return o, nil
}

func (c *Committer) ownLocked(ctx context.Context, t *task, recheck, restoring bool) (manifests.Owner, error) {
	name := t.name
	t.ownMu.Lock()
	defer t.ownMu.Unlock()
	c.mu.Lock()
	owner, fenced := t.owner, t.fenced
	c.mu.Unlock()
	switch {
	case fenced != nil && !restoring:
		return manifests.Owner{}, fenced
	case fenced != nil:
		// The task moves back here (A -> B -> A): re-owned below.
	case owner != nil && recheck:
		err := manifests.CheckOwner(ctx, c.cfg.Store, c.cfg.Job, *owner)
		if err == nil {
			return *owner, nil
		}
		if !restoring || !errors.Is(err, manifests.ErrFenced) {
			return manifests.Owner{}, c.fence(t, err)
		}
	case owner != nil:
		return *owner, nil
	}
	may := func(cur manifests.Owner) error {
		if restoring || c.cfg.Succeeds(name, cur) {
			return nil
		}
		if e, ok := c.cfg.Local.TakeoverEpoch(name); ok && e == cur.Epoch {
			return nil
		}
		return fmt.Errorf("task %s is owned by agent %s on node %s (epoch %d): %w; an agent takes a task over from another node only by restoring it first (the restore op, or ckpt restore --local-dir into this agent's local dir)",
			name, cur.AgentID, cur.Node, cur.Epoch, manifests.ErrOwnedElsewhere)
	}
	vol, err := c.cfg.Volume()
	if err != nil {
		return manifests.Owner{}, err
	}
	// Where this node's store left the old owner's WAL: the restore op's
	// resume point, else the note of the last restore into the local dir
	// (recorded only if it extends the owner taken over from).
	c.mu.Lock()
	resumed := t.resumed
	t.resumed = nil
	c.mu.Unlock()
	if resumed == nil && !restoring {
		if r, ok := c.cfg.Local.WALResumed(name); ok {
			resumed = &r
		}
	}
	rec, err := manifests.TakeOwnershipResuming(ctx, c.cfg.Store, c.cfg.Job, name, c.cfg.Node, vol, c.cfg.AgentID, resumed, may)
	if err != nil {
		c.cfg.Note(context.WithoutCancel(ctx), name, err)
		return manifests.Owner{}, err
	}
	c.cfg.Log.Info("took ownership of task", "task", name, "epoch", rec.Epoch, "after", rec.After, "node", rec.Node, "agent_id", rec.AgentID, "again", owner != nil)
	c.mu.Lock()
	t.owner, t.fenced = &rec, nil
	// What was loaded before (nothing, normally) may predate the takeover.
	t.loaded = false
	if owner != nil {
		// Re-owned after a newer owner held the task: what this agent
		// knew of it is stale (its last checkpoints may even be fenced).
		// The load that follows reads the task afresh from storage.
		t.retained, t.prev, t.prevM, t.hashes, t.problems = nil, nil, nil, nil, nil
		t.lastCompleted, t.lastSize, t.lastFull, t.jobComplete = 0, 0, 0, 0
	}
	c.mu.Unlock()
	return rec, nil
}

// Fence records that a newer owner fenced this agent for task, when err
// (from another writer of the task's, such as its WAL shipping) is a
// *manifests.FencedError: its checkpoints then fail as Run's do, until a
// restore re-owns the task. It returns err.
func (c *Committer) Fence(name string, err error) error {
	c.mu.Lock()
	t := c.taskLocked(name)
	c.mu.Unlock()
	return c.fence(t, err)
}

// fence records that a newer owner fenced this agent for t when err is a
// *manifests.FencedError, until a restore re-owns the task (own); it
// returns err.
//
// An error about an ownership this agent no longer holds (a checkpoint of
// an earlier epoch, still in flight when a restore re-owned the task) does
// not fence the newer one.
func (c *Committer) fence(t *task, err error) error {
	var fe *manifests.FencedError
	if errors.As(err, &fe) {
		c.mu.Lock()
		if t.fenced == nil && (t.owner == nil || t.owner.Epoch <= fe.Mine) {
			t.fenced = err
			c.cfg.Log.Warn("fenced: another agent owns the task now; its requests here fail with conflict", "task", t.name, "err", err)
			defer c.cfg.Note(context.Background(), t.name, err)
		}
		c.mu.Unlock()
	}
	return err
}
