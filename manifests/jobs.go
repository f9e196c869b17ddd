package manifests

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/ckpt-io/ckpt/storage"
)

// JobsListLimit bounds the objects Jobs looks at.
const JobsListLimit = 100_000

// Jobs names the jobs that hold at least one checkpoint manifest in s, in
// order, looking at no more than limit objects (JobsListLimit when limit
// is 0): a listing of the whole store, meant for the message that tells a
// user their --job names nothing. partial is true when the limit stopped
// it before the end.
func Jobs(ctx context.Context, s storage.Store, limit int) (jobs []string, partial bool, err error) {
	if limit <= 0 {
		limit = JobsListLimit
	}
	errEnough := errors.New("enough objects")
	seen := map[string]bool{}
	n := 0
	err = s.List(ctx, "", func(o storage.ObjectInfo) error {
		if n++; n > limit {
			return errEnough
		}
		job, _, ok := strings.Cut(o.Key, "/")
		if ok && !seen[job] && parseTaskKey(job, o.Key).kind == keyManifest {
			seen[job] = true
			jobs = append(jobs, job)
		}
		return nil
	})
	if errors.Is(err, errEnough) {
		partial, err = true, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("list the jobs in %s: %w", s, err)
	}
	sort.Strings(jobs)
	return jobs, partial, nil
}
