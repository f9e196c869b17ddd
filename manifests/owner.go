package manifests

// Ownership and fencing (invariant 9: one owner per task).
//
// The first request an agent serves for a task takes the task's ownership:
// it creates the record <job>/tasks/<task>/owner/<epoch:020>, one epoch above
// the newest it listed, by conditional create. Two takers of the same epoch
// cannot both succeed: the loser lists again and takes the next epoch. The
// record holds {task, epoch, node, agent_id, created, after}, where after is
// the newest complete, valid checkpoint number of the task that the taker
// saw (from a scan made just before the create).
//
// A manifest carries the epoch of the owner that wrote it (0: written before
// ownership existed), and an owner of epoch e >= 1 writes it at
// chk/<N>/manifest.e<e> (private objects under chk/<N>/private.e<e>/), so
// keys of different owners never collide: a fenced zombie that committed N
// first cannot make the new owner's commit of N fail, nor overwrite its
// private objects.
//
// The rule every reader applies (Fence, inside Scan): the manifest (N, e) is
// fenced iff some ownership record k > e has N > after_k. A fenced manifest
// is not listed, restored, retained, reused, drilled or counted by
// retention; GC keeps nothing alive for it and deletes it. Records are never
// deleted or rewritten, so a fenced manifest stays fenced.
//
// Why it holds:
//
//   - The old owner's work up to the takeover survives: every checkpoint the
//     taker saw complete and valid has N <= after_k, so record k does not
//     fence it, and later records saw it too (their after is at least as
//     high, since retention never retires a task's newest checkpoint, and
//     readers count no retention marker on it: see markerCounts).
//   - A zombie (epoch e < k) that commits after the taker's scan commits
//     an N the taker did not see. Checkpoint numbers increase per task, and
//     an agent refuses N at or below the newest complete one it knows, so
//     the zombie's late N is above after_k (the newest the taker saw), and
//     record k fences it. (Only a checkpoint number below one that is
//     already complete could slip under after_k; it is then simply an old
//     checkpoint, still at most one per N, and never the one restored.)
//   - At most one valid manifest per N: an owner of epoch k commits N only
//     when N > after_k (the agent refuses N at or below the newest complete
//     checkpoint it knows, which is at least after_k). If (N, e) and (N, k)
//     with e < k were both valid, validity of (N, e) needs N <= after_k,
//     contradicting N > after_k. Two manifests of the same epoch and N share
//     a key, and the conditional create lets only one exist.
//   - The owner re-checks before each commit that no newer record exists
//     (one listing of owner/) and fails the checkpoint with a FencedError.
//     A zombie that checked just before a takeover and commits right after
//     is the residual window: the reader-side rule ignores its manifest, and
//     the agent checks again after its commit, so that it reports the
//     checkpoint as fenced rather than completed when it can see that.
//   - The new owner never waits for or is blocked by the zombie: it writes
//     only keys of its own epoch, and its records are created once.
//
// Readers compute fencing from one listing of the task's prefix (owner
// records and manifests together) and read only the records that can fence
// something: those newer than the oldest manifest epoch present. A record
// that does not decode makes that task unreadable (OwnerError); other tasks
// go on, and GC keeps every object of such a task alive.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/ckpt-io/ckpt/storage"
)

// Owner is one ownership record of a task.
type Owner struct {
	Task    string    `json:"task"`
	Epoch   uint64    `json:"epoch"`
	Node    string    `json:"node"`
	AgentID string    `json:"agent_id"`
	Created time.Time `json:"created"`
	// After is the newest complete, valid checkpoint of the task the taker
	// saw when it took over: the old owners' checkpoints above it are fenced.
	After uint64 `json:"after"`
	// Volume is the identity of the volume the taker's local dir is on
	// (sidecar mode; empty in node-agent mode and before ckpt recorded it).
	Volume string `json:"volume,omitempty"`
	// WALResumed, when set, says the taker's local state came from a
	// restore of checkpoint Checkpoint of the owner of Epoch extended with
	// that owner's WAL up to manifest Seq: a restore uses the WAL of that
	// owner only so far. Without it, a restore uses no WAL of the owners
	// before this one (see wal.Usable).
	WALResumed *WALResumed `json:"wal_resumed,omitempty"`
}

// WALResumed is the WAL position a taker's local state was restored to.
type WALResumed struct {
	Checkpoint uint64 `json:"checkpoint"`
	Epoch      uint64 `json:"epoch"`
	Seq        uint64 `json:"seq"`
}

// ErrOwnedElsewhere is wrapped by the error of an agent that may not take a
// task over from its owner on another node (see TakeOwnershipIf).
var ErrOwnedElsewhere = errors.New("owned by an agent on another node")

// ErrFenced is wrapped by FencedError.
var ErrFenced = errors.New("fenced by a newer owner")

// FencedError says that a newer owner took the task over from the agent
// that holds ownership Mine.
type FencedError struct {
	Task string
	Mine uint64 // the fenced owner's epoch
	By   Owner  // the newer owner's record (only Epoch is set if unreadable)
	// Committed is set when the fenced checkpoint's manifest was written but
	// falls under the fencing rule: readers ignore it.
	Committed bool
}

func (e *FencedError) Error() string {
	by := fmt.Sprintf("agent %s on node %s", e.By.AgentID, e.By.Node)
	if e.By.AgentID == "" && e.By.Node == "" {
		by = "another agent (its ownership record is unreadable)"
	}
	msg := fmt.Sprintf("this agent was fenced: task %s was taken over by %s at epoch %d (this agent held epoch %d)", e.Task, by, e.By.Epoch, e.Mine)
	if e.Committed {
		msg += "; the manifest written after the takeover is ignored by list, restore, retention and GC"
	}
	return msg
}

func (e *FencedError) Unwrap() error { return ErrFenced }

// OwnerError is the error for an ownership record that is stored but does
// not decode or names another task or epoch than its key. The task's
// checkpoints cannot be told valid or fenced until an operator fixes it.
type OwnerError struct {
	Key string
	Err error
}

func (e *OwnerError) Error() string {
	return "ownership record " + e.Key + ": " + e.Err.Error() + " (the task's checkpoints cannot be checked for fencing; fix or remove the record)"
}
func (e *OwnerError) Unwrap() error { return e.Err }

// Owners is what storage holds of one task's ownership.
type Owners struct {
	Task    string
	Epochs  []uint64         // every record listed, ascending
	Records map[uint64]Owner // the records read (those that can fence something)
}

// Latest is the newest epoch listed (0: none).
func (o *Owners) Latest() uint64 {
	if o == nil || len(o.Epochs) == 0 {
		return 0
	}
	return o.Epochs[len(o.Epochs)-1]
}

// Fences returns the record that fences the manifest of checkpoint n
// written at epoch, if any: the oldest record k > epoch with n > after_k.
// Every record newer than epoch must have been read.
func (o *Owners) Fences(n, epoch uint64) (Owner, bool) {
	if o == nil {
		return Owner{}, false
	}
	for _, k := range o.Epochs {
		if k <= epoch {
			continue
		}
		r, ok := o.Records[k]
		if !ok || n > r.After {
			if !ok {
				r = Owner{Task: o.Task, Epoch: k}
			}
			return r, true
		}
	}
	return Owner{}, false
}

// Fence is the fencing filter every reader of complete checkpoints goes
// through (Scan applies it): of refs, the manifests of one task, it keeps
// for each checkpoint number the one manifest no ownership record fences,
// and returns the others as fenced. Should two be unfenced (only possible
// if storage was edited by hand), the newer epoch's is kept.
func Fence(refs []Ref, owners *Owners) (valid, fenced []Ref) {
	best := map[uint64]int{}
	for _, r := range refs {
		if _, ok := owners.Fences(r.Checkpoint, r.Epoch); ok {
			fenced = append(fenced, r)
			continue
		}
		if i, ok := best[r.Checkpoint]; ok {
			if valid[i].Epoch > r.Epoch {
				fenced = append(fenced, r)
				continue
			}
			fenced = append(fenced, valid[i])
			valid[i] = r
			continue
		}
		best[r.Checkpoint] = len(valid)
		valid = append(valid, r)
	}
	return valid, fenced
}

// ReadOwner reads and checks the ownership record of epoch.
func ReadOwner(ctx context.Context, s storage.Store, job, task string, epoch uint64) (Owner, error) {
	key := OwnerKey(job, task, epoch)
	rc, err := s.Get(ctx, key)
	if err != nil {
		if errors.Is(err, storage.ErrNotFound) {
			return Owner{}, &OwnerError{Key: key, Err: errors.New("listed but gone")}
		}
		return Owner{}, fmt.Errorf("read ownership record %s: %w", key, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, 1<<20))
	if err != nil {
		return Owner{}, fmt.Errorf("read ownership record %s: %w", key, err)
	}
	var o Owner
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&o); err != nil {
		return Owner{}, &OwnerError{Key: key, Err: fmt.Errorf("not valid JSON: %w", err)}
	}
	if o.Task != task || o.Epoch != epoch {
		return Owner{}, &OwnerError{Key: key, Err: fmt.Errorf("names task %q epoch %d, not where it is stored", o.Task, o.Epoch)}
	}
	return o, nil
}

// readOwners reads the records of o newer than from into o.Records.
func readOwners(ctx context.Context, s storage.Store, job string, o *Owners, from uint64) error {
	for _, k := range o.Epochs {
		if _, ok := o.Records[k]; ok || k <= from {
			continue
		}
		r, err := ReadOwner(ctx, s, job, o.Task, k)
		if err != nil {
			return err
		}
		o.Records[k] = r
	}
	return nil
}

// ListOwners lists the epochs of a task's ownership records, ascending,
// and reads the records newer than from.
func ListOwners(ctx context.Context, s storage.Store, job, task string, from uint64) (*Owners, error) {
	o := &Owners{Task: task, Records: map[uint64]Owner{}}
	err := s.List(ctx, OwnerPrefix(job, task), func(info storage.ObjectInfo) error {
		if k := parseTaskKey(job, info.Key); k.kind == keyOwner && k.task == task {
			o.Epochs = append(o.Epochs, k.n)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list ownership records of task %s: %w", task, err)
	}
	sort.Slice(o.Epochs, func(i, j int) bool { return o.Epochs[i] < o.Epochs[j] })
	if err := readOwners(ctx, s, job, o, from); err != nil {
		return nil, err
	}
	return o, nil
}

// TakeOwnership makes the caller the owner of task: it scans the task,
// notes its newest valid checkpoint, and creates the record one epoch
// above the newest, retrying with the next epoch if another taker won.
// From its return on, every older owner is fenced.
func TakeOwnership(ctx context.Context, s storage.Store, job, task, node, agentID string) (Owner, error) {
	return TakeOwnershipIf(ctx, s, job, task, node, agentID, nil)
}

// TakeOwnershipOn is TakeOwnershipIf for a taker whose local dir is on
// the volume named volume (recorded in the new record).
func TakeOwnershipOn(ctx context.Context, s storage.Store, job, task, node, volume, agentID string, may func(latest Owner) error) (Owner, error) {
	return TakeOwnershipResuming(ctx, s, job, task, node, volume, agentID, nil, may)
}

// TakeOwnershipResuming is TakeOwnershipOn for a taker whose local state
// was restored from an owner's WAL up to resumed (see Owner.WALResumed;
// nil: from no WAL). It is recorded only when it extends the newest
// owner's valid checkpoint the taker saw; anything else would let a
// restore use a WAL the taker did not go on from.
func TakeOwnershipResuming(ctx context.Context, s storage.Store, job, task, node, volume, agentID string, resumed *WALResumed, may func(latest Owner) error) (Owner, error) {
	for attempt := 0; ; attempt++ {
		cat, err := Scan(ctx, s, job, task)
		if err != nil {
			return Owner{}, err
		}
		if err := cat.OwnerProblems[task]; err != nil {
			return Owner{}, err
		}
		owners := cat.Owners[task]
		latest := owners.Latest()
		if latest > 0 {
			// The newest record must decode: a task whose ownership
			// cannot be read is not taken over blindly.
			cur, err := ReadOwner(ctx, s, job, task, latest)
			if err != nil {
				return Owner{}, err
			}
			if may != nil {
				if err := may(cur); err != nil {
					return Owner{}, err
				}
			}
		}
		rec := Owner{Task: task, Epoch: latest + 1, Node: node, AgentID: agentID, Created: time.Now().UTC(), Volume: volume}
		var afterEpoch uint64
		for _, r := range cat.Refs {
			if r.Task == task && r.Checkpoint > rec.After {
				rec.After, afterEpoch = r.Checkpoint, r.Epoch
			}
		}
		if resumed != nil && resumed.Checkpoint == rec.After && resumed.Epoch == afterEpoch && resumed.Seq > 0 {
			w := *resumed
			rec.WALResumed = &w
		}
		data, err := json.Marshal(rec)
		if err != nil {
			return Owner{}, err
		}
		err = s.Create(ctx, OwnerKey(job, task, rec.Epoch), bytes.NewReader(data), int64(len(data)))
		switch {
		case err == nil:
			return rec, nil
		case errors.Is(err, storage.ErrExists) && attempt < 100:
			continue // another agent took this epoch: look again
		default:
			return Owner{}, fmt.Errorf("take ownership of task %s at epoch %d: %w", task, rec.Epoch, err)
		}
	}
}

// CheckOwner returns a *FencedError if an ownership record newer than
// mine exists, nil if mine is still the newest. One listing of owner/,
// plus one read to name the newer owner when there is one.
func CheckOwner(ctx context.Context, s storage.Store, job string, mine Owner) error {
	o, err := ListOwners(ctx, s, job, mine.Task, ^uint64(0))
	if err != nil {
		return err
	}
	latest := o.Latest()
	if latest <= mine.Epoch {
		return nil
	}
	by, err := ReadOwner(ctx, s, job, mine.Task, latest)
	var bad *OwnerError
	switch {
	case errors.As(err, &bad):
		by = Owner{Task: mine.Task, Epoch: latest}
	case err != nil:
		return err
	}
	return &FencedError{Task: mine.Task, Mine: mine.Epoch, By: by}
}

// CheckCommitted is the owner's check after it committed checkpoint n: it
// returns a *FencedError with Committed set if a newer owner fences that
// manifest (readers ignore it), nil if the manifest is valid.
func CheckCommitted(ctx context.Context, s storage.Store, job string, mine Owner, n uint64) error {
	o, err := ListOwners(ctx, s, job, mine.Task, mine.Epoch)
	if err != nil {
		var bad *OwnerError
		if errors.As(err, &bad) {
			return &FencedError{Task: mine.Task, Mine: mine.Epoch, By: Owner{Task: mine.Task, Epoch: o.Latest()}, Committed: true}
		}
		return err
	}
	if by, ok := o.Fences(n, mine.Epoch); ok {
		return &FencedError{Task: mine.Task, Mine: mine.Epoch, By: by, Committed: true}
	}
	return nil
}
