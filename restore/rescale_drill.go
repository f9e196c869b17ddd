package restore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sync/errgroup"
)

// RescaleDrillResult is `ckpt drill --rescale-from --json`: a rescale
// restore timed beside a plain restore of the same old checkpoints.
type RescaleDrillResult struct {
	Checkpoint uint64 `json:"checkpoint"`
	// Rescale is the rescale restore, into a scratch directory.
	Rescale *RescaleResult `json:"rescale"`
	// DurationMS and Bytes are the rescale restore's (Bytes fetched).
	DurationMS int64 `json:"duration_ms"`
	Bytes      int64 `json:"bytes"`
	// BytesInRange are the old stores' bytes in the range; BytesRatio is
	// Bytes / BytesInRange.
	BytesInRange int64   `json:"bytes_in_range"`
	BytesRatio   float64 `json:"bytes_ratio"`
	// PlainDurationMS and PlainBytes are plain restores of every old
	// task's whole checkpoint, in parallel, from storage alone.
	PlainDurationMS int64 `json:"plain_duration_ms"`
	PlainBytes      int64 `json:"plain_bytes"`
	// PlainSameStateMS is the plain restores' time scaled to BytesInRange
	// (at the plain restores' throughput): a plain restore of as much state
	// as the new task gets. TimeRatio is DurationMS over it.
	PlainSameStateMS float64 `json:"plain_same_state_ms"`
	TimeRatio        float64 `json:"time_ratio"`
	Verified         bool    `json:"verified"`
}

// RescaleDrill runs a rescale restore into a scratch directory, then plain
// restores of the same old checkpoints (every task at once, from storage
// alone), and reports both times; everything it wrote is removed. The
// plain restores come second, so that neither profits from a page cache
// the other warmed for the same objects more than the first did.
func RescaleDrill(ctx context.Context, o RescaleOptions, scratchDir string) (*RescaleDrillResult, error) {
	if scratchDir == "" {
		scratchDir = os.TempDir()
	}
	scratch, err := os.MkdirTemp(scratchDir, "ckpt-drill-")
	if err != nil {
		return nil, fmt.Errorf("drill scratch dir: %w", err)
	}
	defer os.RemoveAll(scratch)
	o.Target = filepath.Join(scratch, "rescaled")
	res, err := Rescale(ctx, o)
	if err != nil {
		return nil, err
	}
	out := &RescaleDrillResult{Checkpoint: res.Checkpoint, Rescale: res, DurationMS: res.DurationMS, Bytes: res.Bytes,
		BytesInRange: res.BytesInRange, Verified: res.Verified}
	if res.BytesInRange > 0 {
		out.BytesRatio = float64(res.Bytes) / float64(res.BytesInRange)
	}
	os.RemoveAll(o.Target)
	start := time.Now()
	sizes := make([]int64, len(o.From))
	g, gctx := errgroup.WithContext(ctx)
	for i, t := range o.From {
		g.Go(func() error {
			r, err := Run(gctx, Options{Store: o.Store, Job: o.Job, Task: t, Checkpoint: res.Checkpoint,
				Target: filepath.Join(scratch, fmt.Sprintf("plain-%d", i)), Parallelism: o.Parallelism})
			if err != nil {
				return fmt.Errorf("plain restore of task %s: %w", t, err)
			}
			sizes[i] = r.Bytes
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	out.PlainDurationMS = time.Since(start).Milliseconds()
	for _, b := range sizes {
		out.PlainBytes += b
	}
	if out.PlainBytes > 0 {
		out.PlainSameStateMS = float64(out.PlainDurationMS) * float64(out.BytesInRange) / float64(out.PlainBytes)
	}
	if out.PlainSameStateMS > 0 {
		out.TimeRatio = float64(out.DurationMS) / out.PlainSameStateMS
	}
	return out, nil
}
