package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/retry"
)

// DefaultStorageProbeInterval is how often the agent checks that its
// storage answers, for ckpt_storage_up and the status page.
const DefaultStorageProbeInterval = 15 * time.Second

// storageProbeTimeout bounds one storage check.
const storageProbeTimeout = 10 * time.Second

// StorageCheck asks storage one cheap question (a Stat of a key that need
// not exist) for every job this agent serves, and records the answer
// (ckpt_storage_up, the status page). It returns nil when every store
// answers. It is /healthz/storage, never a condition of /readyz: an
// outage makes checkpoints answer unavailable, while the app runs on.
func (a *Agent) StorageCheck(ctx context.Context) error {
	cores := a.cores
	if cores == nil {
		cores = []*Agent{a}
	}
	var errs []error
	for _, c := range cores {
		if err := c.checkStorage(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkStorage is StorageCheck for one core.
func (a *Agent) checkStorage(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, storageProbeTimeout)
	defer cancel()
	_, err := a.cfg.Store.Stat(ctx, manifests.TasksPrefix(a.cfg.Job)+".ready-probe")
	if errors.Is(err, storage.ErrNotFound) {
		err = nil
	}
	if err != nil {
		err = fmt.Errorf("storage %s: %w", a.cfg.Store, err)
	}
	a.cfg.Telemetry.StorageChecked(context.WithoutCancel(ctx), err)
	return err
}

// probeStorage checks storage every StorageProbeInterval until ctx is done.
func (a *Agent) probeStorage(ctx context.Context) {
	defer a.jobs.Done()
	every := a.cfg.StorageProbeInterval
	if every <= 0 {
		every = DefaultStorageProbeInterval
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		if err := a.checkStorage(ctx); err != nil && ctx.Err() == nil {
			a.log.Warn("storage does not answer: checkpoints answer unavailable until it does", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// noteOutcome keeps the health an async phase's end says something
// about: one that completed (err nil) clears the task's block and shows
// storage up; one that failed for a reason an operator must act on (the
// task is owned elsewhere, this agent was fenced, an ownership record is
// unreadable, storage refuses the agent's permissions) blocks the task,
// visibly (ckpt_checkpoint_blocked{task,reason}, the status page, one
// error log line) until a checkpoint completes; a storage outage shows
// storage down. err is the failure as the step returned it (its chain
// intact), not the protocol error the client gets.
func (a *Agent) noteOutcome(ctx context.Context, task string, err error) {
	tel := a.cfg.Telemetry
	if err == nil {
		tel.TaskUnblocked(ctx, task)
		tel.StorageChecked(ctx, nil)
		return
	}
	if reason := blockReason(err); reason != "" {
		if tel.TaskBlocked(ctx, task, reason, err.Error()) {
			a.log.Error("checkpoints of the task are blocked until an operator acts", "task", task, "reason", reason, "err", err)
		}
		return
	}
	if retry.Transient(err) {
		tel.StorageChecked(ctx, err)
	}
}

// blockReason names why a failed checkpoint cannot succeed without an
// operator ("" when retrying may be enough).
func blockReason(err error) string {
	var bad *manifests.OwnerError
	switch {
	case errors.Is(err, manifests.ErrOwnedElsewhere):
		return "owned_elsewhere"
	case errors.Is(err, manifests.ErrFenced):
		return "fenced"
	case errors.As(err, &bad):
		return "ownership_record"
	case permissionDenied(err):
		return "permission_denied"
	}
	return ""
}

// permissionDenied reports a storage answer that refuses the agent's
// credentials: HTTP 401/403, or an S3 error code of that meaning.
func permissionDenied(err error) bool {
	var st interface{ HTTPStatusCode() int }
	if errors.As(err, &st) && (st.HTTPStatusCode() == 401 || st.HTTPStatusCode() == 403) {
		return true
	}
	var ec interface{ ErrorCode() string }
	if errors.As(err, &ec) {
		switch ec.ErrorCode() {
		case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "AllAccessDisabled":
			return true
		}
	}
	var ge interface{ PermissionDenied() bool }
	return errors.As(err, &ge) && ge.PermissionDenied()
}

// succeeds reports whether this agent is the successor of cur, the newest
// owner of task, and may take the task over without a restore: cur ran
// on this node (an agent restarted in place), or, in sidecar mode, on
// this agent's volume (the pod's store moved with its volume, an EBS or PD
// disk, to this node), or cur predates volume identities and a restore at
// this pod's start found the store already on this volume
// (localrecovery.Store.RecordPresent). In node-agent mode the node alone
// decides.
func (a *Agent) succeeds(task string, cur manifests.Owner) bool {
	if cur.Node == a.cfg.Node {
		return true
	}
	vol, err := a.volumeID()
	if err != nil || vol == "" {
		return false
	}
	if cur.Volume != "" {
		return cur.Volume == vol
	}
	v, ok := a.local.PresentOn(task)
	return ok && v == vol
}

// volumeID returns the identity of the volume the local dir is on (made
// on first use: a refused request leaves nothing behind), or "" in
// node-agent mode.
func (a *Agent) volumeID() (string, error) {
	if a.tenant != nil {
		return "", nil
	}
	a.volumeMu.Lock()
	defer a.volumeMu.Unlock()
	if a.volume == "" {
		v, err := a.local.VolumeID()
		if err != nil {
			return "", err
		}
		a.volume = v
	}
	return a.volume, nil
}
