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
}

// Catalog is what a scan of a job's task prefix found.
type Catalog struct {
	Job  string
	Refs []Ref // sorted by task, then checkpoint
	// Private holds the private objects seen, by key.
	Private map[string]storage.ObjectInfo
	// StrayMarkers are retired markers whose manifest is gone.
	StrayMarkers []string
	ListedAt     time.Time
}

// Retained returns the complete, not retired checkpoints of task (all tasks
// when task is ""), oldest first.
func (c *Catalog) Retained(task string) []Ref {
	var out []Ref
	for _, r := range c.Refs {
		if !r.Retired && (task == "" || r.Task == task) {
			out = append(out, r)
		}
	}
	return out
}

// Scan lists the manifests, retention markers and private objects of a job
// (of one task when task is not ""). It reads no manifest bodies.
func Scan(ctx context.Context, s storage.Store, job, task string) (*Catalog, error) {
	prefix := TasksPrefix(job)
	if task != "" {
		prefix = TaskPrefix(job, task)
	}
	c := &Catalog{Job: job, Private: map[string]storage.ObjectInfo{}, ListedAt: time.Now()}
	type id struct {
		task string
		n    uint64
	}
	refs := map[id]*Ref{}
	markers := map[id]storage.ObjectInfo{}
	err := s.List(ctx, prefix, func(o storage.ObjectInfo) error {
		t, n, kind := parseTaskKey(job, o.Key)
		switch kind {
		case keyManifest:
			refs[id{t, n}] = &Ref{Task: t, Checkpoint: n, Created: o.ModTime, ManifestSize: o.Size}
		case keyRetired:
			markers[id{t, n}] = o
		case keyPrivate:
			c.Private[o.Key] = o
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("scan checkpoints of job %s in %s: %w", job, s, err)
	}
	for k, m := range markers {
		if r, ok := refs[k]; ok {
			r.Retired, r.RetiredAt = true, m.ModTime
		} else {
			c.StrayMarkers = append(c.StrayMarkers, m.Key)
		}
	}
	for _, r := range refs {
		c.Refs = append(c.Refs, *r)
	}
	sort.Slice(c.Refs, func(i, j int) bool {
		if c.Refs[i].Task != c.Refs[j].Task {
			return c.Refs[i].Task < c.Refs[j].Task
		}
		return c.Refs[i].Checkpoint < c.Refs[j].Checkpoint
	})
	sort.Strings(c.StrayMarkers)
	return c, nil
}

// Load reads and checks the manifest of checkpoint n of task. A missing
// manifest returns an error wrapping storage.ErrNotFound.
func Load(ctx context.Context, s storage.Store, job, task string, n uint64) (*Manifest, error) {
	m, _, err := LoadEncoded(ctx, s, job, task, n)
	return m, err
}

// LoadEncoded is Load that also returns the manifest as stored.
func LoadEncoded(ctx context.Context, s storage.Store, job, task string, n uint64) (*Manifest, []byte, error) {
	key := ManifestKey(job, task, n)
	rc, err := s.Get(ctx, key)
	if err != nil {
		return nil, nil, fmt.Errorf("read manifest of %s checkpoint %d: %w", task, n, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, MaxManifestBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("read manifest of %s checkpoint %d: %w", task, n, err)
	}
	m, err := Decode(data)
	if err != nil {
		return nil, nil, &UnreadableError{Key: key, Err: err}
	}
	if m.Job != job || m.Task != task || m.Checkpoint != n {
		return nil, nil, &UnreadableError{Key: key, Err: fmt.Errorf("names job %q task %q checkpoint %d, not where it is stored", m.Job, m.Task, m.Checkpoint)}
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
	var problems []Problem
	for _, r := range refs {
		m, err := Load(ctx, s, job, r.Task, r.Checkpoint)
		var bad *UnreadableError
		switch {
		case errors.As(err, &bad):
			problems = append(problems, Problem{Task: r.Task, Checkpoint: r.Checkpoint, Key: bad.Key, Problem: bad.Error()})
			continue
		case errors.Is(err, storage.ErrNotFound):
			continue
		case err != nil:
			return nil, nil, err
		}
		out = append(out, m)
	}
	return out, problems, nil
}

// Commit writes the encoded manifest of m with a conditional create: the
// checkpoint becomes complete at this moment, and only if no other writer
// completed it first (then the error wraps ErrConflict and the winner's
// manifest is left intact). Every object m names must already be durable.
func Commit(ctx context.Context, s storage.Store, m *Manifest, encoded []byte) error {
	key := ManifestKey(m.Job, m.Task, m.Checkpoint)
	err := s.Create(ctx, key, bytes.NewReader(encoded), int64(len(encoded)))
	if errors.Is(err, storage.ErrExists) {
		return fmt.Errorf("commit %s checkpoint %d: %w", m.Task, m.Checkpoint, ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("commit %s checkpoint %d: %w", m.Task, m.Checkpoint, err)
	}
	return nil
}

// Retire writes the retention marker of checkpoint n. From then on the
// checkpoint is no longer listed, restored or used for deduplication; its
// objects stay live for the GC grace period that the marker's time starts,
// so a checkpoint in flight that chose to reuse them can still commit.
func Retire(ctx context.Context, s storage.Store, job, task string, n uint64) error {
	if err := s.Put(ctx, RetiredKey(job, task, n), bytes.NewReader(nil), 0); err != nil {
		return fmt.Errorf("retire %s checkpoint %d: %w", task, n, err)
	}
	return nil
}

// Retention is the one retention decision of ckpt, used by the agent after
// each checkpoint, by GC (GCOptions.Retain) and so by `ckpt gc --retain`.
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
	return Ref{Task: m.Task, Checkpoint: m.Checkpoint}
}
