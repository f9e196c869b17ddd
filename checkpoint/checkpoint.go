// Package checkpoint owns the storage transaction of one task's checkpoint:
// from a snapshot in the local store to a committed manifest.
//
// One Run, in this order (docs/design.md, "The flow of one checkpoint"):
//
//  1. own the task: this agent's ownership record, taken by conditional
//     create of the next epoch on the task's first checkpoint, then cached;
//     a fenced owner stops here (invariant 9);
//  2. load the task's previous checkpoint and retained manifests, once:
//     the only objects the checkpoint may reuse (invariant 3);
//  3. upload through package uploader: hash, dedupe against confirmed
//     objects, transfer, confirm every reused object's presence;
//  4. look at GC's marks: a marked object is stored again under a fresh
//     key, and the commit is sent within D/2 of the look (invariant 4);
//  5. check the owner is still this one (invariant 9);
//  6. commit the manifest last, conditionally (invariants 1 and 2);
//  7. a commit whose outcome is unknown is read back: storage decides;
//  8. confirm the ownership after the commit, keep the local copy, and
//     retire the manifests beyond the retention, fenced like a commit.
//
// The caller (the agent) keeps the socket, sessions, queue, abort and
// telemetry; it maps this package's errors to protocol codes.
package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ckpt-io/ckpt/engines"
	"github.com/ckpt-io/ckpt/gc"
	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/uploader"
)

// Errors of Run, for errors.Is. An error of the transaction itself (not a
// storage or local failure as such) is an *Error of kind ErrConflict or
// ErrUnavailable, or an *OwnershipError (wrapping ErrFenced,
// ErrOwnedElsewhere, ...); its message is the one to show the user.
var (
	// ErrConflict: the checkpoint number is at or below the task's last
	// completed checkpoint, or another writer committed it first (the
	// error then also wraps manifests.ErrConflict). Retrying it is useless.
	ErrConflict = errors.New("checkpoint conflicts with a completed one")
	// ErrFenced: a newer owner took the task; this agent commits and
	// retires nothing for it until a restore takes it back
	// (Committer.OwnForRestore).
	// It is manifests.ErrFenced.
	ErrFenced = manifests.ErrFenced
	// ErrOwnedElsewhere: the task's newest owner runs on another node;
	// this agent takes the task only by a restore. It is
	// manifests.ErrOwnedElsewhere.
	ErrOwnedElsewhere = manifests.ErrOwnedElsewhere
	// ErrUnavailable: the commit could not be sent in time after the look
	// at GC's marks, or names an object GC marked meanwhile
	// (gc.ErrStale, gc.ErrMarked); a retry succeeds.
	// Storage outages are storage's own errors (see storage/retry).
	ErrUnavailable = errors.New("checkpoint could not commit now; retry")
	// ErrTimeout is the cause of a context cancelled by a checkpoint's
	// timeout (context.WithTimeoutCause); see TimedOut.
	ErrTimeout = errors.New("checkpoint timeout")
)

// Error is an error of Run with its kind (one of the Err* above) and the
// message to show the user.
type Error struct {
	Kind error  // ErrConflict, ErrUnavailable, ...
	Msg  string // the whole message
	Err  error  // the cause, or nil
}

func (e *Error) Error() string { return e.Msg }

// Unwrap returns the kind and the cause: errors.Is sees both.
func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}

func newError(kind, cause error, format string, args ...any) *Error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...), Err: cause}
}

// OwnershipError is a failure to take or keep the task's ownership: it
// wraps the error of manifests' ownership calls (ErrFenced,
// ErrOwnedElsewhere, a *manifests.OwnerError for an unreadable record, or
// a storage error). Its message is its cause's.
type OwnershipError struct{ Err error }

func (e *OwnershipError) Error() string { return e.Err.Error() }
func (e *OwnershipError) Unwrap() error { return e.Err }

// Config is what a Committer works with: the job's storage and the
// agent's identity. Hooks may be nil.
type Config struct {
	Store   storage.Store
	Job     string
	Node    string // the node this agent runs on (ownership records)
	AgentID string
	// Local is the local store: snapshots, local copies, takeover notes.
	Local *localrecovery.Store
	// Presence confirms reused objects before commits (invariant 3).
	Presence          *uploader.Presence
	Retain            int // complete checkpoints each task keeps
	UploadConcurrency int
	ManifestFormat    int           // manifests.Format1 or Format2
	CommitPatience    time.Duration // how long a commit retries transient failures
	Log               *slog.Logger
	// Guard is the writers' view of GC's marks (nil: gc.NewGuard
	// of Store and Job, made on first use).
	Guard *gc.Guard

	// Volume returns the identity of the volume the local dir is on, for
	// ownership records ("" in node-agent mode).
	Volume func() (string, error)
	// Succeeds reports whether this agent is the successor of cur, the
	// task's newest owner, and may take the task without a restore.
	Succeeds func(task string, cur manifests.Owner) bool
	// Note is told of a failure to take the task's ownership and of this
	// agent being fenced (the agent's health).
	Note func(ctx context.Context, task string, err error)
	// Replaced is told, per reused object found missing ("missing") or of
	// the wrong size ("size") and uploaded again, the reason.
	Replaced func(ctx context.Context, reason string)
}

// Request is one checkpoint of one task to commit.
type Request struct {
	Task       string
	Checkpoint uint64
	// Tasks is the job's task list of a job-wide checkpoint (nil: none).
	Tasks []string
	// Snapshot is the checkpoint's files in the local store, inspected.
	Snapshot *localrecovery.Snapshot
	Engine   engines.Engine // classifies the files
	// Step, if set, is told what Run is doing (for a timeout's message).
	Step func(string)
}

func (r Request) at(step string) {
	if r.Step != nil {
		r.Step(step)
	}
}

// Result is a committed checkpoint.
type Result struct {
	Manifest *manifests.Manifest
	// Reconciled: the commit reported an error, but reading the manifest
	// back showed it landed.
	Reconciled bool
}

// Committer runs the checkpoint transactions of the tasks of one job for
// one agent, and keeps what it knows of each task (its ownership, retained
// manifests, last checkpoint). It is safe for concurrent use; Runs of the
// same task may overlap (the caller bounds them).
type Committer struct {
	cfg Config

	guardOnce sync.Once
	guard     *gc.Guard

	mu    sync.Mutex
	tasks map[string]*task
}

// New returns a Committer for cfg.
func New(cfg Config) *Committer {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Note == nil {
		cfg.Note = func(context.Context, string, error) {}
	}
	if cfg.Replaced == nil {
		cfg.Replaced = func(context.Context, string) {}
	}
	if cfg.Volume == nil {
		cfg.Volume = func() (string, error) { return "", nil }
	}
	if cfg.Succeeds == nil {
		cfg.Succeeds = func(string, manifests.Owner) bool { return false }
	}
	return &Committer{cfg: cfg, tasks: map[string]*task{}}
}

// gcGuard returns the view of GC's marks, made on first use.
func (c *Committer) gcGuard() *gc.Guard {
	c.guardOnce.Do(func() {
		c.guard = c.cfg.Guard
		if c.guard == nil {
			c.guard = gc.NewGuard(c.cfg.Store, c.cfg.Job)
		}
	})
	return c.guard
}

// TimedOut reports whether ctx, a checkpoint's context, is past its
// timeout. Its deadline is the test, not only its Done channel: a call
// bounded by the same deadline (see detached) may return first.
func TimedOut(ctx context.Context) bool {
	if errors.Is(context.Cause(ctx), ErrTimeout) {
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
		return context.WithDeadlineCause(d, dl, ErrTimeout)
	}
	return d, func() {}
}
