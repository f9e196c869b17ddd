package restore

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ckpt-io/ckpt/engines"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
)

// DrillOptions says what to drill.
type DrillOptions struct {
	Store     storage.Store
	Job, Task string
	// Checkpoint picks the checkpoint to drill (0: the newest complete).
	Checkpoint uint64
	// ScratchDir is where the scratch restore goes (default: os.TempDir()).
	ScratchDir string
	// Parallelism bounds concurrent file restores (default 8).
	Parallelism int
	// Check, when set, opens the restored store with its engine (named in
	// the manifest) and reports whether it could.
	Check    func(ctx context.Context, engine, dir string) (engines.Result, error)
	Progress func(done, total int64)
	// MaxBytes, when positive, refuses a drill of a checkpoint whose full
	// size exceeds it (ErrDrillRefused). Every drill is also refused when
	// the scratch directory lacks the free space for it.
	MaxBytes int64
	// SampleBytes, when positive, drills a sample instead of the whole
	// checkpoint: files picked at random until SampleBytes (plus at most
	// one file), each object read whole from storage and checked against
	// the manifest's size and hash, nothing written to disk (no scratch
	// space, no MaxBytes, no engine check). SampleSeed seeds the pick (0: a
	// random seed); the result reports the seed used.
	SampleBytes int64
	SampleSeed  uint64
	// To is the point the drill restores to: ToLatest (the default: what
	// an outage would restore, the checkpoint and its shipped WAL) or
	// ToCheckpoint.
	To string
}

// DrillResult is `ckpt drill --json`.
type DrillResult struct {
	Task                string  `json:"task"`
	Checkpoint          uint64  `json:"checkpoint"`
	Bytes               int64   `json:"bytes"`
	Files               int     `json:"files"`
	DurationMS          int64   `json:"duration_ms"`
	ThroughputBytesPerS float64 `json:"throughput_bytes_per_s"`
	Verified            bool    `json:"verified"`
	EngineChecked       bool    `json:"engine_checked"`
	Keys                int64   `json:"keys,omitempty"`
	// Sample is true for a sample drill (DrillOptions.SampleBytes): Bytes
	// and Files are then the checkpoint's, SampleFiles and SampleBytes
	// what was read and verified, and DurationMS and the throughput those
	// of the sample.
	Sample      bool   `json:"sample"`
	SampleFiles int    `json:"sample_files,omitempty"`
	SampleBytes int64  `json:"sample_bytes,omitempty"`
	SampleSeed  uint64 `json:"sample_seed,omitempty"`
	// RPOMS is the drill's recovery point: when it ended, the age of the
	// newest write its restore recovered (the last applied WAL manifest's
	// through time, else the checkpoint's creation). Not for a sample
	// drill, which restores nothing.
	RPOMS int64 `json:"rpo_ms,omitempty"`
	// WALSegments and WALBytes: the WAL the drill's restore applied over
	// the checkpoint.
	WALSegments int   `json:"wal_segments,omitempty"`
	WALBytes    int64 `json:"wal_bytes,omitempty"`
}

// Drill restores the newest checkpoint of a task from storage alone (never
// the local copy) into a scratch directory, verifying every byte as every
// restore does, optionally opens it with its engine, and removes it. The
// duration is the restore an outage would wait for; the engine check is not
// part of it. With o.SampleBytes, it verifies a sample and restores
// nothing (see DrillOptions).
func Drill(ctx context.Context, o DrillOptions) (*DrillResult, error) {
	if o.SampleBytes > 0 {
		return drillSample(ctx, o)
	}
	if o.ScratchDir == "" {
		o.ScratchDir = os.TempDir()
	}
	if err := checkDrillRoom(ctx, &o); err != nil {
		return nil, err
	}
	scratch, err := os.MkdirTemp(o.ScratchDir, "ckpt-drill-")
	if err != nil {
		return nil, fmt.Errorf("drill scratch dir: %w", err)
	}
	defer os.RemoveAll(scratch)
	target := scratch + "/store"
	start := time.Now()
	to := o.To
	if to == "" {
		to = ToLatest
	}
	res, err := Run(ctx, Options{Store: o.Store, Job: o.Job, Task: o.Task, Checkpoint: o.Checkpoint, Target: target, Parallelism: o.Parallelism, Progress: o.Progress, To: to})
	if err != nil {
		return nil, fmt.Errorf("drill of task %s: %w", o.Task, err)
	}
	d := time.Since(start)
	out := &DrillResult{Task: o.Task, Checkpoint: res.Checkpoint, Bytes: res.Bytes, Files: res.Files,
		DurationMS: d.Milliseconds(), Verified: true, RPOMS: res.RecoveredWriteAgeMS, WALSegments: res.WALSegments, WALBytes: res.WALBytes}
	if d > 0 {
		out.ThroughputBytesPerS = float64(res.Bytes) / d.Seconds()
	}
	if o.Check != nil {
		m, err := manifests.Load(ctx, o.Store, o.Job, o.Task, res.Checkpoint)
		if err != nil {
			return nil, err
		}
		r, err := o.Check(ctx, m.Engine, target)
		if err != nil {
			return nil, fmt.Errorf("drill of task %s checkpoint %d: the files verified but the store does not open: %w", o.Task, res.Checkpoint, err)
		}
		out.EngineChecked, out.Keys = r.Checked, r.Keys
	}
	return out, nil
}

// JobDrillOptions says which job to drill.
type JobDrillOptions struct {
	Store storage.Store
	Job   string
	// ScratchDir, Parallelism and Check are as in DrillOptions, for each
	// task.
	ScratchDir  string
	Parallelism int
	Check       func(ctx context.Context, engine, dir string) (engines.Result, error)
	// Tasks bounds the tasks restored at once (default 16).
	Tasks int
}

// JobDrillResult is `ckpt drill --job J --json`: the job's recovery time.
type JobDrillResult struct {
	Checkpoint uint64 `json:"checkpoint"`
	Tasks      int    `json:"tasks"`
	Bytes      int64  `json:"bytes"`
	Files      int    `json:"files"`
	// DurationMS is from the start until the last task's store was
	// restored and verified: what a job-wide restore would wait for.
	DurationMS int64          `json:"duration_ms"`
	Verified   bool           `json:"verified"`
	TaskDrills []*DrillResult `json:"task_drills"`
}

// JobDrill restores every task of the newest job-complete checkpoint of a
// job from storage, in parallel, each into its own scratch directory, as
// Drill does for one task. It fails if any task fails, naming it.
func JobDrill(ctx context.Context, o JobDrillOptions) (*JobDrillResult, error) {
	if o.Tasks < 1 {
		o.Tasks = 16
	}
	cat, err := manifests.Scan(ctx, o.Store, o.Job, "")
	if err != nil {
		return nil, err
	}
	st, ok, err := manifests.NewJobReader(o.Store, cat).NewestJobCheckpoint(ctx)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: storage %s holds no job-complete checkpoint of job %s (see ckpt list)", ErrNoCheckpoint, o.Store, o.Job)
	}
	out := &JobDrillResult{Checkpoint: st.Checkpoint, Tasks: len(st.Tasks), TaskDrills: make([]*DrillResult, len(st.Tasks))}
	start := time.Now()
	var mu sync.Mutex
	var last time.Time
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(o.Tasks)
	for i, task := range st.Tasks {
		g.Go(func() error {
			taskStart := time.Now()
			res, err := Drill(gctx, DrillOptions{Store: o.Store, Job: o.Job, Task: task, Checkpoint: st.Checkpoint,
				ScratchDir: o.ScratchDir, Parallelism: o.Parallelism, Check: o.Check, To: ToCheckpoint})
			if err != nil {
				return err
			}
			end := taskStart.Add(time.Duration(res.DurationMS) * time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			out.TaskDrills[i] = res
			out.Bytes += res.Bytes
			out.Files += res.Files
			if end.After(last) {
				last = end
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("job drill of %s checkpoint %d: %w", o.Job, st.Checkpoint, err)
	}
	out.DurationMS = last.Sub(start).Milliseconds()
	out.Verified = true
	return out, nil
}
