package restore_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/ckpt-io/ckpt/gc"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
)

// fenceAgent is one agent's view in the fencing model: what it owns, the
// newest checkpoint it knows complete, and a manifest it is about to
// commit (it passed its pre-commit ownership check: a zombie in the
// making).
type fenceAgent struct {
	name    string
	owner   map[string]*manifests.Owner
	fenced  map[string]bool
	last    map[string]uint64
	pending map[string]*manifests.Manifest
	// known is the task's retained checkpoints as the agent remembers
	// them; retiring holds a retention that passed its ownership check and
	// is not written yet (a takeover may come in between); taking holds a
	// takeover whose scan is done and whose record is not created yet.
	known    map[string][]uint64
	retiring map[string][]uint64
	taking   map[string]*taking
}

type taking struct {
	after uint64
	known []uint64
}

func newFenceAgent(name string) *fenceAgent {
	return &fenceAgent{name: name, owner: map[string]*manifests.Owner{}, fenced: map[string]bool{},
		last: map[string]uint64{}, pending: map[string]*manifests.Manifest{},
		known: map[string][]uint64{}, retiring: map[string][]uint64{}, taking: map[string]*taking{}}
}

type committedKey struct {
	task  string
	n     uint64
	epoch uint64
}

type fenceModel struct {
	t       *rapid.T
	tt      *testing.T
	ctx     context.Context
	s       storage.Store
	agents  []*fenceAgent
	records map[string][]manifests.Owner // by task, epoch order
	content map[committedKey][]byte      // every committed manifest's private bytes
}

// modelFenced is the rule, computed from the model's own records.
func (m *fenceModel) modelFenced(task string, n, epoch uint64) bool {
	for _, r := range m.records[task] {
		if r.Epoch > epoch && n > r.After {
			return true
		}
	}
	return false
}

func (m *fenceModel) take(a *fenceAgent, task string) {
	rec, err := manifests.TakeOwnership(m.ctx, m.s, "job", task, "node-"+a.name, a.name)
	if err != nil {
		m.t.Fatalf("%s takes %s: %v", a.name, task, err)
	}
	if want := uint64(len(m.records[task]) + 1); rec.Epoch != want {
		m.t.Fatalf("%s took %s at epoch %d, want %d", a.name, task, rec.Epoch, want)
	}
	m.records[task] = append(m.records[task], rec)
	a.owner[task], a.fenced[task], a.last[task] = &rec, false, rec.After
	delete(a.pending, task) // a new incarnation; the old one's pending commit is lost
	delete(a.retiring, task)
	a.known[task] = m.retainedNs(task)
}

func (m *fenceModel) retainedNs(task string) []uint64 {
	cat, err := manifests.Scan(m.ctx, m.s, "job", task)
	if err != nil {
		m.t.Fatal(err)
	}
	var out []uint64
	for _, r := range cat.Retained(task) {
		out = append(out, r.Checkpoint)
	}
	return out
}

// beginTake is the first half of a takeover: the scan that decides the
// record's after. Commits and retirements may land before endTake.
func (m *fenceModel) beginTake(a *fenceAgent, task string) {
	cat, err := manifests.Scan(m.ctx, m.s, "job", task)
	if err != nil {
		m.t.Fatal(err)
	}
	tk := &taking{}
	for _, r := range cat.Refs {
		tk.after = max(tk.after, r.Checkpoint)
	}
	for _, r := range cat.Retained(task) {
		tk.known = append(tk.known, r.Checkpoint)
	}
	a.taking[task] = tk
}

// endTake creates the record beginTake prepared, as TakeOwnership does.
func (m *fenceModel) endTake(a *fenceAgent, task string) {
	tk := a.taking[task]
	if tk == nil {
		return
	}
	delete(a.taking, task)
	rec := manifests.Owner{Task: task, Epoch: uint64(len(m.records[task]) + 1), Node: "node-" + a.name, AgentID: a.name, Created: time.Now().UTC(), After: tk.after}
	data, err := json.Marshal(rec)
	if err != nil {
		m.t.Fatal(err)
	}
	if err := m.s.Create(m.ctx, manifests.OwnerKey("job", task, rec.Epoch), bytes.NewReader(data), int64(len(data))); err != nil {
		m.t.Fatal(err)
	}
	m.records[task] = append(m.records[task], rec)
	a.owner[task], a.fenced[task], a.last[task] = &rec, false, rec.After
	delete(a.pending, task)
	delete(a.retiring, task)
	a.known[task] = tk.known
}

// prepareRetire is an owner's retention (keep 1) from memory, after its
// ownership check: a fenced owner retires nothing. The retirements are
// written later (retire), a takeover may come in between.
func (m *fenceModel) prepareRetire(a *fenceAgent, task string) {
	own := a.owner[task]
	if own == nil || a.fenced[task] || len(a.known[task]) < 2 {
		return
	}
	if err := manifests.CheckOwner(m.ctx, m.s, "job", *own); err != nil {
		if !errors.Is(err, manifests.ErrFenced) {
			m.t.Fatal(err)
		}
		a.fenced[task] = true
		return
	}
	k := a.known[task]
	a.retiring[task] = append(a.retiring[task], k[:len(k)-1]...)
	a.known[task] = k[len(k)-1:]
}

// retire writes a prepared retention, whatever happened since its check.
func (m *fenceModel) retire(a *fenceAgent, task string) {
	for _, n := range a.retiring[task] {
		if err := manifests.RetireAt(m.ctx, m.s, "job", task, n, a.owner[task].Epoch); err != nil {
			m.t.Fatal(err)
		}
	}
	delete(a.retiring, task)
}

func (m *fenceModel) prepare(a *fenceAgent, task string, skip uint64) {
	own := a.owner[task]
	if own == nil || a.fenced[task] {
		return
	}
	n := a.last[task] + 1 + skip
	if p := a.pending[task]; p != nil && p.Checkpoint >= n {
		n = p.Checkpoint + 1
	}
	body := []byte(fmt.Sprintf("%s epoch %d checkpoint %d of %s", a.name, own.Epoch, n, task))
	sum := sha256.Sum256(body)
	key := manifests.PrivateKeyOf("job", task, n, own.Epoch, "MANIFEST-000001")
	if err := m.s.Put(m.ctx, key, bytes.NewReader(body), int64(len(body))); err != nil {
		m.t.Fatal(err)
	}
	mf := &manifests.Manifest{Job: "job", Task: task, Checkpoint: n, Epoch: own.Epoch, Node: "node-" + a.name, AgentID: a.name,
		Files:    []manifests.File{{Name: "MANIFEST-000001", Kind: manifests.Private, Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:]), Key: key, Uploaded: true}},
		FullSize: int64(len(body))}
	err := manifests.CheckOwner(m.ctx, m.s, "job", *own)
	newer := len(m.records[task]) > int(own.Epoch)
	switch {
	case errors.Is(err, manifests.ErrFenced) && newer:
		a.fenced[task] = true
	case err == nil && !newer:
		a.pending[task] = mf
	default:
		m.t.Fatalf("%s's pre-commit check of %s: %v; a newer owner exists: %v", a.name, task, err, newer)
	}
}

func (m *fenceModel) commit(a *fenceAgent, task string) {
	mf := a.pending[task]
	if mf == nil {
		return
	}
	delete(a.pending, task)
	enc, err := mf.Encode(mf.FullSize)
	if err != nil {
		m.t.Fatal(err)
	}
	// The new owner never fails because a zombie committed first: keys of
	// different epochs never collide.
	if err := manifests.Commit(m.ctx, m.s, mf, enc); err != nil {
		m.t.Fatalf("%s commits %s checkpoint %d at epoch %d: %v", a.name, task, mf.Checkpoint, mf.Epoch, err)
	}
	m.content[committedKey{task, mf.Checkpoint, mf.Epoch}] = []byte(fmt.Sprintf("%s epoch %d checkpoint %d of %s", a.name, mf.Epoch, mf.Checkpoint, task))
	err = manifests.CheckCommitted(m.ctx, m.s, "job", *a.owner[task], mf.Checkpoint)
	fenced := m.modelFenced(task, mf.Checkpoint, mf.Epoch)
	if errors.Is(err, manifests.ErrFenced) != fenced || (err != nil && !errors.Is(err, manifests.ErrFenced)) {
		m.t.Fatalf("%s's check after committing %s %d: %v; the model says fenced %v", a.name, task, mf.Checkpoint, err, fenced)
	}
	if fenced {
		a.fenced[task] = true
		return
	}
	if mf.Checkpoint > a.last[task] {
		a.last[task] = mf.Checkpoint
	}
	a.known[task] = append(a.known[task], mf.Checkpoint)
	slices.Sort(a.known[task])
	m.prepareRetire(a, task) // as the agent does right after its commit
}

// slowTakeover is a takeover by a that the task's other agents overtake:
// between its scan and its record they may commit (and check their
// ownership for retention), and after its record they may write the
// retirements they decided before it.
func (m *fenceModel) slowTakeover(t *rapid.T, a *fenceAgent, task string) {
	m.beginTake(a, task)
	for _, z := range m.agents {
		if z == a || z.owner[task] == nil {
			continue
		}
		if rapid.Bool().Draw(t, "prepare before the record") {
			m.prepare(z, task, 0)
		}
		if rapid.Bool().Draw(t, "commit before the record") {
			m.commit(z, task)
		}
	}
	m.endTake(a, task)
	for _, z := range m.agents {
		if z != a && rapid.Bool().Draw(t, "retire after the record") {
			m.retire(z, task)
		}
	}
}

// check: no fenced manifest is listed or loaded, every listed checkpoint
// restores with its writer's bytes, and the newest valid checkpoint of
// every task is listed.
func (m *fenceModel) check() {
	cat, err := manifests.Scan(m.ctx, m.s, "job", "")
	if err != nil {
		m.t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range cat.Refs {
		id := fmt.Sprintf("%s/%d", r.Task, r.Checkpoint)
		if seen[id] {
			m.t.Fatalf("two manifests listed for %s", id)
		}
		seen[id] = true
		if m.modelFenced(r.Task, r.Checkpoint, r.Epoch) {
			m.t.Fatalf("fenced manifest listed: %s checkpoint %d epoch %d", r.Task, r.Checkpoint, r.Epoch)
		}
	}
	for _, r := range cat.Fenced {
		if !m.modelFenced(r.Task, r.Checkpoint, r.Epoch) {
			m.t.Fatalf("valid manifest treated as fenced: %s checkpoint %d epoch %d", r.Task, r.Checkpoint, r.Epoch)
		}
	}
	for _, r := range cat.Retained("") {
		target := filepath.Join(m.tt.TempDir(), "r")
		res, err := restore.Run(m.ctx, restore.Options{Store: m.s, Job: "job", Task: r.Task, Checkpoint: r.Checkpoint, Target: target})
		if err != nil {
			m.t.Fatalf("listed %s checkpoint %d does not restore: %v", r.Task, r.Checkpoint, err)
		}
		got, err := os.ReadFile(filepath.Join(target, "MANIFEST-000001"))
		if err != nil || res.Checkpoint != r.Checkpoint {
			m.t.Fatalf("restore of %s %d: %v", r.Task, r.Checkpoint, err)
		}
		if want := m.content[committedKey{r.Task, r.Checkpoint, r.Epoch}]; !bytes.Equal(got, want) {
			m.t.Fatalf("restore of %s %d gave %q, its valid writer wrote %q", r.Task, r.Checkpoint, got, want)
		}
	}
	for task := range m.records {
		var newest uint64
		for k := range m.content {
			if k.task == task && k.n > newest && !m.modelFenced(k.task, k.n, k.epoch) {
				newest = k.n
			}
		}
		if newest == 0 {
			continue
		}
		r := cat.Retained(task)
		if len(r) == 0 || r[len(r)-1].Checkpoint != newest {
			m.t.Fatalf("task %s: newest valid checkpoint %d is not the newest listed (%+v)", task, newest, r)
		}
		// What a restore picks (it restores every listed one above).
		if n, err := restore.Pick(m.ctx, restore.Options{Store: m.s, Job: "job", Task: task}); err != nil || n != newest {
			m.t.Fatalf("task %s: a restore picks %d, %v; want checkpoint %d", task, n, err, newest)
		}
	}
}

// Random interleavings of commits, takeovers (atomic, or with commits and
// retirements between the takeover's scan and its record), retentions
// from memory written after a takeover, and GC, by three agents: no
// fenced manifest is listed or restored, and every task keeps its newest
// valid checkpoint listed and restorable.
func TestNoFencedManifestIsEverListedOrRestored(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s, err := file.New(t.TempDir())
		if err != nil {
			rt.Fatal(err)
		}
		m := &fenceModel{t: rt, tt: t, ctx: context.Background(), s: s, records: map[string][]manifests.Owner{}, content: map[committedKey][]byte{}}
		for _, name := range []string{"A", "B", "C"}[:rapid.IntRange(2, 3).Draw(rt, "agents")] {
			m.agents = append(m.agents, newFenceAgent(name))
		}
		tasks := []string{"x", "y"}[:rapid.IntRange(1, 2).Draw(rt, "tasks")]
		agent := func(t *rapid.T) *fenceAgent { return rapid.SampledFrom(m.agents).Draw(t, "agent") }
		task := func(t *rapid.T) string { return rapid.SampledFrom(tasks).Draw(t, "task") }
		rt.Repeat(map[string]func(*rapid.T){
			"take over": func(t *rapid.T) { m.take(agent(t), task(t)) },
			"prepare": func(t *rapid.T) {
				m.prepare(agent(t), task(t), rapid.Uint64Range(0, 1).Draw(t, "skip"))
			},
			"commit":             func(t *rapid.T) { m.commit(agent(t), task(t)) },
			"begin a takeover":   func(t *rapid.T) { m.beginTake(agent(t), task(t)) },
			"end a takeover":     func(t *rapid.T) { m.endTake(agent(t), task(t)) },
			"slow takeover":      func(t *rapid.T) { m.slowTakeover(t, agent(t), task(t)) },
			"retire from memory": func(t *rapid.T) { m.retire(agent(t), task(t)) },
			"gc without grace": func(t *rapid.T) {
				if _, err := gc.Collect(m.ctx, m.s, "job", gc.Options{Grace: 0}); err != nil {
					t.Fatal(err)
				}
			},
			"gc with retention": func(t *rapid.T) {
				if _, err := gc.Collect(m.ctx, m.s, "job", gc.Options{Retain: 2, Grace: time.Hour}); err != nil {
					t.Fatal(err)
				}
			},
			"": func(t *rapid.T) { m.check() },
		})
	})
}

// A task whose storage holds checkpoints that cannot be used (its
// ownership record does not decode) fails the restore loudly, even with
// --if-checkpoint-exists: reporting "no checkpoint" would start the app
// empty. A task with fenced manifests only has nothing to restore.
func TestARestoreThatFindsCheckpointsButNoneUsableFailsLoudly(t *testing.T) {
	ctx := context.Background()
	s, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	commitPlain := func(task string, n, epoch uint64) {
		body := []byte("CURRENT\n")
		sum := sha256.Sum256(body)
		mf := &manifests.Manifest{Job: "job", Task: task, Checkpoint: n, Epoch: epoch,
			Files:    []manifests.File{{Name: "CURRENT", Kind: manifests.Private, Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:]), Inline: body, Uploaded: true}},
			FullSize: int64(len(body))}
		enc, err := mf.Encode(0)
		if err != nil {
			t.Fatal(err)
		}
		if err := manifests.Commit(ctx, s, mf, enc); err != nil {
			t.Fatal(err)
		}
	}
	commitPlain("bad", 1, 0)
	junk := []byte("{not json")
	if err := s.Put(ctx, manifests.OwnerKey("job", "bad", 1), bytes.NewReader(junk), int64(len(junk))); err != nil {
		t.Fatal(err)
	}
	res, err := restore.Run(ctx, restore.Options{Store: s, Job: "job", Task: "bad", Target: filepath.Join(t.TempDir(), "r"), IfCheckpointExists: true})
	if err == nil || errors.Is(err, restore.ErrNoCheckpoint) {
		t.Fatalf("restore of a task whose checkpoints cannot be used: %+v, %v; want a loud error", res, err)
	}
	// Fenced only: the owner of epoch 2 resumed from nothing, and epoch
	// 1's checkpoint 1 came after its takeover.
	for _, e := range []uint64{1, 2} {
		rec := manifests.Owner{Task: "fenced", Epoch: e}
		data, _ := json.Marshal(rec)
		if err := s.Create(ctx, manifests.OwnerKey("job", "fenced", e), bytes.NewReader(data), int64(len(data))); err != nil {
			t.Fatal(err)
		}
	}
	commitPlain("fenced", 1, 1)
	res, err = restore.Run(ctx, restore.Options{Store: s, Job: "job", Task: "fenced", Target: filepath.Join(t.TempDir(), "r"), IfCheckpointExists: true})
	if err != nil || res.Restored {
		t.Fatalf("restore of a task with fenced checkpoints only: %+v, %v; want nothing to restore", res, err)
	}
}
