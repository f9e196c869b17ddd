package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/ckpt-io/ckpt/client"
	ckptpebble "github.com/ckpt-io/ckpt/client/pebble"
	"github.com/ckpt-io/ckpt/lab/workload"
)

type savepointResult struct {
	Savepoint        string `json:"savepoint"`
	Checkpoint       uint64 `json:"checkpoint"`
	Tasks            int    `json:"tasks"`
	Files            int    `json:"files"`
	Bytes            int64  `json:"bytes"`
	CopiedServerSide int    `json:"copied_server_side"`
	DurationMS       int64  `json:"duration_ms"`
}

// checkpointWorkload writes rounds of a Pebble workload into a store under
// root and checkpoints it as task's checkpoint n through the agent on socket.
func checkpointWorkload(t *testing.T, ctx context.Context, w *workload.Workload, store, socket, task string, n uint64, rounds int) *workload.Expected {
	t.Helper()
	for range rounds {
		if _, err := w.Round(ctx); err != nil {
			t.Fatal(err)
		}
	}
	exp := w.Snapshot()
	c, err := client.Dial(ctx, socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := ckptpebble.Checkpoint(ctx, c, w.DB(), store, task, n)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	return exp
}

// deleteJob removes every object of job from an S3 backend's prefix.
func deleteS3Job(t *testing.T, b *backend, job string) {
	t.Helper()
	ctx := context.Background()
	p := s3.NewListObjectsV2Paginator(b.s3.Client(), &s3.ListObjectsV2Input{Bucket: aws.String(testBucket), Prefix: aws.String(testPrefix + "/" + job + "/")})
	n := 0
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []types.ObjectIdentifier
		for _, o := range page.Contents {
			ids = append(ids, types.ObjectIdentifier{Key: o.Key})
		}
		if len(ids) > 0 {
			if _, err := b.s3.Client().DeleteObjects(ctx, &s3.DeleteObjectsInput{Bucket: aws.String(testBucket), Delete: &types.Delete{Objects: ids}}); err != nil {
				t.Fatal(err)
			}
			n += len(ids)
		}
	}
	if n == 0 {
		t.Fatalf("job %s had no object to delete", job)
	}
}

// A savepoint from file:// to S3 and one from S3 to GCS: each outlives the
// job's storage deleted entirely, restores key by key, refuses to be
// overwritten by accident, and a fresh job restored from one checkpoints
// on from it.
func TestSavepointsOutliveTheirJobAcrossBackends(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s3b, gsb := newBackend(t, "s3"), newBackend(t, "gs")
	env := append(append([]string(nil), s3b.env...), gsb.env...)
	sp1 := strings.Replace(s3b.url, "/"+testPrefix, "/savepoints/sp1", 1)
	sp2 := strings.Replace(gsb.url, "/"+testPrefix, "/savepoints/sp2", 1)

	// Job 1 on file:// storage: two checkpoints of a Pebble store.
	storageDir, root, local := t.TempDir(), t.TempDir(), t.TempDir()
	const job, task = "orders", "orders-0"
	socket := filepath.Join(shortDir(t), "a.sock")
	a := startAgent(t, "A", agentConfig{Socket: socket, StorageDir: storageDir, Job: job, LocalDir: local, AllowRoots: []string{root}})
	store := filepath.Join(root, "store")
	w, err := workload.Open(store, workload.Options{Seed: 11, StateBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	checkpointWorkload(t, ctx, w, store, socket, task, 1, 2)
	exp := checkpointWorkload(t, ctx, w, store, socket, task, 2, 1)
	w.Close()
	a.stop()

	var sp savepointResult
	ckptJSONEnv(t, env, &sp, "savepoint", "--storage", "file://"+storageDir, "--job", job, "--task", task, "--to", sp1, "--json")
	t.Logf("savepoint file:// -> S3: %+v", sp)
	if sp.Checkpoint != 2 || sp.Tasks != 1 || sp.Files == 0 || sp.Bytes == 0 || sp.CopiedServerSide != 0 || sp.Savepoint == "" {
		t.Fatalf("savepoint result %+v", sp)
	}
	// Not twice to one target by accident.
	if r := runCkptEnv(t, env, "savepoint", "--storage", "file://"+storageDir, "--job", job, "--task", task, "--to", sp1); r.Code != 1 || !strings.Contains(string(r.Stderr), "--overwrite") {
		t.Fatalf("second savepoint to %s: exit %d, %s", sp1, r.Code, r.Stderr)
	}
	// Nor inside the job's storage.
	if r := runCkptEnv(t, env, "savepoint", "--storage", "file://"+storageDir, "--job", job, "--task", task, "--to", "file://"+filepath.Join(storageDir, "sp")); r.Code != 2 || !strings.Contains(string(r.Stderr), "overlaps") {
		t.Fatalf("savepoint inside the job's storage: exit %d, %s", r.Code, r.Stderr)
	}

	// The job's storage goes entirely; the savepoint restores alone.
	if err := os.RemoveAll(storageDir); err != nil {
		t.Fatal(err)
	}
	var rr restoreResult
	ckptJSONEnv(t, env, &rr, "restore", "--savepoint", sp1, "--target", filepath.Join(t.TempDir(), "store"), "--json")
	if !rr.Restored || rr.Checkpoint != 2 || rr.Task != task {
		t.Fatalf("restore from the savepoint: %+v", rr)
	}

	// Job 2, fresh, on S3, starts from the savepoint: the restored store
	// checkpoints on, uploading only what changed.
	const job2 = "orders-v2"
	root2, local2 := t.TempDir(), t.TempDir()
	store2 := filepath.Join(root2, "store")
	ckptJSONEnv(t, env, &rr, "restore", "--savepoint", sp1, "--storage", s3b.url, "--job", job2, "--target", store2, "--local-dir", local2, "--json")
	if !rr.Restored || rr.Checkpoint != 2 || rr.Task != task {
		t.Fatalf("restore from the savepoint into job 2: %+v", rr)
	}
	verifyStore(t, store2, exp)
	if r := runCkptEnv(t, env, "restore", "--savepoint", sp1, "--storage", s3b.url, "--job", job2, "--target", filepath.Join(t.TempDir(), "x")); r.Code != 1 || !strings.Contains(string(r.Stderr), "already holds checkpoint 2") {
		t.Fatalf("seeding job 2 twice: exit %d, %s", r.Code, r.Stderr)
	}
	socket2 := filepath.Join(shortDir(t), "b.sock")
	b := startAgent(t, "B", s3b.agentConfig(socket2, job2, local2, []string{root2}))
	w2, err := workload.Resume(ctx, store2, workload.Options{Seed: 11, StateBytes: 8 << 20}, exp)
	if err != nil {
		t.Fatal(err)
	}
	exp2 := checkpointWorkload(t, ctx, w2, store2, socket2, task, 3, 1)
	w2.Close()
	done := waitLogRecords(t, b, "checkpoint completed", 1)
	t.Logf("job 2's first checkpoint after the savepoint: %v files uploaded, %v reused, %v B", done[0]["files_uploaded"], done[0]["files_reused"], done[0]["checkpoint_size"])
	if done[0]["files_reused"] == float64(0) {
		t.Fatalf("job 2's first checkpoint reused nothing of the savepoint: %v", done[0])
	}
	b.stop()

	// From S3 to GCS, then job 2 goes entirely.
	ckptJSONEnv(t, env, &sp, "savepoint", "--storage", s3b.url, "--job", job2, "--task", task, "--to", sp2, "--json")
	t.Logf("savepoint S3 -> GCS: %+v", sp)
	if sp.Checkpoint != 3 || sp.CopiedServerSide != 0 {
		t.Fatalf("savepoint result %+v", sp)
	}
	deleteS3Job(t, s3b, job2)
	if r := runCkptEnv(t, env, "list", "--storage", s3b.url, "--job", job2, "--json"); strings.Contains(string(r.Stdout), `"checkpoint"`) {
		t.Fatalf("job 2 still lists checkpoints: %s", r.Stdout)
	}
	store3 := filepath.Join(t.TempDir(), "store")
	ckptJSONEnv(t, env, &rr, "restore", "--savepoint", sp2, "--target", store3, "--json")
	if !rr.Restored || rr.Checkpoint != 3 {
		t.Fatalf("restore from the GCS savepoint: %+v", rr)
	}
	verifyStore(t, store3, exp2)
	// A tampered savepoint does not restore.
	if r := runCkptEnv(t, env, "restore", "--savepoint", sp2, "--target", store3+"x", "--task", "nope"); r.Code != 2 || !strings.Contains(string(r.Stderr), "no task nope") {
		t.Fatalf("restore of a task the savepoint lacks: exit %d, %s", r.Code, r.Stderr)
	}
}
