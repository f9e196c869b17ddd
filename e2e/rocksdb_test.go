//go:build rocksdb

// The RocksDB engine plugin end to end. This file needs librocksdb-dev and
// builds only with -tags rocksdb (scripts/test.sh runs it so):
//
//	go test -count=1 -tags rocksdb -run RocksDB ./e2e/

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/linxGnu/grocksdb"

	"github.com/ckpt-io/ckpt/plugins"
)

// buildRocksDBPlugin builds ckpt-plugin-rocksdb (with -tags rocksdb, as
// docs/plugins.md says) into a new plugin directory.
func buildRocksDBPlugin(t *testing.T) string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-tags", "rocksdb", "-o", dir+"/", "./plugins/ckpt-plugin-rocksdb")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build -tags rocksdb ./plugins/ckpt-plugin-rocksdb: %v\n%s", err, out)
	}
	return dir
}

// rocksApp is the application: a RocksDB store it writes through grocksdb
// and checkpoints with RocksDB's Checkpoint API.
type rocksApp struct {
	t    *testing.T
	db   *grocksdb.DB
	opts *grocksdb.Options
	wo   *grocksdb.WriteOptions
	fo   *grocksdb.FlushOptions
	keys int
}

func openRocksApp(t *testing.T, dir string) *rocksApp {
	t.Helper()
	opts := grocksdb.NewDefaultOptions()
	opts.SetCreateIfMissing(true)
	opts.EnableBlobFiles(true)
	opts.SetMinBlobSize(1024)
	opts.SetDisableAutoCompactions(true) // the checkpoints below reuse every table file
	db, err := grocksdb.OpenDb(opts, dir)
	if err != nil {
		t.Fatal(err)
	}
	a := &rocksApp{t: t, db: db, opts: opts, wo: grocksdb.NewDefaultWriteOptions(), fo: grocksdb.NewDefaultFlushOptions()}
	a.fo.SetWait(true)
	t.Cleanup(func() {
		a.db.Close()
		a.wo.Destroy()
		a.fo.Destroy()
		a.opts.Destroy()
	})
	return a
}

// write puts n new keys (one in ten with a value large enough for a blob
// file) and, when flush is set, flushes them to a new table file.
func (a *rocksApp) write(n int, flush bool) {
	a.t.Helper()
	for i := 0; i < n; i++ {
		k := a.keys + i
		v := []byte(fmt.Sprintf("value-%08d", k))
		if k%10 == 0 {
			v = append(v, bytes.Repeat([]byte{byte(k)}, 2048)...)
		}
		if err := a.db.Put(a.wo, []byte(fmt.Sprintf("key-%08d", k)), v); err != nil {
			a.t.Fatal(err)
		}
	}
	a.keys += n
	if flush {
		if err := a.db.Flush(a.fo); err != nil {
			a.t.Fatal(err)
		}
	}
}

// checkpoint makes a RocksDB checkpoint in dir (which must not exist).
func (a *rocksApp) checkpoint(dir string) {
	a.t.Helper()
	cp, err := a.db.NewCheckpoint()
	if err != nil {
		a.t.Fatal(err)
	}
	defer cp.Destroy()
	if err := cp.CreateCheckpoint(dir, 0); err != nil {
		a.t.Fatal(err)
	}
}

// requireSameKeys reads the store in dir read-only and compares it key by
// key, value by value, with the application's store.
func (a *rocksApp) requireSameKeys(dir string) {
	a.t.Helper()
	opts := grocksdb.NewDefaultOptions()
	defer opts.Destroy()
	opts.SetDbLogDir(a.t.TempDir())
	got, err := grocksdb.OpenDbForReadOnly(opts, dir, false)
	if err != nil {
		a.t.Fatalf("open the restored store: %v", err)
	}
	defer got.Close()
	ro := grocksdb.NewDefaultReadOptions()
	defer ro.Destroy()
	want, have := a.db.NewIterator(ro), got.NewIterator(ro)
	defer want.Close()
	defer have.Close()
	n := 0
	have.SeekToFirst()
	for want.SeekToFirst(); want.Valid(); want.Next() {
		if !have.Valid() {
			a.t.Fatalf("the restored store ends after %d keys, the source has %d", n, a.keys)
		}
		wk, wv, hk, hv := want.Key(), want.Value(), have.Key(), have.Value()
		same := bytes.Equal(wk.Data(), hk.Data()) && bytes.Equal(wv.Data(), hv.Data())
		key, restored := string(wk.Data()), string(hk.Data())
		wk.Free()
		wv.Free()
		hk.Free()
		hv.Free()
		if !same {
			a.t.Fatalf("key %d: the source has %q, the restored store %q (or their values differ)", n, key, restored)
		}
		n++
		have.Next()
	}
	if have.Valid() {
		a.t.Fatalf("the restored store has more keys than the source's %d", n)
	}
	if err := want.Err(); err != nil {
		a.t.Fatal(err)
	}
	if err := have.Err(); err != nil {
		a.t.Fatal(err)
	}
	if n != a.keys {
		a.t.Fatalf("compared %d keys, the application wrote %d", n, a.keys)
	}
}

func withSuffixes(t *testing.T, dir string, suffixes ...string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		for _, s := range suffixes {
			if strings.HasSuffix(e.Name(), s) {
				out = append(out, e.Name())
			}
		}
	}
	sort.Strings(out)
	return out
}

// TestRocksDBCheckpointsRestoreAndCheckThroughThePlugin: a RocksDB store
// written through grocksdb is checkpointed twice with "engine":"rocksdb"
// by an agent whose plugin directory holds ckpt-plugin-rocksdb; the second
// checkpoint reuses every table and blob file of the first; `ckpt restore`
// brings back a store that the plugin checks and that equals the source
// key by key; `ckpt drill --engine rocksdb` opens it through the plugin;
// and a flipped byte in a restored table file fails the plugin's check,
// naming the file.
func TestRocksDBCheckpointsRestoreAndCheckThroughThePlugin(t *testing.T) {
	pluginDir := buildRocksDBPlugin(t)
	var found []pluginEntry
	ckptJSON(t, &found, "plugins", "--plugin-dir", pluginDir, "--json")
	if len(found) != 1 || found[0].Kind != "engine" || found[0].Engine != "rocksdb" {
		t.Fatalf("plugins --json: %+v, want the rocksdb engine", found)
	}

	root, storageDir, localDir := t.TempDir(), t.TempDir(), t.TempDir()
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	const job, task = "rocks", "rocks-0"
	startAgent(t, "A", agentConfig{Socket: socket, StorageDir: storageDir, Job: job, LocalDir: localDir,
		AllowRoots: []string{root}, Extra: []string{"--plugin-dir", pluginDir}})

	app := openRocksApp(t, filepath.Join(root, "db"))
	for i := 0; i < 4; i++ {
		app.write(5000, true)
	}
	app.write(1000, false) // in the WAL only
	snap1 := filepath.Join(root, "snap-1")
	app.checkpoint(snap1)
	shared1 := withSuffixes(t, snap1, ".sst", ".blob")
	if len(withSuffixes(t, snap1, ".sst")) < 4 || len(withSuffixes(t, snap1, ".blob")) == 0 {
		t.Fatalf("checkpoint 1 holds %v, want several table files and a blob file", shared1)
	}
	triggerRocks := func(n uint64, dir string) completedEvent {
		t.Helper()
		var ev completedEvent
		ckptJSON(t, &ev, "trigger", "--socket", socket, "--task", task, "--checkpoint", fmt.Sprint(n), "--dir", dir,
			"--engine", "rocksdb", "--plugin-dir", pluginDir, "--json")
		if ev.Event != "completed" {
			t.Fatalf("trigger %d: %+v", n, ev)
		}
		return ev
	}
	triggerRocks(1, snap1)
	m1 := readManifest(t, storageDir, job, task, 1)
	for _, f := range m1.Files {
		want := "private"
		if strings.HasSuffix(f.Name, ".sst") || strings.HasSuffix(f.Name, ".blob") {
			want = "shared"
		}
		if f.Kind != want {
			t.Errorf("checkpoint 1: %s is %s, want %s", f.Name, f.Kind, want)
		}
	}

	app.write(3000, true)
	app.write(500, false)
	snap2 := filepath.Join(root, "snap-2")
	app.checkpoint(snap2)
	ev2 := triggerRocks(2, snap2)
	kept := 0
	for _, name := range shared1 {
		if _, err := os.Stat(filepath.Join(snap2, name)); err == nil {
			kept++
		}
	}
	t.Logf("checkpoint 2: %d files uploaded, %d reused (%d table and blob files kept from checkpoint 1), %d B shipped of %d B",
		ev2.FilesUploaded, ev2.FilesReused, kept, ev2.CheckpointSize, ev2.FullSize)
	if kept == 0 || ev2.FilesReused < kept {
		t.Errorf("checkpoint 2 reused %d files; %d table and blob files of checkpoint 1 are unchanged in it", ev2.FilesReused, kept)
	}
	if ev2.CheckpointSize >= ev2.FullSize {
		t.Errorf("checkpoint 2 shipped %d B of %d B: not incremental", ev2.CheckpointSize, ev2.FullSize)
	}

	target := filepath.Join(t.TempDir(), "restored")
	var rr restoreResult
	ckptJSON(t, &rr, "restore", "--storage", "file://"+storageDir, "--job", job, "--task", task, "--target", target,
		"--plugin-dir", pluginDir, "--json")
	if !rr.Restored || rr.Checkpoint != 2 {
		t.Fatalf("restore: %+v", rr)
	}

	// The plugin checks the restored store, over the plugin boundary.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	host, err := plugins.Discover(ctx, plugins.Options{Dir: pluginDir, Log: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	eng, ok := host.Engine("rocksdb")
	if !ok {
		t.Fatalf("the plugin directory serves no rocksdb engine: refused %v", host.Refused())
	}
	res, err := eng.Check(ctx, target)
	if err != nil || !res.Checked || res.Keys != int64(app.keys) {
		t.Fatalf("the plugin's check of the restored store: %+v, %v; want checked with %d keys", res, err, app.keys)
	}
	app.requireSameKeys(target)
	t.Logf("restored checkpoint 2: %d files, %d B; the plugin read %d keys, equal to the source's", rr.Files, rr.Bytes, res.Keys)

	var drill struct {
		Checkpoint    uint64 `json:"checkpoint"`
		Verified      bool   `json:"verified"`
		EngineChecked bool   `json:"engine_checked"`
		Keys          int64  `json:"keys"`
	}
	for _, engineFlag := range [][]string{{"--engine", "rocksdb"}, nil} { // nil: the manifest's engine
		drill.EngineChecked, drill.Keys = false, 0
		args := append([]string{"drill", "--storage", "file://" + storageDir, "--job", job, "--task", task,
			"--plugin-dir", pluginDir, "--scratch", t.TempDir(), "--json"}, engineFlag...)
		ckptJSON(t, &drill, args...)
		if drill.Checkpoint != 2 || !drill.Verified || !drill.EngineChecked || drill.Keys != int64(app.keys) {
			t.Errorf("drill %v: %+v, want checkpoint 2 opened by the plugin with %d keys", engineFlag, drill, app.keys)
		}
	}
	drill.EngineChecked = true
	ckptJSON(t, &drill, "drill", "--storage", "file://"+storageDir, "--job", job, "--task", task, "--scratch", t.TempDir(), "--json")
	if drill.EngineChecked {
		t.Errorf("drill without the plugin: %+v; the built-in rocksdb engine cannot open a store", drill)
	}
	if r := runCkpt(t, "drill", "--storage", "file://"+storageDir, "--job", job, "--task", task, "--engine", "nosuch", "--json"); r.Code != 2 ||
		!strings.Contains(string(r.Stderr), `unknown engine "nosuch"`) {
		t.Errorf("drill --engine nosuch: exit %d, stderr %s; want 2 naming the engine", r.Code, r.Stderr)
	}
	if r := runCkpt(t, "drill", "--storage", "file://"+storageDir, "--job", job, "--task", task, "--engine", "rocksdb", "--no-engine-check"); r.Code != 2 {
		t.Errorf("drill --engine with --no-engine-check: exit %d, want 2 (bad usage)", r.Code)
	}

	// A flipped byte in a restored table file: the plugin's check fails
	// and names the file.
	bad := withSuffixes(t, target, ".sst")[0]
	path := filepath.Join(target, bad)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := len(b) / 3; i < len(b)/3+16; i++ {
		b[i] ^= 0xff
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = eng.Check(ctx, target)
	if err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("the plugin's check of a store with %s corrupt: %v, want an error naming it", bad, err)
	}
}
