package agent

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/client"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/protocol"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage"
)

// hooks is a store that calls onCreate before each conditional create and
// onList after each listing of an ownership prefix.
type hooks struct {
	storage.Store
	onCreate func(key string)
	onList   func(prefix string)
}

func (h *hooks) Create(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	if h.onCreate != nil {
		h.onCreate(key)
	}
	return h.Store.Create(ctx, key, body, size)
}

func (h *hooks) List(ctx context.Context, prefix string, fn func(storage.ObjectInfo) error) error {
	err := h.Store.List(ctx, prefix, fn)
	if h.onList != nil && strings.HasSuffix(prefix, "/owner/") {
		h.onList(prefix)
	}
	return err
}

// await waits for ch, or fails the test after a while.
func await(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Errorf("timed out waiting: %s", what)
	}
}

// startRestoring starts an agent on node over store that serves the
// restore op (as ckpt agent does: into its roots, recording the
// restore in its local dir), counting the restores it ran.
func startRestoring(t *testing.T, store storage.Store, node string, retain int, ran *atomic.Int32) *harness {
	var h *harness
	h = start(t, func(storage.Store) storage.Store { return store }, func(c *Config) {
		c.Node, c.GCInterval, c.Retain = node, -1, retain
		c.Restore = func(ctx context.Context, r RestoreRequest) (*restore.Result, error) {
			if ran != nil {
				ran.Add(1)
			}
			return restore.Run(ctx, restore.Options{Store: store, Job: "job", Task: r.Task, Checkpoint: r.Checkpoint,
				JobConsistent: r.JobConsistent, Target: r.Target, TargetParent: r.Parent, LocalDir: h.local})
		}
	})
	return h
}

func (h *harness) checkpointErr(task string, n uint64, name string, files map[string]int) error {
	p, err := h.dial().Checkpoint(ctxT(h.t), task, n, h.snapshot(name, files), "pebble")
	if err != nil {
		return err
	}
	_, err = p.Wait(ctxT(h.t))
	return err
}

// The old owner commits checkpoint 2 after the new owner's takeover scan
// (so 2 is fenced), confirms its commit before the new owner's record
// exists, and then applies retention (--retain 1) from memory after the
// takeover: it would retire 1, the checkpoint the new owner resumed from.
// The task must keep 1 restorable: listed, restorable with
// --if-checkpoint-exists, and the base of the new owner's next checkpoint.
func TestAZombiesRetentionNeverLeavesTheTaskWithNothingToRestore(t *testing.T) {
	shared := sharedStore(t)
	const task = "t"
	takerScanned, zombieChecked, recordCreated := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var zombieCommitted atomic.Bool
	var once1, once2 sync.Once
	zstore := &hooks{Store: shared,
		onCreate: func(key string) {
			if strings.Contains(key, manifestMark(2)) {
				await(t, takerScanned, "the new owner's takeover scan")
				zombieCommitted.Store(true)
			}
		},
		onList: func(string) {
			// The zombie's first look at the ownership records after its
			// commit passes (no newer record yet); the takeover lands
			// right after it.
			if zombieCommitted.Load() {
				once1.Do(func() {
					close(zombieChecked)
					await(t, recordCreated, "the new owner's record")
				})
			}
		},
	}
	zombie := startRestoring(t, zstore, "node-a", 1, nil)
	ostore := &hooks{Store: shared, onCreate: func(key string) {
		if strings.Contains(key, "/owner/") {
			once2.Do(func() {
				close(takerScanned)
				await(t, zombieChecked, "the zombie's check after its commit")
				go func() {
					// Once the record exists (the create below).
					for {
						if _, err := shared.Stat(context.Background(), manifests.OwnerKey("job", task, 2)); err == nil {
							close(recordCreated)
							return
						}
						time.Sleep(time.Millisecond)
					}
				}()
			})
		}
	}}
	owner := startRestoring(t, ostore, "node-b", 1, nil)

	files := map[string]int{"000001.sst": 20_000, "CURRENT": 16}
	if err := zombie.checkpointErr(task, 1, "z1", files); err != nil {
		t.Fatal(err)
	}
	zdone := make(chan error, 1)
	go func() {
		zdone <- zombie.checkpointErr(task, 2, "z2", map[string]int{"000001.sst": 20_000, "000002.sst": 10_000, "CURRENT": 16})
	}()
	target := filepath.Join(owner.root, "restored")
	ev := owner.restoreOp(task, target)
	t.Logf("the zombie's checkpoint 2: %v; the new owner's restore: %v", <-zdone, ev)

	ctx := ctxT(t)
	cat, err := manifests.Scan(ctx, shared, "job", task)
	if err != nil {
		t.Fatal(err)
	}
	if r := cat.Retained(task); len(r) != 1 || r[0].Checkpoint != 1 {
		t.Fatalf("retained %+v after the zombie's retention, want checkpoint 1 (the one the new owner resumed from)", r)
	}
	// A fenced owner retires nothing (the readers' rule aside).
	if _, err := shared.Stat(ctx, manifests.RetiredKeyOf("job", task, 1, 1)); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("the superseded owner wrote a retirement of 1: %v", err)
	}
	res, err := restore.Run(ctx, restore.Options{Store: shared, Job: "job", Task: task, Target: filepath.Join(t.TempDir(), "r"), IfCheckpointExists: true})
	if err != nil || !res.Restored || res.Checkpoint != 1 {
		t.Fatalf("restore --if-checkpoint-exists: %+v, %v: want checkpoint 1 restored", res, err)
	}
	// The new owner goes on from 1; its retention retires 1 in its name.
	if err := owner.checkpointErr(task, 2, "o2", map[string]int{"000001.sst": 20_000, "000003.sst": 10_000, "CURRENT": 16}); err != nil {
		t.Fatalf("the new owner's checkpoint 2: %v", err)
	}
	cat, err = manifests.Scan(ctx, shared, "job", task)
	if err != nil {
		t.Fatal(err)
	}
	if r := cat.Retained(task); len(r) != 1 || r[0].Checkpoint != 2 || r[0].Epoch != 2 {
		t.Fatalf("retained %+v, want the new owner's 2", r)
	}
	// The zombie, having seen the takeover at its retention, is fenced.
	var pe *protocol.Error
	if err := zombie.checkpointErr(task, 3, "z3", files); !errors.As(err, &pe) || pe.Code != protocol.CodeConflict || !strings.Contains(pe.Message, "fenced") {
		t.Fatalf("the zombie's next checkpoint: %v, want conflict: fenced", err)
	}
}

// A task moves A -> B -> A by restores: A's restore takes it back at a new
// epoch, and A's checkpoints commit again (no restart needed).
func TestATaskMovesBackToALongLivedAgentByARestore(t *testing.T) {
	shared := sharedStore(t)
	a := startRestoring(t, shared, "node-a", 1, nil)
	b := startRestoring(t, shared, "node-b", 1, nil)
	files := map[string]int{"000001.sst": 10_000, "CURRENT": 16}
	if err := a.checkpointErr("t", 1, "a1", files); err != nil {
		t.Fatal(err)
	}
	if ev := b.restoreOp("t", filepath.Join(b.root, "r1")); ev["event"] != "restored" || ev["checkpoint"] != float64(1) {
		t.Fatalf("restore on B: %v", ev)
	}
	if err := b.checkpointErr("t", 2, "b2", files); err != nil {
		t.Fatal(err)
	}
	var pe *protocol.Error
	if err := a.checkpointErr("t", 3, "a3", files); !errors.As(err, &pe) || pe.Code != protocol.CodeConflict {
		t.Fatalf("A before its restore: %v, want conflict: fenced", err)
	}
	ev := a.restoreOp("t", filepath.Join(a.root, "r2"))
	if ev["event"] != "restored" || ev["checkpoint"] != float64(2) {
		t.Fatalf("restore on A after the task moved to B: %v, want checkpoint 2 restored", ev)
	}
	if err := a.checkpointErr("t", 3, "a3b", files); err != nil {
		t.Fatalf("A's checkpoint after its restore: %v", err)
	}
	cat, err := manifests.Scan(ctxT(t), shared, "job", "t")
	if err != nil {
		t.Fatal(err)
	}
	if r := cat.Retained("t"); len(r) != 1 || r[0].Checkpoint != 3 || r[0].Epoch != 3 {
		t.Fatalf("retained %+v, want A's 3 at epoch 3", r)
	}
	if err := b.checkpointErr("t", 4, "b4", files); !errors.As(err, &pe) || pe.Code != protocol.CodeConflict {
		t.Fatalf("B after the task moved back: %v, want conflict: fenced", err)
	}
}

// A restore op naming a task without checkpoints answers not_found and
// writes nothing: no ownership record, no task on the status page, no
// restore run (and so no metric series).
func TestARestoreOfAnUnknownTaskWritesNothing(t *testing.T) {
	shared := sharedStore(t)
	var ran atomic.Int32
	h := startRestoring(t, shared, "node-a", 1, &ran)
	ev := h.restoreOp("nope", filepath.Join(h.root, "r"))
	if code(ev) != protocol.CodeNotFound {
		t.Fatalf("restore of an unknown task: %v, want not_found", ev)
	}
	var keys []string
	shared.List(ctxT(t), "job/", func(o storage.ObjectInfo) error {
		keys = append(keys, o.Key)
		return nil
	})
	if len(keys) != 0 {
		t.Fatalf("the restore of an unknown task wrote %v", keys)
	}
	st, err := h.dial().Status(ctxT(t), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, ts := range st.Tasks {
		if ts.Task == "nope" {
			t.Fatalf("status lists the unknown task: %+v", st.Tasks)
		}
	}
	if n := ran.Load(); n != 0 {
		t.Fatalf("%d restores ran for a task without checkpoints", n)
	}
	if _, err := os.Stat(filepath.Join(h.root, "r")); !os.IsNotExist(err) {
		t.Fatalf("the target was made: %v", err)
	}
}

// landsThenTimesOut is a store whose create of a manifest writes it, then
// waits for the caller's context to end and reports its error: the write
// landed, the reply did not.
type landsThenTimesOut struct{ storage.Store }

func (s *landsThenTimesOut) Create(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	if !strings.Contains(key, "/manifest") {
		return s.Store.Create(ctx, key, body, size)
	}
	if err := s.Store.Create(context.WithoutCancel(ctx), key, body, size); err != nil {
		return err
	}
	<-ctx.Done()
	return ctx.Err()
}

// A checkpoint whose manifest write lands but times out before it answers
// is complete: the agent looks, reports it completed, counts it as its last
// checkpoint, and its retention retires it once a newer one commits.
func TestACheckpointWhoseManifestLandsAsItTimesOutIsReportedComplete(t *testing.T) {
	var slow atomic.Bool
	h := start(t, func(s storage.Store) storage.Store {
		return &switchable{Store: s, slow: &landsThenTimesOut{s}, on: &slow}
	}, func(c *Config) { c.Retain, c.GCInterval = 1, -1 })
	c := h.dial()
	slow.Store(true)
	p, err := c.Send(ctxT(t), client.Request{Task: "t", Checkpoint: 1, Dir: h.snapshot("s1", map[string]int{"000001.sst": 1000, "CURRENT": 10}), TimeoutMS: 300})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := p.Wait(ctxT(t))
	if err != nil || ev.Event != "completed" {
		t.Fatalf("checkpoint 1, whose manifest landed as it timed out: %+v, %v; want completed", ev, err)
	}
	slow.Store(false)
	st, err := c.Status(ctxT(t), "t")
	if err != nil || len(st.Tasks) != 1 || st.Tasks[0].LastCompleted != 1 {
		t.Fatalf("status: %+v, %v; want last checkpoint 1", st, err)
	}
	if err := h.checkpointErr("t", 2, "s2", map[string]int{"000001.sst": 1000, "000002.sst": 500, "CURRENT": 10}); err != nil {
		t.Fatal(err)
	}
	cat, err := manifests.Scan(ctxT(t), h.store, "job", "t")
	if err != nil {
		t.Fatal(err)
	}
	if r := cat.Retained("t"); len(r) != 1 || r[0].Checkpoint != 2 {
		t.Fatalf("retained %+v with --retain 1, want 2 alone: retention must know of 1", r)
	}
}

// switchable sends calls to slow while on is set.
type switchable struct {
	storage.Store
	slow storage.Store
	on   *atomic.Bool
}

func (s *switchable) Create(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	if s.on.Load() {
		return s.slow.Create(ctx, key, body, size)
	}
	return s.Store.Create(ctx, key, body, size)
}
