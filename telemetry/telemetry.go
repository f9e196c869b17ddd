// Package telemetry publishes what ckpt does: OpenTelemetry metrics
// (scraped as Prometheus at /metrics, pushed over OTLP when the standard
// OTEL_EXPORTER_OTLP_* variables are set), traces (exported as
// OTEL_TRACES_EXPORTER says, the standard autoexport behaviour), and the
// recent history of every task that the status page draws.
//
// Metric names follow Flink's meanings: the last checkpoint size is what a
// checkpoint shipped (lastCheckpointSize), the last full size what a restore
// must fetch (lastCheckpointFullSize). Both are always published together.
package telemetry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	promexp "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
)

// HistoryLen is how many checkpoints per task the status page keeps.
const HistoryLen = 120

// CheckpointRecord is the outcome of one checkpoint.
type CheckpointRecord struct {
	Task           string        `json:"task"`
	Checkpoint     uint64        `json:"checkpoint"`
	Status         string        `json:"status"` // completed, failed, aborted
	CheckpointSize int64         `json:"checkpoint_size"`
	FullSize       int64         `json:"full_size"`
	FilesUploaded  int           `json:"files_uploaded"`
	FilesReused    int           `json:"files_reused"`
	BytesUploaded  int64         `json:"bytes_uploaded"`
	Sync           time.Duration `json:"sync_ns"`
	Async          time.Duration `json:"async_ns"`
	Total          time.Duration `json:"total_ns"`
	At             time.Time     `json:"at"`
}

// RestoreRecord is the outcome of one restore (or drill).
type RestoreRecord struct {
	Task        string
	Checkpoint  uint64
	BytesLocal  int64
	BytesRemote int64
	Duration    time.Duration
	OK          bool
}

// DrillRecord is the outcome of one restore drill.
type DrillRecord struct {
	Task       string        `json:"task"`
	Checkpoint uint64        `json:"checkpoint"`
	Bytes      int64         `json:"bytes"`
	Files      int           `json:"files"`
	Duration   time.Duration `json:"duration_ns"`
	Throughput float64       `json:"throughput_bytes_per_s"`
	Verified   bool          `json:"verified"`
	// Sample is true for a sample drill (--drill-sample-bytes): Bytes and
	// Files are the sample's, read from storage and verified, not
	// restored.
	Sample bool      `json:"sample,omitempty"`
	Error  string    `json:"error,omitempty"`
	At     time.Time `json:"at"`
	// RPO is the drill's recovery point: the age of the newest write its
	// restore recovered (0: not measured, a sample drill).
	RPO time.Duration `json:"rpo_ns,omitempty"`
}

// StandbyRecord is one refresh of a warm standby's copy of a task this
// agent follows but does not own.
type StandbyRecord struct {
	Task string `json:"task"`
	// Held is the checkpoint the copy holds, Newest the one it follows.
	Held   uint64 `json:"held"`
	Newest uint64 `json:"newest"`
	// Lag is how long ago Newest was committed while the copy lacks it.
	Lag         time.Duration `json:"lag_ns"`
	BytesLocal  int64         `json:"bytes_local"`
	BytesRemote int64         `json:"bytes_remote"`
	Duration    time.Duration `json:"duration_ns"`
	// Failover, when measured, is how long the restore a failover to this
	// node runs took: from the copy, every byte verified; FailoverBytes
	// what it restored and FailoverRemote what it still had to fetch.
	Failover       time.Duration `json:"failover_ns,omitempty"`
	FailoverBytes  int64         `json:"failover_bytes,omitempty"`
	FailoverRemote int64         `json:"failover_bytes_remote,omitempty"`
	Error          string        `json:"error,omitempty"`
	At             time.Time     `json:"at"`
}

// TaskView is one task as the status page shows it.
type TaskView struct {
	Task      string             `json:"task"`
	History   []CheckpointRecord `json:"history"` // oldest first
	InFlight  int                `json:"in_flight"`
	LastDrill *DrillRecord       `json:"last_drill,omitempty"`
	// Standby is the last refresh of this agent's warm copy of the task,
	// when it follows the task (--standby-for) instead of owning it.
	Standby *StandbyRecord `json:"standby,omitempty"`
	// Blocked, when set, says why the task's checkpoints cannot complete
	// until an operator acts (cleared by the next completed checkpoint).
	Blocked *BlockedRecord `json:"blocked,omitempty"`
	// WAL is the shipping of the task's write-ahead log between
	// checkpoints, when its checkpoints name a wal_dir.
	WAL *WALRecord `json:"wal,omitempty"`
}

// View is everything the status page shows.
type View struct {
	Job           string     `json:"job"`
	Storage       string     `json:"storage"`
	Version       string     `json:"version"`
	Tasks         []TaskView `json:"tasks"`
	RetainedBytes int64      `json:"retained_bytes"` // bytes held in storage by retained checkpoints
	LogicalBytes  int64      `json:"logical_bytes"`  // sum of the tasks' last full sizes
	GCDeleted     int64      `json:"gc_deleted_objects"`
	Now           time.Time  `json:"now"`
	// JobStatus is the whole job as the last scan of storage saw it (nil:
	// none yet, or no source; see SetJobSource).
	JobStatus *JobView `json:"job_status,omitempty"`
	// StorageHealth is the last check of storage (nil: none yet).
	StorageHealth *StorageHealth `json:"storage_health,omitempty"`
}

// Telemetry owns the providers and the instruments. A nil *Telemetry is
// valid and records nothing, so code under test needs no setup.
type Telemetry struct {
	job, storage, version string

	mp       *sdkmetric.MeterProvider
	tp       *sdktrace.TracerProvider
	Registry *prometheus.Registry

	// instruments are shared by the Telemetry of every job (ForJob).
	*instruments
	// child is set on a ForJob Telemetry: its providers are its parent's.
	child bool
	// children are the ForJob Telemetries of t, whose tasks t's View shows
	// too (guarded by mu).
	children []*Telemetry

	mu     sync.Mutex
	tasks  map[string]*TaskView
	retB   int64
	gcDel  int64
	jobAtt attribute.KeyValue

	jobView jobState // the status page's job view (its own lock)

	storageHealth *StorageHealth // guarded by mu
}

// instruments are the metric instruments, created once per provider.
type instruments struct {
	lastSize, lastFull, lastID                metric.Int64Gauge
	lastSync, lastAsync, lastTotal            metric.Float64Gauge
	histSync, histAsync, histTotal            metric.Float64Histogram
	filesUploaded, filesReused, bytesUploaded metric.Int64Counter
	checkpoints                               metric.Int64Counter
	inFlight                                  metric.Int64UpDownCounter
	retained, logical                         metric.Int64Gauge
	gcDeleted, gcDeletedBytes                 metric.Int64Counter
	reuseReplaced                             metric.Int64Counter
	scrubObjects, scrubBytes                  metric.Int64Counter
	restoreDur                                metric.Float64Histogram
	restoreBytes                              metric.Int64Counter
	drillDur, drillThroughput                 metric.Float64Gauge
	drillOK, drillSample                      metric.Int64Gauge
	drillRPO                                  metric.Float64Gauge
	standbyLag                                metric.Float64Gauge
	standbyHeld                               metric.Int64Gauge
	standbyBytes                              metric.Int64Counter
	standbyFailover                           metric.Float64Gauge
	requests                                  metric.Int64Counter
	health                                    healthInstruments
	wal                                       walInstruments
}

// JobLabel is the metric attribute naming the job: not "job", which is
// Prometheus's own target label (a scrape would rename ckpt's to
// exported_job, or overwrite it under honor_labels).
const JobLabel = "ckpt_job"

// Options names what the telemetry describes.
type Options struct {
	Job, Storage, Version string
	// Service is the OTel service name (default "ckpt").
	Service string
}

// New sets up metrics (Prometheus registry, plus OTLP when configured) and
// traces (exporter from OTEL_TRACES_EXPORTER, or OTLP when an OTLP endpoint
// is set, else none), installs them as the global providers, and returns a
// Telemetry to record into. Shutdown flushes and stops them.
func New(ctx context.Context, o Options) (*Telemetry, error) {
	if o.Service == "" {
		// OTEL_SERVICE_NAME, when set, names the service (resource.Default
		// reads it; the merge below must not override it).
		o.Service = cmp.Or(os.Getenv("OTEL_SERVICE_NAME"), "ckpt")
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		semconv.ServiceName(o.Service), semconv.ServiceVersion(o.Version)))
	if err != nil {
		res = resource.Default()
	}
	reg := prometheus.NewRegistry()
	prom, err := promexp.New(promexp.WithRegisterer(reg), promexp.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	mopts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(prom)}
	if otlpMetricsWanted() {
		r, err := autoexport.NewMetricReader(ctx)
		if err != nil {
			return nil, fmt.Errorf("metrics exporter (OTEL_METRICS_EXPORTER, OTEL_EXPORTER_OTLP_*): %w", err)
		}
		if !autoexport.IsNoneMetricReader(r) {
			mopts = append(mopts, sdkmetric.WithReader(r))
		}
	}
	mp := sdkmetric.NewMeterProvider(mopts...)

	topts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if tracesWanted() {
		exp, err := autoexport.NewSpanExporter(ctx)
		if err != nil {
			return nil, fmt.Errorf("traces exporter (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_*): %w", err)
		}
		if !autoexport.IsNoneSpanExporter(exp) {
			topts = append(topts, sdktrace.WithBatcher(exp))
		}
	}
	tp := sdktrace.NewTracerProvider(topts...)
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))

	t := &Telemetry{job: o.Job, storage: o.Storage, version: o.Version, mp: mp, tp: tp, Registry: reg,
		tasks: map[string]*TaskView{}, jobAtt: attribute.String(JobLabel, o.Job), instruments: &instruments{}}
	if err := t.instruments.create(mp.Meter("ckpt")); err != nil {
		return nil, err
	}
	return t, nil
}

func otlpMetricsWanted() bool {
	v := os.Getenv("OTEL_METRICS_EXPORTER")
	if v == "none" || v == "prometheus" {
		return false
	}
	return v != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") != ""
}

func tracesWanted() bool {
	return os.Getenv("OTEL_TRACES_EXPORTER") != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// durationBuckets suit checkpoint phases: from a millisecond to an hour.
var durationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}

func (t *instruments) create(m metric.Meter) error {
	var errs []error
	ig := func(name, unit, desc string) metric.Int64Gauge {
		g, err := m.Int64Gauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	fg := func(name, unit, desc string) metric.Float64Gauge {
		g, err := m.Float64Gauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	hist := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(durationBuckets...))
		errs = append(errs, err)
		return h
	}
	ctr := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	t.lastSize = ig("ckpt.checkpoint.last.size", "By", "Bytes the task's last completed checkpoint wrote to storage (Flink's lastCheckpointSize).")
	t.lastFull = ig("ckpt.checkpoint.last.full_size", "By", "Bytes of every file the task's last completed checkpoint references: what a restore fetches (Flink's lastCheckpointFullSize).")
	t.lastID = ig("ckpt.checkpoint.last.id", "{checkpoint}", "Number of the task's last completed checkpoint.")
	t.lastSync = fg("ckpt.checkpoint.last.sync.duration", "s", "Sync phase of the last completed checkpoint: the only time the app waited.")
	t.lastAsync = fg("ckpt.checkpoint.last.async.duration", "s", "Async phase (upload and commit) of the last completed checkpoint.")
	t.lastTotal = fg("ckpt.checkpoint.last.duration", "s", "End-to-end duration of the last completed checkpoint.")
	t.histSync = hist("ckpt.checkpoint.sync.duration", "Sync phase durations.")
	t.histAsync = hist("ckpt.checkpoint.async.duration", "Async phase durations.")
	t.histTotal = hist("ckpt.checkpoint.duration", "End-to-end checkpoint durations.")
	t.filesUploaded = ctr("ckpt.checkpoint.files.uploaded", "{file}", "Files uploaded by checkpoints.")
	t.filesReused = ctr("ckpt.checkpoint.files.reused", "{file}", "Files reused from earlier retained checkpoints.")
	t.bytesUploaded = ctr("ckpt.checkpoint.uploaded", "By", "Bytes written to storage by checkpoints.")
	t.checkpoints = ctr("ckpt.checkpoints", "{checkpoint}", "Checkpoints that ended, by status (completed, failed, aborted).")
	var err error
	t.inFlight, err = m.Int64UpDownCounter("ckpt.checkpoint.in_flight", metric.WithUnit("{checkpoint}"), metric.WithDescription("Checkpoints in their sync or async phase."))
	errs = append(errs, err)
	t.retained = ig("ckpt.storage.retained", "By", "Bytes held in storage by the job's retained checkpoints (the bucket bill), as of the last GC.")
	t.logical = ig("ckpt.state.logical", "By", "Logical state of the job: the sum of its tasks' last full sizes.")
	t.gcDeleted = ctr("ckpt.gc.deleted.objects", "{object}", "Objects deleted by GC.")
	t.gcDeletedBytes = ctr("ckpt.gc.deleted", "By", "Bytes deleted by GC.")
	t.reuseReplaced = ctr("ckpt.reuse.replaced", "{object}", "Objects a checkpoint meant to reuse but found missing or of the wrong size in storage, and uploaded again, by reason (missing, size).")
	t.scrubObjects = ctr("ckpt.scrub.objects", "{object}", "Live objects the scrub checked, by result (ok, corrupt, missing, error), and healed or unhealed after corrupt or missing.")
	t.scrubBytes = ctr("ckpt.scrub", "By", "Bytes the scrub read back from storage and hashed.")
	t.restoreDur = hist("ckpt.restore.duration", "Restore durations.")
	t.restoreBytes = ctr("ckpt.restore", "By", "Bytes restored, by source (local, remote).")
	t.drillDur = fg("ckpt.drill.last.duration", "s", "Duration of the last restore drill: measured restore time from storage alone.")
	t.drillThroughput = fg("ckpt.drill.last.throughput", "By/s", "Throughput of the last restore drill.")
	t.drillRPO = fg("ckpt.drill.last.rpo", "s", "Recovery point of the last restore drill: the age, when it ended, of the newest write its restore recovered (checkpoint and shipped WAL).")
	t.drillOK = ig("ckpt.drill.last.verified", "1", "1 if the last restore drill verified every byte, 0 if it failed.")
	t.drillSample = ig("ckpt.drill.last.sample", "1", "1 if the last restore drill was a sample (--drill-sample-bytes: a random sample of the files read and verified, nothing restored), 0 if it restored the whole checkpoint.")
	t.standbyLag = fg("ckpt.standby.lag", "s", "How long ago the owner committed the checkpoint a warm standby follows, while the standby's copy lacks it (0: it holds it).")
	t.standbyHeld = ig("ckpt.standby.checkpoint", "{checkpoint}", "The checkpoint a warm standby's local copy holds.")
	t.standbyFailover = fg("ckpt.standby.failover.duration", "s", "Measured failover restore on a warm standby's node: from its copy, every byte verified (with --drill-interval).")
	t.standbyBytes = ctr("ckpt.standby", "By", "Bytes a warm standby's refreshes took, by source (local: from its older copy, remote: from storage).")
	t.requests = ctr("ckpt.requests", "{request}", "Socket requests by op and outcome: ok for accepted ones, else the error code they were refused with (op connect: connections refused at accept).")
	errs = append(errs, t.health.create(m))
	errs = append(errs, t.wal.create(m))
	return errors.Join(errs...)
}

// ForJob returns a Telemetry for another job (node-agent mode serves
// several): it records into t's instruments and providers, with job as
// the job attribute of every measurement, and keeps its own task views
// for its View. Its Shutdown stops only its own job view; t's stops the
// providers. A nil t gives nil.
func (t *Telemetry) ForJob(job, storage string) *Telemetry {
	if t == nil {
		return nil
	}
	c := &Telemetry{job: job, storage: storage, version: t.version, mp: t.mp, tp: t.tp, Registry: t.Registry,
		instruments: t.instruments, child: true, tasks: map[string]*TaskView{}, jobAtt: attribute.String(JobLabel, job)}
	t.mu.Lock()
	t.children = append(t.children, c)
	t.mu.Unlock()
	return c
}

// Shutdown flushes and stops the providers.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	t.jobView.wait(ctx)
	if t.child {
		return nil
	}
	return errors.Join(t.tp.Shutdown(ctx), t.mp.Shutdown(ctx))
}

func (t *Telemetry) task(name string) *TaskView {
	v := t.tasks[name]
	if v == nil {
		v = &TaskView{Task: name}
		t.tasks[name] = v
	}
	return v
}

func (t *Telemetry) taskAttrs(task string) metric.MeasurementOption {
	return metric.WithAttributes(t.jobAtt, attribute.String("task", task))
}

// CheckpointStarted counts a checkpoint in flight.
func (t *Telemetry) CheckpointStarted(ctx context.Context, task string) {
	if t == nil {
		return
	}
	t.inFlight.Add(ctx, 1, t.taskAttrs(task))
	t.mu.Lock()
	t.task(task).InFlight++
	t.mu.Unlock()
}

// CheckpointEnded records the outcome of a checkpoint that CheckpointStarted counted.
func (t *Telemetry) CheckpointEnded(ctx context.Context, r CheckpointRecord) {
	if t == nil {
		return
	}
	a := t.taskAttrs(r.Task)
	t.inFlight.Add(ctx, -1, a)
	t.checkpoints.Add(ctx, 1, metric.WithAttributes(t.jobAtt, attribute.String("task", r.Task), attribute.String("status", r.Status)))
	if r.Status == "completed" {
		t.lastSize.Record(ctx, r.CheckpointSize, a)
		t.lastFull.Record(ctx, r.FullSize, a)
		t.lastID.Record(ctx, int64(r.Checkpoint), a)
		t.lastSync.Record(ctx, r.Sync.Seconds(), a)
		t.lastAsync.Record(ctx, r.Async.Seconds(), a)
		t.lastTotal.Record(ctx, r.Total.Seconds(), a)
		t.histSync.Record(ctx, r.Sync.Seconds(), a)
		t.histAsync.Record(ctx, r.Async.Seconds(), a)
		t.histTotal.Record(ctx, r.Total.Seconds(), a)
		t.filesUploaded.Add(ctx, int64(r.FilesUploaded), a)
		t.filesReused.Add(ctx, int64(r.FilesReused), a)
		t.health.lastSuccess.Record(ctx, float64(orNow(r.At).UnixNano())/1e9, a)
	}
	t.bytesUploaded.Add(ctx, r.BytesUploaded, a)
	t.mu.Lock()
	v := t.task(r.Task)
	v.InFlight--
	if r.At.IsZero() {
		r.At = time.Now()
	}
	v.History = append(v.History, r)
	if len(v.History) > HistoryLen {
		v.History = v.History[len(v.History)-HistoryLen:]
	}
	logical := t.logicalLocked()
	t.mu.Unlock()
	t.logical.Record(ctx, logical, metric.WithAttributes(t.jobAtt))
}

// logicalLocked sums the tasks' last completed full sizes.
func (t *Telemetry) logicalLocked() int64 {
	var sum int64
	for _, v := range t.tasks {
		for i := len(v.History) - 1; i >= 0; i-- {
			if v.History[i].Status == "completed" {
				sum += v.History[i].FullSize
				break
			}
		}
	}
	return sum
}

// GCEnded records a GC: the live bytes retained checkpoints hold, and what
// was deleted.
func (t *Telemetry) GCEnded(ctx context.Context, liveBytes int64, deletedObjects int, deletedBytes int64) {
	if t == nil {
		return
	}
	a := metric.WithAttributes(t.jobAtt)
	t.retained.Record(ctx, liveBytes, a)
	t.gcDeleted.Add(ctx, int64(deletedObjects), a)
	t.gcDeletedBytes.Add(ctx, deletedBytes, a)
	t.mu.Lock()
	t.retB = liveBytes
	t.gcDel += int64(deletedObjects)
	t.mu.Unlock()
}

// ReuseReplaced counts a reused object found missing or of the wrong size
// before a commit, and uploaded again; reason is "missing" or "size".
func (t *Telemetry) ReuseReplaced(ctx context.Context, reason string) {
	if t == nil {
		return
	}
	t.reuseReplaced.Add(ctx, 1, metric.WithAttributes(t.jobAtt, attribute.String("reason", reason)))
}

// ScrubObject counts one object the scrub checked or healed: result is
// ok, corrupt, missing, error (what it found; error: it could not read
// it), or healed, unhealed (what it did about a corrupt or missing one);
// bytes is what it read.
func (t *Telemetry) ScrubObject(ctx context.Context, result string, bytes int64) {
	if t == nil {
		return
	}
	t.scrubObjects.Add(ctx, 1, metric.WithAttributes(t.jobAtt, attribute.String("result", result)))
	if bytes > 0 {
		t.scrubBytes.Add(ctx, bytes, metric.WithAttributes(t.jobAtt))
	}
}

// RestoreEnded records a restore and where its bytes came from.
func (t *Telemetry) RestoreEnded(ctx context.Context, r RestoreRecord) {
	if t == nil {
		return
	}
	status := "completed"
	if !r.OK {
		status = "failed"
	}
	t.restoreDur.Record(ctx, r.Duration.Seconds(), metric.WithAttributes(t.jobAtt, attribute.String("task", r.Task), attribute.String("status", status)))
	t.restoreBytes.Add(ctx, r.BytesLocal, metric.WithAttributes(t.jobAtt, attribute.String("task", r.Task), attribute.String("source", "local")))
	t.restoreBytes.Add(ctx, r.BytesRemote, metric.WithAttributes(t.jobAtt, attribute.String("task", r.Task), attribute.String("source", "remote")))
}

// RequestEnded counts one socket request by its op and outcome: code is
// "ok" for a request the agent accepted, else the protocol error code it
// was refused with.
func (t *Telemetry) RequestEnded(ctx context.Context, op, code string) {
	if t == nil {
		return
	}
	t.requests.Add(ctx, 1, metric.WithAttributes(t.jobAtt, attribute.String("op", op), attribute.String("code", code)))
}

// DrillEnded records a restore drill.
func (t *Telemetry) DrillEnded(ctx context.Context, d DrillRecord) {
	if t == nil {
		return
	}
	a := t.taskAttrs(d.Task)
	ok := int64(0)
	if d.Verified {
		ok = 1
		t.drillDur.Record(ctx, d.Duration.Seconds(), a)
		t.drillThroughput.Record(ctx, d.Throughput, a)
		if d.RPO > 0 {
			t.drillRPO.Record(ctx, d.RPO.Seconds(), a)
		}
	}
	t.drillOK.Record(ctx, ok, a)
	sample := int64(0)
	if d.Sample {
		sample = 1
	}
	t.drillSample.Record(ctx, sample, a)
	if d.At.IsZero() {
		d.At = time.Now()
	}
	t.mu.Lock()
	t.task(d.Task).LastDrill = &d
	t.mu.Unlock()
}

// StandbyRefreshed records a refresh of a warm standby's copy.
func (t *Telemetry) StandbyRefreshed(ctx context.Context, r StandbyRecord) {
	if t == nil {
		return
	}
	a := t.taskAttrs(r.Task)
	t.standbyLag.Record(ctx, r.Lag.Seconds(), a)
	t.standbyHeld.Record(ctx, int64(r.Held), a)
	t.standbyBytes.Add(ctx, r.BytesLocal, metric.WithAttributes(t.jobAtt, attribute.String("task", r.Task), attribute.String("source", "local")))
	t.standbyBytes.Add(ctx, r.BytesRemote, metric.WithAttributes(t.jobAtt, attribute.String("task", r.Task), attribute.String("source", "remote")))
	if r.Failover > 0 {
		t.standbyFailover.Record(ctx, r.Failover.Seconds(), a)
	}
	if r.At.IsZero() {
		r.At = time.Now()
	}
	t.mu.Lock()
	tv := t.task(r.Task)
	if prev := tv.Standby; prev != nil && r.Failover == 0 {
		// The last measured failover stays on show until the next one.
		r.Failover, r.FailoverBytes, r.FailoverRemote = prev.Failover, prev.FailoverBytes, prev.FailoverRemote
	}
	tv.Standby = &r
	t.mu.Unlock()
}

// View returns a copy of what the status page shows.
func (t *Telemetry) View() View {
	v := View{Now: time.Now()}
	if t == nil {
		return v
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	v.Job, v.Storage, v.Version = t.job, t.storage, t.version
	v.RetainedBytes, v.LogicalBytes, v.GCDeleted = t.retB, t.logicalLocked(), t.gcDel
	for _, tv := range t.tasks {
		c := *tv
		c.History = append([]CheckpointRecord(nil), tv.History...)
		if tv.LastDrill != nil {
			d := *tv.LastDrill
			c.LastDrill = &d
		}
		if tv.WAL != nil {
			w := *tv.WAL
			c.WAL = &w
		}
		v.Tasks = append(v.Tasks, c)
	}
	// A node agent's page shows every job's tasks, named job/task.
	for _, c := range t.children {
		cv := c.View()
		v.RetainedBytes += cv.RetainedBytes
		v.LogicalBytes += cv.LogicalBytes
		v.GCDeleted += cv.GCDeleted
		for _, tv := range cv.Tasks {
			tv.Task = c.job + "/" + tv.Task
			v.Tasks = append(v.Tasks, tv)
		}
	}
	sort.Slice(v.Tasks, func(i, j int) bool { return v.Tasks[i].Task < v.Tasks[j].Task })
	v.JobStatus = t.jobView.view()
	if t.storageHealth != nil {
		h := *t.storageHealth
		v.StorageHealth = &h
	}
	return v
}

// Tracer returns ckpt's tracer from the global provider.
func Tracer() trace.Tracer { return otel.Tracer("ckpt") }

// ContextWithTraceparent returns ctx carrying the remote span context of a
// W3C traceparent header value, so that spans started from it become its
// children. An empty or invalid value returns ctx unchanged.
func ContextWithTraceparent(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent})
}
