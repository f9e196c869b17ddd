package manifests

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/ckpt-io/ckpt/internal/failpoint"
	"github.com/ckpt-io/ckpt/storage"
)

// GCOptions tunes a collection.
type GCOptions struct {
	// Retain, when > 0, first retires all but the newest Retain complete
	// checkpoints of every task. Zero leaves retention alone.
	Retain int
	// Grace is how old an unreferenced object (and a retirement) must be
	// before it is deleted. It protects uploads in flight elsewhere and
	// checkpoints in flight that reuse objects of a just-retired manifest.
	Grace time.Duration
	// DryRun reports what would be deleted and changes nothing.
	DryRun bool
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// GCReport says what a collection found and did.
type GCReport struct {
	DeletedObjects      int      `json:"deleted_objects"`
	DeletedBytes        int64    `json:"deleted_bytes"`
	LiveObjects         int      `json:"live_objects"`
	LiveBytes           int64    `json:"live_bytes"`
	RetainedCheckpoints int      `json:"retained_checkpoints"`
	RetiredCheckpoints  int      `json:"retired_checkpoints"`
	DeletedManifests    int      `json:"deleted_manifests"`
	IncompleteUploads   int      `json:"incomplete_uploads_removed"`
	DryRun              bool     `json:"dry_run,omitempty"`
	Deleted             []string `json:"-"`
}

// deleteBatch bounds one Delete call, and so the time between re-checking
// a batch's ages and deleting it.
const deleteBatch = 1000

// GC collects a job's garbage. The live set is derived from storage alone:
// every object referenced by a retained manifest, or by a manifest retired
// less than Grace ago, is live. Everything else under the job's shared and
// private prefixes that is older than Grace is deleted: objects of retired
// checkpoints, and orphans of crashed or aborted checkpoints. Manifests
// retired more than Grace ago are deleted first (then their objects).
//
// A manifest that cannot be read or fails its checks stops the collection
// before anything is deleted: GC never guesses what a manifest references.
//
// Ages are read from a listing; when deleting starts more than Grace/10
// after the listing, each batch is re-checked with Stat right before it is
// deleted, so that an object refreshed by a re-upload in the meantime is
// kept: the view of an age is never staler than a small part of Grace.
func GC(ctx context.Context, s storage.Store, job string, opts GCOptions) (GCReport, error) {
	now := time.Now
	if opts.Now != nil {
		now = opts.Now
	}
	var rep GCReport
	rep.DryRun = opts.DryRun
	cat, err := Scan(ctx, s, job, "")
	if err != nil {
		return rep, err
	}
	start := now()
	if opts.Retain > 0 {
		tasks := map[string]bool{}
		for _, r := range cat.Refs {
			tasks[r.Task] = true
		}
		for task := range tasks {
			_, retire := Retention(cat.Retained(task), opts.Retain)
			for _, old := range retire {
				if !opts.DryRun {
					if err := Retire(ctx, s, job, task, old.Checkpoint); err != nil {
						return rep, err
					}
				}
				for j := range cat.Refs {
					if cat.Refs[j].Task == task && cat.Refs[j].Checkpoint == old.Checkpoint {
						cat.Refs[j].Retired, cat.Refs[j].RetiredAt = true, start
					}
				}
			}
		}
	}

	// The live set: objects of retained manifests and of recent retirements.
	live := map[string]bool{}
	var expired []Ref
	for _, r := range cat.Refs {
		if r.Retired && start.Sub(r.RetiredAt) >= opts.Grace {
			expired = append(expired, r)
			rep.RetiredCheckpoints++
			continue
		}
		if r.Retired {
			rep.RetiredCheckpoints++
		} else {
			rep.RetainedCheckpoints++
		}
		m, err := Load(ctx, s, job, r.Task, r.Checkpoint)
		if err != nil {
			if errors.Is(err, storage.ErrNotFound) {
				continue // deleted since the scan: a concurrent GC retired it
			}
			return rep, fmt.Errorf("gc of job %s stopped, nothing deleted: %w (fix or remove that manifest)", job, err)
		}
		for _, f := range m.Files {
			if f.Key != "" {
				live[f.Key] = true
			}
		}
	}

	// Candidates: unreferenced objects older than the grace period.
	var candidates []storage.ObjectInfo
	consider := func(o storage.ObjectInfo) {
		if live[o.Key] {
			rep.LiveObjects++
			rep.LiveBytes += o.Size
			return
		}
		if start.Sub(o.ModTime) >= opts.Grace {
			candidates = append(candidates, o)
		}
	}
	listedAt := now()
	if err := s.List(ctx, SharedPrefix(job), func(o storage.ObjectInfo) error {
		consider(o)
		return nil
	}); err != nil {
		return rep, fmt.Errorf("gc: list shared objects: %w", err)
	}
	for _, o := range cat.Private {
		consider(o)
	}
	sort.Slice(candidates, func(i, j int) bool { return candidates[i].Key < candidates[j].Key })

	// Manifests of expired retirements go first, then their markers and stray
	// markers, then unreferenced objects: a crash in between leaves only
	// orphans, never a manifest pointing at deleted objects.
	var meta []string
	for _, r := range expired {
		meta = append(meta, ManifestKey(job, r.Task, r.Checkpoint))
	}
	if !opts.DryRun && len(meta) > 0 {
		if err := s.Delete(ctx, meta...); err != nil {
			return rep, fmt.Errorf("gc: delete retired manifests: %w", err)
		}
	}
	rep.DeletedManifests = len(meta)
	var markers []string
	for _, r := range expired {
		markers = append(markers, RetiredKey(job, r.Task, r.Checkpoint))
	}
	markers = append(markers, cat.StrayMarkers...)
	if !opts.DryRun && len(markers) > 0 {
		if err := s.Delete(ctx, markers...); err != nil {
			return rep, fmt.Errorf("gc: delete retirement markers: %w", err)
		}
	}
	failpoint.Hit(failpoint.MidGC) // expired manifests and markers deleted, their objects not yet

	for len(candidates) > 0 {
		n := min(deleteBatch, len(candidates))
		batch := candidates[:n]
		candidates = candidates[n:]
		if now().Sub(listedAt) > opts.Grace/10 {
			batch = recheck(ctx, s, batch, now(), opts.Grace)
		}
		keys := make([]string, 0, len(batch))
		for _, o := range batch {
			keys = append(keys, o.Key)
			rep.DeletedBytes += o.Size
		}
		if !opts.DryRun {
			if err := s.Delete(ctx, keys...); err != nil {
				return rep, fmt.Errorf("gc: delete unreferenced objects: %w", err)
			}
		}
		rep.DeletedObjects += len(keys)
		rep.Deleted = append(rep.Deleted, keys...)
	}

	if c, ok := storage.AsCleaner(s); ok && !opts.DryRun {
		n, _, err := c.CleanIncomplete(ctx, job+"/", start.Add(-opts.Grace))
		if err != nil {
			return rep, fmt.Errorf("gc: remove incomplete uploads: %w", err)
		}
		rep.IncompleteUploads = n
	}
	return rep, nil
}

// recheck re-reads the age of each candidate and keeps those still older
// than grace (an upload may have refreshed one since the listing).
func recheck(ctx context.Context, s storage.Store, batch []storage.ObjectInfo, now time.Time, grace time.Duration) []storage.ObjectInfo {
	out := batch[:0:0]
	for _, o := range batch {
		info, err := s.Stat(ctx, o.Key)
		if err != nil || now.Sub(info.ModTime) < grace {
			continue // gone, refreshed, or unknown: keep it for a later GC
		}
		out = append(out, info)
	}
	return out
}
