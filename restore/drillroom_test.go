package restore_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/ckpt-io/ckpt/restore"
)

// A drill is bounded: a checkpoint above the size cap, or one that does
// not fit in the scratch dir's free space, is refused with the reason
// before anything is read or written; within bounds it runs.
func TestADrillIsRefusedWhenItDoesNotFitOrExceedsTheCap(t *testing.T) {
	e := setup(t)
	scratch := t.TempDir()
	drill := func(max int64) (*restore.DrillResult, error) {
		return restore.Drill(context.Background(), restore.DrillOptions{Store: e.store, Job: "job", Task: "t", ScratchDir: scratch, MaxBytes: max})
	}
	empty := func() {
		t.Helper()
		if entries, _ := os.ReadDir(scratch); len(entries) != 0 {
			t.Fatalf("a refused drill left %v in the scratch dir", entries)
		}
	}
	_, err := drill(1000)
	if !errors.Is(err, restore.ErrDrillRefused) || !strings.Contains(err.Error(), "--drill-max-bytes") {
		t.Fatalf("drill above the cap: %v, want ErrDrillRefused naming --drill-max-bytes", err)
	}
	empty()

	undo := restore.SetFreeBytes(func(string) (int64, error) { return 100 << 10, nil })
	_, err = drill(0)
	undo()
	if !errors.Is(err, restore.ErrDrillRefused) || !strings.Contains(err.Error(), "free") {
		t.Fatalf("drill into a nearly full scratch dir: %v, want ErrDrillRefused naming the free space", err)
	}
	empty()

	res, err := drill(10 << 20)
	if err != nil || !res.Verified || res.Checkpoint != 3 {
		t.Fatalf("drill within bounds: %+v %v", res, err)
	}
}
