package workload

import (
	"context"
	"fmt"
	"os"

	"github.com/cockroachdb/pebble/v2"
)

// Resume opens a store restored from a checkpoint whose state was exp and
// continues the workload from there, as the app of a task that moved to
// another node does: the model starts as exp (the round count included,
// so the next Round is numbered as the original's next one would be; which
// keys it picks may differ), and the store is first checked to hold exactly exp (Verify), so that a
// store that does not match is reported here rather than as a puzzling
// difference later. opts must be those of the original workload (the
// seed, value size and key layout are part of the state).
func Resume(ctx context.Context, dir string, opts Options, exp *Expected) (*Workload, error) {
	if err := opts.defaults(); err != nil {
		return nil, fmt.Errorf("workload options: %w", err)
	}
	if exp.seed != opts.Seed || exp.valueSize != opts.ValueSize || exp.keyer != (keyer{opts.Seed, opts.Scatter}) {
		return nil, fmt.Errorf("resume: the expected state is of another workload (seed %d, value size %d), not of seed %d, value size %d",
			exp.seed, exp.valueSize, opts.Seed, opts.ValueSize)
	}
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	w := &Workload{opts: opts, dir: dir, val: make([]byte, opts.ValueSize)}
	db, err := pebble.Open(dir, PebbleOptions(opts.MemTableSize))
	if err != nil {
		return nil, fmt.Errorf("open pebble store %s: %w", dir, err)
	}
	if err := Verify(ctx, db, exp); err != nil {
		db.Close()
		return nil, fmt.Errorf("resume %s: %w", dir, err)
	}
	w.db = db
	w.versions = append([]uint32(nil), exp.versions...)
	w.pos = make([]int32, len(w.versions))
	w.oldest = uint32(len(w.versions))
	for id, v := range w.versions {
		w.pos[id] = -1
		if v == 0 {
			continue
		}
		w.pos[id] = int32(len(w.live))
		w.live = append(w.live, uint32(id))
		w.oldest = min(w.oldest, uint32(id))
	}
	w.stats.Rounds = exp.round
	return w, nil
}
