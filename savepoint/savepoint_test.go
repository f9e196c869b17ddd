package savepoint

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/lab/testservers"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
	_ "github.com/ckpt-io/ckpt/storage/s3"
)

func fileStore(t *testing.T) storage.Store {
	t.Helper()
	s, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// commit writes checkpoint n of task: its shared files as objects, its
// private ones inline, then the manifest (tasks: a job-wide checkpoint).
func commit(t *testing.T, s storage.Store, job, task string, n uint64, files map[string]string, tasks []string) *manifests.Manifest {
	t.Helper()
	ctx := context.Background()
	m := &manifests.Manifest{Job: job, Task: task, Checkpoint: n, Created: time.Now().UTC(), Engine: "generic", Tasks: tasks}
	for name, body := range files {
		// Both algorithms side by side, as in a job that switched formats:
		// BLAKE3 for names whose byte before the extension is even.
		alg := manifests.SHA256
		if i := strings.LastIndexByte(name, '.'); i > 0 && name[i-1]%2 == 0 {
			alg = manifests.BLAKE3
		}
		f := manifests.File{Name: name, Size: int64(len(body))}
		f.SetDigest(manifests.SumBytes(alg, []byte(body)))
		if strings.HasSuffix(name, ".sst") {
			f.Kind, f.Key = manifests.Shared, manifests.SharedKey(job, f.Digest(), f.Size)
			if err := s.Put(ctx, f.Key, strings.NewReader(body), f.Size); err != nil {
				t.Fatal(err)
			}
		} else {
			f.Kind, f.Inline = manifests.Private, []byte(body)
		}
		m.Files = append(m.Files, f)
		m.FullSize += f.Size
	}
	enc, err := m.Encode(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := manifests.Commit(ctx, s, m, enc); err != nil {
		t.Fatal(err)
	}
	return m
}

func sst(i int) string { return strings.Repeat(fmt.Sprintf("sst %d;", i), 1000+i) }

// restoreFrom restores task from the savepoint in s and returns the
// restored files.
func restoreFrom(t *testing.T, s storage.Store, task string) map[string]string {
	t.Helper()
	ctx := context.Background()
	rec, err := Read(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	e, err := rec.Entry(task)
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "store")
	if _, err := restore.Run(ctx, restore.Options{Store: s, Job: rec.Job, Task: e.Task, Checkpoint: rec.Checkpoint, Target: target}); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	ents, _ := os.ReadDir(target)
	for _, de := range ents {
		b, _ := os.ReadFile(filepath.Join(target, de.Name()))
		got[de.Name()] = string(b)
	}
	return got
}

func TestASavepointOutlivesItsJobAndRestoresAlone(t *testing.T) {
	ctx := context.Background()
	src, dst := fileStore(t), fileStore(t)
	commit(t, src, "j", "t0", 1, map[string]string{"000001.sst": sst(1), "CURRENT": "MANIFEST-1\n"}, nil)
	files := map[string]string{"000001.sst": sst(1), "000002.sst": sst(2), "CURRENT": "MANIFEST-2\n"}
	commit(t, src, "j", "t0", 2, files, nil)
	res, err := Create(ctx, Options{Source: src, Job: "j", Task: "t0", Target: dst})
	if err != nil {
		t.Fatal(err)
	}
	if res.Checkpoint != 2 || res.Tasks != 1 || res.Files != 3 || res.Objects != 2 || res.CopiedServerSide != 0 {
		t.Fatalf("result %+v", res)
	}
	// The job's storage goes entirely.
	if err := src.List(ctx, "", func(o storage.ObjectInfo) error { return src.Delete(ctx, o.Key) }); err != nil {
		t.Fatal(err)
	}
	got := restoreFrom(t, dst, "")
	if len(got) != len(files) {
		t.Fatalf("restored %d files, want %d", len(got), len(files))
	}
	for name, body := range files {
		if got[name] != body {
			t.Errorf("%s differs after the restore from the savepoint", name)
		}
	}
	rec, err := Read(ctx, dst)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Origin.Job != "j" || rec.Origin.Task != "t0" || rec.Origin.Checkpoint != 2 || rec.Origin.Storage != src.String() || rec.Origin.Created.IsZero() {
		t.Fatalf("origin %+v", rec.Origin)
	}
}

func TestAJobSavepointHoldsEveryTaskOfTheJobCompleteCheckpoint(t *testing.T) {
	ctx := context.Background()
	src, dst := fileStore(t), fileStore(t)
	tasks := []string{"a", "b"}
	commit(t, src, "j", "a", 1, map[string]string{"000001.sst": sst(1)}, tasks)
	commit(t, src, "j", "b", 1, map[string]string{"000001.sst": sst(1), "000003.sst": sst(3)}, tasks)
	commit(t, src, "j", "a", 2, map[string]string{"000002.sst": sst(2)}, tasks) // b has no 2: not job-complete
	res, err := Create(ctx, Options{Source: src, Job: "j", Task: "a", JobConsistent: true, Target: dst})
	if err != nil {
		t.Fatal(err)
	}
	if res.Checkpoint != 1 || res.Tasks != 2 || res.Objects != 2 {
		t.Fatalf("result %+v: want checkpoint 1 of both tasks, 2 distinct objects", res)
	}
	n, err := manifests.NewestJobComplete(ctx, dst, "j", "b")
	if err != nil || n != 1 {
		t.Fatalf("the savepoint's newest job-complete checkpoint: %d, %v", n, err)
	}
	if got := restoreFrom(t, dst, "b"); got["000003.sst"] != sst(3) {
		t.Fatal("task b restored wrong from the job savepoint")
	}
	if _, err := Read(ctx, dst); err != nil {
		t.Fatal(err)
	}
	rec, _ := Read(ctx, dst)
	if _, err := rec.Entry(""); err == nil {
		t.Fatal("a job savepoint picked a task without being told which")
	}
}

func TestASavepointIsNotOverwrittenByAccidentAndNotBuiltOnTheJob(t *testing.T) {
	ctx := context.Background()
	src, dst := fileStore(t), fileStore(t)
	commit(t, src, "j", "t0", 1, map[string]string{"000001.sst": sst(1)}, nil)
	if _, err := Create(ctx, Options{Source: src, Job: "j", Task: "t0", Target: dst}); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, dst)
	commit(t, src, "j", "t0", 2, map[string]string{"000002.sst": sst(2)}, nil)
	if _, err := Create(ctx, Options{Source: src, Job: "j", Task: "t0", Target: dst}); !errors.Is(err, ErrExists) {
		t.Fatalf("second savepoint to the same target: %v, want ErrExists", err)
	}
	if after := snapshot(t, dst); after != before {
		t.Fatal("a refused savepoint changed the target")
	}
	res, err := Create(ctx, Options{Source: src, Job: "j", Task: "t0", Target: dst, Overwrite: true})
	if err != nil || res.Checkpoint != 2 {
		t.Fatalf("--overwrite: %+v, %v", res, err)
	}
	// The replaced savepoint's objects are gone, the new one's whole.
	if _, err := dst.Stat(ctx, manifests.SharedKey("j", sha(sst(1)), int64(len(sst(1))))); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("the replaced savepoint's object is still there: %v", err)
	}
	if got := restoreFrom(t, dst, "t0"); got["000002.sst"] != sst(2) || len(got) != 1 {
		t.Fatalf("restored %d files after the overwrite", len(got))
	}
	// Inside the job's storage: refused, nothing written.
	in, err := file.New(filepath.Join(strings.TrimPrefix(src.String(), "file://"), "sp"))
	if err == nil {
		_, err = Create(ctx, Options{Source: src, Job: "j", Task: "t0", Target: in})
	}
	if err == nil || !strings.Contains(err.Error(), "overlaps") {
		t.Fatalf("a savepoint inside the job's storage: %v", err)
	}
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// snapshot lists every object of s with its bytes' hash.
func snapshot(t *testing.T, s storage.Store) string {
	t.Helper()
	var b strings.Builder
	err := s.List(context.Background(), "", func(o storage.ObjectInfo) error {
		r, err := s.Get(context.Background(), o.Key)
		if err != nil {
			return err
		}
		defer r.Close()
		var buf bytes.Buffer
		buf.ReadFrom(r)
		fmt.Fprintf(&b, "%s %s\n", o.Key, sha(buf.String()))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// A damaged object in the job's storage is not saved; a savepoint whose
// manifest or record was tampered with does not read.
func TestDamageIsNeverSavedNorRestored(t *testing.T) {
	ctx := context.Background()
	src, dst := fileStore(t), fileStore(t)
	m := commit(t, src, "j", "t0", 1, map[string]string{"000001.sst": sst(1), "000002.sst": sst(2)}, nil)
	var key string
	var size int64
	for _, f := range m.Files {
		if f.Kind == manifests.Shared {
			key, size = f.Key, f.Size
		}
	}
	bad := bytes.Repeat([]byte("x"), int(size)) // the right size, the wrong bytes
	if err := src.Put(ctx, key, bytes.NewReader(bad), int64(len(bad))); err != nil {
		t.Fatal(err)
	}
	if _, err := Create(ctx, Options{Source: src, Job: "j", Task: "t0", Target: dst}); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("savepoint of a damaged checkpoint: %v", err)
	}
	if _, err := dst.Stat(ctx, Key); !errors.Is(err, storage.ErrNotFound) {
		t.Fatal("a failed savepoint wrote its record")
	}

	src2, dst2 := fileStore(t), fileStore(t)
	commit(t, src2, "j", "t0", 1, map[string]string{"000001.sst": sst(1), "CURRENT": "x\n"}, nil)
	if _, err := Create(ctx, Options{Source: src2, Job: "j", Task: "t0", Target: dst2}); err != nil {
		t.Fatal(err)
	}
	rec, _ := Read(ctx, dst2)
	other := commit(t, fileStore(t), "j", "t0", 1, map[string]string{"000001.sst": sst(1), "CURRENT": "y\n"}, nil)
	enc, _ := other.Encode(0)
	if err := dst2.Put(ctx, rec.Tasks[0].Manifest, bytes.NewReader(enc), int64(len(enc))); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(ctx, dst2); err == nil || !strings.Contains(err.Error(), "replaced or damaged") {
		t.Fatalf("a savepoint with a replaced manifest: %v", err)
	}
	data := []byte(`{"format":1,"kind":"ckpt-savepoint","sha256":"00","body":{}}`)
	dst2.Put(ctx, Key, bytes.NewReader(data), int64(len(data)))
	if _, err := Read(ctx, dst2); err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("a savepoint with a damaged record: %v", err)
	}
}

// Between two buckets of one S3 endpoint the objects are copied by the
// service (CopyObject), then read back and verified; a crashed savepoint
// resumes, keeping what it copied.
func TestS3ToS3CopiesServerSide(t *testing.T) {
	srv := testservers.S3(t)
	srv.CreateBucket(t, "jobs")
	srv.CreateBucket(t, "archive")
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	ctx := context.Background()
	open := func(u string) storage.Store {
		s, err := storage.Open(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	src := open(srv.URL("jobs", "prod"))
	dst := open(srv.URL("archive", "sp1"))
	files := map[string]string{"000001.sst": sst(1), "000002.sst": sst(2), "000003.sst": sst(3), "CURRENT": "MANIFEST-9\n"}
	commit(t, src, "j", "t0", 9, files, nil)
	// A crashed earlier attempt left one object behind.
	if err := dst.Put(ctx, manifests.SharedKey("j", sha(sst(1)), int64(len(sst(1)))), strings.NewReader(sst(1)), int64(len(sst(1)))); err != nil {
		t.Fatal(err)
	}
	res, err := Create(ctx, Options{Source: src, Job: "j", Task: "t0", Target: dst})
	if err != nil {
		t.Fatal(err)
	}
	if res.Objects != 3 || res.CopiedServerSide != 2 || res.Reused != 1 {
		t.Fatalf("result %+v: want 2 objects copied server-side, 1 kept from the crashed attempt", res)
	}
	got := restoreFrom(t, dst, "t0")
	for name, body := range files {
		if got[name] != body {
			t.Errorf("%s differs after the restore from the savepoint", name)
		}
	}
}
