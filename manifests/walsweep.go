package manifests

import (
	"context"

	"github.com/ckpt-io/ckpt/storage"
)

// walSweep is the WAL package's sweep (wal.Sweep), registered by it: GC
// passes it the WAL objects' liveness and its own consider. A program
// that does not link the wal package collects no WAL object (they leak,
// nothing live is lost).
var walSweep func(ctx context.Context, s storage.Store, job string, live func(task string, n, epoch uint64) bool, consider func(storage.ObjectInfo) error) error

// RegisterWALSweep registers the sweep of WAL objects GC runs.
func RegisterWALSweep(f func(ctx context.Context, s storage.Store, job string, live func(task string, n, epoch uint64) bool, consider func(storage.ObjectInfo) error) error) {
	walSweep = f
}

// sweepWAL passes the WAL objects of job that no live checkpoint holds to
// consider: the WAL of checkpoint n by epoch lives while that manifest is
// one of cat.Refs and not expired (like its private files); a fenced or
// expired manifest's WAL, and one whose manifest is gone, is garbage.
func sweepWAL(ctx context.Context, s storage.Store, job string, cat *Catalog, expired []Ref, consider func(storage.ObjectInfo) error) error {
	if walSweep == nil {
		return nil
	}
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
	return walSweep(ctx, s, job, func(task string, n, epoch uint64) bool {
		return live[id{task, n, epoch}] || cat.OwnerProblems[task] != nil
	}, consider)
}
