package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ckpt-io/ckpt/gc"
	"github.com/ckpt-io/ckpt/internal/failpoint"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/uploader"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
)

// Run commits one checkpoint of one task: ownership, load, upload, GC's
// marks, the ownership check, the conditional commit, the read-back of an
// unknown outcome, the local copy, retention (see the package comment for
// the order and the invariants each step holds).
//
// Run returns a Result once the manifest is in storage (written, or read
// back after an error): from then on nothing fails the checkpoint, and
// ctx's cancellation or deadline only cuts short the checks and retention
// that follow. On error no manifest of this Run is in storage, or whether
// one landed could not be known (then the next Run reads the task afresh);
// what was uploaded is left to GC. Errors: an *OwnershipError (wrapping
// ErrFenced, ErrOwnedElsewhere, ...) when the task's ownership could not be
// taken or kept; an *Error of kind ErrConflict or ErrUnavailable; ctx's
// error; or storage's and the local store's errors, wrapped.
//
// Cancelling ctx (an abort) stops Run between steps, but never interrupts
// the manifest's write; ctx's deadline (its cause ErrTimeout) bounds every
// storage call, the write included.
func (c *Committer) Run(ctx context.Context, req Request) (Result, error) {
	t := c.task(req.Task)
	// Ownership first (taken on the task's first request, then cached),
	// then the task's checkpoints as this owner sees them.
	req.at("taking the task's ownership")
	own, err := c.own(ctx, t, false, false)
	if err != nil {
		return Result{}, err
	}
	req.at("reading the task's checkpoints from storage")
	if err := c.load(ctx, t); err != nil {
		return Result{}, fmt.Errorf("read the task's checkpoints from storage: %w", err)
	}
	ureq, parent, err := c.prepare(ctx, t, own, req)
	if err != nil {
		return Result{}, err
	}
	res, hold, err := c.upload(ctx, req, ureq)
	if err != nil {
		return Result{}, err
	}
	m := &manifests.Manifest{
		Job: c.cfg.Job, Task: req.Task, Checkpoint: req.Checkpoint, Parent: parent,
		Created: time.Now().UTC(), Engine: req.Engine.Name(), AgentID: c.cfg.AgentID, Tasks: manifests.SortedTasks(req.Tasks),
		Epoch: own.Epoch, Node: c.cfg.Node, Files: res.Files, Format: c.cfg.ManifestFormat,
		FilesUploaded: res.FilesUploaded, FilesReused: res.FilesReused,
	}
	for _, f := range res.Files {
		m.FullSize += f.Size
	}
	encoded, err := m.Encode(res.BytesWritten)
	if err != nil {
		return Result{}, err
	}
	reconciled, err := c.commitOwned(ctx, t, own, req, m, encoded, hold)
	if err != nil {
		return Result{}, err
	}
	failpoint.Hit(failpoint.AfterManifest) // committed; not yet recorded locally nor older ones retired
	// Committed: from here on nothing fails the checkpoint, and the
	// timeout only cuts short the checks and retention that follow.
	after, cancel := detached(ctx)
	if reconciled {
		// Past the timeout: the checks and retention get a bound of
		// their own, so that status and retention agree with storage.
		cancel()
		after, cancel = context.WithTimeout(context.WithoutCancel(ctx), reconcileTimeout)
	}
	defer cancel()
	if err := manifests.CheckCommitted(after, c.cfg.Store, c.cfg.Job, own, req.Checkpoint); err != nil {
		if errors.Is(err, manifests.ErrFenced) {
			return Result{}, &OwnershipError{Err: c.fence(t, err)}
		}
		// The manifest is written; whether a takeover fenced it is for
		// readers to decide. Most likely it did not.
		c.cfg.Log.Warn("check ownership after commit", "task", t.name, "checkpoint", req.Checkpoint, "err", err)
	}
	c.committed(after, t, own, m, encoded, req)
	return Result{Manifest: m, Reconciled: reconciled}, nil
}

// prepare checks the checkpoint's number against what the owner knows
// complete and builds the upload's request: the objects it may reuse
// (invariant 3) and the previous checkpoint. parent is the task's last
// completed checkpoint.
func (c *Committer) prepare(ctx context.Context, t *task, own manifests.Owner, req Request) (ureq uploader.Request, parent uint64, err error) {
	c.mu.Lock()
	// An owner commits only above every checkpoint it knows complete,
	// own.After included: so there is at most one valid manifest per N.
	if last := max(t.lastCompleted, own.After); req.Checkpoint <= last {
		c.mu.Unlock()
		return ureq, 0, newError(ErrConflict, nil, "checkpoint %d of task %s is at or below its last completed checkpoint %d", req.Checkpoint, req.Task, last)
	}
	retained := slices.Clone(t.retained)
	hashes, parent := t.hashes, t.lastCompleted
	var prev *uploader.Previous
	if t.prev != nil {
		p := *t.prev
		// Its objects are reusable while its manifest is retained.
		p.Confirmed = slices.Contains(retained, t.prevM)
		prev = &p
	}
	c.mu.Unlock()
	// Retained manifests are never changed: the set is built without the lock.
	confirmed := uploader.NewConfirmed()
	for _, m := range retained {
		confirmed.AddFiles(m.Files)
	}
	if len(retained) == 0 {
		// A task with no checkpoint of its own (one a rescale restore built
		// from other tasks' tables) reuses what the job's other tasks retain.
		req.at("reading the job's other tasks' checkpoints")
		sizes := make(map[int64]bool, len(req.Snapshot.Files))
		for _, f := range req.Snapshot.Files {
			sizes[f.Size] = true
		}
		others, err := uploader.OtherTasksConfirmed(ctx, c.cfg.Store, c.cfg.Job, t.name, sizes)
		if err != nil {
			c.cfg.Log.Warn("read the job's other tasks' checkpoints: their objects are not reused", "task", t.name, "err", err)
		}
		for id, key := range others {
			confirmed.AddID(id, key) // the task has no retained manifest of its own
		}
	}
	// Presence: confirmed also means still there. After the transfers, every
	// reused object is checked against storage (an observation no older than
	// the presence's max age), and one missing or of the wrong size is
	// uploaded again from the snapshot before the manifest names it.
	ureq = uploader.Request{
		Store: c.cfg.Store, Job: c.cfg.Job, Task: req.Task, Checkpoint: req.Checkpoint, Epoch: own.Epoch,
		Snapshot: req.Snapshot, Confirmed: confirmed, Previous: prev, Hashes: hashes, Classify: req.Engine.Classify,
		Concurrency: c.cfg.UploadConcurrency, Presence: c.cfg.Presence, Alg: manifests.BLAKE3,
	}
	if c.cfg.ManifestFormat == manifests.Format1 {
		ureq.Alg = manifests.SHA256 // all format 1 can name
	}
	return ureq, parent, nil
}

// upload transfers the snapshot and looks at GC's marks: the hold it
// returns bounds when the commit may be sent.
func (c *Committer) upload(ctx context.Context, req Request, ureq uploader.Request) (*uploader.Result, *gc.Hold, error) {
	uctx, upSpan := otel.Tracer("ckpt").Start(ctx, "upload")
	req.at("uploading (hashing, transfers, presence checks)")
	res, err := uploader.Upload(uctx, ureq)
	var hold *gc.Hold
	if err == nil {
		req.at("checking GC's marks")
		// GC deletes only what it marked at least D earlier: the manifest
		// names no marked object, and is committed within D/2 of this look.
		hold, err = uploader.AvoidMarked(uctx, ureq, res, c.gcGuard())
	}
	if err != nil {
		upSpan.SetStatus(codes.Error, err.Error())
		upSpan.End()
		return nil, nil, err
	}
	upSpan.SetAttributes(attribute.Int64("ckpt.bytes_uploaded", res.BytesWritten), attribute.Int64("ckpt.bytes_hashed", res.BytesHashed),
		attribute.Int("ckpt.files_uploaded", res.FilesUploaded), attribute.Int("ckpt.files_reused", res.FilesReused),
		attribute.Int("ckpt.objects_replaced", len(res.Replaced)))
	upSpan.End()
	for _, k := range res.Rekeyed {
		c.cfg.Log.Info("object marked for deletion by GC: stored again under a new key", "task", req.Task, "checkpoint", req.Checkpoint, "key", k)
	}
	for _, r := range res.Replaced {
		c.cfg.Log.Warn("reused object missing or damaged in storage: uploaded again from the snapshot",
			"task", req.Task, "checkpoint", req.Checkpoint, "key", r.Key, "problem", r.String())
		reason := "missing"
		if r.Found {
			reason = "size"
		}
		c.cfg.Replaced(ctx, reason)
	}
	return res, hold, nil
}
