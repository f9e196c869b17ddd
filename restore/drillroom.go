package restore

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/ckpt-io/ckpt/manifests"
)

// ErrDrillRefused is wrapped by the error of a drill refused before it
// started: the checkpoint is larger than the drill's size cap, or the
// scratch directory has too little free space for it. Nothing was read
// from storage and nothing written.
var ErrDrillRefused = errors.New("drill refused")

// drillHeadroom is the free space a drill leaves on its scratch
// filesystem besides the checkpoint: the engine check writes a little,
// and other tenants of the disk need room.
const drillHeadroom = 64 << 20

// freeBytes returns the bytes an unprivileged writer may still use on
// dir's filesystem (a variable for tests).
var freeBytes = func(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// checkDrillRoom reads the size of the checkpoint a drill would restore
// (its manifest's full size) and refuses the drill when it exceeds
// o.MaxBytes or does not fit in the scratch directory's free space with
// drillHeadroom to spare. It sets o.Checkpoint to the one it checked, so
// that the drill restores that one.
func checkDrillRoom(ctx context.Context, o *DrillOptions) error {
	n := o.Checkpoint
	if n == 0 {
		cat, err := manifests.Scan(ctx, o.Store, o.Job, o.Task)
		if err != nil {
			return fmt.Errorf("drill of task %s: %w", o.Task, err)
		}
		for _, r := range cat.Retained(o.Task) {
			n = max(n, r.Checkpoint)
		}
		if n == 0 {
			return fmt.Errorf("drill of task %s: %w", o.Task, ErrNoCheckpoint)
		}
	}
	m, err := manifests.Load(ctx, o.Store, o.Job, o.Task, n)
	if err != nil {
		return fmt.Errorf("drill of task %s: %w", o.Task, err)
	}
	if o.MaxBytes > 0 && m.FullSize > o.MaxBytes {
		return fmt.Errorf("drill of task %s checkpoint %d: %w: its full size %d B exceeds the drill size cap of %d B (--drill-max-bytes)", o.Task, n, ErrDrillRefused, m.FullSize, o.MaxBytes)
	}
	free, err := freeBytes(o.ScratchDir)
	if err != nil {
		return fmt.Errorf("drill of task %s: free space of the scratch dir %s: %w", o.Task, o.ScratchDir, err)
	}
	if need := m.FullSize + drillHeadroom; need > free {
		return fmt.Errorf("drill of task %s checkpoint %d: %w: it needs %d B free in the scratch dir %s (the checkpoint's %d B and %d B of headroom), and %d B are free (give a larger --drill-dir, or cap drills with --drill-max-bytes)",
			o.Task, n, ErrDrillRefused, need, o.ScratchDir, m.FullSize, int64(drillHeadroom), free)
	}
	o.Checkpoint = n
	return nil
}
