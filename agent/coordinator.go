package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/ckpt-io/ckpt/engines"
	"go.opentelemetry.io/otel"
	"io"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ckpt-io/ckpt/internal/failpoint"
	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/protocol"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/lazy"
	"github.com/ckpt-io/ckpt/storage/retry"
	"github.com/ckpt-io/ckpt/telemetry"
	"github.com/ckpt-io/ckpt/uploader"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// task is the agent's session for one task. All fields are guarded by
// Agent.mu except those noted.
type task struct {
	name string

	loadMu sync.Mutex // serialises loading from storage (held without Agent.mu)
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
	// retainMu serialises retention after commits (held without Agent.mu,
	// across the reads that find the newest job-complete checkpoint).
	retainMu sync.Mutex

	ownMu sync.Mutex // serialises taking ownership (held without Agent.mu)
	// owner is this agent's ownership record of the task, once taken;
	// fenced is set for good once a newer owner is seen (a *FencedError).
	owner  *manifests.Owner
	fenced error

	inflight map[uint64]*checkpoint // syncing, queued or running
	pending  []*checkpoint          // synced, waiting for an async slot
	running  int
}

// checkpoint is one checkpoint in flight.
type checkpoint struct {
	t      *task
	req    protocol.Request
	engine engines.Engine // the engine the request named (classifies its files)
	c      *conn
	start  time.Time
	synced time.Time
	span   trace.Span
	snap   *localrecovery.Snapshot
	// result holds the sizes of a completed checkpoint for telemetry.
	result telemetry.CheckpointRecord
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	// aborted is set (under Agent.mu) when an abort request cancelled it.
	aborted bool
	// completed is set before done is closed when the manifest was committed.
	completed bool
	// step names what the async phase is doing, for the message of a
	// checkpoint that timed out.
	step atomic.Value // string
}

// at records the async phase's current step.
func (ck *checkpoint) at(step string) { ck.step.Store(step) }

// errTimedOut is the cause of a checkpoint context cancelled by its timeout.
var errTimedOut = errors.New("checkpoint timeout")

// timeout is the bound on ck's async phase: the agent's
// Config.CheckpointTimeout, lowered by the request's timeout_ms; 0 for none.
func (a *Agent) timeout(req protocol.Request) time.Duration {
	d := a.cfg.CheckpointTimeout
	if req.TimeoutMS > 0 {
		r := time.Duration(req.TimeoutMS) * time.Millisecond
		if d <= 0 || r < d {
			d = r
		}
	}
	return max(d, 0)
}

// timedOut reports whether ctx, a checkpoint's async context, is past its
// timeout. Its deadline is the test, not only its Done channel: a call
// bounded by the same deadline (see detached) may return first.
func timedOut(ctx context.Context) bool {
	if errors.Is(context.Cause(ctx), errTimedOut) {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// detached returns a context that ignores ctx's cancellation (an abort or
// a shutdown must not interrupt a write in progress) but keeps its
// deadline (a checkpoint's timeout bounds every storage call it makes).
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	d := context.WithoutCancel(ctx)
	if dl, ok := ctx.Deadline(); ok {
		return context.WithDeadlineCause(d, dl, errTimedOut)
	}
	return d, func() {}
}

func (a *Agent) taskLocked(name string) *task {
	t := a.tasks[name]
	if t == nil {
		t = &task{name: name, inflight: map[uint64]*checkpoint{}}
		a.tasks[name] = t
	}
	return t
}

// takeSnapshot is the sync phase's local work; fault tests replace it.
var takeSnapshot = (*localrecovery.Store).TakeDir

// afterInspect runs once a snapshot's files are inspected, before any of
// them is read; tests swap files there.
var afterInspect = func(*localrecovery.Snapshot) {}

// diskFull reports whether err is the local filesystem out of space or
// quota: a condition to retry later, not a bug.
func diskFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

func failed(req protocol.Request, e *protocol.Error) protocol.Event {
	return protocol.Event{Event: "failed", ID: req.ID, Task: req.Task, Checkpoint: req.Checkpoint, Error: e}
}

// checkpoint runs the sync phase in the caller's goroutine and queues the
// async phase. Everything before "synced" is local: confinement, the queue
// bound, and hard links. No hashing, no network, no fsync. The snapshot dir
// is opened once by resolveDir, and the sync phase works on its files only
// through that handle (localrecovery.Store.TakeDir).
func (a *Agent) checkpoint(c *conn, req protocol.Request) {
	start := time.Now()
	if req.Tasks != nil {
		if err := manifests.CheckTasks(req.Task, req.Tasks); err != nil {
			c.send(failed(req, errorf(protocol.CodeBadRequest, "%v", err)))
			return
		}
	}
	eng, err := a.cfg.Engines.Lookup(req.Engine)
	if err != nil {
		c.send(failed(req, errorf(protocol.CodeBadRequest, "%v", err)))
		return
	}
	dir, perr := a.resolveDir(req.Dir)
	if perr != nil {
		c.send(failed(req, perr))
		return
	}
	defer dir.Close()
	if a.tenant != nil {
		if perr := checkOwner(dir, c.peer().UID); perr != nil {
			c.send(failed(req, perr))
			return
		}
	}
	a.mu.Lock()
	if a.draining {
		a.mu.Unlock()
		c.send(failed(req, errorf(protocol.CodeUnavailable, "the agent is shutting down")))
		return
	}
	t := a.taskLocked(req.Task)
	switch {
	case t.fenced != nil:
		a.mu.Unlock()
		c.send(failed(req, errorf(protocol.CodeConflict, "checkpoint %d of task %s: %v", req.Checkpoint, req.Task, t.fenced)))
		return
	case req.Checkpoint <= t.lastCompleted:
		a.mu.Unlock()
		c.send(failed(req, errorf(protocol.CodeConflict, "checkpoint %d of task %s is at or below its last completed checkpoint %d", req.Checkpoint, req.Task, t.lastCompleted)))
		return
	case t.inflight[req.Checkpoint] != nil:
		a.mu.Unlock()
		c.send(failed(req, errorf(protocol.CodeConflict, "checkpoint %d of task %s is already in flight", req.Checkpoint, req.Task)))
		return
	case len(t.pending) >= a.cfg.MaxQueued:
		a.mu.Unlock()
		c.send(failed(req, errorf(protocol.CodeUnavailable, "task %s already has %d checkpoints queued behind the running one (limit --max-queued); retry later", req.Task, len(t.pending))))
		return
	}
	ctx, cancel := context.WithCancel(telemetry.ContextWithTraceparent(a.jobsCtx, req.Traceparent))
	ctx, span := otel.Tracer("ckpt").Start(ctx, "checkpoint", trace.WithTimestamp(start), trace.WithAttributes(
		attribute.String("ckpt.job", a.cfg.Job), attribute.String("ckpt.task", req.Task), attribute.Int64("ckpt.checkpoint", int64(req.Checkpoint))))
	ck := &checkpoint{t: t, req: req, engine: eng, c: c, start: start, ctx: ctx, cancel: cancel, span: span, done: make(chan struct{})}
	t.inflight[req.Checkpoint] = ck
	a.jobs.Add(1)
	a.mu.Unlock()
	a.cfg.Telemetry.CheckpointStarted(ctx, req.Task)

	_, syncSpan := otel.Tracer("ckpt").Start(ctx, "sync")
	snap, err := takeSnapshot(a.local, req.Task, req.Checkpoint, dir, req.Handoff)
	syncSpan.End()
	if err != nil {
		var bad *localrecovery.BadFileError
		e := errorf(protocol.CodeInternal, "sync phase: %v", err)
		switch {
		case errors.As(err, &bad):
			e = errorf(protocol.CodeBadRequest, "%v", err)
		case diskFull(err):
			e = errorf(protocol.CodeUnavailable, "sync phase: the local disk is full: %v (free space in --local-dir, then retry)", err)
		}
		c.send(failed(req, e))
		a.ended(ck, "failed", e)
		a.finish(ck, false)
		return
	}
	failpoint.Hit(failpoint.AfterLink) // files linked into the local store, "synced" not yet sent
	if crossDevice := snap.Copied - snap.CopiedNotPermitted; crossDevice > 0 {
		a.log.Warn("snapshot copied, not hard-linked: the local dir is on another device than the snapshot; put --local-dir on the app's filesystem for instant sync phases",
			"task", req.Task, "checkpoint", req.Checkpoint, "files_copied", crossDevice)
	}
	if snap.CopiedNotPermitted > 0 {
		a.log.Warn("snapshot copied, not hard-linked: the kernel refuses hard links to files of another user that the agent may not write (fs.protected_hardlinks); run the agent as the app's uid for instant sync phases",
			"task", req.Task, "checkpoint", req.Checkpoint, "files_copied", snap.CopiedNotPermitted)
	}
	ck.snap = snap
	ck.synced = time.Now()
	syncMS := ck.synced.Sub(start).Milliseconds()
	c.send(protocol.Event{Event: "synced", ID: req.ID, Task: req.Task, Checkpoint: req.Checkpoint, SyncMS: syncMS})

	a.mu.Lock()
	t.pending = append(t.pending, ck)
	a.mu.Unlock()
	a.dispatch(t)
}

// dispatch starts queued async phases of t, in checkpoint order, while
// fewer than MaxConcurrent run.
func (a *Agent) dispatch(t *task) {
	a.mu.Lock()
	defer a.mu.Unlock()
	sort.Slice(t.pending, func(i, j int) bool { return t.pending[i].req.Checkpoint < t.pending[j].req.Checkpoint })
	for t.running < a.cfg.MaxConcurrent && len(t.pending) > 0 {
		ck := t.pending[0]
		t.pending = t.pending[1:]
		t.running++
		go a.run(ck)
	}
}

// finish removes ck from its task and releases its async slot.
func (a *Agent) finish(ck *checkpoint, ran bool) {
	a.mu.Lock()
	delete(ck.t.inflight, ck.req.Checkpoint)
	if ran {
		ck.t.running--
	}
	a.mu.Unlock()
	ck.cancel()
	close(ck.done)
	a.jobs.Done()
	if ran {
		a.dispatch(ck.t)
	}
}

// run is the async phase of one checkpoint. It is bounded by the
// checkpoint's timeout: every storage call takes its context, so a hung
// call returns when it expires, and the next queued checkpoint starts.
func (a *Agent) run(ck *checkpoint) {
	req := ck.req
	ctx := ck.ctx
	limit := a.timeout(req)
	if limit > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, limit, errTimedOut)
		defer cancel()
	}
	ev, err := a.upload(ctx, ck)
	a.noteOutcome(context.WithoutCancel(ck.ctx), req.Task, err)
	if err == nil {
		ck.completed = true
		// Metrics first, so that a client reading /metrics on completed sees
		// this checkpoint; then the event, before finish: a stopping agent
		// waits for finish, then hangs up.
		a.ended(ck, "completed", nil)
		ck.c.send(ev)
		a.local.RemoveDiscarded() // the previous local copy, now in the background
		a.maybeSweep()
		a.walCheckpointed(ck) // the WAL now extends this checkpoint (wal.go)
		a.finish(ck, true)
		return
	}
	// The checkpoint did not complete: its local copy goes now; what it
	// uploaded is unreferenced and left to GC.
	if derr := a.local.Discard(req.Task, req.Checkpoint); derr != nil {
		a.log.Warn("discard local copy", "task", req.Task, "checkpoint", req.Checkpoint, "err", derr)
	}
	a.mu.Lock()
	aborted := ck.aborted
	a.mu.Unlock()
	defer a.finish(ck, true)
	switch {
	case aborted:
		ck.c.send(protocol.Event{Event: "aborted", ID: req.ID, Task: req.Task, Checkpoint: req.Checkpoint})
		a.ended(ck, "aborted", err)
	case ck.ctx.Err() == nil && timedOut(ctx):
		step, _ := ck.step.Load().(string)
		e := errorf(protocol.CodeUnavailable, "checkpoint %d of task %s timed out after %v while it was at %s: %v (--checkpoint-timeout, or the request's timeout_ms); what it uploaded is left to GC, the next checkpoint starts now",
			req.Checkpoint, req.Task, limit, step, err)
		ck.c.send(failed(req, e))
		a.ended(ck, "timeout", e)
	case ck.ctx.Err() != nil:
		e := errorf(protocol.CodeUnavailable, "the agent shut down before checkpoint %d completed", req.Checkpoint)
		ck.c.send(failed(req, e))
		a.ended(ck, "aborted", e)
	default:
		e := &protocol.Error{Code: protocol.CodeInternal, Message: err.Error()}
		var pe *protocol.Error
		switch {
		case errors.As(err, &pe):
			e = pe
		case errors.Is(err, manifests.ErrConflict):
			e.Code = protocol.CodeConflict
		case retry.Transient(err):
			e.Code = protocol.CodeUnavailable // storage outage or throttling: retry later
		case diskFull(err):
			e.Code = protocol.CodeUnavailable // local disk full: retry once there is space
		}
		ck.c.send(failed(req, e))
		a.ended(ck, "failed", e)
	}
}

// ended publishes a checkpoint's outcome: one log line (with the peer's
// credentials), the span's end, and the metrics, all with the same fields.
func (a *Agent) ended(ck *checkpoint, status string, err error) {
	r := ck.result
	r.Task, r.Checkpoint, r.Status, r.At = ck.req.Task, ck.req.Checkpoint, status, time.Now()
	r.Total = r.At.Sub(ck.start)
	if !ck.synced.IsZero() {
		r.Sync, r.Async = ck.synced.Sub(ck.start), r.At.Sub(ck.synced)
	}
	attrs := []any{"task", r.Task, "checkpoint", r.Checkpoint, "status", status,
		"checkpoint_size", r.CheckpointSize, "full_size", r.FullSize,
		"files_uploaded", r.FilesUploaded, "files_reused", r.FilesReused,
		"sync_ms", r.Sync.Milliseconds(), "async_ms", r.Async.Milliseconds(), "duration_ms", r.Total.Milliseconds()}
	ck.span.SetAttributes(attribute.String("ckpt.status", status),
		attribute.Int64("ckpt.checkpoint_size", r.CheckpointSize), attribute.Int64("ckpt.full_size", r.FullSize),
		attribute.Int("ckpt.files_uploaded", r.FilesUploaded), attribute.Int("ckpt.files_reused", r.FilesReused))
	switch {
	case err != nil && status == "failed":
		ck.span.SetStatus(codes.Error, err.Error())
		ck.c.log.Error("checkpoint failed", append(attrs, "err", err)...)
	case err != nil:
		ck.span.SetStatus(codes.Error, status)
		ck.c.log.Warn("checkpoint aborted", append(attrs, "err", err)...)
	default:
		ck.c.log.Info("checkpoint completed", attrs...)
	}
	ck.span.End()
	a.cfg.Telemetry.CheckpointEnded(context.WithoutCancel(ck.ctx), r)
}

// load reads the task's retained manifests from storage, once: the live set
// is always derived from the manifests in storage, never from counters.
func (a *Agent) load(ctx context.Context, t *task) error {
	t.loadMu.Lock()
	defer t.loadMu.Unlock()
	a.mu.Lock()
	loaded := t.loaded
	a.mu.Unlock()
	if loaded {
		return nil
	}
	cat, err := manifests.Scan(ctx, a.cfg.Store, a.cfg.Job, t.name)
	if err != nil {
		return err
	}
	// An unreadable manifest is a problem to report, not an outage: its
	// objects are simply not reused (invariant 3 allows fewer reuses).
	retained, problems, err := manifests.LoadRetained(ctx, a.cfg.Store, a.cfg.Job, cat.Retained(t.name))
	if err != nil {
		return err
	}
	for _, p := range problems {
		a.log.Warn("unreadable manifest: not reused; GC stops until it is fixed or removed", "task", t.name, "checkpoint", p.Checkpoint, "key", p.Key, "err", p.Problem)
	}
	latest, err := a.local.Latest(t.name)
	if err != nil {
		a.log.Warn("read local copy", "task", t.name, "err", err)
	}
	hashes := localrecovery.HashIndex(latest)
	a.mu.Lock()
	defer a.mu.Unlock()
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

// upload is the async phase proper: dedup, transfer, then the manifest.
func (a *Agent) upload(ctx context.Context, ck *checkpoint) (protocol.Event, error) {
	req, t := ck.req, ck.t
	// The files themselves are checked now, before anything is read: the
	// sync phase only looked at directory entries.
	ck.at("inspecting the snapshot's files")
	if err := ck.snap.Inspect(); err != nil {
		var bad *localrecovery.BadFileError
		if errors.As(err, &bad) {
			return protocol.Event{}, errorf(protocol.CodeBadRequest, "%v", err)
		}
		return protocol.Event{}, err
	}
	afterInspect(ck.snap)
	// Ownership first (taken on the task's first request, then cached),
	// then the task's checkpoints as this owner sees them.
	ck.at("taking the task's ownership")
	own, err := a.own(ctx, t.name, false, false)
	if err != nil {
		return protocol.Event{}, ownError(req, err)
	}
	ck.at("reading the task's checkpoints from storage")
	if err := a.load(ctx, t); err != nil {
		return protocol.Event{}, fmt.Errorf("read the task's checkpoints from storage: %w", err)
	}
	a.mu.Lock()
	// An owner commits only above every checkpoint it knows complete,
	// own.After included: so there is at most one valid manifest per N.
	if last := max(t.lastCompleted, own.After); req.Checkpoint <= last {
		a.mu.Unlock()
		return protocol.Event{}, errorf(protocol.CodeConflict, "checkpoint %d of task %s is at or below its last completed checkpoint %d", req.Checkpoint, req.Task, last)
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
	a.mu.Unlock()
	// Retained manifests are never changed: the set is built without the lock.
	first := len(retained) == 0
	confirmed := uploader.NewConfirmed()
	for _, m := range retained {
		confirmed.AddFiles(m.Files)
	}
	if first {
		// A task with no checkpoint of its own (one a rescale restore built
		// from other tasks' tables) reuses what the job's other tasks retain.
		ck.at("reading the job's other tasks' checkpoints")
		sizes := make(map[int64]bool, len(ck.snap.Files))
		for _, f := range ck.snap.Files {
			sizes[f.Size] = true
		}
		others, err := uploader.OtherTasksConfirmed(ctx, a.cfg.Store, a.cfg.Job, t.name, sizes)
		if err != nil {
			a.log.Warn("read the job's other tasks' checkpoints: their objects are not reused", "task", t.name, "err", err)
		}
		for id, key := range others {
			confirmed.AddID(id, key) // the task has no retained manifest of its own
		}
	}

	uctx, upSpan := otel.Tracer("ckpt").Start(ctx, "upload")
	// Presence: confirmed also means still there. After the transfers, every
	// reused object is checked against storage (an observation no older than
	// Config.ReuseCheckMaxAge), and one missing or of the wrong size is
	// uploaded again from the snapshot before the manifest names it.
	ureq := uploader.Request{
		Store: a.cfg.Store, Job: a.cfg.Job, Task: req.Task, Checkpoint: req.Checkpoint, Epoch: own.Epoch,
		Snapshot: ck.snap, Confirmed: confirmed, Previous: prev, Hashes: hashes, Classify: ck.engine.Classify,
		Concurrency: a.cfg.UploadConcurrency, Presence: a.presence, Alg: manifests.BLAKE3,
	}
	if a.cfg.ManifestFormat == manifests.Format1 {
		ureq.Alg = manifests.SHA256 // all format 1 can name
	}
	ck.at("uploading (hashing, transfers, presence checks)")
	res, err := uploader.Upload(uctx, ureq)
	var hold *manifests.Hold
	if err == nil {
		ck.at("checking GC's marks")
		// GC deletes only what it marked at least D earlier: the manifest
		// names no marked object, and is committed within D/2 of this look.
		hold, err = uploader.AvoidMarked(uctx, ureq, res, a.gcGuard())
	}
	if err != nil {
		upSpan.SetStatus(codes.Error, err.Error())
		upSpan.End()
		return protocol.Event{}, err
	}
	upSpan.SetAttributes(attribute.Int64("ckpt.bytes_uploaded", res.BytesWritten), attribute.Int64("ckpt.bytes_hashed", res.BytesHashed),
		attribute.Int("ckpt.files_uploaded", res.FilesUploaded), attribute.Int("ckpt.files_reused", res.FilesReused),
		attribute.Int("ckpt.objects_replaced", len(res.Replaced)))
	upSpan.End()
	for _, k := range res.Rekeyed {
		a.log.Info("object marked for deletion by GC: stored again under a new key", "task", req.Task, "checkpoint", req.Checkpoint, "key", k)
	}
	for _, r := range res.Replaced {
		a.log.Warn("reused object missing or damaged in storage: uploaded again from the snapshot",
			"task", req.Task, "checkpoint", req.Checkpoint, "key", r.Key, "problem", r.String())
		reason := "missing"
		if r.Found {
			reason = "size"
		}
		a.cfg.Telemetry.ReuseReplaced(ctx, reason)
	}
	engine := ck.engine.Name()
	m := &manifests.Manifest{
		Job: a.cfg.Job, Task: req.Task, Checkpoint: req.Checkpoint, Parent: parent,
		Created: time.Now().UTC(), Engine: engine, AgentID: a.agentID, Tasks: manifests.SortedTasks(req.Tasks),
		Epoch: own.Epoch, Node: a.cfg.Node, Files: res.Files, Format: a.cfg.ManifestFormat,
		FilesUploaded: res.FilesUploaded, FilesReused: res.FilesReused,
	}
	for _, f := range res.Files {
		m.FullSize += f.Size
	}
	encoded, err := m.Encode(res.BytesWritten)
	if err != nil {
		return protocol.Event{}, err
	}
	// Objects first, manifest last: the checkpoint exists from this write on.
	if err := ctx.Err(); err != nil {
		return protocol.Event{}, err
	}
	// Still the owner? A newer owner fences this agent: commit nothing.
	// (A takeover right after this check is the residual window: readers
	// ignore such a manifest, and the check after the commit says so.)
	ck.at("checking the task's ownership before the commit")
	if err := manifests.CheckOwner(ctx, a.cfg.Store, a.cfg.Job, own); err != nil {
		return protocol.Event{}, ownError(req, a.fence(t, err))
	}
	failpoint.Hit(failpoint.BeforeManifest) // every object uploaded and confirmed, no manifest yet
	ck.at("committing the manifest")
	_, commitSpan := otel.Tracer("ckpt").Start(ctx, "commit", trace.WithAttributes(attribute.Int("ckpt.manifest_bytes", len(encoded))))
	err = a.commit(ctx, m, encoded, hold)
	reconciled := false
	if err != nil && !errors.Is(err, manifests.ErrMarked) && !errors.Is(err, manifests.ErrStale) {
		// The write's outcome is unknown (a timeout or a lost reply may
		// hide a write that landed; a conflict on this owner's own key
		// may be this very write, retried): storage decides.
		if !timedOut(ctx) { // a timeout names the step it struck: the commit
			ck.at("checking whether the manifest landed")
		}
		ok, lerr := a.landed(ctx, m, encoded)
		switch {
		case ok:
			a.log.Warn("manifest commit reported an error, but the manifest is in storage: the checkpoint is complete", "task", t.name, "checkpoint", req.Checkpoint, "err", err)
			err, reconciled = nil, true
		default:
			if lerr != nil {
				err = fmt.Errorf("%w (and whether the manifest landed is unknown: %v)", err, lerr)
			}
			// If the write lands later, the next checkpoint's load
			// learns it from storage.
			a.mu.Lock()
			t.loaded = false
			a.mu.Unlock()
		}
	}
	commitSpan.End()
	if err != nil {
		if errors.Is(err, manifests.ErrMarked) || errors.Is(err, manifests.ErrStale) {
			return protocol.Event{}, errorf(protocol.CodeUnavailable, "checkpoint %d of task %s: %v; retry", req.Checkpoint, req.Task, err)
		}
		if errors.Is(err, manifests.ErrConflict) {
			return protocol.Event{}, errorf(protocol.CodeConflict, "checkpoint %d of task %s was already committed by another writer; the existing one is kept", req.Checkpoint, req.Task)
		}
		return protocol.Event{}, err
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
	if err := manifests.CheckCommitted(after, a.cfg.Store, a.cfg.Job, own, req.Checkpoint); err != nil {
		if errors.Is(err, manifests.ErrFenced) {
			return protocol.Event{}, ownError(req, a.fence(t, err))
		}
		// The manifest is written; whether a takeover fenced it is for
		// readers to decide. Most likely it did not.
		a.log.Warn("check ownership after commit", "task", t.name, "checkpoint", req.Checkpoint, "err", err)
	}
	a.committed(after, t, own, m, encoded, ck.snap)
	dur := time.Since(ck.start).Milliseconds()
	ck.result = telemetry.CheckpointRecord{CheckpointSize: m.CheckpointSize, FullSize: m.FullSize,
		FilesUploaded: m.FilesUploaded, FilesReused: m.FilesReused, BytesUploaded: m.CheckpointSize}
	return protocol.Event{
		Event: "completed", ID: req.ID, Task: req.Task, Checkpoint: req.Checkpoint,
		CheckpointSize: m.CheckpointSize, FullSize: m.FullSize,
		FilesUploaded: m.FilesUploaded, FilesReused: m.FilesReused, DurationMS: dur,
	}, nil
}

// commit writes the manifest, retrying transient failures with backoff
// for up to Config.CommitPatience: the objects are all uploaded by then,
// and giving up would waste them. Retrying the conditional create is safe:
// the retry decorator recognises its own earlier write by its bytes.
// Cancellation (abort, shutdown) stops retries but never interrupts a
// write in progress; the checkpoint's timeout does (the manifest may then
// exist or not: a retry of the same number is refused as a conflict if it
// does, and GC keeps what it names either way).
//
// Every attempt is sent within D/2 of the look at GC's marks (hold), so
// no collection deletes what m names; past that, the commit fails.
func (a *Agent) commit(ctx context.Context, m *manifests.Manifest, encoded []byte, hold *manifests.Hold) error {
	deadline := time.Now().Add(a.cfg.CommitPatience)
	delay := 500 * time.Millisecond
	wctx, cancel := detached(ctx)
	defer cancel()
	for {
		err := manifests.CommitHeld(wctx, a.cfg.Store, m, encoded, hold)
		if err == nil || !retry.Transient(err) || time.Now().Add(delay).After(deadline) {
			return err
		}
		a.log.Warn("manifest commit failed, retrying", "task", m.Task, "checkpoint", m.Checkpoint, "err", err, "delay", delay.String())
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
		delay = min(2*delay, 15*time.Second)
	}
}

// reconcileTimeout bounds the look at storage after a manifest write
// whose outcome is unknown, and the steps after it.
var reconcileTimeout = 30 * time.Second

// landed reports whether storage holds the manifest of m with exactly the
// bytes encoded: a commit that timed out or lost its reply may have landed.
// It ignores ctx's cancellation and deadline (the checkpoint's timeout may
// be what ended the write) and is bounded by reconcileTimeout.
func (a *Agent) landed(ctx context.Context, m *manifests.Manifest, encoded []byte) (bool, error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reconcileTimeout)
	defer cancel()
	key := manifests.ManifestKeyOf(m.Job, m.Task, m.Checkpoint, m.Epoch)
	rc, err := a.cfg.Store.Get(rctx, key)
	if errors.Is(err, storage.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s: %w", key, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, int64(len(encoded))+1))
	if err != nil {
		return false, fmt.Errorf("read %s: %w", key, err)
	}
	return bytes.Equal(data, encoded), nil
}

// committed updates the task after its manifest was written: local copy,
// retained set, and retention of older manifests. Failures here are logged;
// the checkpoint is complete whatever happens to its local copy.
//
// Retirement is fenced like a commit: it is written in the name of owner
// (retired.e<epoch>), and only after a look at the task's ownership
// records shows owner still the newest; a fenced owner retires nothing. (A
// takeover between that look and the writes is covered by the readers'
// rule, manifests.markerCounts.)
func (a *Agent) committed(ctx context.Context, t *task, owner manifests.Owner, m *manifests.Manifest, encoded []byte, snap *localrecovery.Snapshot) {
	var prev *uploader.Previous
	if l, err := a.local.CompleteInspected(t.name, m.Checkpoint, m, encoded, snap.Files); err != nil {
		a.log.Warn("keep local copy", "task", t.name, "checkpoint", m.Checkpoint, "err", err)
	} else {
		prev = &uploader.Previous{Files: m.Files, IDs: l.IDs()}
	}
	t.retainMu.Lock()
	defer t.retainMu.Unlock()
	a.mu.Lock()
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
	a.mu.Unlock()
	// The newest job-complete checkpoint of the task is never retired; it
	// takes the other tasks' manifests to know it (I/O, without the lock).
	protect, ok := a.jobProtect(ctx, t, own)
	a.mu.Lock()
	refs := make([]manifests.Ref, len(t.retained))
	for i, r := range t.retained {
		refs[i] = manifests.RefOf(r)
	}
	var retire []manifests.Ref
	if ok {
		t.jobComplete = max(t.jobComplete, protect)
		// Job-wide checkpoints the job may still complete stay too.
		keep := append(manifests.Pending(t.retained, t.jobComplete, time.Now()), protect)
		_, retire = manifests.Retention(refs, a.cfg.Retain, keep...)
	}
	a.mu.Unlock()
	if len(retire) == 0 {
		return
	}
	// Still the owner? A superseded owner's view of the task is stale: the
	// checkpoints it would retire may be the ones its successor resumed
	// from. Not retired, they stay in the retained set.
	if err := manifests.CheckOwner(ctx, a.cfg.Store, a.cfg.Job, owner); err != nil {
		a.fence(t, err)
		a.log.Warn("retention skipped: cannot confirm this agent still owns the task", "task", t.name, "checkpoint", m.Checkpoint, "err", err)
		return
	}
	a.mu.Lock()
	t.retained = slices.DeleteFunc(t.retained, func(r *manifests.Manifest) bool {
		return slices.ContainsFunc(retire, func(old manifests.Ref) bool { return old.Checkpoint == r.Checkpoint })
	})
	a.mu.Unlock()
	// A task retires older manifests only after a newer one is complete.
	for _, old := range retire {
		failpoint.Hit(failpoint.MidRetire) // before each retirement: with AFTER=k, k retired, the rest not
		if err := manifests.RetireAt(ctx, a.cfg.Store, a.cfg.Job, t.name, old.Checkpoint, owner.Epoch); err != nil {
			a.log.Warn("retire", "task", t.name, "checkpoint", old.Checkpoint, "err", err)
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
func (a *Agent) jobProtect(ctx context.Context, t *task, own []*manifests.Manifest) (protect uint64, ok bool) {
	refs := make([]manifests.Ref, len(own))
	for i, m := range own {
		refs[i] = manifests.RefOf(m)
	}
	kept, retire := manifests.Retention(refs, a.cfg.Retain)
	byN := map[uint64]*manifests.Manifest{}
	for _, m := range own {
		byN[m.Checkpoint] = m
	}
	if !slices.ContainsFunc(retire, func(r manifests.Ref) bool { return byN[r.Checkpoint].Tasks != nil }) {
		return 0, true
	}
	cat, err := manifests.Scan(ctx, a.cfg.Store, a.cfg.Job, "")
	if err != nil {
		a.log.Warn("retention postponed: cannot list the job's checkpoints to find its newest job-complete one", "task", t.name, "err", err)
		return 0, false
	}
	jobs := manifests.NewJobReader(a.cfg.Store, cat)
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
			a.log.Warn("retention postponed: cannot read the job's manifests to find its newest job-complete checkpoint", "task", t.name, "err", err)
			return 0, false
		}
		if st.Complete && st.Includes(t.name) {
			return n, true
		}
	}
	return 0, true
}

// gcGuard returns the agent's view of GC's marks, made on first use.
func (a *Agent) gcGuard() *manifests.Guard {
	a.guardOnce.Do(func() { a.guard = manifests.NewGuard(a.cfg.Store, a.cfg.Job) })
	return a.guard
}

// maybeSweep starts a job-wide GC unless one runs or ran recently.
func (a *Agent) maybeSweep() {
	if a.cfg.GCInterval < 0 {
		return
	}
	a.sweepMu.Lock()
	if a.sweeping || (!a.lastSweep.IsZero() && time.Since(a.lastSweep) < a.cfg.GCInterval) {
		a.sweepMu.Unlock()
		return
	}
	a.sweeping = true
	a.sweepMu.Unlock()
	a.jobs.Add(1)
	go func() {
		defer a.jobs.Done()
		ctx, span := otel.Tracer("ckpt").Start(a.jobsCtx, "gc", trace.WithAttributes(attribute.String("ckpt.job", a.cfg.Job)))
		rep, err := manifests.GC(ctx, a.cfg.Store, a.cfg.Job, manifests.GCOptions{Grace: a.cfg.GCGrace})
		span.SetAttributes(attribute.Int("ckpt.deleted_objects", rep.DeletedObjects), attribute.Int64("ckpt.live_bytes", rep.LiveBytes))
		span.End()
		a.sweepMu.Lock()
		a.sweeping, a.lastSweep = false, time.Now()
		a.sweepMu.Unlock()
		if err != nil {
			a.cfg.Telemetry.GCRun(context.WithoutCancel(ctx), "failed")
			a.log.Error("gc failed: unreferenced objects stay in storage until a sweep succeeds", "err", err)
			return
		}
		a.cfg.Telemetry.GCRun(ctx, "ok")
		a.cfg.Telemetry.GCEnded(ctx, rep.LiveBytes, rep.DeletedObjects, rep.DeletedBytes)
		a.log.Info("gc", "deleted_objects", rep.DeletedObjects, "deleted_bytes", rep.DeletedBytes,
			"live_objects", rep.LiveObjects, "live_bytes", rep.LiveBytes, "retained_checkpoints", rep.RetainedCheckpoints)
	}()
}

// abort cancels an in-flight checkpoint and answers once it has stopped.
func (a *Agent) abort(c *conn, req protocol.Request) {
	a.mu.Lock()
	var ck *checkpoint
	if t := a.tasks[req.Task]; t != nil {
		ck = t.inflight[req.Checkpoint]
	}
	if ck == nil {
		a.mu.Unlock()
		c.send(protocol.Event{Event: "error", ID: req.ID, Task: req.Task, Checkpoint: req.Checkpoint,
			Error: errorf(protocol.CodeNotFound, "checkpoint %d of task %s is not in flight", req.Checkpoint, req.Task)})
		return
	}
	ck.aborted = true
	for i, p := range ck.t.pending {
		if p == ck { // queued, never started: finish it here
			ck.t.pending = slices.Delete(ck.t.pending, i, i+1)
			a.mu.Unlock()
			a.local.Discard(req.Task, req.Checkpoint)
			a.ended(ck, "aborted", errors.New("aborted while queued"))
			a.finish(ck, false)
			ck.c.send(protocol.Event{Event: "aborted", ID: ck.req.ID, Task: req.Task, Checkpoint: req.Checkpoint})
			c.send(protocol.Event{Event: "aborted", ID: req.ID, Task: req.Task, Checkpoint: req.Checkpoint})
			return
		}
	}
	a.mu.Unlock()
	ck.cancel()
	go func() {
		<-ck.done
		if ck.completed {
			c.send(protocol.Event{Event: "error", ID: req.ID, Task: req.Task, Checkpoint: req.Checkpoint,
				Error: errorf(protocol.CodeConflict, "checkpoint %d of task %s completed before the abort took effect", req.Checkpoint, req.Task)})
			return
		}
		c.send(protocol.Event{Event: "aborted", ID: req.ID, Task: req.Task, Checkpoint: req.Checkpoint})
	}()
}

// restored is the restored event's part of a restore's result: the fields
// of `ckpt restore --json`. nil stays nil.
func restored(res *restore.Result) *protocol.Restored {
	if res == nil {
		return nil
	}
	return res.Outcome()
}

// own returns this agent's ownership of task, taking it on the first call
// (epoch one above the last, by conditional create) and caching it. With
// recheck, a cached ownership is checked against storage first. A fenced
// agent gets its *manifests.FencedError, until a restore (restoring) takes
// the task back at a new epoch: a task may move A -> B -> A.
//
// Taking a task from an owner on another node is a move, and a task moves
// by a restore: the restore op (restoring), or `ckpt restore --local-dir`
// into this agent's local dir that saw that very owner as the newest
// (localrecovery's takeover note). Any other first request for such a task
// gets conflict: an agent revived on a node the task has left (a zombie
// after a partition) must not take the task back from its new home.
func (a *Agent) own(ctx context.Context, name string, recheck, restoring bool) (manifests.Owner, error) {
	a.mu.Lock()
	t := a.taskLocked(name)
	a.mu.Unlock()
	t.ownMu.Lock()
	defer t.ownMu.Unlock()
	a.mu.Lock()
	owner, fenced := t.owner, t.fenced
	a.mu.Unlock()
	switch {
	case fenced != nil && !restoring:
		return manifests.Owner{}, fenced
	case fenced != nil:
		// The task moves back here (A -> B -> A): re-owned below.
	case owner != nil && recheck:
		err := manifests.CheckOwner(ctx, a.cfg.Store, a.cfg.Job, *owner)
		if err == nil {
			return *owner, nil
		}
		if !restoring || !errors.Is(err, manifests.ErrFenced) {
			return manifests.Owner{}, a.fence(t, err)
		}
	case owner != nil:
		return *owner, nil
	}
	may := func(cur manifests.Owner) error {
		if restoring || a.succeeds(name, cur) {
			return nil
		}
		if e, ok := a.local.TakeoverEpoch(name); ok && e == cur.Epoch {
			return nil
		}
		return fmt.Errorf("task %s is owned by agent %s on node %s (epoch %d): %w; an agent takes a task over from another node only by restoring it first (the restore op, or ckpt restore --local-dir into this agent's local dir)",
			name, cur.AgentID, cur.Node, cur.Epoch, manifests.ErrOwnedElsewhere)
	}
	vol, err := a.volumeID()
	if err != nil {
		return manifests.Owner{}, err
	}
	rec, err := manifests.TakeOwnershipOn(ctx, a.cfg.Store, a.cfg.Job, name, a.cfg.Node, vol, a.agentID, may)
	if err != nil {
		a.noteOutcome(context.WithoutCancel(ctx), name, err)
		return manifests.Owner{}, err
	}
	a.log.Info("took ownership of task", "task", name, "epoch", rec.Epoch, "after", rec.After, "node", rec.Node, "agent_id", rec.AgentID, "again", owner != nil)
	a.mu.Lock()
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
	a.mu.Unlock()
	return rec, nil
}

// fence records that a newer owner fenced this agent for t when err is a
// *manifests.FencedError, until a restore re-owns the task (own); it
// returns err.
//
// An error about an ownership this agent no longer holds (a checkpoint of
// an earlier epoch, still in flight when a restore re-owned the task) does
// not fence the newer one.
func (a *Agent) fence(t *task, err error) error {
	var fe *manifests.FencedError
	if errors.As(err, &fe) {
		a.mu.Lock()
		if t.fenced == nil && (t.owner == nil || t.owner.Epoch <= fe.Mine) {
			t.fenced = err
			a.log.Warn("fenced: another agent owns the task now; its requests here fail with conflict", "task", t.name, "err", err)
			defer a.noteOutcome(context.Background(), t.name, err)
		}
		a.mu.Unlock()
	}
	return err
}

// ownError is the protocol error for a failure to take or keep ownership:
// conflict when fenced (the message names the new owner), internal for an
// unreadable ownership record, unavailable for a storage outage.
func ownError(req protocol.Request, err error) *protocol.Error {
	var bad *manifests.OwnerError
	switch {
	case errors.Is(err, manifests.ErrOwnedElsewhere):
		return errorf(protocol.CodeConflict, "%v", err)
	case errors.Is(err, manifests.ErrFenced):
		if req.Checkpoint != 0 && req.Op != protocol.OpRestore {
			return errorf(protocol.CodeConflict, "checkpoint %d of task %s: %v", req.Checkpoint, req.Task, err)
		}
		return errorf(protocol.CodeConflict, "task %s: %v", req.Task, err)
	case errors.As(err, &bad):
		return errorf(protocol.CodeInternal, "task %s: %v", req.Task, err)
	case retry.Transient(err), errors.As(err, new(*lazy.UnavailableError)):
		return errorf(protocol.CodeUnavailable, "task %s: take ownership: %v", req.Task, err)
	}
	return errorf(protocol.CodeInternal, "task %s: take ownership: %v", req.Task, err)
}

// errorf returns a *protocol.Error with the given code and message.
func errorf(code, format string, args ...any) *protocol.Error {
	return protocol.Errorf(code, format, args...)
}
