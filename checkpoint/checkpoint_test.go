package checkpoint_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/checkpoint"
	"github.com/ckpt-io/ckpt/engines"
	"github.com/ckpt-io/ckpt/gc"
	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
	"github.com/ckpt-io/ckpt/uploader"
)

const job = "job"

// rig is one agent's Committer over a file:// store, with its own local
// store, and no socket.
type rig struct {
	t     *testing.T
	store storage.Store
	local *localrecovery.Store
	c     *checkpoint.Committer
	snaps string
}

func newStore(t *testing.T) storage.Store {
	t.Helper()
	s, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newRig returns a Committer on node for store s (wrapped by hooks, if set).
func newRig(t *testing.T, s storage.Store, node string, retain int) *rig {
	t.Helper()
	local, err := localrecovery.Open(t.TempDir(), job)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, store: s, local: local, snaps: t.TempDir()}
	r.c = checkpoint.New(checkpoint.Config{
		Store: s, Job: job, Node: node, AgentID: "agent-" + node, Local: local,
		// Every reused object is looked at again before each commit.
		Presence: uploader.NewPresence(s, manifests.SharedPrefix(job), time.Nanosecond),
		Retain:   retain, UploadConcurrency: 2, ManifestFormat: manifests.Format2,
		CommitPatience: time.Second,
	})
	return r
}

// content returns the bytes of a shared file called name (4 KiB, the
// same for the same name).
func content(name string) []byte {
	return bytes.Repeat([]byte(name+";"), 4096/(len(name)+1)+1)[:4096]
}

// snapshot writes files (names of shared files; CURRENT is added) and takes
// them into the local store as checkpoint n of task, inspected.
func (r *rig) snapshot(task string, n uint64, files ...string) *localrecovery.Snapshot {
	r.t.Helper()
	dir := filepath.Join(r.snaps, fmt.Sprintf("%s-%d", task, n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		r.t.Fatal(err)
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f), content(f), 0o644); err != nil {
			r.t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "CURRENT"), fmt.Appendf(nil, "MANIFEST-%06d\n", n), 0o644); err != nil {
		r.t.Fatal(err)
	}
	sn, err := r.local.Take(task, n, dir, false)
	if err == nil {
		err = sn.Inspect()
	}
	if err != nil {
		r.t.Fatal(err)
	}
	return sn
}

func (r *rig) run(task string, n uint64, files ...string) (checkpoint.Result, error) {
	r.t.Helper()
	eng, err := engines.Lookup("generic")
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := r.c.Run(ctx, checkpoint.Request{Task: task, Checkpoint: n, Snapshot: r.snapshot(task, n, files...), Engine: eng})
	if err != nil {
		if derr := r.local.Discard(task, n); derr != nil {
			r.t.Log(derr)
		}
	}
	return res, err
}

func (r *rig) mustRun(task string, n uint64, files ...string) *manifests.Manifest {
	r.t.Helper()
	res, err := r.run(task, n, files...)
	if err != nil {
		r.t.Fatalf("checkpoint %d of %s: %v", n, task, err)
	}
	return res.Manifest
}

func fileNamed(m *manifests.Manifest, name string) manifests.File {
	for _, f := range m.Files {
		if f.Name == name {
			return f
		}
	}
	return manifests.File{}
}

// keys lists the keys in s under prefix.
func keys(t *testing.T, s storage.Store, prefix string) []string {
	t.Helper()
	var out []string
	if err := s.List(context.Background(), prefix, func(o storage.ObjectInfo) error {
		out = append(out, o.Key)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// retained returns the checkpoint numbers of task's retained manifests.
func retained(t *testing.T, s storage.Store, task string) []uint64 {
	t.Helper()
	cat, err := manifests.Scan(context.Background(), s, job, task)
	if err != nil {
		t.Fatal(err)
	}
	var out []uint64
	for _, r := range cat.Retained(task) {
		out = append(out, r.Checkpoint)
	}
	return out
}

// hooked runs hook on the Create of a key containing match, once, and
// returns hook's error instead of the Create's when it returns one; with
// write, the object is written first.
type hooked struct {
	storage.Store
	mu    sync.Mutex
	match string
	write bool
	hook  func() error
	done  bool
}

func (h *hooked) Create(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	h.mu.Lock()
	fire := !h.done && h.match != "" && strings.Contains(key, h.match)
	if fire {
		h.done = true
	}
	h.mu.Unlock()
	if !fire {
		return h.Store.Create(ctx, key, body, size)
	}
	if h.write {
		if err := h.Store.Create(ctx, key, body, size); err != nil {
			return err
		}
	}
	if err := h.hook(); err != nil {
		return err
	}
	if h.write {
		return nil
	}
	return h.Store.Create(ctx, key, body, size)
}

func (h *hooked) arm(match string, write bool, hook func() error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.match, h.write, h.hook, h.done = match, write, hook, false
}

func manifestOf(n uint64) string { return fmt.Sprintf("/chk/%020d/manifest", n) }

// errLostReply is a commit's error that hides whether the write landed.
var errLostReply = errors.New("connection reset by peer")

// Invariant 3: a checkpoint reuses only objects that retained manifests
// name and that are still in storage; an object that merely exists (written
// by a checkpoint that never committed) or that was lost is uploaded again.
func TestReusesOnlyConfirmedObjects(t *testing.T) {
	base := newStore(t)
	h := &hooked{Store: base}
	r := newRig(t, h, "node-a", 2)

	m1 := r.mustRun("t", 1, "000001.sst", "000002.sst")
	if m1.FilesReused != 0 || m1.FilesUploaded < 2 {
		t.Fatalf("checkpoint 1: %d uploaded, %d reused", m1.FilesUploaded, m1.FilesReused)
	}
	m2 := r.mustRun("t", 2, "000001.sst", "000002.sst", "000003.sst")
	for _, name := range []string{"000001.sst", "000002.sst"} {
		if f := fileNamed(m2, name); f.Uploaded || f.Key != fileNamed(m1, name).Key {
			t.Fatalf("checkpoint 2 did not reuse %s from checkpoint 1: %+v", name, f)
		}
	}
	if !fileNamed(m2, "000003.sst").Uploaded {
		t.Fatal("checkpoint 2 reused 000003.sst, which no manifest names")
	}

	// Checkpoint 3 uploads 000004.sst, then its commit fails for good: the
	// object exists in storage, but no manifest names it.
	h.arm(manifestOf(3), false, func() error { return errors.New("refused") })
	if _, err := r.run("t", 3, "000001.sst", "000004.sst"); err == nil {
		t.Fatal("checkpoint 3 committed through a refused write")
	}
	orphans := 0
	for _, k := range keys(t, base, manifests.SharedPrefix(job)) {
		if strings.Contains(k, fmt.Sprintf("-%d", len(content("000004.sst")))) {
			orphans++
		}
	}
	if orphans == 0 {
		t.Fatal("checkpoint 3 left no object behind: the test proves nothing")
	}
	// A lost object: checkpoint 1's 000002.sst goes from storage.
	lost := fileNamed(m1, "000002.sst").Key
	if err := base.Delete(context.Background(), lost); err != nil {
		t.Fatal(err)
	}
	m4 := r.mustRun("t", 4, "000001.sst", "000002.sst", "000004.sst")
	if f := fileNamed(m4, "000004.sst"); !f.Uploaded {
		t.Fatalf("checkpoint 4 reused 000004.sst, an object no manifest confirmed: %+v", f)
	}
	if f := fileNamed(m4, "000001.sst"); f.Uploaded {
		t.Fatalf("checkpoint 4 uploaded 000001.sst again, a confirmed object: %+v", f)
	}
	if _, err := base.Stat(context.Background(), fileNamed(m4, "000002.sst").Key); err != nil {
		t.Fatalf("checkpoint 4 names 000002.sst, lost from storage, without uploading it again: %v", err)
	}
}

// Invariant 9: once a newer owner took the task, the old owner commits
// nothing, whether it learns of the takeover before its commit or right
// after it, and retires nothing.
func TestAFencedOwnerCommitsNothingAndRetiresNothing(t *testing.T) {
	base := newStore(t)
	h := &hooked{Store: base}
	old := newRig(t, h, "node-a", 1)
	old.mustRun("t", 1, "000001.sst")
	old.mustRun("t", 2, "000001.sst", "000002.sst") // retires 1: retain 1
	if got := fmt.Sprint(retained(t, base, "t")); got != "[2]" {
		t.Fatalf("retained before the takeover: %s", got)
	}

	// The new owner takes the task (a restore on another node).
	nu := newRig(t, base, "node-b", 1)
	if _, err := nu.c.OwnForRestore(context.Background(), "t", nil); err != nil {
		t.Fatal(err)
	}
	// The old owner's ownership is cached: only its check before the
	// commit can stop it.
	_, err := old.run("t", 3, "000001.sst", "000003.sst")
	var oe *checkpoint.OwnershipError
	if !errors.Is(err, checkpoint.ErrFenced) || !errors.As(err, &oe) {
		t.Fatalf("a fenced owner's checkpoint: got %v, want ErrFenced", err)
	}
	if ks := keys(t, base, manifests.CheckpointPrefix(job, "t", 3)); len(ks) != 0 {
		t.Fatalf("a fenced owner wrote %v", ks)
	}
	if st := old.c.Status("t"); !errors.Is(st.Fenced, checkpoint.ErrFenced) {
		t.Fatalf("status after the fence: %+v", st)
	}
	// And it stays fenced, without even uploading.
	if _, err := old.run("t", 4, "000001.sst"); !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("the next checkpoint of a fenced owner: %v", err)
	}

	// A takeover that lands right after the new owner's commit of 3: the
	// takeover saw checkpoint 3, so it is valid, but its writer is fenced
	// by then and retires nothing (retain 1 would retire 2).
	nu2 := newRig(t, h, "node-b", 1)
	if _, err := nu2.c.OwnForRestore(context.Background(), "t", nil); err != nil {
		t.Fatal(err)
	}
	third := newRig(t, base, "node-c", 1)
	h.arm(manifestOf(3), true, func() error {
		_, err := third.c.OwnForRestore(context.Background(), "t", nil)
		return err
	})
	if _, err := nu2.run("t", 3, "000001.sst", "000003.sst"); err != nil {
		t.Fatalf("a checkpoint the takeover saw committed: %v", err)
	}
	for _, k := range keys(t, base, manifests.CheckpointPrefix(job, "t", 2)) {
		if strings.Contains(k, "retired") {
			t.Fatalf("a fenced owner retired checkpoint 2: %s", k)
		}
	}
	if got := fmt.Sprint(retained(t, base, "t")); got != "[2 3]" {
		t.Fatalf("retained after a fenced owner's retention: %s, want [2 3]", got)
	}
	if st := nu2.c.Status("t"); !errors.Is(st.Fenced, checkpoint.ErrFenced) {
		t.Fatalf("status of the owner fenced at retention: %+v", st)
	}
}

// Invariant 4: a writer that sees GC's mark on an object it would name
// stores the bytes again under a fresh key and names that one.
func TestAWriterThatSawAGCMarkUploadsAgain(t *testing.T) {
	base := newStore(t)
	h := &hooked{Store: base}
	r := newRig(t, h, "node-a", 2)
	r.mustRun("t", 1, "000001.sst")
	// Checkpoint 2's commit fails: 000002.sst is an unreferenced object.
	h.arm(manifestOf(2), false, func() error { return errors.New("refused") })
	if _, err := r.run("t", 2, "000001.sst", "000002.sst"); err == nil {
		t.Fatal("checkpoint 2 committed through a refused write")
	}
	// GC marks it (grace 0: anything unreferenced).
	rep, err := gc.Collect(context.Background(), base, job, gc.Options{Grace: 0})
	if err != nil {
		t.Fatal(err)
	}
	if rep.MarkedObjects == 0 {
		t.Fatalf("GC marked nothing: %+v", rep)
	}
	var marked []string
	for _, k := range keys(t, base, manifests.SharedPrefix(job)) {
		if strings.HasSuffix(k, fmt.Sprintf("-%d", len(content("000002.sst")))) {
			marked = append(marked, k)
		}
	}
	m := r.mustRun("t", 3, "000001.sst", "000002.sst")
	f := fileNamed(m, "000002.sst")
	for _, k := range marked {
		if f.Key == k {
			t.Fatalf("checkpoint 3 names %s, which GC marked for deletion", k)
		}
	}
	if !f.Uploaded || !strings.Contains(f.Key, ".") {
		t.Fatalf("checkpoint 3's 000002.sst is not stored again under a fresh key: %+v", f)
	}
}

// Invariant 4: a writer whose look at GC's marks is older than D/2 when
// its commit would be sent commits nothing: GC may delete what it names.
// The error is ErrUnavailable (a retry looks again).
func TestAWriterThatLookedAtTheMarksTooLongAgoCommitsNothing(t *testing.T) {
	base := newStore(t)
	r := newRig(t, base, "node-a", 2)
	var skew atomic.Int64 // added to the writer's clock
	g := gc.NewGuard(base, job)
	g.Now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	r.c = checkpoint.New(checkpoint.Config{
		Store: base, Job: job, Node: "node-a", AgentID: "agent-a", Local: r.local,
		Presence: uploader.NewPresence(base, manifests.SharedPrefix(job), time.Nanosecond),
		Retain:   2, UploadConcurrency: 2, ManifestFormat: manifests.Format2, Guard: g,
	})
	eng, err := engines.Lookup("generic")
	if err != nil {
		t.Fatal(err)
	}
	// The commit is reached D/2 and a second after the look.
	step := func(s string) {
		if s == "committing the manifest" {
			skew.Store(int64(g.Delay/2 + time.Second))
		}
	}
	_, err = r.c.Run(context.Background(), checkpoint.Request{Task: "t", Checkpoint: 1, Snapshot: r.snapshot("t", 1, "000001.sst"), Engine: eng, Step: step})
	if !errors.Is(err, checkpoint.ErrUnavailable) || !errors.Is(err, gc.ErrStale) {
		t.Fatalf("a late commit: got %v, want ErrUnavailable (stale)", err)
	}
	if ks := keys(t, base, manifests.CheckpointPrefix(job, "t", 1)); len(ks) != 0 {
		t.Fatalf("a late commit wrote %v", ks)
	}
}

// A commit whose reply is lost after the manifest landed is read back and
// reported complete; one whose write did not land fails, and the next
// checkpoint learns the task from storage.
func TestACommitWhoseOutcomeIsUnknownIsReadBack(t *testing.T) {
	base := newStore(t)
	h := &hooked{Store: base}
	r := newRig(t, h, "node-a", 2)
	r.mustRun("t", 1, "000001.sst")

	h.arm(manifestOf(2), true, func() error { return errLostReply })
	res, err := r.run("t", 2, "000001.sst", "000002.sst")
	if err != nil {
		t.Fatalf("a commit that landed but lost its reply: %v", err)
	}
	if !res.Reconciled || res.Manifest.Checkpoint != 2 {
		t.Fatalf("result: %+v", res)
	}
	if st := r.c.Status("t"); st.LastCompleted != 2 {
		t.Fatalf("status after a reconciled commit: %+v", st)
	}

	h.arm(manifestOf(3), false, func() error { return errLostReply })
	if _, err := r.run("t", 3, "000001.sst"); !errors.Is(err, errLostReply) {
		t.Fatalf("a commit that did not land: got %v, want its error", err)
	}
	if got := fmt.Sprint(retained(t, base, "t")); got != "[1 2]" {
		t.Fatalf("retained: %s", got)
	}
	// Checkpoint 3 may be retried, and 2 stays its parent.
	m := r.mustRun("t", 3, "000001.sst")
	if m.Parent != 2 {
		t.Fatalf("checkpoint 3's parent: %d", m.Parent)
	}
}

// A checkpoint at or below the task's last completed one, or one another
// writer committed first, is a conflict; the existing manifest is kept.
func TestStaleAndDuplicateNumbersConflict(t *testing.T) {
	base := newStore(t)
	r := newRig(t, base, "node-a", 2)
	r.mustRun("t", 5, "000001.sst")
	_, err := r.run("t", 5, "000001.sst")
	if !errors.Is(err, checkpoint.ErrConflict) || !strings.Contains(err.Error(), "at or below its last completed checkpoint 5") {
		t.Fatalf("a repeated number: %v", err)
	}
	if _, err := r.run("t", 4, "000001.sst"); !errors.Is(err, checkpoint.ErrConflict) {
		t.Fatalf("a lower number: %v", err)
	}
}
