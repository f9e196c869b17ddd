package pebble_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"pgregory.net/rapid"

	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage/file"
	"github.com/ckpt-io/ckpt/uploader"
)

// rescaleKeySpace is the key space of the model: ids as 2-byte keys.
const rescaleKeySpace = 300

func modelKey(id int) []byte { return binary.BigEndian.AppendUint16(nil, uint16(id)) }

// tb is what the helpers need of a *testing.T or a *rapid.T.
type tb interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

type silent struct{}

func (silent) Infof(string, ...any)              {}
func (silent) Errorf(string, ...any)             {}
func (silent) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

// modelStore is one old task: a Pebble store with tiny tables (so that a
// range has tables inside it, straddling it and outside it) and the map
// of what it should hold.
type modelStore struct {
	task string
	dir  string
	db   *pebble.DB
	m    map[string]string
}

func openModelStore(t tb, dir, task string) *modelStore {
	opts := &pebble.Options{Logger: silent{}, MemTableSize: 64 << 10, DisableAutomaticCompactions: true}
	for i := range opts.TargetFileSizes {
		opts.TargetFileSizes[i] = 2 << 10
	}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return &modelStore{task: task, dir: dir, db: db, m: map[string]string{}}
}

// checkpointJob checks each store in as job-wide checkpoint n of the
// tasks (a Pebble checkpoint with its WAL, uploaded and committed as the
// agent does).
func checkpointJob(t tb, st *file.Store, local *localrecovery.Store, n uint64, stores []*modelStore) {
	ctx := context.Background()
	var tasks []string
	for _, s := range stores {
		tasks = append(tasks, s.task)
	}
	for _, s := range stores {
		snap := filepath.Join(filepath.Dir(s.dir), fmt.Sprintf("%s-chk-%d", s.task, n))
		if err := s.db.Checkpoint(snap, pebble.WithFlushedWAL()); err != nil {
			t.Fatal(err)
		}
		sn, err := local.Take(s.task, n, snap, false)
		if err == nil {
			err = sn.Inspect()
		}
		if err != nil {
			t.Fatal(err)
		}
		res, err := uploader.Upload(ctx, uploader.Request{Store: st, Job: "job", Task: s.task, Checkpoint: n, Snapshot: sn})
		if err != nil {
			t.Fatal(err)
		}
		m := &manifests.Manifest{Job: "job", Task: s.task, Checkpoint: n, Created: time.Now(), Files: res.Files, Tasks: tasks, Engine: "pebble"}
		for _, f := range res.Files {
			m.FullSize += f.Size
		}
		enc, _ := m.Encode(res.BytesWritten)
		if err := manifests.Commit(ctx, st, m, enc); err != nil {
			t.Fatal(err)
		}
		os.RemoveAll(snap)
	}
}

// requireStore opens the store in dir as an app does (default options)
// and requires it to hold exactly want's keys in [start, end).
func requireStore(t tb, dir string, want map[string]string, start, end []byte) {
	db, err := pebble.Open(dir, &pebble.Options{Logger: silent{}})
	if err != nil {
		t.Fatalf("open the rescaled store with default options: %v", err)
	}
	defer db.Close()
	var ks []string
	for k := range want {
		if (start == nil || k >= string(start)) && (end == nil || k < string(end)) {
			ks = append(ks, k)
		}
	}
	slices.Sort(ks)
	it, err := db.NewIter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	i := 0
	for valid := it.First(); valid; valid = it.Next() {
		if i >= len(ks) || string(it.Key()) != ks[i] {
			next := "no more keys"
			if i < len(ks) {
				next = fmt.Sprintf("%x", ks[i])
			}
			t.Fatalf("the rescaled store holds key %x at position %d, want %s", it.Key(), i, next)
		}
		if string(it.Value()) != want[ks[i]] {
			t.Fatalf("key %x holds %q, want %q", it.Key(), it.Value(), want[ks[i]])
		}
		i++
	}
	if i != len(ks) {
		t.Fatalf("the rescaled store holds %d keys, want %d", i, len(ks))
	}
}

// Random workloads on up to three range-partitioned Pebble tasks (sets,
// overwrites, merges, deletes, range deletes, flushes and compactions at
// random points, a WAL tail), rescaled to a random range: the new store
// holds, key by key, what the old stores hold in the range, whichever way
// each task took (tables ingested unchanged under an overlay, or keys
// rewritten).
func TestRescaleEqualsTheOldStoresRestrictedToTheRange(t *testing.T) {
	var ingested, rewritten, delta int
	root := fastTempDir(t)
	rapid.Check(t, func(rt *rapid.T) {
		base, err := os.MkdirTemp(root, "model-")
		if err != nil {
			rt.Fatal(err)
		}
		defer os.RemoveAll(base)
		st, _ := file.New(filepath.Join(base, "store"))
		local, err := localrecovery.Open(filepath.Join(base, "local"), "job")
		if err != nil {
			rt.Fatal(err)
		}
		nTasks := rapid.IntRange(1, 3).Draw(rt, "tasks")
		var stores []*modelStore
		union := map[string]string{}
		for i := range nTasks {
			s := openModelStore(rt, filepath.Join(base, fmt.Sprintf("old-%d", i)), fmt.Sprintf("old-%d", i))
			defer s.db.Close()
			lo, hi := i*rescaleKeySpace/nTasks, (i+1)*rescaleKeySpace/nTasks
			own := rapid.IntRange(lo, hi-1)
			version := 0
			set := func(id int) {
				version++
				k := modelKey(id)
				v := fmt.Sprintf("%s/%d/%d/%s", s.task, id, version, strings.Repeat("x", id%40))
				if err := s.db.Set(k, []byte(v), pebble.NoSync); err != nil {
					rt.Fatal(err)
				}
				s.m[string(k)] = v
			}
			// Every key once, compacted to the bottom (sequence number zero).
			for id := lo; id < hi; id++ {
				if rapid.IntRange(0, 3).Draw(rt, "initial") > 0 {
					set(id)
				}
			}
			if err := s.db.Compact(context.Background(), []byte{0}, []byte{0xff, 0xff, 0xff}, false); err != nil {
				rt.Fatal(err)
			}
			ops := rapid.IntRange(0, 60).Draw(rt, "ops")
			for range ops {
				switch op := rapid.IntRange(0, 11).Draw(rt, "op"); {
				case op < 4:
					set(own.Draw(rt, "set"))
				case op < 5:
					id := own.Draw(rt, "merge")
					k := modelKey(id)
					if err := s.db.Merge(k, []byte("+m"), pebble.NoSync); err != nil {
						rt.Fatal(err)
					}
					s.m[string(k)] += "+m"
				case op < 7:
					k := modelKey(own.Draw(rt, "delete"))
					if err := s.db.Delete(k, pebble.NoSync); err != nil {
						rt.Fatal(err)
					}
					delete(s.m, string(k))
				case op < 8:
					// Range deletions may reach into other tasks' keys (the
					// store holds none there).
					a := rapid.IntRange(max(0, lo-20), min(rescaleKeySpace, hi+20)).Draw(rt, "from")
					b := rapid.IntRange(a, min(rescaleKeySpace, a+40)).Draw(rt, "to")
					if err := s.db.DeleteRange(modelKey(a), modelKey(b), pebble.NoSync); err != nil {
						rt.Fatal(err)
					}
					for k := range s.m {
						if k >= string(modelKey(a)) && k < string(modelKey(b)) {
							delete(s.m, k)
						}
					}
				case op < 10:
					if err := s.db.Flush(); err != nil {
						rt.Fatal(err)
					}
				case op < 11:
					a := own.Draw(rt, "compact from")
					b := rapid.IntRange(a+1, hi).Draw(rt, "compact to")
					if err := s.db.Compact(context.Background(), modelKey(a), modelKey(b), false); err != nil {
						rt.Fatal(err)
					}
				default:
					if err := s.db.Compact(context.Background(), []byte{0}, []byte{0xff, 0xff, 0xff}, false); err != nil {
						rt.Fatal(err)
					}
				}
			}
			stores = append(stores, s)
			for k, v := range s.m {
				union[k] = v
			}
		}
		checkpointJob(rt, st, local, 1, stores)
		var start, end []byte
		a := rapid.IntRange(-1, rescaleKeySpace).Draw(rt, "start")
		b := rapid.IntRange(a+1, rescaleKeySpace+1).Draw(rt, "end")
		if a >= 0 {
			start = modelKey(a)
		}
		if b <= rescaleKeySpace {
			end = modelKey(b)
		}
		var from []string
		for _, s := range stores {
			from = append(from, s.task)
		}
		target := filepath.Join(base, "new")
		res, err := restore.Rescale(context.Background(), restore.RescaleOptions{Store: st, Job: "job", From: from,
			Start: start, End: end, Engine: "pebble", Target: target, Parallelism: 2})
		if err != nil {
			rt.Fatalf("rescale [%x, %x): %v", start, end, err)
		}
		if !res.Verified {
			rt.Fatalf("rescale: not verified: %+v", res)
		}
		for _, tk := range res.Tasks {
			if tk.Rewritten == "" {
				ingested++
			} else {
				rewritten++
			}
			if tk.DeltaKeys > 0 {
				delta++
			}
		}
		requireStore(rt, target, union, start, end)
	})
	t.Logf("tasks whose tables were ingested: %d (%d with an overlay), rewritten: %d", ingested, delta, rewritten)
	if ingested == 0 || delta == 0 {
		t.Fatalf("no task took the fast path with an overlay: the property says nothing about it")
	}
}

// A store whose bottom tables are clean and whose newer writes delete and
// overwrite some of their keys (point deletions and a range deletion in a
// flushed table, a deletion and a range deletion in the WAL): the rescaled
// store ingests the clean tables and shows none of the deleted keys. If
// the overlay dropped a deletion, the deleted key would show through from
// the clean table and the restore would fail its check.
func TestRescaleOverlayKeepsTheOldStoresDeletions(t *testing.T) {
	base := t.TempDir()
	st, _ := file.New(filepath.Join(base, "store"))
	local, err := localrecovery.Open(filepath.Join(base, "local"), "job")
	if err != nil {
		t.Fatal(err)
	}
	s := openModelStore(t, filepath.Join(base, "old"), "old")
	defer s.db.Close()
	put := func(id int, v string) {
		if err := s.db.Set(modelKey(id), []byte(v), nil); err != nil {
			t.Fatal(err)
		}
		s.m[string(modelKey(id))] = v
	}
	del := func(a, b int) {
		var err error
		if b == a+1 {
			err = s.db.Delete(modelKey(a), nil)
		} else {
			err = s.db.DeleteRange(modelKey(a), modelKey(b), nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		for id := a; id < b; id++ {
			delete(s.m, string(modelKey(id)))
		}
	}
	for id := range 200 {
		put(id, fmt.Sprintf("v0-%d-%s", id, strings.Repeat("y", 50)))
	}
	if err := s.db.Compact(context.Background(), []byte{0}, []byte{0xff}, false); err != nil {
		t.Fatal(err)
	}
	del(10, 11)
	del(40, 60)
	put(45, "back")
	put(70, "new")
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	del(90, 91)
	del(120, 130)
	checkpointJob(t, st, local, 1, []*modelStore{s})
	target := filepath.Join(base, "new")
	res, err := restore.Rescale(context.Background(), restore.RescaleOptions{Store: st, Job: "job", From: []string{"old"},
		Start: modelKey(5), End: modelKey(150), Engine: "pebble", Target: target})
	if err != nil {
		t.Fatal(err)
	}
	tk := res.Tasks[0]
	t.Logf("%d tables ingested (%d B), %d keys in the overlay, rewritten %q", tk.TablesIngested, tk.BytesIngested, tk.DeltaKeys, tk.Rewritten)
	if tk.Rewritten != "" || tk.TablesIngested == 0 || tk.DeltaKeys < 1+20+1+10 {
		t.Fatalf("the fast path was not taken with the deletions in its overlay: %+v", tk)
	}
	requireStore(t, target, s.m, modelKey(5), modelKey(150))
}

// The tables ingested unchanged keep the old objects' bytes: the new
// store's tables include files whose digest is that of an old table.
func TestRescaleIngestsCleanTablesByteForByte(t *testing.T) {
	base := t.TempDir()
	st, _ := file.New(filepath.Join(base, "store"))
	local, err := localrecovery.Open(filepath.Join(base, "local"), "job")
	if err != nil {
		t.Fatal(err)
	}
	s := openModelStore(t, filepath.Join(base, "old"), "old")
	defer s.db.Close()
	for id := range 200 {
		if err := s.db.Set(modelKey(id), bytes.Repeat([]byte{byte(id)}, 60), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.db.Compact(context.Background(), []byte{0}, []byte{0xff}, false); err != nil {
		t.Fatal(err)
	}
	checkpointJob(t, st, local, 1, []*modelStore{s})
	m, _, err := manifests.LoadEncoded(context.Background(), st, "job", "old", 1)
	if err != nil {
		t.Fatal(err)
	}
	old := map[string]bool{} // the old tables' digests, by their own algorithm
	algs := map[manifests.Alg]bool{}
	for _, f := range m.Files {
		if f.Kind == manifests.Shared {
			old[f.Digest()] = true
			algs[f.Alg()] = true
		}
	}
	target := filepath.Join(base, "new")
	res, err := restore.Rescale(context.Background(), restore.RescaleOptions{Store: st, Job: "job", From: []string{"old"},
		Start: modelKey(50), End: modelKey(150), Engine: "pebble", Target: target})
	if err != nil {
		t.Fatal(err)
	}
	same := 0
	entries, _ := os.ReadDir(target)
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".sst") {
			continue
		}
		for alg := range algs {
			d, _, err := manifests.HashFile(context.Background(), filepath.Join(target, e.Name()), alg)
			if err != nil {
				t.Fatal(err)
			}
			if old[d] {
				same++
				break
			}
		}
	}
	if same == 0 || same != res.TablesIngested {
		t.Fatalf("%d of the new store's tables are old tables byte for byte, %d were ingested unchanged", same, res.TablesIngested)
	}
}

// fastTempDir is a temporary directory on /dev/shm when it is a
// writable directory (a tmpfs on Linux), else t.TempDir(): each case of
// the model test makes a dozen small stores, and the fsyncs of a shared
// disk, not the code under test, would take nearly all of its time.
func fastTempDir(t *testing.T) string {
	if dir, err := os.MkdirTemp("/dev/shm", "ckpt-rescale-"); err == nil {
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return t.TempDir()
}

// Task a once held the keys task b holds now, and deleted them: a's clean
// table still holds them under its range deletion. Ingesting a's tables
// would bring them back over b's (or b's over a's deletion): the tasks
// whose tables meet another's keys are rewritten, and the result is right.
func TestRescaleRewritesTasksWhoseTablesMeetAnothersKeys(t *testing.T) {
	base := fastTempDir(t)
	st, _ := file.New(filepath.Join(base, "store"))
	local, err := localrecovery.Open(filepath.Join(base, "local"), "job")
	if err != nil {
		t.Fatal(err)
	}
	a := openModelStore(t, filepath.Join(base, "a"), "a")
	defer a.db.Close()
	b := openModelStore(t, filepath.Join(base, "b"), "b")
	defer b.db.Close()
	// Even ids, a flush, odd ids: a compaction then rewrites both tables
	// into one at sequence number zero (a lone table would only move).
	for _, odd := range []int{0, 1} {
		for id := odd; id < 100; id += 2 {
			if err := a.db.Set(modelKey(id), []byte(fmt.Sprintf("a%d", id)), nil); err != nil {
				t.Fatal(err)
			}
			if id < 50 {
				a.m[string(modelKey(id))] = fmt.Sprintf("a%d", id)
			}
			if id >= 50 {
				if err := b.db.Set(modelKey(id), []byte(fmt.Sprintf("b%d", id)), nil); err != nil {
					t.Fatal(err)
				}
				b.m[string(modelKey(id))] = fmt.Sprintf("b%d", id)
			}
		}
		for _, s := range []*modelStore{a, b} {
			if err := s.db.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, s := range []*modelStore{a, b} {
		if err := s.db.Compact(context.Background(), []byte{0}, []byte{0xff}, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.db.DeleteRange(modelKey(50), modelKey(100), nil); err != nil {
		t.Fatal(err)
	}
	if err := a.db.Flush(); err != nil {
		t.Fatal(err)
	}
	checkpointJob(t, st, local, 1, []*modelStore{a, b})
	target := filepath.Join(base, "new")
	res, err := restore.Rescale(context.Background(), restore.RescaleOptions{Store: st, Job: "job", From: []string{"a", "b"},
		Engine: "pebble", Target: target})
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range res.Tasks {
		t.Logf("%s: %d keys, rewritten %q", tk.Task, tk.Keys, tk.Rewritten)
		if !strings.Contains(tk.Rewritten, "overlap") {
			t.Errorf("task %s was not rewritten for its overlap: %+v", tk.Task, tk)
		}
	}
	union := map[string]string{}
	for _, s := range []*modelStore{a, b} {
		for k, v := range s.m {
			union[k] = v
		}
	}
	requireStore(t, target, union, nil, nil)
}
