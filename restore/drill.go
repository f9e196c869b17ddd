package restore

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/ckpt-io/ckpt/engines"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
)

// DrillOptions says what to drill.
type DrillOptions struct {
	Store     storage.Store
	Job, Task string
	// ScratchDir is where the scratch restore goes (default: os.TempDir()).
	ScratchDir string
	// Parallelism bounds concurrent file restores (default 8).
	Parallelism int
	// Check, when set, opens the restored store with its engine (named in
	// the manifest) and reports whether it could.
	Check    func(ctx context.Context, engine, dir string) (engines.Result, error)
	Progress func(done, total int64)
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
}

// Drill restores the newest checkpoint of a task from storage alone (never
// the local copy) into a scratch directory, verifying every byte as every
// restore does, optionally opens it with its engine, and removes it. The
// duration is the restore an outage would wait for; the engine check is not
// part of it.
func Drill(ctx context.Context, o DrillOptions) (*DrillResult, error) {
	if o.ScratchDir == "" {
		o.ScratchDir = os.TempDir()
	}
	scratch, err := os.MkdirTemp(o.ScratchDir, "ckpt-drill-")
	if err != nil {
		return nil, fmt.Errorf("drill scratch dir: %w", err)
	}
	defer os.RemoveAll(scratch)
	target := scratch + "/store"
	start := time.Now()
	res, err := Run(ctx, Options{Store: o.Store, Job: o.Job, Task: o.Task, Target: target, Parallelism: o.Parallelism, Progress: o.Progress})
	if err != nil {
		return nil, fmt.Errorf("drill of task %s: %w", o.Task, err)
	}
	d := time.Since(start)
	out := &DrillResult{Task: o.Task, Checkpoint: res.Checkpoint, Bytes: res.Bytes, Files: res.Files,
		DurationMS: d.Milliseconds(), Verified: true}
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
