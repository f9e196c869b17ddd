package e2e

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ckpt-io/ckpt/client"
	ckptpebble "github.com/ckpt-io/ckpt/client/pebble"
)

// rescaleResult is `ckpt restore --rescale-from --json`.
type rescaleResult struct {
	Restored     bool   `json:"restored"`
	Task         string `json:"task"`
	Checkpoint   uint64 `json:"checkpoint"`
	Files        int    `json:"files"`
	Bytes        int64  `json:"bytes"`
	BytesInRange int64  `json:"bytes_in_range"`
	FilesFetched int    `json:"files_fetched"`
	FilesSkipped int    `json:"files_skipped"`
	Keys         int64  `json:"keys"`
	Verified     bool   `json:"verified"`
	// TablesIngested counts the old tables ingested unchanged.
	TablesIngested int    `json:"tables_ingested"`
	BytesIngested  int64  `json:"bytes_ingested"`
	DeltaKeys      int64  `json:"delta_keys"`
	Target         string `json:"target"`
	Tasks          []struct {
		Task         string `json:"task"`
		Keys         int64  `json:"keys"`
		FilesFetched int    `json:"files_fetched"`
	} `json:"tasks"`
}

// rescaleKeys is the key space of the rescale tests: ids 0..rescaleKeys-1
// as 4-byte big-endian keys, range-partitioned over the old tasks.
const rescaleKeys = 16000

func rescaleKey(id int) []byte { return binary.BigEndian.AppendUint32(nil, uint32(id)) }

// kvModel is what a store should hold.
type kvModel map[string]string

// in returns the model's keys in [start, end) (nil: open), sorted.
func (m kvModel) in(start, end []byte) []string {
	var ks []string
	for k := range m {
		if (start == nil || k >= string(start)) && (end == nil || k < string(end)) {
			ks = append(ks, k)
		}
	}
	slices.Sort(ks)
	return ks
}

// storeEquals opens the Pebble store in dir and requires it to hold
// exactly the model's keys in [start, end), with their values.
func storeEquals(t *testing.T, dir string, m kvModel, start, end []byte) {
	t.Helper()
	db, err := pebble.Open(dir, &pebble.Options{ReadOnly: true, Logger: quietLog{}})
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	defer db.Close()
	it, err := db.NewIter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	want := m.in(start, end)
	i := 0
	for valid := it.First(); valid; valid = it.Next() {
		k := string(it.Key())
		if i >= len(want) || k != want[i] {
			t.Fatalf("%s: key %x at position %d, want %s", dir, k, i, describeWant(want, i))
		}
		if v := string(it.Value()); v != m[k] {
			t.Fatalf("%s: key %x holds %q, want %q", dir, k, v, m[k])
		}
		i++
	}
	if i != len(want) {
		t.Fatalf("%s: %d keys, want %d", dir, i, len(want))
	}
}

func describeWant(want []string, i int) string {
	if i >= len(want) {
		return "no more keys"
	}
	return hex.EncodeToString([]byte(want[i]))
}

type quietLog struct{}

func (quietLog) Infof(string, ...any)              {}
func (quietLog) Errorf(string, ...any)             {}
func (quietLog) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

// rescaleApp is one old task: a Pebble store holding the ids [lo, hi).
type rescaleApp struct {
	task   string
	dir    string
	db     *pebble.DB
	lo, hi int
	m      kvModel
	rng    *rand.Rand
}

func (a *rescaleApp) put(t *testing.T, id, version int) {
	k := rescaleKey(id)
	fill := make([]byte, 50+id%100)
	for i := range fill {
		fill[i] = byte(a.rng.Uint32())
	}
	v := fmt.Sprintf("%s/%d/v%d/%x", a.task, id, version, fill)
	if err := a.db.Set(k, []byte(v), pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	a.m[string(k)] = v
}

func (a *rescaleApp) del(t *testing.T, id int) {
	k := rescaleKey(id)
	if err := a.db.Delete(k, pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	delete(a.m, string(k))
}

// round overwrites and deletes a share of the task's keys and, with
// flush, flushes the memtable: after a few rounds the store has tables in
// several levels, tombstones over older values, and a WAL tail.
func (a *rescaleApp) round(t *testing.T, version int, flush bool) {
	for id := a.lo; id < a.hi; id++ {
		switch r := a.rng.IntN(10); {
		case version == 0 || r < 3:
			a.put(t, id, version)
		case r < 5:
			a.del(t, id)
		}
	}
	if flush {
		if err := a.db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
}

// A job of 4 Pebble tasks, each owning a contiguous quarter of the keys,
// takes job-wide checkpoints 1 and 2 (and 3 for one task only). It is
// rescaled to 3 tasks and to 6: each new task's store, built from
// checkpoint 2 by ckpt restore --rescale-from, holds exactly the old
// stores' keys in its range, fetching no table outside it; then each new
// task checkpoints through an agent, checkpoints again incrementally, and
// restores.
func TestRescaleRestoreBuildsEachNewTaskFromTheOldTasksKeyRanges(t *testing.T) {
	base := t.TempDir()
	storageDir := filepath.Join(base, "storage")
	apps := filepath.Join(base, "apps")
	const job = "rescale"
	cfg := agentConfig{Socket: filepath.Join(shortDir(t), "ckpt.sock"), StorageDir: storageDir, Job: job,
		LocalDir: filepath.Join(apps, "local"), AllowRoots: []string{apps}}
	if err := os.MkdirAll(apps, 0o755); err != nil {
		t.Fatal(err)
	}
	startAgent(t, "agent", cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	const oldN = 4
	var olds []*rescaleApp
	var tasks []string
	for i := range oldN {
		a := &rescaleApp{task: fmt.Sprintf("old-%d", i), dir: filepath.Join(apps, fmt.Sprintf("old-%d", i)),
			lo: i * rescaleKeys / oldN, hi: (i + 1) * rescaleKeys / oldN, m: kvModel{}, rng: rand.New(rand.NewPCG(uint64(i), 9))}
		a.db, err = pebble.Open(a.dir, &pebble.Options{MemTableSize: 256 << 10, Logger: quietLog{}})
		if err != nil {
			t.Fatal(err)
		}
		defer a.db.Close()
		olds = append(olds, a)
		tasks = append(tasks, a.task)
	}
	checkpoint := func(a *rescaleApp, n uint64, tasks []string) {
		t.Helper()
		dir, err := ckptpebble.Snapshot(a.db, a.dir, n)
		if err != nil {
			t.Fatal(err)
		}
		p, err := c.Send(ctx, client.Request{Task: a.task, Checkpoint: n, Dir: dir, Tasks: tasks, Engine: "pebble", Handoff: true})
		if err != nil {
			t.Fatalf("checkpoint %d of %s: %v", n, a.task, err)
		}
		if _, err := p.Wait(ctx); err != nil {
			t.Fatalf("checkpoint %d of %s: %v", n, a.task, err)
		}
	}
	// Version 0 writes every key; later rounds overwrite and delete, the
	// last one stays in the memtable (the checkpoint's WAL holds it).
	for _, a := range olds {
		a.round(t, 0, true)
		a.round(t, 1, true)
		if err := a.db.Compact(ctx, rescaleKey(a.lo), rescaleKey(a.lo+(a.hi-a.lo)/2), true); err != nil {
			t.Fatal(err)
		}
		a.round(t, 2, true)
		checkpoint(a, 1, tasks)
	}
	model := kvModel{}
	for _, a := range olds {
		a.round(t, 3, true)
		a.round(t, 4, false)
		checkpoint(a, 2, tasks)
		for k, v := range a.m {
			model[k] = v
		}
	}
	// Checkpoint 3 of one task alone is not job-complete: rescale reads 2.
	olds[0].round(t, 5, true)
	checkpoint(olds[0], 3, tasks)

	storage := "file://" + storageDir
	from := "old-0,old-1,old-2,old-3"
	var fullBytes int64
	oldObjects := map[string]bool{} // the shared objects of checkpoint 2
	for _, task := range tasks {
		m := readManifest(t, storageDir, job, task, 2)
		fullBytes += m.FullSize
		for _, f := range m.Files {
			if f.Kind == "shared" {
				oldObjects[f.Key] = true
			}
		}
	}
	bound := func(id int) string {
		if id <= 0 || id >= rescaleKeys {
			return ""
		}
		return hex.EncodeToString(rescaleKey(id))
	}
	n := uint64(100)
	for _, newN := range []int{3, 6} {
		t.Run(fmt.Sprintf("4 to %d", newN), func(t *testing.T) {
			skipped := 0
			for j := range newN {
				lo, hi := j*rescaleKeys/newN, (j+1)*rescaleKeys/newN
				kr := bound(lo) + ":" + bound(hi)
				start, end := rescaleKey(lo), rescaleKey(hi)
				if j == 0 {
					start = nil
				}
				if j == newN-1 {
					end = nil
				}
				target := filepath.Join(apps, fmt.Sprintf("new%d-%d", newN, j))
				task := fmt.Sprintf("new%d-%d", newN, j)
				var res rescaleResult
				ckptJSON(t, &res, "restore", "--storage", storage, "--job", job, "--rescale-from", from,
					"--key-range", kr, "--engine", "pebble", "--target", target, "--task", task, "--json")
				t.Logf("4->%d task %d [%s): %d keys, %d B fetched of %d B in checkpoint 2, %d B of the old stores in the range, %d files fetched, %d skipped; %d tables (%d B) ingested unchanged, %d keys in the overlay",
					newN, j, kr, res.Keys, res.Bytes, fullBytes, res.BytesInRange, res.FilesFetched, res.FilesSkipped, res.TablesIngested, res.BytesIngested, res.DeltaKeys)
				if res.TablesIngested == 0 {
					t.Fatalf("rescale restore %s ingested no old table unchanged: %+v", kr, res)
				}
				if !res.Restored || !res.Verified || res.Checkpoint != 2 || res.Target != target || res.Task != task {
					t.Fatalf("rescale restore %s: %+v", kr, res)
				}
				if want := len(model.in(start, end)); res.Keys != int64(want) {
					t.Fatalf("rescale restore %s: %d keys, want %d", kr, res.Keys, want)
				}
				if res.Bytes <= 0 || res.Bytes >= fullBytes {
					t.Fatalf("rescale restore %s fetched %d B, checkpoint 2 of all tasks is %d B: want a part of it", kr, res.Bytes, fullBytes)
				}
				skipped += res.FilesSkipped
				storeEquals(t, target, model, start, end)

				// The new task lives on: two checkpoints through the agent
				// (the second uploads only its new tables), then a restore.
				a := &rescaleApp{task: task, dir: target, lo: lo, hi: hi, m: kvModel{}, rng: rand.New(rand.NewPCG(uint64(newN), uint64(j)))}
				for _, k := range model.in(start, end) {
					a.m[k] = model[k]
				}
				a.db, err = pebble.Open(target, &pebble.Options{MemTableSize: 256 << 10, Logger: quietLog{}, DisableAutomaticCompactions: true})
				if err != nil {
					t.Fatal(err)
				}
				defer a.db.Close()
				n++
				dir, err := ckptpebble.Snapshot(a.db, a.dir, n)
				if err != nil {
					t.Fatal(err)
				}
				first := trigger(t, cfg.Socket, task, n, dir)
				// The first checkpoint reuses the old objects the store
				// ingested unchanged: it uploads only the other tables (or
				// reuses them too, when a new task of the other rescale
				// uploaded the same bytes).
				reused := 0
				for _, f := range readManifest(t, storageDir, job, task, n).Files {
					if f.Kind != "shared" {
						continue
					}
					if oldObjects[f.Key] {
						if f.Uploaded {
							t.Fatalf("%s's first checkpoint uploaded %s again, an old task's object %s", task, f.Name, f.Key)
						}
						reused++
					}
				}
				if first.FilesReused == 0 || reused < res.TablesIngested {
					t.Fatalf("%s's first checkpoint reused %d files (%d old tables), want the %d tables ingested unchanged: %+v", task, first.FilesReused, reused, res.TablesIngested, first)
				}
				for id := lo; id < lo+50; id++ {
					a.put(t, id, 9)
				}
				if err := a.db.Flush(); err != nil {
					t.Fatal(err)
				}
				n++
				dir, err = ckptpebble.Snapshot(a.db, a.dir, n)
				if err != nil {
					t.Fatal(err)
				}
				second := trigger(t, cfg.Socket, task, n, dir)
				t.Logf("%s: first checkpoint uploaded %d files (%d B), the next %d files (%d B), reused %d", task,
					first.FilesUploaded, first.CheckpointSize, second.FilesUploaded, second.CheckpointSize, second.FilesReused)
				// The next uploads only the tables the first did not name.
				inFirst := map[string]bool{}
				for _, f := range readManifest(t, storageDir, job, task, n-1).Files {
					inFirst[f.Key] = f.Kind == "shared"
				}
				for _, f := range readManifest(t, storageDir, job, task, n).Files {
					if f.Kind == "shared" && inFirst[f.Key] && f.Uploaded {
						t.Fatalf("%s: the checkpoint after the first uploaded %s again: %+v after %+v", task, f.Name, second, first)
					}
				}
				if second.FilesReused == 0 || second.CheckpointSize >= second.FullSize/2 {
					t.Fatalf("%s: the checkpoint after the first is not incremental: %+v after %+v", task, second, first)
				}
				restored := filepath.Join(base, "restored-"+task)
				var rr restoreResult
				ckptJSON(t, &rr, "restore", "--storage", storage, "--job", job, "--task", task, "--target", restored, "--json")
				if !rr.Restored || rr.Checkpoint != n {
					t.Fatalf("restore of %s: %+v", task, rr)
				}
				storeEquals(t, restored, a.m, nil, nil)
			}
			if skipped == 0 {
				t.Fatalf("4->%d: no rescale restore left a table outside its range unfetched", newN)
			}
		})
	}
}

// Bad requests fail with a clear error before anything is written.
func TestRescaleRestoreRefusesBadRequests(t *testing.T) {
	base := t.TempDir()
	storageDir := filepath.Join(base, "storage")
	apps := filepath.Join(base, "apps")
	const job = "rescale-bad"
	cfg := agentConfig{Socket: filepath.Join(shortDir(t), "ckpt.sock"), StorageDir: storageDir, Job: job,
		LocalDir: filepath.Join(apps, "local"), AllowRoots: []string{apps}}
	if err := os.MkdirAll(apps, 0o755); err != nil {
		t.Fatal(err)
	}
	startAgent(t, "agent", cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// a holds "a", b holds "b", c holds "a" and "c": c overlaps a.
	tasks := []string{"a", "b", "c"}
	for _, task := range tasks {
		dir := filepath.Join(apps, task)
		db, err := pebble.Open(dir, &pebble.Options{Logger: quietLog{}})
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Set([]byte(task), []byte("v"), nil); err != nil {
			t.Fatal(err)
		}
		if task == "c" {
			if err := db.Set([]byte("a"), []byte("v"), nil); err != nil {
				t.Fatal(err)
			}
		}
		for n := uint64(1); n <= 2; n++ {
			if n == 2 && task != "a" {
				break // checkpoint 2 is not job-complete
			}
			snap, err := ckptpebble.Snapshot(db, dir, n)
			if err != nil {
				t.Fatal(err)
			}
			p, err := c.Send(ctx, client.Request{Task: task, Checkpoint: n, Dir: snap, Tasks: tasks, Engine: "pebble", Handoff: true})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
		db.Close()
	}
	storage := "file://" + storageDir
	target := filepath.Join(base, "new")
	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{"start not below end", []string{"--rescale-from", "a,b", "--key-range", "80:40", "--engine", "pebble"}, 2},
		{"equal bounds", []string{"--rescale-from", "a,b", "--key-range", "40:40", "--engine", "pebble"}, 2},
		{"bounds that are not hex", []string{"--rescale-from", "a,b", "--key-range", "zz:", "--engine", "pebble"}, 2},
		{"no colon", []string{"--rescale-from", "a,b", "--key-range", "40", "--engine", "pebble"}, 2},
		{"another engine", []string{"--rescale-from", "a,b", "--key-range", ":", "--engine", "rocksdb"}, 2},
		{"no engine", []string{"--rescale-from", "a,b", "--key-range", ":"}, 2},
		{"a bad task name", []string{"--rescale-from", "a,../b", "--key-range", ":", "--engine", "pebble"}, 2},
		{"a task named twice", []string{"--rescale-from", "a,a", "--key-range", ":", "--engine", "pebble"}, 2},
		{"an unknown task", []string{"--rescale-from", "a,zz", "--key-range", ":", "--engine", "pebble"}, 1},
		{"a checkpoint not complete for every task", []string{"--rescale-from", "a,b", "--key-range", ":", "--engine", "pebble", "--checkpoint", "2"}, 1},
		{"old tasks whose keys overlap", []string{"--rescale-from", "a,c", "--key-range", ":", "--engine", "pebble"}, 1},
		{"a task not named holds keys in the range", []string{"--rescale-from", "a,b", "--key-range", ":62", "--engine", "pebble"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"restore", "--storage", storage, "--job", job, "--target", target}, tc.args...)
			r := runCkpt(t, args...)
			t.Logf("stderr: %s", r.Stderr)
			if r.Code != tc.code || len(r.Stderr) == 0 {
				t.Fatalf("exit %d, want %d; stderr: %s", r.Code, tc.code, r.Stderr)
			}
			entries, err := os.ReadDir(base)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				if e.Name() != "storage" && e.Name() != "apps" {
					t.Fatalf("a refused rescale restore left %s behind (stderr: %s)", e.Name(), r.Stderr)
				}
			}
		})
	}
	// The same tasks at checkpoint 1 (job-complete) rescale fine with
	// --partial (c's key a is left out), and the drill reports both times.
	var res rescaleResult
	ckptJSON(t, &res, "restore", "--storage", storage, "--job", job, "--rescale-from", "a,b", "--key-range", ":62", "--engine", "pebble", "--partial", "--target", target, "--json")
	if !res.Restored || res.Checkpoint != 1 || res.Keys != 1 {
		t.Fatalf("rescale restore of [, 62): %+v, want checkpoint 1 with key a", res)
	}
	storeEquals(t, target, kvModel{"a": "v"}, nil, nil)
	var drill struct {
		Checkpoint      uint64  `json:"checkpoint"`
		DurationMS      *int64  `json:"duration_ms"`
		Bytes           int64   `json:"bytes"`
		PlainDurationMS *int64  `json:"plain_duration_ms"`
		PlainBytes      int64   `json:"plain_bytes"`
		TimeRatio       float64 `json:"time_ratio"`
		Verified        bool    `json:"verified"`
	}
	ckptJSON(t, &drill, "drill", "--storage", storage, "--job", job, "--rescale-from", "a,b", "--key-range", ":62", "--engine", "pebble", "--partial", "--json")
	if drill.Checkpoint != 1 || !drill.Verified || drill.DurationMS == nil || drill.PlainDurationMS == nil || drill.Bytes <= 0 || drill.PlainBytes <= 0 {
		t.Fatalf("drill --rescale-from: %+v", drill)
	}
}
