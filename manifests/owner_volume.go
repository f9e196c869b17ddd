package manifests

import (
	"context"

	"github.com/ckpt-io/ckpt/storage"
)

// TakeOwnershipIf is TakeOwnership that first asks may whether the caller
// may take the task from its newest owner (not asked when there is none):
// an error from may is returned, and nothing is written.
func TakeOwnershipIf(ctx context.Context, s storage.Store, job, task, node, agentID string, may func(latest Owner) error) (Owner, error) {
	return TakeOwnershipOn(ctx, s, job, task, node, "", agentID, may)
}
