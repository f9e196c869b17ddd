package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ckpt-io/ckpt/client"
	ckptpebble "github.com/ckpt-io/ckpt/client/pebble"
	"github.com/ckpt-io/ckpt/lab/workload"
)

// localCopy is the agent's local copy of checkpoint n: the snapshot's files
// as hard links, by name and size.
func localCopy(t *testing.T, localDir, job, task string, n uint64) (string, map[string]int64) {
	t.Helper()
	dir := filepath.Join(localDir, job, task, fmt.Sprintf("%020d", n))
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("local copy of checkpoint %d: %v", n, err)
	}
	files := map[string]int64{}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = fi.Size()
	}
	return dir, files
}

// newBytes splits a snapshot's files into SSTs not in prev and private
// files, and returns their bytes: what an incremental checkpoint ships.
func newBytes(files map[string]int64, prev map[string]bool) (newSST, private int64, nNew, nReused int) {
	for name, size := range files {
		switch {
		case !strings.HasSuffix(name, ".sst"):
			private += size
		case prev[name]:
			nReused++
		default:
			newSST += size
			nNew++
		}
	}
	return
}

func ssts(files map[string]int64) map[string]bool {
	out := map[string]bool{}
	for name := range files {
		if strings.HasSuffix(name, ".sst") {
			out[name] = true
		}
	}
	return out
}

func TestPebbleCheckpointsGrowStorageByExactlyTheirNewFiles(t *testing.T) {
	storeParent, storageDir, localDir := t.TempDir(), t.TempDir(), t.TempDir()
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	const job, task = "pebble", "kv-0"
	jobDir := filepath.Join(storageDir, job)
	startAgent(t, "A", agentConfig{Socket: socket, StorageDir: storageDir, Job: job, LocalDir: localDir, AllowRoots: []string{storeParent}})

	storeDir := filepath.Join(storeParent, "store")
	w, err := workload.Open(storeDir, workload.Options{Seed: 42, StateBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	var prev map[string]bool
	var exp *workload.Expected
	for n := uint64(1); n <= 5; n++ {
		if _, err := w.Round(ctx); err != nil {
			t.Fatal(err)
		}
		exp = w.Snapshot()
		before := treeSize(t, jobDir)
		// Checkpoints alone: WAL segments shipped between them would
		// grow storage too (wal/ship_test.go measures those).
		p, err := ckptpebble.Checkpoint(ctx, c, w.DB(), storeDir, task, n, ckptpebble.WithoutWAL())
		if err != nil {
			t.Fatalf("checkpoint %d: %v", n, err)
		}
		ev, err := p.Wait(ctx)
		if err != nil {
			t.Fatalf("checkpoint %d: %v", n, err)
		}
		growth := treeSize(t, jobDir) - before
		_, files := localCopy(t, localDir, job, task, n)
		newSST, private, nNew, nReused := newBytes(files, prev)
		m := readManifest(t, storageDir, job, task, n)
		// Exact accounting: new SSTs, private files too large to inline,
		// and the manifest (which carries the small private files inline).
		var bigPrivate int64
		for _, f := range m.Files {
			if f.Kind == "private" && f.Inline == nil {
				bigPrivate += f.Size
			}
		}
		exact := newSST + bigPrivate + m.Size
		want := newSST + private
		t.Logf("checkpoint %d: %d new SSTs (%d B), %d reused, private %d B; storage grew %d B (%.4fx the new files); reported checkpoint_size %d, full_size %d, sync %d ms, total %d ms",
			n, nNew, newSST, nReused, private, growth, float64(growth)/float64(want), ev.CheckpointSize, ev.FullSize, p.Synced.SyncMS, ev.DurationMS)
		if n > 1 { // the first checkpoint ships everything; the later ones are the small changes
			if !within(growth, want, 0.02) {
				t.Errorf("checkpoint %d: storage grew %d B, the new SSTs and private files are %d B (%.4fx)", n, growth, want, float64(growth)/float64(want))
			}
			if ev.FilesReused != nReused {
				t.Errorf("checkpoint %d: files_reused %d, want %d (SSTs of the previous checkpoint)", n, ev.FilesReused, nReused)
			}
		}
		if growth != exact {
			t.Errorf("checkpoint %d: storage grew %d B, new SSTs + non-inline private files + manifest are %d B", n, growth, exact)
		}
		if !within(ev.CheckpointSize, growth, 0.02) {
			t.Errorf("checkpoint %d: reported checkpoint_size %d, storage grew %d", n, ev.CheckpointSize, growth)
		}
		var full int64
		for _, size := range files {
			full += size
		}
		if ev.FullSize != full || m.FullSize != full {
			t.Errorf("checkpoint %d: full_size %d (manifest %d), the snapshot holds %d B", n, ev.FullSize, m.FullSize, full)
		}
		prev = ssts(files)
	}

	// The last checkpoint restores from storage alone into a store that
	// holds exactly the workload's state.
	target := filepath.Join(t.TempDir(), "restored")
	var rr restoreResult
	res := ckptJSON(t, &rr, "restore", "--storage", "file://"+storageDir, "--job", job, "--task", task, "--target", target, "--json")
	t.Logf("restore of checkpoint %d from storage: %d files, %d B in %d ms (process %v)", rr.Checkpoint, rr.Files, rr.Bytes, rr.DurationMS, res.Elapsed)
	if rr.Checkpoint != 5 || rr.BytesRemote != rr.Bytes {
		t.Errorf("restore: %+v", rr)
	}
	verifyStore(t, target, exp)
}

// verifyStore opens a restored store with Pebble and checks it holds
// exactly the expected state.
func verifyStore(t *testing.T, dir string, exp *workload.Expected) {
	t.Helper()
	db, err := pebble.Open(dir, workload.PebbleOptions(0))
	if err != nil {
		t.Fatalf("open the restored store: %v", err)
	}
	defer db.Close()
	if err := workload.Verify(context.Background(), db, exp); err != nil {
		t.Fatalf("restored store: %v", err)
	}
}

func TestCorruptAndMissingLocalCopiesFallBackToStorageFileByFile(t *testing.T) {
	storeParent, storageDir, localDir := t.TempDir(), t.TempDir(), t.TempDir()
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	const job, task = "local", "kv-1"
	a := startAgent(t, "A", agentConfig{Socket: socket, StorageDir: storageDir, Job: job, LocalDir: localDir, AllowRoots: []string{storeParent}})

	storeDir := filepath.Join(storeParent, "store")
	w, err := workload.Open(storeDir, workload.Options{Seed: 9, StateBytes: 12 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for range 2 {
		if _, err := w.Round(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.DB().Flush(); err != nil {
		t.Fatal(err)
	}
	exp := w.Snapshot()
	c, err := client.Dial(ctx, socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := ckptpebble.Checkpoint(ctx, c, w.DB(), storeDir, task, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	a.stop()

	// Keep real copies of the snapshot, then let the local copy be the only
	// link to its inodes: close and remove the store.
	local, files := localCopy(t, localDir, job, task, 1)
	snapshot := filepath.Join(t.TempDir(), "snapshot")
	copyDir(t, local, snapshot)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(storeDir); err != nil {
		t.Fatal(err)
	}
	m := readManifest(t, storageDir, job, task, 1)
	want := fileHashes(t, snapshot)
	for _, f := range m.Files {
		if want[f.Name] != f.ContentID() {
			t.Fatalf("the local copy's %s does not match the manifest", f.Name)
		}
	}
	var names []string
	for name := range ssts(files) {
		names = append(names, name)
	}
	sort.Strings(names)
	if len(names) < 2 {
		t.Fatalf("the store has %d SSTs; the test needs two", len(names))
	}
	corrupt, missing := names[0], names[len(names)-1]
	f, err := os.OpenFile(filepath.Join(local, corrupt), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	off := files[corrupt] / 2
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x40
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Remove(filepath.Join(local, missing)); err != nil {
		t.Fatal(err)
	}

	target := filepath.Join(t.TempDir(), "restored")
	var rr restoreResult
	res := ckptJSON(t, &rr, "restore", "--storage", "file://"+storageDir, "--job", job, "--task", task,
		"--target", target, "--local-dir", localDir, "--json")
	t.Logf("restore with a corrupt and a missing local SST: %+v (process %v)", rr, res.Elapsed)
	if rr.LocalFallbacks != 2 {
		t.Errorf("local_fallbacks %d, want 2", rr.LocalFallbacks)
	}
	if rr.BytesLocal <= 0 || rr.BytesRemote < files[corrupt]+files[missing] || rr.BytesLocal+rr.BytesRemote != rr.Bytes {
		t.Errorf("bytes local %d + remote %d should cover %d with both SSTs remote (%d B)", rr.BytesLocal, rr.BytesRemote, rr.Bytes, files[corrupt]+files[missing])
	}
	if rr.FilesLocal+rr.FilesRemote != rr.Files || rr.FilesRemote < 2 {
		t.Errorf("files local %d + remote %d, want %d with at least 2 remote", rr.FilesLocal, rr.FilesRemote, rr.Files)
	}
	requireSameFiles(t, snapshot, target)
	// The restore re-records the local copy, healthy again.
	if got := hashFile(t, filepath.Join(local, corrupt)); got != want[corrupt] {
		t.Errorf("the local copy of %s is still corrupt after the restore", corrupt)
	}
	verifyStore(t, target, exp)
}

func TestRestoreOnAFreshNodeThenOneCheckpointUploadsOnlyNewFiles(t *testing.T) {
	storageDir := t.TempDir()
	const job, task = "nodes", "kv-2"
	jobDir := filepath.Join(storageDir, job)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Node A: a store, one checkpoint, then the node is gone.
	rootA, localA := t.TempDir(), t.TempDir()
	socketA := filepath.Join(shortDir(t), "a.sock")
	a := startAgent(t, "A", agentConfig{Socket: socketA, StorageDir: storageDir, Job: job, LocalDir: localA, AllowRoots: []string{rootA}})
	storeA := filepath.Join(rootA, "store")
	w, err := workload.Open(storeA, workload.Options{Seed: 5, StateBytes: 12 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for range 2 {
		if _, err := w.Round(ctx); err != nil {
			t.Fatal(err)
		}
	}
	exp := w.Snapshot()
	ca, err := client.Dial(ctx, socketA)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	p, err := ckptpebble.Checkpoint(ctx, ca, w.DB(), storeA, task, 7)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	ca.Close()
	a.stop()
	w.Close()
	m7 := readManifest(t, storageDir, job, task, 7)
	restoredSSTs := map[string]bool{}
	for _, f := range m7.Files {
		if f.Kind == "shared" {
			restoredSSTs[f.Name] = true
		}
	}

	// Node B: a fresh local dir and store dir, restored from storage.
	rootB, localB := t.TempDir(), t.TempDir()
	storeB := filepath.Join(rootB, "store")
	var rr restoreResult
	res := ckptJSON(t, &rr, "restore", "--storage", "file://"+storageDir, "--job", job, "--task", task,
		"--target", storeB, "--local-dir", localB, "--if-not-exists", "--json")
	t.Logf("restore on node B: %d files, %d B (%d local, %d remote) in %d ms (process %v)", rr.Files, rr.Bytes, rr.BytesLocal, rr.BytesRemote, rr.DurationMS, res.Elapsed)
	if !rr.Restored || rr.Checkpoint != 7 || rr.BytesLocal != 0 {
		t.Fatalf("restore on a fresh node: %+v", rr)
	}
	socketB := filepath.Join(shortDir(t), "b.sock")
	startAgent(t, "B", agentConfig{Socket: socketB, StorageDir: storageDir, Job: job, LocalDir: localB, AllowRoots: []string{rootB}})

	opts := workload.PebbleOptions(0)
	opts.DisableAutomaticCompactions = true // keep every restored SST in the next checkpoint
	db, err := pebble.Open(storeB, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := workload.Verify(ctx, db, exp); err != nil {
		t.Fatalf("restored store: %v", err)
	}
	batch := db.NewBatch()
	for i := range 2048 {
		if err := batch.Set([]byte(fmt.Sprintf("node-b/%06d", i)), randomBytes(1024, uint64(50000+i)), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := batch.Commit(pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}

	before := treeSize(t, jobDir)
	cb, err := client.Dial(ctx, socketB)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	p, err = ckptpebble.Checkpoint(ctx, cb, db, storeB, task, 8)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := p.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	growth := treeSize(t, jobDir) - before
	_, files := localCopy(t, localB, job, task, 8)
	newSST, private, nNew, nReused := newBytes(files, restoredSSTs)
	want := newSST + private
	t.Logf("first checkpoint on node B: %d new SSTs (%d B) + private %d B; storage grew %d B (%.4fx); reported checkpoint_size %d, uploaded %d, reused %d of %d restored SSTs",
		nNew, newSST, private, growth, float64(growth)/float64(want), ev.CheckpointSize, ev.FilesUploaded, ev.FilesReused, len(restoredSSTs))
	if nNew == 0 {
		t.Fatal("the flush on node B made no new SST")
	}
	if !within(growth, want, 0.02) {
		t.Errorf("storage grew %d B, the new SSTs and private files are %d B", growth, want)
	}
	if !within(ev.CheckpointSize, growth, 0.02) {
		t.Errorf("reported checkpoint_size %d, storage grew %d", ev.CheckpointSize, growth)
	}
	if ev.FilesReused != len(restoredSSTs) || nReused != len(restoredSSTs) {
		t.Errorf("files_reused %d (snapshot kept %d), want the %d restored SSTs", ev.FilesReused, nReused, len(restoredSSTs))
	}
	m8 := readManifest(t, storageDir, job, task, 8)
	for _, f := range m8.Files {
		if f.Kind == "shared" && f.Uploaded == restoredSSTs[f.Name] {
			t.Errorf("checkpoint 8: %s uploaded=%v, but restored=%v", f.Name, f.Uploaded, restoredSSTs[f.Name])
		}
	}
}
