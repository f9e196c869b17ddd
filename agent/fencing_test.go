package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/gc"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/protocol"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
)

// commitHook is a store that runs hook before the conditional create of a
// manifest of checkpoint n (any epoch), once.
type commitHook struct {
	storage.Store
	n    string // "/chk/<n:020>/manifest"
	once sync.Once
	hook func()
}

func (c *commitHook) Create(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	if strings.Contains(key, c.n) {
		c.once.Do(c.hook)
	}
	return c.Store.Create(ctx, key, body, size)
}

func manifestMark(n uint64) string { return fmt.Sprintf("/chk/%020d/manifest", n) }

func pad(n uint64) string { return fmt.Sprintf("%020d", n) }

// sharedStore opens one file:// store that several harnesses share.
func sharedStore(t *testing.T) storage.Store {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "shared-store")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := file.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The zombie's commit of checkpoint 2 is held until a second agent has
// taken the task over and reached its own commit of checkpoint 2; then the
// zombie commits first, and the new owner after it. The new owner must
// succeed, and the zombie's manifest must not be listed, restored, counted
// by retention, or kept by GC.
func TestAZombieCommittingFirstNeitherBlocksTheNewOwnerNorIsEverUsed(t *testing.T) {
	shared := sharedStore(t)
	const task = "t"
	zombieAtCommit, zombieMayCommit, zombieCommitted := make(chan struct{}), make(chan struct{}), make(chan struct{})
	zstore := &commitHook{Store: shared, n: manifestMark(2), hook: func() { close(zombieAtCommit); <-zombieMayCommit }}
	zombie := start(t, func(storage.Store) storage.Store { return zstore }, func(c *Config) { c.Node = "node-a"; c.GCInterval = -1 })
	// The new owner, at its commit of 2: let the zombie commit, wait for it.
	ostore := &commitHook{Store: shared, n: manifestMark(2), hook: func() {
		close(zombieMayCommit)
		select {
		case <-zombieCommitted:
		case <-time.After(20 * time.Second):
		}
	}}
	owner := start(t, func(storage.Store) storage.Store { return ostore }, func(c *Config) { c.Node = "node-b"; c.GCInterval = -1 })

	zc := zombie.dial()
	p, err := zc.Checkpoint(ctxT(t), task, 1, zombie.snapshot("z1", map[string]int{"000001.sst": 40_000, "CURRENT": 16}), "pebble")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(ctxT(t)); err != nil {
		t.Fatalf("zombie checkpoint 1: %v", err)
	}
	zp, err := zc.Checkpoint(ctxT(t), task, 2, zombie.snapshot("z2", map[string]int{"000001.sst": 40_000, "000009.sst": 30_000, "CURRENT": 16, "MANIFEST-Z": 70_000}), "pebble")
	if err != nil {
		t.Fatal(err)
	}
	zdone := make(chan error, 1)
	go func() {
		_, err := zp.Wait(ctxT(t))
		close(zombieCommitted)
		zdone <- err
	}()

	// The zombie passed every check it makes before its commit.
	select {
	case <-zombieAtCommit:
	case <-time.After(20 * time.Second):
		t.Fatal("the zombie never reached its commit of checkpoint 2")
	}
	// The task moves to the new owner's node the way tasks move: a restore
	// into its local dir (of the zombie's checkpoint 1, the newest).
	restoreInto(t, owner, shared, task)
	oc := owner.dial()
	odir := owner.snapshot("o2", map[string]int{"000001.sst": 40_000, "000002.sst": 20_000, "CURRENT": 16, "MANIFEST-O": 90_000})
	op, err := oc.Checkpoint(ctxT(t), task, 2, odir, "pebble")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.Wait(ctxT(t)); err != nil {
		t.Fatalf("the new owner's checkpoint 2 failed after a zombie committed 2 first: %v", err)
	}
	zerr := <-zdone
	t.Logf("the zombie's checkpoint 2 ended with: %v", zerr)

	ctx := ctxT(t)
	cat, err := manifests.Scan(ctx, shared, "job", task)
	if err != nil {
		t.Fatal(err)
	}
	retained := cat.Retained(task)
	if len(retained) != 2 || retained[0].Checkpoint != 1 || retained[1].Checkpoint != 2 {
		t.Fatalf("retained %+v, want checkpoints 1 and 2 once each", retained)
	}
	ms, _, err := manifests.LoadRetained(ctx, shared, "job", retained)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || !hasFile(ms[1], "MANIFEST-O") {
		t.Fatalf("listed checkpoint 2 is not the new owner's: %+v", ms)
	}
	m2, err := manifests.Load(ctx, shared, "job", task, 2)
	if err != nil || !hasFile(m2, "MANIFEST-O") {
		t.Fatalf("load of checkpoint 2: %v, %+v: want the new owner's", err, m2)
	}
	target := filepath.Join(t.TempDir(), "restored")
	if _, err := restore.Run(ctx, restore.Options{Store: shared, Job: "job", Task: task, Checkpoint: 2, Target: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(target, "MANIFEST-O")); err != nil {
		t.Fatalf("restore of checkpoint 2 is not the new owner's: %v", err)
	}
	if _, err := os.Stat(filepath.Join(target, "MANIFEST-Z")); err == nil {
		t.Fatal("restore of checkpoint 2 holds the zombie's file")
	}
	// Retention keeps one: the new owner's 2, never the zombie's.
	// Two collections: the first marks what no valid manifest names, the
	// second (a mark delay later) deletes it.
	for range 2 {
		if _, err := gc.Collect(ctx, shared, "job", gc.Options{Retain: 1, Grace: 0, MarkDelay: time.Nanosecond}); err != nil {
			t.Fatal(err)
		}
	}
	cat, err = manifests.Scan(ctx, shared, "job", task)
	if err != nil {
		t.Fatal(err)
	}
	if r := cat.Retained(task); len(r) != 1 || r[0].Checkpoint != 2 {
		t.Fatalf("after retention: %+v, want the new owner's 2 alone", r)
	}
	if m2, err = manifests.Load(ctx, shared, "job", task, 2); err != nil || !hasFile(m2, "MANIFEST-O") {
		t.Fatalf("after GC, checkpoint 2: %v", err)
	}
	var left []string
	shared.List(ctx, "job/tasks/"+task+"/chk/"+pad(2)+"/", func(o storage.ObjectInfo) error {
		left = append(left, o.Key)
		return nil
	})
	for _, k := range left {
		if strings.Contains(k, "MANIFEST-Z") {
			t.Errorf("GC kept the zombie's private object %s", k)
		}
	}
	if len(cat.Fenced) != 0 {
		t.Errorf("GC kept the fenced manifests %+v", cat.Fenced)
	}
	// The zombie learns it was fenced: at the latest on its next request.
	var pe *protocol.Error
	if zerr == nil {
		zp, err := zc.Checkpoint(ctxT(t), task, 3, zombie.snapshot("z3", map[string]int{"000001.sst": 40_000, "CURRENT": 16}), "pebble")
		if err != nil {
			t.Fatal(err)
		}
		_, zerr = zp.Wait(ctxT(t))
	}
	if !errors.As(zerr, &pe) || pe.Code != protocol.CodeConflict || !strings.Contains(pe.Message, "node-b") || !strings.Contains(pe.Message, "fenced") {
		t.Fatalf("zombie: %v, want conflict saying it was fenced by node-b", zerr)
	}
}

func hasFile(m *manifests.Manifest, name string) bool {
	for _, f := range m.Files {
		if f.Name == name {
			return true
		}
	}
	return false
}

// Once another agent took the task over, the old agent's next request for
// it fails with conflict, naming the new owner's node; and so does every
// later one, before anything is linked or uploaded.
func TestAFencedAgentsRequestsGetConflictNamingTheNewOwner(t *testing.T) {
	shared := sharedStore(t)
	old := start(t, func(storage.Store) storage.Store { return shared }, func(c *Config) { c.Node = "node-old"; c.GCInterval = -1 })
	nw := start(t, func(storage.Store) storage.Store { return shared }, func(c *Config) { c.Node = "node-new"; c.GCInterval = -1 })
	files := map[string]int{"000001.sst": 10_000, "CURRENT": 16}
	checkpoint := func(h *harness, n uint64, name string) error {
		p, err := h.dial().Checkpoint(ctxT(t), "t", n, h.snapshot(name, files), "pebble")
		if err != nil {
			return err
		}
		_, err = p.Wait(ctxT(t))
		return err
	}
	if err := checkpoint(old, 1, "o1"); err != nil {
		t.Fatal(err)
	}
	// Without a restore on its node, the new agent may not take the task.
	if err := checkpoint(nw, 2, "n2"); err == nil || !strings.Contains(err.Error(), "only by restoring it first") {
		t.Fatalf("a checkpoint on another node before any restore there: %v, want conflict saying to restore first", err)
	}
	restoreInto(t, nw, shared, "t")
	if err := checkpoint(nw, 2, "n2"); err != nil {
		t.Fatalf("the new owner's first checkpoint: %v", err)
	}
	for n, name := range map[uint64]string{3: "o3", 4: "o4"} {
		err := checkpoint(old, n, name)
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Code != protocol.CodeConflict || !strings.Contains(pe.Message, "node-new") || !strings.Contains(pe.Message, "fenced") {
			t.Fatalf("the fenced agent's checkpoint %d: %v, want conflict: fenced by node-new", n, err)
		}
	}
	if err := checkpoint(nw, 3, "n3"); err != nil {
		t.Fatalf("the new owner's next checkpoint: %v", err)
	}
	cat, err := manifests.Scan(ctxT(t), shared, "job", "t")
	if err != nil {
		t.Fatal(err)
	}
	if r := cat.Retained("t"); len(r) != 2 || r[0].Checkpoint != 2 || r[1].Checkpoint != 3 || r[1].Epoch != 2 {
		t.Fatalf("retained %+v, want the new owner's 2 and 3 at epoch 2", r)
	}
}

// restoreInto restores task from storage into a fresh dir under h's root,
// recording it in h's local dir, as `ckpt restore --local-dir` does on a
// task's new node before its agent serves the task.
func restoreInto(t *testing.T, h *harness, s storage.Store, task string) {
	t.Helper()
	target, err := os.MkdirTemp(h.root, "restored-")
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(target)
	if _, err := restore.Run(ctxT(t), restore.Options{Store: s, Job: "job", Task: task, Target: target, LocalDir: h.local}); err != nil {
		t.Fatalf("restore of %s on the new node: %v", task, err)
	}
}
