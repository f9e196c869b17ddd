package agent

import (
	"context"
	"slices"
	"time"

	"github.com/ckpt-io/ckpt/protocol"

	"github.com/ckpt-io/ckpt/telemetry"
)

// standbys keeps this node's warm copies of the tasks of
// Config.StandbyFor: a refresh of each at start, then every
// Config.StandbyInterval, until ctx is done. A refresh yields to the
// node's own work: it waits while any checkpoint of this agent is in its
// async phase or queued for it. A followed task that this agent serves
// (it moved here, by a restore) is no longer followed.
func (a *Agent) standbys(ctx context.Context) {
	defer a.jobs.Done()
	tick := time.NewTicker(a.cfg.StandbyInterval)
	defer tick.Stop()
	for {
		a.mu.Lock()
		followed := slices.Clone(a.followed)
		a.mu.Unlock()
		for _, task := range followed {
			if !a.waitIdle(ctx) {
				return
			}
			if a.serves(task) {
				continue
			}
			start := time.Now()
			res, err := a.cfg.Standby(ctx, task)
			if ctx.Err() != nil {
				return
			}
			rec := telemetry.StandbyRecord{Task: task, At: time.Now(), Duration: time.Since(start)}
			if res != nil {
				rec.Held, rec.Newest, rec.Lag = res.Held, res.Newest, res.Lag
				if res.Fetched != nil {
					rec.BytesLocal, rec.BytesRemote = res.Fetched.BytesLocal, res.Fetched.BytesRemote
				}
				if f := res.Failover; f != nil {
					rec.Failover = time.Duration(f.DurationMS) * time.Millisecond
					rec.FailoverBytes, rec.FailoverRemote = f.Bytes, f.BytesRemote
					a.log.Info("standby failover restore measured", "task", task, "checkpoint", f.Checkpoint,
						"bytes", f.Bytes, "bytes_remote", f.BytesRemote, "duration_ms", f.DurationMS)
				}
			}
			switch {
			case err != nil:
				rec.Error = err.Error()
				a.log.Warn("standby refresh failed", "task", task, "held", rec.Held, "newest", rec.Newest, "err", err)
			case res.Fetched != nil:
				a.log.Info("standby refreshed", "task", task, "checkpoint", rec.Held, "bytes_local", rec.BytesLocal,
					"bytes_remote", rec.BytesRemote, "duration_ms", rec.Duration.Milliseconds())
			}
			a.cfg.Telemetry.StandbyRefreshed(ctx, rec)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-a.nudge:
		}
	}
}

// follow answers a follow request: the task joins the tasks this agent
// keeps a warm copy of, and a refresh starts at once. A task this agent
// serves is owned here, not followed (conflict); an agent with no standby
// service (node-agent mode) answers unavailable. In node-agent mode the
// task and job are the tenant's, or the request was refused before this.
func (a *Agent) follow(c *conn, req protocol.Request) {
	if a.cfg.Standby == nil {
		c.send(protocol.Event{Event: "error", ID: req.ID, Task: req.Task, Error: errorf(protocol.CodeUnavailable, "this agent keeps no warm standbys (node-agent mode); run a sidecar agent with --standby-for")})
		return
	}
	if a.serves(req.Task) {
		c.send(protocol.Event{Event: "error", ID: req.ID, Task: req.Task, Error: errorf(protocol.CodeConflict, "this agent serves task %s: it owns it and does not follow it", req.Task)})
		return
	}
	a.mu.Lock()
	if !slices.Contains(a.followed, req.Task) {
		a.followed = append(a.followed, req.Task)
	}
	a.mu.Unlock()
	select {
	case a.nudge <- struct{}{}:
	default:
	}
	c.send(protocol.Event{Event: "following", ID: req.ID, Task: req.Task})
}

// waitIdle waits until no checkpoint of this agent is in its async phase
// or queued for it; false when ctx ended first.
func (a *Agent) waitIdle(ctx context.Context) bool {
	for {
		a.mu.Lock()
		busy := false
		for _, t := range a.tasks {
			busy = busy || t.running > 0 || len(t.pending) > 0
		}
		a.mu.Unlock()
		if !busy {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// serves reports whether this agent has served a checkpoint of task.
func (a *Agent) serves(task string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.tasks[task]
	return t != nil && (a.txn.Status(t.name).LastCompleted > 0 || len(t.inflight) > 0)
}
