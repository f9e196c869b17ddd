package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/ckpt-io/ckpt/gc"
	"github.com/ckpt-io/ckpt/internal/failpoint"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/retry"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// commitOwned checks the owner is still this one, then commits m: objects
// first, manifest last, the checkpoint exists from this write on. A write
// whose outcome is unknown is read back (reconciled: it landed).
func (c *Committer) commitOwned(ctx context.Context, t *task, own manifests.Owner, req Request, m *manifests.Manifest, encoded []byte, hold *gc.Hold) (reconciled bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	// Still the owner? A newer owner fences this agent: commit nothing.
	// (A takeover right after this check is the residual window: readers
	// ignore such a manifest, and the check after the commit says so.)
	req.at("checking the task's ownership before the commit")
	if err := manifests.CheckOwner(ctx, c.cfg.Store, c.cfg.Job, own); err != nil {
		return false, &OwnershipError{Err: c.fence(t, err)}
	}
	failpoint.Hit(failpoint.BeforeManifest) // every object uploaded and confirmed, no manifest yet
	req.at("committing the manifest")
	_, commitSpan := otel.Tracer("ckpt").Start(ctx, "commit", trace.WithAttributes(attribute.Int("ckpt.manifest_bytes", len(encoded))))
	err = c.commit(ctx, m, encoded, hold)
	if err != nil && !errors.Is(err, gc.ErrMarked) && !errors.Is(err, gc.ErrStale) {
		// The write's outcome is unknown (a timeout or a lost reply may
		// hide a write that landed; a conflict on this owner's own key
		// may be this very write, retried): storage decides.
		if !TimedOut(ctx) { // a timeout names the step it struck: the commit
			req.at("checking whether the manifest landed")
		}
		ok, lerr := c.landed(ctx, m, encoded)
		switch {
		case ok:
			c.cfg.Log.Warn("manifest commit reported an error, but the manifest is in storage: the checkpoint is complete", "task", t.name, "checkpoint", req.Checkpoint, "err", err)
			err, reconciled = nil, true
		default:
			if lerr != nil {
				err = fmt.Errorf("%w (and whether the manifest landed is unknown: %v)", err, lerr)
			}
			// If the write lands later, the next checkpoint's load
			// learns it from storage.
			c.mu.Lock()
			t.loaded = false
			c.mu.Unlock()
		}
	}
	commitSpan.End()
	switch {
	case err == nil:
		return reconciled, nil
	case errors.Is(err, gc.ErrMarked) || errors.Is(err, gc.ErrStale):
		return false, newError(ErrUnavailable, err, "checkpoint %d of task %s: %v; retry", req.Checkpoint, req.Task, err)
	case errors.Is(err, manifests.ErrConflict):
		return false, newError(ErrConflict, err, "checkpoint %d of task %s was already committed by another writer; the existing one is kept", req.Checkpoint, req.Task)
	}
	return false, err
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
func (c *Committer) commit(ctx context.Context, m *manifests.Manifest, encoded []byte, hold *gc.Hold) error {
	deadline := time.Now().Add(c.cfg.CommitPatience)
	delay := 500 * time.Millisecond
	wctx, cancel := detached(ctx)
	defer cancel()
	for {
		err := gc.CommitHeld(wctx, c.cfg.Store, m, encoded, hold)
		if err == nil || !retry.Transient(err) || time.Now().Add(delay).After(deadline) {
			return err
		}
		c.cfg.Log.Warn("manifest commit failed, retrying", "task", m.Task, "checkpoint", m.Checkpoint, "err", err, "delay", delay.String())
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
func (c *Committer) landed(ctx context.Context, m *manifests.Manifest, encoded []byte) (bool, error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reconcileTimeout)
	defer cancel()
	key := manifests.ManifestKeyOf(m.Job, m.Task, m.Checkpoint, m.Epoch)
	rc, err := c.cfg.Store.Get(rctx, key)
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
