package agent

import (
	"context"
	"errors"
	"go.opentelemetry.io/otel"
	"slices"
	"sort"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ckpt-io/ckpt/checkpoint"
	"github.com/ckpt-io/ckpt/engines"
	"github.com/ckpt-io/ckpt/gc"
	"github.com/ckpt-io/ckpt/internal/failpoint"
	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/protocol"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage/lazy"
	"github.com/ckpt-io/ckpt/storage/retry"
	"github.com/ckpt-io/ckpt/telemetry"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// task is the agent's session for one task: its checkpoints in flight.
// All fields are guarded by Agent.mu. What is known of the task in
// storage (ownership, retained manifests, last checkpoint) is the
// Committer's (Agent.txn).
type task struct {
	name string

	inflight map[uint64]*flight // syncing, queued or running
	pending  []*flight          // synced, waiting for an async slot
	running  int
}

// flight is one checkpoint in flight.
type flight struct {
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
	// epoch is the owner's epoch the completed checkpoint was committed by.
	epoch  uint64
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
func (ck *flight) at(step string) { ck.step.Store(step) }

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

func (a *Agent) taskLocked(name string) *task {
	t := a.tasks[name]
	if t == nil {
		t = &task{name: name, inflight: map[uint64]*flight{}}
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
	st := a.txn.Status(req.Task)
	switch {
	case st.Fenced != nil:
		a.mu.Unlock()
		c.send(failed(req, errorf(protocol.CodeConflict, "checkpoint %d of task %s: %v", req.Checkpoint, req.Task, st.Fenced)))
		return
	case req.Checkpoint <= st.LastCompleted:
		a.mu.Unlock()
		c.send(failed(req, errorf(protocol.CodeConflict, "checkpoint %d of task %s is at or below its last completed checkpoint %d", req.Checkpoint, req.Task, st.LastCompleted)))
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
	ck := &flight{t: t, req: req, engine: eng, c: c, start: start, ctx: ctx, cancel: cancel, span: span, done: make(chan struct{})}
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
func (a *Agent) finish(ck *flight, ran bool) {
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
func (a *Agent) run(ck *flight) {
	req := ck.req
	ctx := ck.ctx
	limit := a.timeout(req)
	if limit > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, limit, checkpoint.ErrTimeout)
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
	case ck.ctx.Err() == nil && checkpoint.TimedOut(ctx):
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
func (a *Agent) ended(ck *flight, status string, err error) {
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

// upload is the async phase proper: the files' inspection, then the
// storage transaction (checkpoint.Committer.Run).
func (a *Agent) upload(ctx context.Context, ck *flight) (protocol.Event, error) {
	req := ck.req
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
	res, err := a.txn.Run(ctx, checkpoint.Request{Task: req.Task, Checkpoint: req.Checkpoint, Tasks: req.Tasks,
		Snapshot: ck.snap, Engine: ck.engine, Step: ck.at})
	if err != nil {
		return protocol.Event{}, txnError(req, err)
	}
	m := res.Manifest
	ck.epoch = m.Epoch
	dur := time.Since(ck.start).Milliseconds()
	ck.result = telemetry.CheckpointRecord{CheckpointSize: m.CheckpointSize, FullSize: m.FullSize,
		FilesUploaded: m.FilesUploaded, FilesReused: m.FilesReused, BytesUploaded: m.CheckpointSize}
	return protocol.Event{
		Event: "completed", ID: req.ID, Task: req.Task, Checkpoint: req.Checkpoint,
		CheckpointSize: m.CheckpointSize, FullSize: m.FullSize,
		FilesUploaded: m.FilesUploaded, FilesReused: m.FilesReused, DurationMS: dur,
	}, nil
}

// txnError maps an error of checkpoint.Committer.Run to the protocol: a
// *protocol.Error for the transaction's own errors (ownership, conflict,
// retry), else err itself (run classifies storage and local failures).
func txnError(req protocol.Request, err error) error {
	var oe *checkpoint.OwnershipError
	switch {
	case errors.As(err, &oe):
		return ownError(req, oe.Err)
	case errors.Is(err, checkpoint.ErrUnavailable):
		return errorf(protocol.CodeUnavailable, "%v", err)
	case errors.Is(err, checkpoint.ErrConflict):
		return errorf(protocol.CodeConflict, "%v", err)
	}
	return err
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
		rep, err := gc.Collect(ctx, a.cfg.Store, a.cfg.Job, gc.Options{Grace: a.cfg.GCGrace})
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
	var ck *flight
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
