package telemetry

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// WALRecord is the shipping of a task's write-ahead log between
// checkpoints, as the status page shows it.
type WALRecord struct {
	// Checkpoint is the checkpoint the shipped WAL extends, Seq its last
	// WAL manifest committed (0: none yet).
	Checkpoint uint64 `json:"checkpoint"`
	Seq        uint64 `json:"seq"`
	// Through: every write the store synced before it is in storage.
	Through  time.Time `json:"through"`
	Bytes    int64     `json:"bytes"`
	Segments int64     `json:"segments"`
	Gaps     int64     `json:"gaps"`
	// Ended says why shipping stopped for this checkpoint (a gap), until
	// the next checkpoint starts it again.
	Ended string    `json:"ended,omitempty"`
	At    time.Time `json:"at"`
}

// walInstruments publish WAL shipping: the lag (the recovery point), the
// bytes and segments shipped, the gaps.
type walInstruments struct {
	bytes, segments, gaps metric.Int64Counter
	lag                   metric.Float64ObservableGauge

	mu      sync.Mutex
	through map[walKey]time.Time // tasks that ship, by job and task
}

type walKey struct{ job, task string }

func (w *walInstruments) create(m metric.Meter) error {
	var err error
	var errs []error
	w.through = map[walKey]time.Time{}
	w.bytes, err = m.Int64Counter("ckpt.wal", metric.WithUnit("By"), metric.WithDescription("Bytes of write-ahead log shipped between checkpoints (segments committed in WAL manifests)."))
	errs = append(errs, err)
	w.segments, err = m.Int64Counter("ckpt.wal.segments", metric.WithUnit("{segment}"), metric.WithDescription("WAL segments shipped between checkpoints."))
	errs = append(errs, err)
	w.gaps, err = m.Int64Counter("ckpt.wal.gaps", metric.WithUnit("{gap}"), metric.WithDescription("Logs deleted or recycled before they were shipped to their end: the task's WAL stops until its next checkpoint."))
	errs = append(errs, err)
	w.lag, err = m.Float64ObservableGauge("ckpt.wal.lag", metric.WithUnit("s"),
		metric.WithDescription("Recovery point of a task that ships its WAL: now minus the time before which every write the store synced is in storage."),
		metric.WithFloat64Callback(func(_ context.Context, o metric.Float64Observer) error {
			now := time.Now()
			w.mu.Lock()
			defer w.mu.Unlock()
			for k, at := range w.through {
				o.Observe(max(now.Sub(at).Seconds(), 0), metric.WithAttributes(attribute.String(JobLabel, k.job), attribute.String("task", k.task)))
			}
			return nil
		}))
	errs = append(errs, err)
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

func (t *Telemetry) walView(task string) *WALRecord {
	v := t.task(task)
	if v.WAL == nil {
		v.WAL = &WALRecord{}
	}
	return v.WAL
}

// WALRebased records that task's WAL now extends checkpoint n, whose
// snapshot holds every write synced before at (as far as the agent
// knows): the lag counts from there until a round ships.
func (t *Telemetry) WALRebased(task string, n uint64, at time.Time) {
	if t == nil {
		return
	}
	t.mu.Lock()
	w := t.walView(task)
	w.Checkpoint, w.Seq, w.Ended, w.At = n, 0, "", time.Now()
	if w.Through.Before(at) {
		w.Through = at
	}
	through := w.Through
	t.mu.Unlock()
	t.setWALThrough(task, through)
}

// WALShipped records a round of task's WAL shipping: seq committed (0: the
// round found nothing new), through its time.
func (t *Telemetry) WALShipped(ctx context.Context, task string, seq uint64, through time.Time, bytes int64, segments int) {
	if t == nil {
		return
	}
	a := t.taskAttrs(task)
	if segments > 0 {
		t.wal.bytes.Add(ctx, bytes, a)
		t.wal.segments.Add(ctx, int64(segments), a)
	}
	t.mu.Lock()
	w := t.walView(task)
	if seq > 0 {
		w.Seq = seq
	}
	w.Bytes += bytes
	w.Segments += int64(segments)
	if through.After(w.Through) {
		w.Through = through
	}
	w.At = time.Now()
	through = w.Through
	t.mu.Unlock()
	t.setWALThrough(task, through)
}

// WALEnded records that task's WAL stopped before the next checkpoint:
// gap is true for a log gone before it was shipped to its end.
func (t *Telemetry) WALEnded(ctx context.Context, task, why string, gap bool) {
	if t == nil {
		return
	}
	if gap {
		t.wal.gaps.Add(ctx, 1, t.taskAttrs(task))
	}
	t.mu.Lock()
	w := t.walView(task)
	w.Ended, w.At = why, time.Now()
	if gap {
		w.Gaps++
	}
	t.mu.Unlock()
}

// WALStopped records that task ships no WAL any more (its checkpoints
// name no wal_dir, or another agent owns it): its lag is not published.
func (t *Telemetry) WALStopped(task string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	if v := t.tasks[task]; v != nil {
		v.WAL = nil
	}
	t.mu.Unlock()
	t.wal.mu.Lock()
	delete(t.wal.through, walKey{t.job, task})
	t.wal.mu.Unlock()
}

func (t *Telemetry) setWALThrough(task string, through time.Time) {
	if through.IsZero() {
		return
	}
	t.wal.mu.Lock()
	t.wal.through[walKey{t.job, task}] = through
	t.wal.mu.Unlock()
}
