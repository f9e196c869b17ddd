// Package gc collects a job's garbage: what no retained manifest of the
// job names, marked by one collection and deleted by a later one, and the
// writers' side of that protocol (Guard, CommitHeld).
//
// # Garbage collection with many writers
//
// GC deletes an object only in a second collection, after marking it in a
// first; writers look at the marks right before they commit. This closes
// the interleaving that a grace period and a re-check cannot: GC finds X
// unreferenced and old and sends its delete; meanwhile another writer (a
// task with a byte-identical file, or the same task adding it again)
// uploads X and commits a manifest naming X; the delete lands, and a
// completed checkpoint cannot be restored. Invariant 4 requires that no
// object referenced by a manifest committed after a collection started is
// deleted by that collection.
//
// What each party does (D = DefaultMarkDelay, 10m; W = D/2):
//
//   - A collection reads storage's clock first (it writes <job>/gc/clock
//     and takes its time, t0), reads the marks under <job>/gc/marks/, then
//     lists the manifests (the live set) and the objects. Objects that no
//     manifest it read references and that are older than the grace (by
//     t0) are marked: it writes a mark naming them, by conditional create,
//     and deletes none of them.
//   - A collection deletes only the candidates of marks that are ripe:
//     written at least D before t0 (both times from storage's clock), and
//     only those still unreferenced by every manifest it listed after t0,
//     still stored and still older than the grace. It deletes only while it
//     holds the job's deletion lock (<job>/gc/lock/<gen>, taken by
//     conditional create of the next generation; taken over only when
//     older than 7m by storage's clock), and sends deletes only within 5m
//     of asking for the lock. It removes a ripe mark after every candidate
//     of it was handled, then releases the lock.
//   - A writer uploads its objects, then looks at the marks (Guard.Check,
//     at its time k). Every object it would reference that a mark names (a
//     reused one, or one it uploaded itself under a key that exists and is
//     marked) is uploaded again from the local copy under a FreshKey
//     (<sha>-<size>.<16 hex>, a key no mark names), and it looks again,
//     until a look finds nothing to replace. It sends the manifest's
//     conditional create only within W of its last look: later, CommitHeld
//     refuses to commit (ErrStale) and the checkpoint fails, to be retried.
//     It cannot simply look again: a collection removes a mark once it has
//     deleted the mark's objects, so a late look may miss a deletion.
//
// Why X cannot be lost. Let a collection G2 delete X, a candidate of mark
// M. M's stored time tm (storage clock) precedes the moment m it became
// visible by at most p, the duration of its PUT. G2 found M ripe, so its
// clock probe, written before G2 listed the manifests at L2, has a stored
// time >= tm + D: L2 > m - p + D. Let a writer commit a manifest naming X,
// landing at c; its last look at the marks started at k, and it sent the
// create by k + W, so c <= k + W + q, q bounding one request's flight.
//
//   - If k >= m, the look listed M (listings are strongly consistent on S3,
//     GCS and files): the writer referenced a fresh key, not X.
//   - If k < m, then c < m + W + q <= m - p + D < L2, since W + q + p <= D:
//     the manifest was committed before G2 listed the manifests, G2 read
//     it, X was live, and G2 did not delete it.
//
// So a manifest committed after G2 started (after L2) never names an
// object G2 deletes, however the writer's upload and G2's delete
// interleave: the delete in flight can only remove a key that no such
// manifest names.
//
// Removing a mark lets writers use X's usual key again, so no collection
// may still be deleting candidates of M after that: only the lock holder
// deletes, it stops sending deletes 5m after asking for the lock, and a
// lock is taken over only when older than 7m (storage clock), so every
// delete of an earlier holder has landed (q plus storage's one-second
// timestamps fit in the 2m gap). The holder removes M only after its own
// deletes returned.
//
// A collection of the old kind, or one within its first pass, deletes
// nothing a writer may still reference: the first sight of an unreferenced
// object only marks it.
//
// Time bounds: D = 10m; writers commit within W = 5m of their last look;
// deletes are sent within 5m of taking the lock; the lock expires after
// 7m. The proof needs q + p <= D - W = 5m (storage requests time out far
// sooner), and the grace (>= MinGrace) still keeps uploads in flight
// from being marked at all.
//
// Clock assumptions: ages and ripeness compare only times written by
// storage (an object's time against the clock probe's time), so the
// collector's clock does not matter; writers and lock holders measure only
// durations, on their own monotonic clocks (drift over minutes is
// negligible). Storage's clock must move forward at the real rate, and an
// object's stored time must lie between the start of its write and its
// visibility.
//
// Interrupted multipart uploads are aborted by every collection once older
// than the grace, as before: an upload in flight cannot be referenced
// before it completes, and a completed one is an object like any other.
// Orphans are marked by one collection and deleted by the first collection
// holding the lock at least D later. `ckpt gc --dry-run` reports what the
// collection would delete now (candidates of ripe marks) and what it would
// mark, and writes nothing (not even the clock probe: it uses its own
// clock).
package gc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ckpt-io/ckpt/internal/failpoint"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
)

// Options tunes a collection.
type Options struct {
	// Retain, when > 0, first retires all but the newest Retain complete
	// checkpoints of every task. Zero leaves retention alone.
	Retain int
	// Grace is how old an unreferenced object (and a retirement) must be
	// before it is marked, and again before it is deleted. It protects
	// uploads in flight elsewhere and checkpoints in flight that reuse
	// objects of a just-retired manifest.
	Grace time.Duration
	// MarkDelay is D, the least time between marking an object and
	// deleting it (MarkDelay() when 0). It must match the writers' Guard.
	MarkDelay time.Duration
	// DryRun reports what would be deleted and marked, and changes nothing.
	DryRun bool
	// Now replaces storage's clock (tests). When nil, a collection reads
	// storage's clock from the time storage gives its clock probe; a dry
	// run, which writes nothing, uses the local clock.
	Now func() time.Time
}

// Report says what a collection found and did.
type Report struct {
	DeletedObjects      int      `json:"deleted_objects"`
	DeletedBytes        int64    `json:"deleted_bytes"`
	LiveObjects         int      `json:"live_objects"`
	LiveBytes           int64    `json:"live_bytes"`
	RetainedCheckpoints int      `json:"retained_checkpoints"`
	RetiredCheckpoints  int      `json:"retired_checkpoints"`
	DeletedManifests    int      `json:"deleted_manifests"`
	IncompleteUploads   int      `json:"incomplete_uploads_removed"`
	MarkedObjects       int      `json:"marked_objects"`
	MarkedBytes         int64    `json:"marked_bytes"`
	PendingObjects      int      `json:"pending_objects"`
	DryRun              bool     `json:"dry_run,omitempty"`
	Deleted             []string `json:"-"`
	Marked              []string `json:"-"`
}

// deleteBatch bounds one Delete call, and so the time between re-checking
// a batch's ages and deleting it, and the candidates a sweep holds. A
// variable only so that tests can lower it.
var deleteBatch = 1000

// Collect collects a job's garbage. The live set is derived from storage alone:
// every object referenced by a retained manifest, or by a manifest retired
// less than Grace ago, is live. Everything else under the job's shared and
// private prefixes that is older than Grace is garbage: objects of retired
// checkpoints, and orphans of crashed or aborted checkpoints. Garbage is
// marked by one collection and deleted by a later one at least D later
// (see the package documentation). Manifests retired more than Grace ago
// are deleted first (their objects are then garbage).
//
// A manifest that cannot be read or fails its checks stops the collection
// before anything is deleted: GC never guesses what a manifest references.
//
// Ages are read from a listing; when deleting starts more than Grace/10
// after the listing, each batch is re-checked with Stat right before it is
// deleted, so that an object refreshed by a re-upload in the meantime is
// kept.
func Collect(ctx context.Context, s storage.Store, job string, opts Options) (Report, error) {
	var rep Report
	rep.DryRun = opts.DryRun
	delay := opts.MarkDelay
	if delay == 0 {
		delay = MarkDelay()
	}
	local0 := time.Now()
	base := local0
	if opts.Now == nil && !opts.DryRun {
		var err error
		if base, err = storageNow(ctx, s, job); err != nil {
			return rep, err
		}
		defer s.Delete(context.WithoutCancel(ctx), clockKey(job))
	}
	now := func() time.Time {
		if opts.Now != nil {
			return opts.Now()
		}
		return base.Add(time.Since(local0))
	}
	start := now()
	marks, err := (&markCache{}).read(ctx, s, job)
	if err != nil {
		return rep, fmt.Errorf("gc: %w", err)
	}
	// Only the holder of the deletion lock deletes objects and removes marks.
	var lock string
	lockAsked := time.Now()
	if !opts.DryRun {
		if lock, err = takeLock(ctx, s, job, start); err != nil {
			return rep, err
		}
		if lock != "" {
			defer s.Delete(context.WithoutCancel(ctx), lock)
		}
	}
	deleting := lock != "" || opts.DryRun

	cat, err := manifests.Scan(ctx, s, job, "")
	if err != nil {
		return rep, err
	}
	if opts.Retain > 0 {
		if err := gcRetire(ctx, s, job, cat, opts, start); err != nil {
			return rep, err
		}
	}
	live, expired, err := gcLive(ctx, s, job, cat, opts.Grace, start, &rep)
	if err != nil {
		return rep, err
	}
	// Marks: ripe ones (at least D old by storage's clock) are processed by
	// the lock holder; the candidates of the others are pending.
	pending, ripeKeys := markedSet{}, markedSet{}
	var ripe []string
	for _, m := range marks {
		if deleting && start.Sub(m.modTime) >= max(delay, m.delay) {
			ripe = append(ripe, m.key)
			ripeKeys.join(m.keys)
			continue
		}
		pending.join(m.keys)
	}
	if err := gcDeleteExpired(ctx, s, cat, expired, opts.DryRun, &rep); err != nil {
		return rep, err
	}
	failpoint.Hit(failpoint.MidGC) // expired manifests and markers deleted, their objects not yet

	// The sweep streams the listing: candidates of ripe marks are deleted
	// deleteBatch at a time, new garbage is marked markBatch at a time, as
	// the listing goes, so memory does not grow with the objects listed.
	sw := &sweep{s: s, job: job, opts: opts, delay: delay, now: now, lockAsked: lockAsked, rep: &rep, complete: true}
	defer sw.waitDeletes() // on the error paths: no delete outlives GC
	consider := func(o storage.ObjectInfo) error {
		if live.has(o.Key) {
			rep.LiveObjects++
			rep.LiveBytes += o.Size
			return nil
		}
		switch {
		case start.Sub(o.ModTime) < opts.Grace:
		case pending.has(o.Key):
			rep.PendingObjects++
		case ripeKeys.has(o.Key):
			return sw.doom(ctx, o)
		default:
			return sw.mark(ctx, o)
		}
		return nil
	}
	if err := gcSweep(ctx, s, job, cat, expired, sw, consider); err != nil {
		return rep, err
	}
	// Every candidate of the ripe marks is deleted, live again, young again
	// or gone: the marks are done.
	if !opts.DryRun && sw.complete && len(ripe) > 0 {
		if err := s.Delete(ctx, ripe...); err != nil {
			return rep, fmt.Errorf("gc: remove processed marks: %w", err)
		}
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

// gcRetire retires, for GC's Retain, each task's checkpoints beyond the
// opts.Retain newest, in the name of the task's newest owner, and notes
// the retirements in cat (at start). Every task keeps its newest
// job-complete checkpoint (and so GC keeps its objects), whatever Retain
// says.
func gcRetire(ctx context.Context, s storage.Store, job string, cat *manifests.Catalog, opts Options, start time.Time) error {
	tasks := map[string]bool{}
	for _, r := range cat.Refs {
		tasks[r.Task] = true
	}
	jobs := manifests.NewJobReader(s, cat)
	for task := range tasks {
		refs := cat.Retained(task)
		_, retire := manifests.Retention(refs, opts.Retain)
		if len(retire) > 0 {
			protect, err := jobs.NewestComplete(ctx, task)
			if err != nil {
				return fmt.Errorf("gc of job %s stopped, nothing deleted: job completeness: %w", job, err)
			}
			keep, err := jobs.PendingRefs(ctx, refs, protect, start)
			if err != nil {
				return fmt.Errorf("gc of job %s stopped, nothing deleted: job completeness: %w", job, err)
			}
			_, retire = manifests.Retention(refs, opts.Retain, append(keep, protect)...)
		}
		for _, old := range retire {
			if !opts.DryRun {
				// In the name of the task's newest owner as listed:
				// a takeover since the scan overrules it (markerCounts).
				epoch := cat.Owners[task].Latest()
				if err := manifests.RetireAt(ctx, s, job, task, old.Checkpoint, epoch); err != nil {
					return err
				}
				cat.AddMarker(task, old.Checkpoint, manifests.RetiredKeyOf(job, task, old.Checkpoint, epoch))
			}
			for j := range cat.Refs {
				if cat.Refs[j].Task == task && cat.Refs[j].Checkpoint == old.Checkpoint {
					cat.Refs[j].Retired, cat.Refs[j].RetiredAt = true, start
				}
			}
		}
	}
	return nil
}

// gcLive returns the live set: objects of retained manifests and of
// recent retirements, all listed after storage's clock was read (start),
// and the manifests whose retirement is older than grace (expired).
// Manifests are read one at a time; only the hashes of their keys are
// kept.
func gcLive(ctx context.Context, s storage.Store, job string, cat *manifests.Catalog, grace time.Duration, start time.Time, rep *Report) (*liveSet, []manifests.Ref, error) {
	live := newLiveSet()
	var expired []manifests.Ref
	for _, r := range cat.Refs {
		if r.Retired && start.Sub(r.RetiredAt) >= grace {
			expired = append(expired, r)
			rep.RetiredCheckpoints++
			continue
		}
		if r.Retired {
			rep.RetiredCheckpoints++
		} else {
			rep.RetainedCheckpoints++
		}
		// Streamed as it arrives: memory holds neither the manifest nor
		// its decoded files. A manifest that fails its checks after some
		// keys were added stops the collection: nothing is deleted, so
		// the extra keys cannot matter (see StreamWalkRef).
		err := manifests.StreamWalkRef(ctx, s, job, r, func(f *manifests.FileView) error {
			if len(f.Key) > 0 {
				live.add(f.Key)
			}
			return nil
		})
		if err != nil {
			if errors.Is(err, storage.ErrNotFound) {
				continue // deleted since the scan: a concurrent GC retired it
			}
			return nil, nil, fmt.Errorf("gc of job %s stopped, nothing deleted: %w (fix or remove that manifest)", job, err)
		}
	}
	return live, expired, nil
}

// gcDeleteExpired deletes the manifests of expired retirements first, then
// their markers and stray markers (unreferenced objects go later, in the
// sweep): a crash in between leaves only orphans, never a manifest
// pointing at deleted objects. Fenced manifests (owner.go) stay fenced
// forever: nothing keeps their objects alive, and they go with the
// expired ones.
func gcDeleteExpired(ctx context.Context, s storage.Store, cat *manifests.Catalog, expired []manifests.Ref, dryRun bool, rep *Report) error {
	var meta []string
	for _, r := range expired {
		meta = append(meta, r.Key)
	}
	for _, r := range cat.Fenced {
		meta = append(meta, r.Key)
	}
	if !dryRun && len(meta) > 0 {
		if err := s.Delete(ctx, meta...); err != nil {
			return fmt.Errorf("gc: delete retired manifests: %w", err)
		}
	}
	rep.DeletedManifests = len(meta)
	var markers []string
	for _, r := range expired {
		markers = append(markers, cat.MarkerKeys(r.Task, r.Checkpoint)...)
	}
	markers = append(markers, cat.StrayMarkers...)
	if !dryRun && len(markers) > 0 {
		if err := s.Delete(ctx, markers...); err != nil {
			return fmt.Errorf("gc: delete retirement markers: %w", err)
		}
	}
	return nil
}

// gcSweep hands consider every shared object as listed, then the
// private objects the scan found, in key order, and flushes the sweep.
func gcSweep(ctx context.Context, s storage.Store, job string, cat *manifests.Catalog, expired []manifests.Ref, sw *sweep, consider func(storage.ObjectInfo) error) error {
	if err := s.List(ctx, manifests.SharedPrefix(job), consider); err != nil {
		var se *sweepError
		if errors.As(err, &se) {
			return se.err
		}
		return fmt.Errorf("gc: list shared objects: %w", err)
	}
	private := make([]storage.ObjectInfo, 0, len(cat.Private))
	for _, o := range cat.Private {
		private = append(private, o)
	}
	sort.Slice(private, func(i, j int) bool { return private[i].Key < private[j].Key })
	for _, o := range private {
		if err := consider(o); err != nil {
			return err
		}
	}
	if err := sweepWAL(ctx, s, job, cat, expired, consider); err != nil {
		return err
	}
	return sw.flush(ctx)
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

// sweepError is the error of a sweep's delete or mark, told apart from
// the listing's own when it comes back through List.
type sweepError struct{ err error }

func (e *sweepError) Error() string { return e.err.Error() }
func (e *sweepError) Unwrap() error { return e.err }

// sweep deletes and marks the garbage a listing finds, in batches, while
// the listing goes on.
type sweep struct {
	s         storage.Store
	job       string
	opts      Options
	delay     time.Duration
	now       func() time.Time
	lockAsked time.Time
	rep       *Report
	// doomed are candidates of ripe marks waiting for their delete, listed
	// from doomedAt on; fresh are new garbage waiting for their mark.
	doomed   []storage.ObjectInfo
	doomedAt time.Time
	fresh    []storage.ObjectInfo
	// complete is false once the lock's hold ran out with candidates left.
	complete bool
	// Deletes run beside the listing, up to deletesInFlight batches at
	// once: deleting 100,000 objects takes as long as listing a million.
	// dels is nil until the first batch; delCtx is canceled by a failed one.
	dels   *errgroup.Group
	delCtx context.Context
	mu     sync.Mutex // rep's deletion counts, written by the deletes
}

// deletesInFlight bounds the batches a sweep deletes at once.
const deletesInFlight = 4

// doom queues o, a candidate of a ripe mark, for deletion.
func (w *sweep) doom(ctx context.Context, o storage.ObjectInfo) error {
	if len(w.doomed) == 0 {
		w.doomedAt = w.now()
	}
	w.doomed = append(w.doomed, o)
	if len(w.doomed) >= deleteBatch {
		return w.deleteDoomed(ctx)
	}
	return nil
}

// waitDeletes waits for the deletes in flight and returns the first error.
func (w *sweep) waitDeletes() error {
	if w.dels == nil {
		return nil
	}
	err := w.dels.Wait()
	w.dels = nil
	return err
}

// mark queues o, new garbage, for a mark.
func (w *sweep) mark(ctx context.Context, o storage.ObjectInfo) error {
	w.rep.MarkedObjects++
	w.rep.MarkedBytes += o.Size
	if w.opts.DryRun {
		w.rep.Marked = append(w.rep.Marked, o.Key)
		return nil
	}
	w.fresh = append(w.fresh, o)
	if len(w.fresh) >= markBatch {
		return w.writeFresh(ctx)
	}
	return nil
}

// flush deletes and marks what is queued, and waits for the deletes.
func (w *sweep) flush(ctx context.Context) error {
	if err := w.deleteDoomed(ctx); err != nil {
		w.waitDeletes()
		return err
	}
	if err := w.waitDeletes(); err != nil {
		return err
	}
	return w.writeFresh(ctx)
}

// deleteDoomed deletes the queued candidates, while the lock's hold lasts,
// re-reading their ages first when they were listed more than a tenth of
// the grace ago.
func (w *sweep) deleteDoomed(ctx context.Context) error {
	if len(w.doomed) == 0 {
		return nil
	}
	batch := slices.Clone(w.doomed)
	w.doomed = w.doomed[:0]
	if !w.opts.DryRun && (!w.complete || time.Since(w.lockAsked) > gcLockHold) {
		w.complete = false // the next lock holder goes on
		w.rep.PendingObjects += len(batch)
		return nil
	}
	if w.dels == nil {
		w.dels, w.delCtx = errgroup.WithContext(ctx)
		w.dels.SetLimit(deletesInFlight)
	}
	if w.delCtx.Err() != nil { // a batch failed, or ctx is done
		err := w.waitDeletes()
		if err == nil {
			err = &sweepError{ctx.Err()}
		}
		return err
	}
	recheckAt := w.now()
	stale := recheckAt.Sub(w.doomedAt) > w.opts.Grace/10
	w.dels.Go(func() error {
		ctx := w.delCtx
		if stale {
			batch = recheck(ctx, w.s, batch, recheckAt, w.opts.Grace)
		}
		keys := make([]string, 0, len(batch))
		var bytes int64
		for _, o := range batch {
			keys = append(keys, o.Key)
			bytes += o.Size
		}
		if !w.opts.DryRun && len(keys) > 0 {
			if err := w.s.Delete(ctx, keys...); err != nil {
				return &sweepError{fmt.Errorf("gc: delete unreferenced objects: %w", err)}
			}
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		w.rep.DeletedBytes += bytes
		w.rep.DeletedObjects += len(keys)
		if w.opts.DryRun {
			w.rep.Deleted = append(w.rep.Deleted, keys...)
		}
		return nil
	})
	return nil
}

// writeFresh writes a mark naming the queued new garbage.
func (w *sweep) writeFresh(ctx context.Context) error {
	if len(w.fresh) == 0 {
		return nil
	}
	err := writeMarks(ctx, w.s, w.job, w.delay, w.fresh)
	w.fresh = w.fresh[:0]
	if err != nil {
		return &sweepError{err}
	}
	return nil
}
