package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"ckpt/client"
)

// appThroughput runs the workload in phases off, on, on, off (twice) of equal
// length; in the "on" phases it takes a checkpoint every interval (flush,
// Pebble checkpoint, request until synced: what the app waits for) while
// the agent uploads the previous ones in the background. The write rate
// is writes over wall-clock time, pauses included.
func (r *run) appThroughput(ctx context.Context) error {
	if err := r.ensureStore(ctx); err != nil {
		return err
	}
	phase, interval := 2500*time.Millisecond, time.Second
	if r.o.Quick {
		phase, interval = 300*time.Millisecond, 100*time.Millisecond
	}
	// A warm-up phase (not counted) brings compactions to their steady
	// state; then off/on in ABBA order twice, so that a drift of the
	// store's speed over time weighs on both sides alike.
	fig := &AppThroughput{IntervalMS: ms(interval), PhaseMS: ms(phase), Phases: []string{"warmup", "off", "on", "on", "off", "off", "on", "on", "off"}}
	var pauses, snaps []float64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	var totals [2]struct {
		writes int64
		d      time.Duration
	}
	for _, p := range fig.Phases {
		on := p == "on"
		start := time.Now()
		lastCkpt := start
		var writes int64
		for time.Since(start) < phase {
			rs, err := r.w.Round(ctx)
			if err != nil {
				return fmt.Errorf("workload round: %w", err)
			}
			writes += int64(rs.Writes())
			if !on || time.Since(lastCkpt) < interval {
				continue
			}
			lastCkpt = time.Now()
			n := r.next
			r.next++
			dir := filepath.Join(r.root, fmt.Sprintf("snap-%d", n))
			t0 := time.Now()
			if _, err := r.snapshot(dir); err != nil {
				return err
			}
			snaps = append(snaps, ms(time.Since(t0)))
			pend, err := r.inc.client.Send(ctx, client.Request{Task: task, Checkpoint: n, Dir: dir, Engine: "pebble", Handoff: true})
			pauses = append(pauses, ms(time.Since(t0)))
			os.RemoveAll(dir)
			var ae *client.Error
			switch {
			case errors.As(err, &ae) && ae.Code == "unavailable":
				fig.CheckpointsRefused++
				continue
			case err != nil:
				return fmt.Errorf("checkpoint %d: %w", n, err)
			}
			fig.Checkpoints++
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := pend.Wait(ctx); err != nil {
					mu.Lock()
					failed = err
					mu.Unlock()
				}
			}()
		}
		d := time.Since(start)
		if p != "warmup" {
			i := map[bool]int{false: 0, true: 1}[on]
			totals[i].writes += writes
			totals[i].d += d
		}
		fig.PhaseWritesPerS = append(fig.PhaseWritesPerS, round(float64(writes)/d.Seconds(), 5))
		if on {
			wg.Wait() // the uploads of this phase end before the next phase starts
		}
	}
	if failed != nil {
		return fmt.Errorf("a checkpoint taken while measuring throughput failed: %w", failed)
	}
	fig.WithoutWritesPerS = round(float64(totals[0].writes)/totals[0].d.Seconds(), 5)
	fig.WithWritesPerS = round(float64(totals[1].writes)/totals[1].d.Seconds(), 5)
	if fig.WithoutWritesPerS > 0 {
		fig.Ratio = round(fig.WithWritesPerS/fig.WithoutWritesPerS, 5)
	}
	fig.PauseP50MS, fig.PauseMaxMS = percentile(pauses, 50), percentile(pauses, 100)
	fig.SnapshotP50MS = percentile(snaps, 50)
	r.rep.AppThroughput = fig
	r.logf("app throughput: %.0f writes/s with checkpoints, %.0f without", fig.WithWritesPerS, fig.WithoutWritesPerS)
	return nil
}
