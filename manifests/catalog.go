package manifests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"time"

	"github.com/ckpt-io/ckpt/storage"
)

// ErrConflict is returned (wrapped) when a manifest for the same checkpoint
// of the same task already exists: another writer committed it first.
var ErrConflict = errors.New("checkpoint already committed")

// Ref names one committed checkpoint as found in storage.
type Ref struct {
	Task         string
	Checkpoint   uint64
	Created      time.Time // the manifest object's time
	ManifestSize int64
	Retired      bool
	RetiredAt    time.Time
	// Epoch is the ownership epoch of the manifest's writer (from its key);
	// Key is the manifest's object key.
	Epoch uint64
	Key   string
}

// Catalog is what a scan of a job's task prefix found.
type Catalog struct {
	Job  string
	Refs []Ref // sorted by task, then checkpoint; never a fenced manifest
	// Fenced are the manifests a newer owner fenced (see owner.go): never
	// listed, restored or retained; GC deletes them and keeps nothing alive
	// for them.
	Fenced []Ref
	// Owners holds each task's ownership records (those that can fence).
	Owners map[string]*Owners
	// OwnerProblems names the tasks whose ownership records cannot be
	// read: their checkpoints are in Refs (every one, so that GC keeps
	// their objects) but Retained withholds them, and Load fails.
	OwnerProblems map[string]error
	// Private holds the private objects seen, by key.
	Private map[string]storage.ObjectInfo
	// StrayMarkers are retired markers whose manifest is gone.
	StrayMarkers []string
	ListedAt     time.Time
	// markers holds the keys of every retention marker of each valid
	// checkpoint, those that count and those that do not.
	markers map[taskN][]string
}

// taskN names one checkpoint of one task.
type taskN struct {
	task string
	n    uint64
}

// marker is a retention marker found by Scan.
type marker struct {
	epoch uint64 // 0: written without one (RetiredKey)
	info  storage.ObjectInfo
}

// MarkerKeys returns the keys of every retention marker of checkpoint n of
// task found by the scan (GC deletes them with the manifest).
func (c *Catalog) MarkerKeys(task string, n uint64) []string {
	return c.markers[taskN{task, n}]
}

// AddMarker records key, a retention marker of checkpoint n of task
// written since the scan (GC's retention), for MarkerKeys.
func (c *Catalog) AddMarker(task string, n uint64, key string) {
	k := taskN{task, n}
	c.markers[k] = append(c.markers[k], key)
}

// The retirement rule every reader applies (inside Scan), the counterpart
// of the fencing rule for retention markers:
//
//   - A task's newest valid checkpoint is never retired, whatever markers
//     name it: no writer retires it on purpose (Retention keeps it), so a
//     marker on it is a superseded owner's, retiring from a stale view of
//     the task, and obeying it would leave the task nothing to restore.
//   - A marker of epoch e >= 1 (retired.e<e>) counts only if it was its
//     owner's to write: if a newer owner took the task over, the first
//     record k > e must have after_k > N, i.e. the taker saw a newer
//     checkpoint than N, so that retiring N left the task something. A
//     superseded owner's late retirement of the checkpoint the taker
//     resumed from (or of any newer one) is ignored, for good: records
//     are never deleted. A marker whose deciding record is unreadable is
//     ignored too (ignoring a marker keeps more, never less).
//   - A marker without an epoch (retired, written by agents older than
//     epoch markers, or by writers without ownership) cannot be placed
//     in time: it counts, except on the newest valid checkpoint.
//
// Ignored markers stay in storage (they are harmless) and go with their
// checkpoint when GC deletes it.
func markerCounts(ow *Owners, n, epoch uint64) bool {
	if epoch == 0 || ow == nil {
		return true
	}
	for _, k := range ow.Epochs {
		if k <= epoch {
			continue
		}
		r, ok := ow.Records[k]
		return ok && n < r.After
	}
	return true
}

// Retained returns the complete, not retired checkpoints of task (all tasks
// when task is ""), oldest first.
func (c *Catalog) Retained(task string) []Ref {
	var out []Ref
	for _, r := range c.Refs {
		if c.OwnerProblems[r.Task] != nil {
			continue
		}
		if !r.Retired && (task == "" || r.Task == task) {
			out = append(out, r)
		}
	}
	return out
}

// Scan lists the manifests, retention markers, private objects and
// ownership records of a job (of one task when task is not ""), and applies
// the fencing rule (Fence): Refs holds, for each checkpoint, the one
// manifest no newer owner fenced. It reads no manifest bodies, only the
// ownership records that can fence a manifest present.
func Scan(ctx context.Context, s storage.Store, job, task string) (*Catalog, error) {
	prefix := TasksPrefix(job)
	if task != "" {
		prefix = TaskRoot(job, task)
	}
	c := &Catalog{Job: job, Private: map[string]storage.ObjectInfo{}, ListedAt: time.Now(),
		Owners: map[string]*Owners{}, OwnerProblems: map[string]error{}}
	type id = taskN
	byTask := map[string][]Ref{}
	markers := map[id][]marker{}
	err := s.List(ctx, prefix, func(o storage.ObjectInfo) error {
		k := parseTaskKey(job, o.Key)
		switch k.kind {
		case keyManifest:
			byTask[k.task] = append(byTask[k.task], Ref{Task: k.task, Checkpoint: k.n, Created: o.ModTime, ManifestSize: o.Size, Epoch: k.epoch, Key: o.Key})
		case keyRetired:
			markers[id{k.task, k.n}] = append(markers[id{k.task, k.n}], marker{epoch: k.epoch, info: o})
		case keyPrivate:
			c.Private[o.Key] = o
		case keyOwner:
			ow := c.Owners[k.task]
			if ow == nil {
				ow = &Owners{Task: k.task, Records: map[uint64]Owner{}}
				c.Owners[k.task] = ow
			}
			ow.Epochs = append(ow.Epochs, k.n)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("scan checkpoints of job %s in %s: %w", job, s, err)
	}
	refs := map[id]*Ref{}
	newest := map[string]uint64{} // each task's newest valid checkpoint
	for t, rs := range byTask {
		ow := c.Owners[t]
		valid := rs
		if ow != nil {
			sort.Slice(ow.Epochs, func(i, j int) bool { return ow.Epochs[i] < ow.Epochs[j] })
			// The records that can fence a manifest or overrule a
			// retention marker present.
			oldest := rs[0].Epoch
			for _, r := range rs {
				oldest = min(oldest, r.Epoch)
			}
			for k, ms := range markers {
				if k.task == t {
					for _, m := range ms {
						if m.epoch > 0 {
							oldest = min(oldest, m.epoch)
						}
					}
				}
			}
			err := readOwners(ctx, s, job, ow, oldest)
			var bad *OwnerError
			switch {
			case errors.As(err, &bad):
				c.OwnerProblems[t] = err
			case err != nil:
				return nil, err
			default:
				var fenced []Ref
				valid, fenced = Fence(rs, ow)
				c.Fenced = append(c.Fenced, fenced...)
			}
		}
		for i := range valid {
			r := valid[i]
			refs[id{r.Task, r.Checkpoint}] = &r
			newest[t] = max(newest[t], r.Checkpoint)
			if c.OwnerProblems[t] != nil {
				c.Refs = append(c.Refs, r) // every manifest, kept whole
			}
		}
	}
	c.markers = map[id][]string{}
	for k, ms := range markers {
		r, ok := refs[k]
		for _, m := range ms {
			if !ok {
				c.StrayMarkers = append(c.StrayMarkers, m.info.Key)
				continue
			}
			c.markers[id(k)] = append(c.markers[id(k)], m.info.Key)
			if k.n == newest[k.task] || !markerCounts(c.Owners[k.task], k.n, m.epoch) {
				continue // see markerCounts
			}
			if !r.Retired || m.info.ModTime.After(r.RetiredAt) {
				r.Retired, r.RetiredAt = true, m.info.ModTime
			}
		}
	}
	for _, r := range refs {
		if c.OwnerProblems[r.Task] == nil {
			c.Refs = append(c.Refs, *r)
		}
	}
	for i := range c.Refs {
		if r, ok := refs[id{c.Refs[i].Task, c.Refs[i].Checkpoint}]; ok && c.OwnerProblems[r.Task] != nil {
			c.Refs[i].Retired, c.Refs[i].RetiredAt = r.Retired, r.RetiredAt
		}
	}
	sortRefs(c.Refs)
	sortRefs(c.Fenced)
	sort.Strings(c.StrayMarkers)
	return c, nil
}

func sortRefs(refs []Ref) {
	sort.Slice(refs, func(i, j int) bool {
		if refs[i].Task != refs[j].Task {
			return refs[i].Task < refs[j].Task
		}
		if refs[i].Checkpoint != refs[j].Checkpoint {
			return refs[i].Checkpoint < refs[j].Checkpoint
		}
		return refs[i].Epoch < refs[j].Epoch
	})
}

// Find returns the valid manifest of checkpoint n of task. An error
// wrapping storage.ErrNotFound says there is none (or only fenced ones);
// an *OwnerError that the task's ownership records cannot be read.
func (c *Catalog) Find(task string, n uint64) (Ref, error) {
	if err := c.OwnerProblems[task]; err != nil {
		return Ref{}, err
	}
	for _, r := range c.Refs {
		if r.Task == task && r.Checkpoint == n {
			return r, nil
		}
	}
	return Ref{}, fmt.Errorf("manifest of %s checkpoint %d: %w", task, n, storage.ErrNotFound)
}

// Load reads and checks the valid manifest of checkpoint n of task: it
// scans the task (one listing) to apply the fencing rule, so a fenced
// manifest is never returned. A missing manifest returns an error wrapping
// storage.ErrNotFound.
func Load(ctx context.Context, s storage.Store, job, task string, n uint64) (*Manifest, error) {
	m, _, err := LoadEncoded(ctx, s, job, task, n)
	return m, err
}

// LoadEncoded is Load that also returns the manifest as stored.
func LoadEncoded(ctx context.Context, s storage.Store, job, task string, n uint64) (*Manifest, []byte, error) {
	cat, err := Scan(ctx, s, job, task)
	if err != nil {
		return nil, nil, err
	}
	ref, err := cat.Find(task, n)
	if err != nil {
		return nil, nil, err
	}
	return LoadRefEncoded(ctx, s, job, ref)
}

// LoadRef reads and checks the manifest ref names, as found by Scan (which
// applied the fencing rule).
func LoadRef(ctx context.Context, s storage.Store, job string, ref Ref) (*Manifest, error) {
	m, _, err := LoadRefEncoded(ctx, s, job, ref)
	return m, err
}

// LoadRefEncoded is LoadRef that also returns the manifest as stored.
func LoadRefEncoded(ctx context.Context, s storage.Store, job string, ref Ref) (*Manifest, []byte, error) {
	data, key, err := readRef(ctx, s, job, ref)
	if err != nil {
		return nil, nil, err
	}
	m, err := Decode(data)
	if err == nil {
		err = placeCheck(job, ref)(m)
	}
	if err != nil {
		return nil, nil, &UnreadableError{Key: key, Err: err}
	}
	return m, data, nil
}

// UnreadableError is Load's error for a manifest that is stored but cannot
// be used: too large, not decodable, failing its checksum or its checks, or
// naming another checkpoint than where it is stored. Reading it again will
// not help; an operator must fix or remove it.
type UnreadableError struct {
	Key string // the manifest's object key
	Err error
}

func (e *UnreadableError) Error() string { return "manifest " + e.Key + ": " + e.Err.Error() }
func (e *UnreadableError) Unwrap() error { return e.Err }

// LoadRetained reads the manifests of refs, in order, for the readers
// that show or use what storage holds (list, the agent's dedup set). An
// unreadable manifest (*UnreadableError) does not hide the others: it is
// returned as a Problem naming its key and error, and skipped. A manifest
// deleted since the scan is skipped silently. Any other error (storage
// unreachable, ctx) fails the whole call.
//
// GC does not use this: it stops on an unreadable manifest, since it
// cannot know what that manifest references.
func LoadRetained(ctx context.Context, s storage.Store, job string, refs []Ref) ([]*Manifest, []Problem, error) {
	var out []*Manifest
	problems, err := EachRetained(ctx, s, job, refs, func(m *Manifest) error {
		out = append(out, m)
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return out, problems, nil
}

// EachRetained is LoadRetained that hands each manifest to fn as it is
// read, in order, instead of keeping them all: a reader that needs a few
// fields of each (list) holds one manifest at a time. An error from fn
// stops it and is returned.
func EachRetained(ctx context.Context, s storage.Store, job string, refs []Ref, fn func(*Manifest) error) ([]Problem, error) {
	return eachRef(refs, func(r Ref) error {
		m, err := LoadRef(ctx, s, job, r)
		if err != nil {
			return err
		}
		return fn(m)
	})
}

// EachRetainedHeader is EachRetained for readers of the totals alone
// (list): each manifest is walked, checked as Decode checks it, without
// decoding its files (see Walk), and fn gets it without Files and their
// number.
func EachRetainedHeader(ctx context.Context, s storage.Store, job string, refs []Ref, fn func(m *Manifest, files int) error) ([]Problem, error) {
	return eachRef(refs, func(r Ref) error {
		m, n, err := WalkRef(ctx, s, job, r, nil)
		if err != nil {
			return err
		}
		return fn(m, n)
	})
}

// eachRef calls load for each of refs, collecting unreadable manifests as
// problems and skipping deleted ones; any other error stops it.
func eachRef(refs []Ref, load func(Ref) error) ([]Problem, error) {
	var problems []Problem
	for _, r := range refs {
		err := load(r)
		var bad *UnreadableError
		switch {
		case errors.As(err, &bad):
			problems = append(problems, Problem{Task: r.Task, Checkpoint: r.Checkpoint, Key: bad.Key, Problem: bad.Error()})
		case errors.Is(err, storage.ErrNotFound):
		case err != nil:
			return nil, err
		}
	}
	return problems, nil
}

// Commit writes the encoded manifest of m with a conditional create: the
// checkpoint becomes complete at this moment, and only if no other writer
// completed it first (then the error wraps ErrConflict and the winner's
// manifest is left intact). Every object m names must already be durable.
func Commit(ctx context.Context, s storage.Store, m *Manifest, encoded []byte) error {
	key := ManifestKeyOf(m.Job, m.Task, m.Checkpoint, m.Epoch)
	err := s.Create(ctx, key, bytes.NewReader(encoded), int64(len(encoded)))
	if errors.Is(err, storage.ErrExists) {
		return fmt.Errorf("commit %s checkpoint %d: %w", m.Task, m.Checkpoint, ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("commit %s checkpoint %d: %w", m.Task, m.Checkpoint, err)
	}
	return nil
}

// Retire writes the retention marker of checkpoint n without an epoch,
// for writers that own nothing: see RetireAt.
func Retire(ctx context.Context, s storage.Store, job, task string, n uint64) error {
	return RetireAt(ctx, s, job, task, n, 0)
}

// RetireAt writes the retention marker of checkpoint n in the name of the
// owner of epoch (retired.e<epoch>). From then on the checkpoint is no
// longer listed, restored or used for deduplication; its objects stay live
// for the GC grace period that the marker's time starts, so a checkpoint
// in flight that chose to reuse them can still commit. Readers ignore the
// marker if the task had passed to a newer owner that resumed from n or a
// newer checkpoint, and on the task's newest valid checkpoint (see
// markerCounts): the writer checks its ownership first (CheckOwner), and
// this rule covers a takeover between that check and this write.
func RetireAt(ctx context.Context, s storage.Store, job, task string, n, epoch uint64) error {
	if err := s.Put(ctx, RetiredKeyOf(job, task, n, epoch), bytes.NewReader(nil), 0); err != nil {
		return fmt.Errorf("retire %s checkpoint %d: %w", task, n, err)
	}
	return nil
}

// Retention is the one retention decision of ckpt, used by the agent after
// each checkpoint, by GC (gc.Options.Retain) and so by `ckpt gc --retain`.
// refs are the retained (complete, not retired) checkpoints of one task,
// oldest first; keep is how many to retain. It returns the refs that stay
// retained and those to retire, each oldest first, without changing refs.
// keep < 1 is treated as 1: a task never retires its newest complete
// checkpoint. protect names checkpoint numbers that stay retained whatever
// keep says, beyond the newest keep: the callers pass the task's newest
// job-complete checkpoint (JobReader.NewestComplete), so that a job-wide
// restore always has one. Retention is pure: the callers write the
// retirements.
func Retention(refs []Ref, keep int, protect ...uint64) (retained, retire []Ref) {
	keep = max(keep, 1)
	cut := max(len(refs)-keep, 0)
	if len(protect) == 0 {
		return refs[cut:len(refs):len(refs)], refs[:cut:cut]
	}
	for i, r := range refs {
		if i >= cut || slices.Contains(protect, r.Checkpoint) {
			retained = append(retained, r)
		} else {
			retire = append(retire, r)
		}
	}
	return retained, retire
}

// RefOf is the Ref of a committed manifest, as Retention sees it.
func RefOf(m *Manifest) Ref {
	return Ref{Task: m.Task, Checkpoint: m.Checkpoint, Epoch: m.Epoch, Key: ManifestKeyOf(m.Job, m.Task, m.Checkpoint, m.Epoch)}
}

// readSized reads r to its end, or to limit bytes, into one buffer sized
// for hint bytes (the size a listing gave): a manifest of 200,000 files is
// tens of MB, and io.ReadAll would copy it through a doubling buffer.
func readSized(r io.Reader, hint, limit int64) ([]byte, error) {
	size := min(max(hint, 0), limit) + 1 // +1: room to see the end without growing
	buf := make([]byte, 0, size)
	lr := io.LimitReader(r, limit)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)] // the hint was short: grow
		}
		n, err := lr.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}
