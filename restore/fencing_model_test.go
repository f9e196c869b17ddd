package restore_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"pgregory.net/rapid"

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
	} else if mf.Checkpoint > a.last[task] {
		a.last[task] = mf.Checkpoint
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
	}
}

func TestNoFencedManifestIsEverListedOrRestored(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s, err := file.New(t.TempDir())
		if err != nil {
			rt.Fatal(err)
		}
		m := &fenceModel{t: rt, tt: t, ctx: context.Background(), s: s, records: map[string][]manifests.Owner{}, content: map[committedKey][]byte{}}
		for _, name := range []string{"A", "B"} {
			m.agents = append(m.agents, &fenceAgent{name: name, owner: map[string]*manifests.Owner{}, fenced: map[string]bool{},
				last: map[string]uint64{}, pending: map[string]*manifests.Manifest{}})
		}
		agent := func(t *rapid.T) *fenceAgent { return rapid.SampledFrom(m.agents).Draw(t, "agent") }
		task := func(t *rapid.T) string { return rapid.SampledFrom([]string{"x", "y"}).Draw(t, "task") }
		rt.Repeat(map[string]func(*rapid.T){
			"take over": func(t *rapid.T) { m.take(agent(t), task(t)) },
			"prepare": func(t *rapid.T) {
				m.prepare(agent(t), task(t), rapid.Uint64Range(0, 1).Draw(t, "skip"))
			},
			"commit": func(t *rapid.T) { m.commit(agent(t), task(t)) },
			"gc with retention": func(t *rapid.T) {
				if _, err := manifests.GC(m.ctx, m.s, "job", manifests.GCOptions{Retain: 2, Grace: time.Hour}); err != nil {
					t.Fatal(err)
				}
			},
			"": func(t *rapid.T) { m.check() },
		})
	})
}
