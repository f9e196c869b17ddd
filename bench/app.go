package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"ckpt/client"
)

// appThroughput runs the workload in phases off, on, on, off (twice) of equal
// length; in the "on" phases it takes a checkpoint every interval the way an
// app does, from its own goroutine, with client.CheckpointPebble (a Pebble
// checkpoint with the WAL tail, handed off, until synced), while the agent
// uploads the previous ones in the background. The write rate is writes
// over wall-clock time. The pause figures are the checkpoint goroutine's
// wait (Pebble's checkpoint and the sync phase).
func (r *run) appThroughput(ctx context.Context) error {
	if err := r.ensureStore(ctx); err != nil {
		return err
	}
	phase, interval := 5*time.Second, time.Second
	if r.o.Quick {
		phase, interval = 300*time.Millisecond, 100*time.Millisecond
	}
	// A warm-up phase (not counted) brings compactions to their steady
	// state; then off/on in ABBA order twice, so that a drift of the
	// store's speed over time weighs on both sides alike.
	fig := &AppThroughput{IntervalMS: ms(interval), PhaseMS: ms(phase), Phases: []string{"warmup", "off", "on", "on", "off", "off", "on", "on", "off"}}
	// The agent runs as a sidecar does: its own process, with a lower CPU
	// weight than the app (nice 10 here; a Kubernetes sidecar gets its
	// weight from its CPU request). Uploads then take spare CPU, not the
	// app's.
	const nice = 10
	sc, err := r.sidecar(ctx, "app", nice)
	if err != nil {
		return err
	}
	defer sc.stop()
	fig.Agent = fmt.Sprintf("separate ckpt agent process at nice %d", nice)
	// Its first checkpoint uploads the whole state; it is taken (and
	// waited for) before the measured phases, which see increments only.
	first, err := sc.client.CheckpointPebble(ctx, r.w.DB(), r.w.Dir(), task, 1)
	if err != nil {
		return fmt.Errorf("first checkpoint: %w", err)
	}
	if _, err := first.Wait(ctx); err != nil {
		return fmt.Errorf("first checkpoint: %w", err)
	}
	next := uint64(2)
	var pauses, snaps []float64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	var totals [2]struct {
		writes int64
		d      time.Duration
	}
	// checkpoints takes a checkpoint every interval until stop closes, from
	// its own goroutine, as a server's checkpoint timer would: Pebble's
	// Checkpoint does not block writers, so the writer loop goes on.
	checkpoints := func(stop <-chan struct{}) error {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
			n := next
			next++
			t0 := time.Now()
			pend, err := sc.client.CheckpointPebble(ctx, r.w.DB(), r.w.Dir(), task, n)
			mu.Lock()
			pauses = append(pauses, ms(time.Since(t0)))
			if pend != nil {
				snaps = append(snaps, ms(time.Since(t0))-float64(pend.Synced.SyncMS))
			}
			mu.Unlock()
			var ae *client.Error
			switch {
			case errors.As(err, &ae) && ae.Code == "unavailable":
				mu.Lock()
				fig.CheckpointsRefused++
				mu.Unlock()
				continue
			case err != nil:
				return fmt.Errorf("checkpoint %d: %w", n, err)
			}
			mu.Lock()
			fig.Checkpoints++
			mu.Unlock()
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
	}
	prev := ""
	for _, p := range fig.Phases {
		on := p == "on"
		if on && prev != "on" {
			// The writes of the phase without checkpoints are shipped first,
			// untimed: an app that checkpoints every interval never carries
			// more than one interval of changes into a checkpoint.
			catchUp, err := sc.client.CheckpointPebble(ctx, r.w.DB(), r.w.Dir(), task, next)
			if err != nil {
				return fmt.Errorf("checkpoint %d: %w", next, err)
			}
			next++
			if _, err := catchUp.Wait(ctx); err != nil {
				return fmt.Errorf("checkpoint %d: %w", next-1, err)
			}
		}
		prev = p
		stop := make(chan struct{})
		ckptErr := make(chan error, 1)
		if on {
			go func() { ckptErr <- checkpoints(stop) }()
		}
		start := time.Now()
		var writes int64
		for time.Since(start) < phase {
			rs, err := r.w.Round(ctx)
			if err != nil {
				return fmt.Errorf("workload round: %w", err)
			}
			writes += int64(rs.Writes())
		}
		d := time.Since(start)
		if on {
			close(stop)
			if err := <-ckptErr; err != nil {
				return err
			}
			wg.Wait() // the uploads of this phase end before the next phase starts
		}
		if p != "warmup" {
			i := map[bool]int{false: 0, true: 1}[on]
			totals[i].writes += writes
			totals[i].d += d
		}
		fig.PhaseWritesPerS = append(fig.PhaseWritesPerS, round(float64(writes)/d.Seconds(), 5))
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
