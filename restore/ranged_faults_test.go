//go:build ckpt_failpoints

package restore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/ckpt-io/ckpt/internal/failpoint"
	"github.com/ckpt-io/ckpt/restore"
)

// A disk fault while a large object lands in ranged pieces (a pwrite of
// the first or a later piece) or while the fetched files are synced fails
// the restore with the disk's error, naming where, and leaves nothing
// beside the target; with the disk fine again, the restore succeeds.
func TestDiskFaultsWhileFetchingInPieces(t *testing.T) {
	for _, f := range []struct {
		point string
		after int
	}{{failpoint.LocalWrite, 0}, {failpoint.LocalWrite, 20}, {failpoint.LocalSync, 0}, {failpoint.LocalSync, 2}} {
		t.Run(fmt.Sprintf("%s/after-%d", f.point, f.after), func(t *testing.T) {
			st, target, files := setupBig(t)
			failpoint.Arm(t, f.point, syscall.EIO, f.after)
			_, err := restore.Run(context.Background(), restore.Options{Store: st, Job: "job", Task: "t", Target: target})
			if !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), filepath.Dir(target)) {
				t.Fatalf("restore: %v, want EIO naming %s", err, filepath.Dir(target))
			}
			if left, _ := os.ReadDir(filepath.Dir(target)); len(left) != 0 {
				t.Fatalf("a failed restore left %d entries beside the target", len(left))
			}
			failpoint.Disarm(t)
			if _, err := restore.Run(context.Background(), restore.Options{Store: st, Job: "job", Task: "t", Target: target}); err != nil {
				t.Fatalf("restore once the disk is fine: %v", err)
			}
			for name, want := range files {
				if got, err := os.ReadFile(filepath.Join(target, name)); err != nil || string(got) != string(want) {
					t.Fatalf("%s differs (%v)", name, err)
				}
			}
		})
	}
}
