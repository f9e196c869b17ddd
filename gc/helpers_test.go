package gc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
)

// commitJob stores checkpoint n of task listing tasks (nil: none), with
// one shared object of its own.
func commitJob(t *testing.T, s storage.Store, task string, n uint64, tasks ...string) {
	t.Helper()
	b := []byte(fmt.Sprintf("%s-%d", task, n))
	f := manifests.File{Name: "a.sst", Kind: manifests.Shared, Size: int64(len(b)), SHA256: sha(b), Key: manifests.SharedKey("job", sha(b), int64(len(b)))}
	put(t, s, f.Key, b)
	m := &manifests.Manifest{Job: "job", Task: task, Checkpoint: n, Created: time.Now(), Files: []manifests.File{f}, FullSize: f.Size,
		Tasks: manifests.SortedTasks(tasks)}
	enc, err := m.Encode(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := manifests.Commit(context.Background(), s, m, enc); err != nil {
		t.Fatal(err)
	}
}

func newStore(t *testing.T) storage.Store {
	s, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func put(t *testing.T, s storage.Store, key string, data []byte) {
	if err := s.Put(context.Background(), key, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
}

// commit stores a checkpoint of task with the given shared contents.
func commit(t *testing.T, s storage.Store, task string, n uint64, contents ...string) {
	m := &manifests.Manifest{Job: "job", Task: task, Checkpoint: n, Created: time.Now()}
	for i, c := range contents {
		b := []byte(c)
		f := manifests.File{Name: string(rune('a'+i)) + ".sst", Kind: manifests.Shared, Size: int64(len(b)), SHA256: sha(b), Key: manifests.SharedKey("job", sha(b), int64(len(b)))}
		put(t, s, f.Key, b)
		m.Files = append(m.Files, f)
		m.FullSize += f.Size
	}
	enc, err := m.Encode(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := manifests.Commit(context.Background(), s, m, enc); err != nil {
		t.Fatal(err)
	}
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// refresher re-uploads a candidate between GC's listing and its delete, as
// a checkpoint elsewhere would; GC must notice the fresh age and keep it.
type refresher struct {
	storage.Store
	key           string
	armed, listed bool
}

func (r *refresher) List(ctx context.Context, prefix string, fn func(storage.ObjectInfo) error) error {
	err := r.Store.List(ctx, prefix, fn)
	if strings.HasSuffix(prefix, "/shared/") && r.armed && !r.listed {
		r.listed = true
		r.Store.Put(ctx, r.key, bytes.NewReader([]byte("orphan")), 6)
	}
	return err
}

// commitAlg stores a checkpoint of task in format with shared contents,
// each hashed with the algorithm its name asks for ("sha:..." SHA-256,
// else BLAKE3; format 1 takes SHA-256 only).
func commitAlg(t *testing.T, s storage.Store, task string, n uint64, format int, contents ...string) *manifests.Manifest {
	t.Helper()
	m := &manifests.Manifest{Job: "job", Task: task, Checkpoint: n, Created: time.Now(), Format: format}
	for i, c := range contents {
		alg := manifests.BLAKE3
		if strings.HasPrefix(c, "sha:") || format == manifests.Format1 {
			alg = manifests.SHA256
		}
		b := []byte(strings.TrimPrefix(c, "sha:"))
		f := manifests.File{Name: string(rune('a'+i)) + ".sst", Kind: manifests.Shared, Size: int64(len(b))}
		f.SetDigest(manifests.SumBytes(alg, b))
		f.Key = manifests.SharedKey("job", f.Digest(), f.Size)
		put(t, s, f.Key, b)
		m.Files = append(m.Files, f)
		m.FullSize += f.Size
	}
	enc, err := m.Encode(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := manifests.Commit(context.Background(), s, m, enc); err != nil {
		t.Fatal(err)
	}
	return m
}

// commitAt commits checkpoint n of task t as the owner of epoch.
func commitAt(t *testing.T, s storage.Store, n, epoch uint64) {
	t.Helper()
	m := testManifest("t", n)
	m.Epoch = epoch
	enc, err := m.Encode(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := manifests.Commit(context.Background(), s, m, enc); err != nil {
		t.Fatal(err)
	}
}

func retainedNs(t *testing.T, s storage.Store) []uint64 {
	t.Helper()
	cat, err := manifests.Scan(context.Background(), s, "job", "t")
	if err != nil {
		t.Fatal(err)
	}
	var out []uint64
	for _, r := range cat.Retained("t") {
		out = append(out, r.Checkpoint)
	}
	return out
}

// testManifest is a one-file (inline) manifest of checkpoint n of task.
func testManifest(task string, n uint64) *manifests.Manifest {
	cur := []byte("MANIFEST-000001\n")
	return &manifests.Manifest{Job: "job", Task: task, Checkpoint: n,
		Files:    []manifests.File{{Name: "CURRENT", Kind: manifests.Private, Size: int64(len(cur)), SHA256: sha(cur), Inline: cur, Uploaded: true}},
		FullSize: int64(len(cur))}
}
