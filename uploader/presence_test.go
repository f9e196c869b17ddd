package uploader_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
	"github.com/ckpt-io/ckpt/uploader"
)

// reads counts what a check asks of storage: object reads, Stats, listings.
type reads struct {
	storage.Store
	gets, stats, lists atomic.Int64
}

func (r *reads) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	r.gets.Add(1)
	return r.Store.Get(ctx, key)
}

func (r *reads) Stat(ctx context.Context, key string) (storage.ObjectInfo, error) {
	r.stats.Add(1)
	return r.Store.Stat(ctx, key)
}

func (r *reads) List(ctx context.Context, prefix string, fn func(storage.ObjectInfo) error) error {
	r.lists.Add(1)
	return r.Store.List(ctx, prefix, fn)
}

// The size check finds a truncated and a deleted object among the reused
// ones and uploads them again from the snapshot, without reading any object
// back nor hashing any file again: sizes from a Stat (few objects) or one
// listing (many) suffice for those.
func TestTheSizeCheckCatchesTruncatedAndDeletedObjectsWithoutRehashing(t *testing.T) {
	for _, mode := range []string{"stat", "list"} {
		t.Run(mode, func(t *testing.T) {
			files := map[string]string{"CURRENT": "c"}
			for i := 1; i <= 5; i++ {
				files[fmt.Sprintf("%06d.sst", i)] = strings.Repeat(fmt.Sprint(i), 1000*i)
			}
			sn, st := snapshot(t, files)
			ctx := context.Background()
			res, err := uploader.Upload(ctx, uploader.Request{Store: st, Job: "job", Task: "t", Checkpoint: 1, Snapshot: sn})
			if err != nil {
				t.Fatal(err)
			}
			confirmed, hashes := uploader.NewConfirmed(), map[localrecovery.Identity]string{}
			var keys []string
			for i, f := range res.Files {
				if f.Kind == manifests.Shared {
					confirmed.Add(&f)
					hashes[sn.Files[i].ID()] = f.Digest()
					keys = append(keys, f.Key)
				}
			}
			truncated, deleted := keys[1], keys[3]
			if err := os.Truncate(filepath.Join(st.Root(), truncated), 10); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(filepath.Join(st.Root(), deleted)); err != nil {
				t.Fatal(err)
			}

			r := &reads{Store: st}
			p := uploader.NewPresence(r, manifests.SharedPrefix("job"), time.Minute)
			if mode == "list" {
				p.StatMax = -1
			}
			res2, err := uploader.Upload(ctx, uploader.Request{Store: r, Job: "job", Task: "t", Checkpoint: 2, Snapshot: sn,
				Confirmed: confirmed, Hashes: hashes, Presence: p})
			if err != nil {
				t.Fatal(err)
			}
			if res2.FilesReused != 3 || res2.FilesUploaded != 3 || res2.BytesHashed != 0 {
				t.Fatalf("reused %d, uploaded %d, hashed %d bytes; want 3, 3 (2 again + CURRENT), 0",
					res2.FilesReused, res2.FilesUploaded, res2.BytesHashed)
			}
			got := map[string]string{}
			for _, f := range res2.Replaced {
				got[f.Key] = f.String()
			}
			if len(got) != 2 || got[deleted] != "missing" || got[truncated] != "size 10, want 2000" {
				t.Fatalf("replaced %v", got)
			}
			if n := r.gets.Load(); n != 0 {
				t.Fatalf("the check read %d objects back", n)
			}
			switch {
			case mode == "stat" && (r.stats.Load() != 5 || r.lists.Load() != 0):
				t.Fatalf("stat mode: %d stats, %d listings", r.stats.Load(), r.lists.Load())
			case mode == "list" && (r.stats.Load() != 0 || r.lists.Load() != 1):
				t.Fatalf("list mode: %d stats, %d listings", r.stats.Load(), r.lists.Load())
			}
			m := &manifests.Manifest{Task: "t", Checkpoint: 2, Files: res2.Files}
			probs, _, err := manifests.Verify(ctx, st, m, 4)
			if err != nil || len(probs) != 0 {
				t.Fatalf("checkpoint 2 objects: %v %v", probs, err)
			}
			// A second check within the bound asks storage nothing.
			before := r.stats.Load() + r.lists.Load()
			if _, err := uploader.Upload(ctx, uploader.Request{Store: r, Job: "job", Task: "t", Checkpoint: 3, Snapshot: sn,
				Confirmed: confirmed, Hashes: hashes, Presence: p}); err != nil {
				t.Fatal(err)
			}
			if after := r.stats.Load() + r.lists.Load(); after != before {
				t.Fatalf("a check within the bound asked storage %d times", after-before)
			}
		})
	}
}

// An observation older than the bound is not trusted: the object is
// observed again.
func TestPresenceObservesAgainPastTheBound(t *testing.T) {
	st, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r := &reads{Store: st}
	p := uploader.NewPresence(r, "job/shared/", time.Hour)
	key := "job/shared/aa/x-3"
	p.Saw(key, 3, time.Now().Add(-2*time.Hour))
	bad, err := p.Check(context.Background(), []uploader.Object{{Key: key, Size: 3}})
	if err != nil || len(bad) != 1 || bad[0].Found || r.stats.Load() != 1 {
		t.Fatalf("stale observation: findings %v, err %v, %d stats", bad, err, r.stats.Load())
	}
}

// TestPresenceIndexesOnlyWhatItIsAskedAbout: a listing of a job's shared
// prefix keeps the objects the check asked about, not the whole job; a
// check of other objects shortly after lists again rather than calling
// them missing, and objects not found or of another size are reported.
func TestPresenceIndexesOnlyWhatItIsAskedAbout(t *testing.T) {
	root := t.TempDir()
	objs := populate(t, root, 300)
	st, err := file.New(root)
	if err != nil {
		t.Fatal(err)
	}
	r := &reads{Store: st}
	p := uploader.NewPresence(r, manifests.SharedPrefix("job"), time.Hour)
	p.StatMax = 10
	ctx := context.Background()
	if bad, err := p.Check(ctx, objs[:50]); err != nil || len(bad) != 0 || r.lists.Load() != 1 {
		t.Fatalf("first check: %v, %v, %d listings", bad, err, r.lists.Load())
	}
	if n := p.Indexed(); n != 50 {
		t.Fatalf("the index holds %d objects after a check of 50 in a prefix of 300", n)
	}
	if bad, err := p.Check(ctx, objs[100:150]); err != nil || len(bad) != 0 || r.lists.Load() != 2 {
		t.Fatalf("a check of other objects within the bound: %v, %v, %d listings", bad, err, r.lists.Load())
	}
	ask := append([]uploader.Object{}, objs[200:220]...)
	ask[0].Size = 9
	ask = append(ask, uploader.Object{Key: manifests.SharedKey("job", fmt.Sprintf("%064x", 999), 8), Size: 8})
	bad, err := p.Check(ctx, ask)
	if err != nil || len(bad) != 2 || !bad[0].Found || bad[0].Stored != 8 || bad[1].Found {
		t.Fatalf("a wrong size and a missing object: %+v, %v", bad, err)
	}
}

// populate writes n small objects under job/shared/ directly in the file
// store's directory (fast) and returns them.
func populate(b testing.TB, root string, n int) []uploader.Object {
	objs := make([]uploader.Object, n)
	for i := range objs {
		sha := fmt.Sprintf("%064x", i)
		key := manifests.SharedKey("job", sha, 8)
		p := filepath.Join(root, filepath.FromSlash(key))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("12345678"), 0o644); err != nil {
			b.Fatal(err)
		}
		objs[i] = uploader.Object{Key: key, Size: 8}
	}
	return objs
}

// BenchmarkPresence measures one confirmation of n reused objects on
// file:// storage that observes them all again: one listing of the shared
// prefix, or one Stat per object.
func BenchmarkPresence(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		root := b.TempDir()
		objs := populate(b, root, n)
		st, err := file.New(root)
		if err != nil {
			b.Fatal(err)
		}
		for _, mode := range []string{"list", "stat"} {
			b.Run(fmt.Sprintf("%s/%d", mode, n), func(b *testing.B) {
				p := uploader.NewPresence(st, manifests.SharedPrefix("job"), 0)
				p.StatMax = n + 1 // stat every one
				if mode == "list" {
					p.StatMax = -1
				}
				for b.Loop() {
					bad, err := p.Check(context.Background(), objs)
					if err != nil || len(bad) != 0 {
						b.Fatalf("%v %v", bad, err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/object")
			})
		}
	}
}
