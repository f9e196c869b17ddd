package gc

import (
	"context"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/wal"
)

// sweepWAL passes the WAL objects of job that no live checkpoint holds to
// consider: the WAL of checkpoint n by epoch lives while that manifest is
// one of cat.Refs and not expired (like its private files); a fenced or
// expired manifest's WAL, and one whose manifest is gone, is garbage.
func sweepWAL(ctx context.Context, s storage.Store, job string, cat *manifests.Catalog, expired []manifests.Ref, consider func(storage.ObjectInfo) error) error {
	type id struct {
		task     string
		n, epoch uint64
	}
	live := map[id]bool{}
	for _, r := range cat.Refs {
		live[id{r.Task, r.Checkpoint, r.Epoch}] = true
	}
	for _, r := range expired {
		delete(live, id{r.Task, r.Checkpoint, r.Epoch})
	}
	// A task whose ownership cannot be read keeps everything (as GC does
	// for its other objects).
	return wal.Sweep(ctx, s, job, func(task string, n, epoch uint64) bool {
		return live[id{task, n, epoch}] || cat.OwnerProblems[task] != nil
	}, consider)
}
