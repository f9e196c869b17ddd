package telemetry

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// healthInstruments say whether checkpoints can succeed: storage answers,
// tasks are not blocked, when each task last completed one, how GC runs.
type healthInstruments struct {
	storageUp   metric.Int64Gauge
	blocked     metric.Int64Gauge
	lastSuccess metric.Float64Gauge
	gcRuns      metric.Int64Counter
}

func (h *healthInstruments) create(m metric.Meter) error {
	var err error
	var errs []error
	// No unit on ckpt.storage.up: Prometheus names it ckpt_storage_up.
	h.storageUp, err = m.Int64Gauge("ckpt.storage.up", metric.WithDescription("1 if the last check of storage (a probe every 15s, and every checkpoint's outcome) got an answer, 0 if storage did not answer or refused the agent; /healthz/storage says why."))
	errs = append(errs, err)
	h.blocked, err = m.Int64Gauge("ckpt.checkpoint.blocked", metric.WithDescription("1 while the task's checkpoints fail for a reason an operator must act on (reason: owned_elsewhere, fenced, ownership_record, permission_denied); 0 once one completes."))
	errs = append(errs, err)
	h.lastSuccess, err = m.Float64Gauge("ckpt.checkpoint.last_success_timestamp", metric.WithUnit("s"), metric.WithDescription("Unix time at which the task's last checkpoint completed: alert on time() minus it."))
	errs = append(errs, err)
	h.gcRuns, err = m.Int64Counter("ckpt.gc.runs", metric.WithUnit("{run}"), metric.WithDescription("GC sweeps that ended, by status (ok, failed)."))
	errs = append(errs, err)
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// orNow is at, or now when at is zero.
func orNow(at time.Time) time.Time {
	if at.IsZero() {
		return time.Now()
	}
	return at
}

// StorageHealth is the last check of storage.
type StorageHealth struct {
	Up bool `json:"up"`
	// Error is why storage did not answer (empty when Up).
	Error string `json:"error,omitempty"`
	// Since is when storage last went up or down.
	Since time.Time `json:"since"`
	At    time.Time `json:"at"`
}

// BlockedRecord says why a task's checkpoints cannot complete.
type BlockedRecord struct {
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	Since   time.Time `json:"since"`
}

// StorageChecked records a check of storage: err nil means it answered.
func (t *Telemetry) StorageChecked(ctx context.Context, err error) {
	if t == nil {
		return
	}
	up := int64(1)
	if err != nil {
		up = 0
	}
	t.health.storageUp.Record(ctx, up, metric.WithAttributes(t.jobAtt))
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.storageHealth
	if h == nil || h.Up != (err == nil) {
		h = &StorageHealth{Up: err == nil, Since: now}
	} else {
		c := *h
		h = &c
	}
	h.At, h.Error = now, ""
	if err != nil {
		h.Error = err.Error()
	}
	t.storageHealth = h
}

// TaskBlocked records that task's checkpoints fail for reason until an
// operator acts. It returns true when the task was not blocked for that
// reason before (the caller logs it once).
func (t *Telemetry) TaskBlocked(ctx context.Context, task, reason, message string) bool {
	if t == nil {
		return false
	}
	t.mu.Lock()
	v := t.task(task)
	prev := v.Blocked
	if prev != nil && prev.Reason == reason {
		v.Blocked = &BlockedRecord{Reason: reason, Message: message, Since: prev.Since}
	} else {
		v.Blocked = &BlockedRecord{Reason: reason, Message: message, Since: time.Now()}
	}
	t.mu.Unlock()
	if prev != nil && prev.Reason != reason {
		t.health.blocked.Record(ctx, 0, metric.WithAttributes(t.jobAtt, attribute.String("task", task), attribute.String("reason", prev.Reason)))
	}
	t.health.blocked.Record(ctx, 1, metric.WithAttributes(t.jobAtt, attribute.String("task", task), attribute.String("reason", reason)))
	return prev == nil || prev.Reason != reason
}

// TaskUnblocked clears task's block, if any.
func (t *Telemetry) TaskUnblocked(ctx context.Context, task string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	v := t.task(task)
	prev := v.Blocked
	v.Blocked = nil
	t.mu.Unlock()
	if prev != nil {
		t.health.blocked.Record(ctx, 0, metric.WithAttributes(t.jobAtt, attribute.String("task", task), attribute.String("reason", prev.Reason)))
	}
}

// GCRun counts a GC sweep that ended: status "ok" or "failed".
func (t *Telemetry) GCRun(ctx context.Context, status string) {
	if t == nil {
		return
	}
	t.health.gcRuns.Add(ctx, 1, metric.WithAttributes(t.jobAtt, attribute.String("status", status)))
}
