package restore_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/engines"
	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage/file"
	"github.com/ckpt-io/ckpt/uploader"
)

// copyScale is an engines.Rescaler whose "store" is one file per old
// task, the concatenation of the files it fetched of it: what restore
// does around an engine (which checkpoint, which files, verified bytes,
// the target whole or absent) shows without an engine's library.
type copyScale struct {
	name string
	// ask, when set, replaces the files asked for: all of every source,
	// each into its own directory below Scratch.
	ask        func(o engines.RescaleRequest, all []engines.FetchFile) []engines.FetchFile
	unverified bool
	fail       error
	holds      map[string]string // task: where it holds keys in the range
	asked      []string          // the tasks HoldsKeys was asked about
}

func (c *copyScale) Name() string                      { return c.name }
func (c *copyScale) Classify(name string) engines.Kind { return engines.SharedBySuffix(name) }
func (c *copyScale) Check(context.Context, string) (engines.Result, error) {
	return engines.Result{}, nil
}

func (c *copyScale) HoldsKeys(_ context.Context, o engines.RescaleRequest) ([]string, error) {
	out := make([]string, len(o.Sources))
	for i, s := range o.Sources {
		c.asked = append(c.asked, s.Task)
		out[i] = c.holds[s.Task]
	}
	return out, nil
}

func (c *copyScale) Rescale(ctx context.Context, o engines.RescaleRequest) (*engines.RescaleReport, error) {
	var all []engines.FetchFile
	for i, s := range o.Sources {
		dir := filepath.Join(o.Scratch, fmt.Sprintf("src-%d", i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, err
		}
		for _, f := range s.Files {
			all = append(all, engines.FetchFile{Source: i, Name: f.Name, Dir: dir})
		}
	}
	if c.ask != nil {
		all = c.ask(o, all)
	}
	if err := o.Fetch(ctx, all); err != nil {
		return nil, err
	}
	if c.fail != nil {
		return nil, c.fail
	}
	rep := &engines.RescaleReport{Verified: !c.unverified, FetchMS: 1, BuildMS: 2, VerifyMS: 3}
	for i, s := range o.Sources {
		var b []byte
		for _, f := range s.Files {
			p, err := os.ReadFile(filepath.Join(o.Scratch, fmt.Sprintf("src-%d", i), f.Name))
			if err != nil {
				return nil, err
			}
			b = append(b, p...)
		}
		if err := os.WriteFile(filepath.Join(o.Target, s.Task), b, 0o644); err != nil {
			return nil, err
		}
		rep.Keys++
		rep.Sources = append(rep.Sources, engines.SourceReport{Keys: 1, First: []byte(s.Task), Last: []byte(s.Task), BytesInRange: 7, Rewritten: "copied"})
	}
	return rep, nil
}

// rescaleEnv is job-wide checkpoint 1 of tasks a, b and c, each a table,
// a MANIFEST and a CURRENT of its own bytes.
type rescaleEnv struct {
	store *file.Store
	base  string
	snaps map[string]string // task: its snapshot dir
}

func newRescaleEnv(t *testing.T) *rescaleEnv {
	t.Helper()
	base := t.TempDir()
	e := &rescaleEnv{base: base, snaps: map[string]string{}}
	var err error
	if e.store, err = file.New(filepath.Join(base, "store")); err != nil {
		t.Fatal(err)
	}
	local, err := localrecovery.Open(filepath.Join(base, "local"), "job")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tasks := []string{"a", "b", "c"}
	for _, task := range tasks {
		snap := filepath.Join(base, "snap-"+task)
		e.snaps[task] = snap
		os.MkdirAll(snap, 0o755)
		for name, size := range map[string]int{"000001.sst": 70_000, "MANIFEST-000001": 20_000, "CURRENT": 16} {
			b := bytes.Repeat([]byte(task+name), size)[:size]
			if err := os.WriteFile(filepath.Join(snap, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		sn, err := local.Take(task, 1, snap, false)
		if err == nil {
			err = sn.Inspect()
		}
		if err != nil {
			t.Fatal(err)
		}
		res, err := uploader.Upload(ctx, uploader.Request{Store: e.store, Job: "job", Task: task, Checkpoint: 1, Snapshot: sn})
		if err != nil {
			t.Fatal(err)
		}
		m := &manifests.Manifest{Job: "job", Task: task, Checkpoint: 1, Created: time.Now(), Files: res.Files, Tasks: tasks}
		for _, f := range res.Files {
			m.FullSize += f.Size
		}
		enc, _ := m.Encode(res.BytesWritten)
		if err := manifests.Commit(ctx, e.store, m, enc); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// engine registers c in engines.Default under a name of the test's own.
func (e *rescaleEnv) engine(t *testing.T, c *copyScale) *copyScale {
	c.name = "copyscale-" + strings.ToLower(strings.NewReplacer("/", "-", "'", "").Replace(t.Name()))
	engines.Register(c)
	return c
}

func (e *rescaleEnv) rescale(c *copyScale, from []string, partial bool) (*restore.RescaleResult, error) {
	return restore.Rescale(context.Background(), restore.RescaleOptions{Store: e.store, Job: "job", From: from,
		Start: []byte{0x10}, End: []byte{0x80}, Engine: c.name, Target: filepath.Join(e.base, "new", "db"), Parallelism: 2, Partial: partial})
}

// nothingLeft requires that a refused or failed rescale left nothing
// beside its target: no target, no temporary or scratch directory.
func (e *rescaleEnv) nothingLeft(t *testing.T) {
	t.Helper()
	entries, _ := os.ReadDir(filepath.Join(e.base, "new"))
	for _, de := range entries {
		t.Errorf("a failed rescale left %s beside its target", de.Name())
	}
}

// Restore's part of a rescale: the engine gets every file it asks for,
// byte for byte the checkpoint's; the tasks of the checkpoint not named
// are put to the engine; the result counts what was fetched and written;
// the target appears with what the engine built, and the scratch goes.
func TestRescaleGivesTheEngineTheCheckpointsFilesAndPlacesWhatItBuilt(t *testing.T) {
	e := newRescaleEnv(t)
	c := e.engine(t, &copyScale{})
	res, err := e.rescale(c, []string{"a", "b"}, false)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.asked, ",") != "c" {
		t.Errorf("HoldsKeys was asked about %v, want the task not named, c", c.asked)
	}
	target := filepath.Join(e.base, "new", "db")
	var written int64
	for i, task := range []string{"a", "b"} {
		var want []byte
		m, err := manifests.Load(context.Background(), e.store, "job", task, 1)
		if err != nil {
			t.Fatal(err)
		}
		var private int64
		for _, f := range m.Files {
			b, err := os.ReadFile(filepath.Join(e.snaps[task], f.Name))
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, b...)
			if f.Kind != manifests.Shared {
				private += f.Size
			}
		}
		got, err := os.ReadFile(filepath.Join(target, task))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("task %s: the new store's file is not its checkpoint's files (%v)", task, err)
		}
		written += int64(len(want))
		tk := res.Tasks[i]
		if tk.Task != task || tk.Files != 3 || tk.FilesFetched != 3 || tk.BytesFetched != int64(len(want)) || tk.BytesPrivate != private ||
			tk.Keys != 1 || tk.First != hex.EncodeToString([]byte(task)) || tk.BytesInRange != 7 || tk.Rewritten != "copied" {
			t.Errorf("task %s: %+v", task, tk)
		}
	}
	if !res.Restored || !res.Verified || res.Checkpoint != 1 || res.Files != 2 || res.BytesWritten != written || res.Bytes != written ||
		res.BytesRemote != written || res.FilesFetched != 6 || res.FilesSkipped != 0 || res.Keys != 2 || res.BuildMS != 2 || res.Start != "10" || res.End != "80" {
		t.Errorf("result %+v", res)
	}
	entries, _ := os.ReadDir(filepath.Join(e.base, "new"))
	if len(entries) != 1 || entries[0].Name() != "db" {
		t.Errorf("beside the target: %v, want the target alone", entries)
	}
}

// Whatever goes wrong, on restore's side or the engine's, the rescale
// fails with an error saying what, and leaves no target and no debris.
func TestAFailedRescaleSaysWhyAndLeavesNothing(t *testing.T) {
	corrupt := func(e *rescaleEnv) {
		m, _ := manifests.Load(context.Background(), e.store, "job", "a", 1)
		for _, f := range m.Files {
			if f.Name == "000001.sst" {
				p := filepath.Join(e.store.Root(), f.Key)
				b, _ := os.ReadFile(p)
				b[100] ^= 0xff
				os.WriteFile(p, b, 0o644)
			}
		}
	}
	for _, tc := range []struct {
		name    string
		other   bool // name engine instead of the test's copyScale
		engine  string
		c       copyScale
		setup   func(*rescaleEnv)
		partial bool
		want    []string
	}{
		{name: "an engine that cannot rescale", other: true, engine: "rocksdb", want: []string{`engine "rocksdb" cannot rescale`, "engines that can:", "copyscale-"}},
		{name: "no engine named", other: true, engine: "", want: []string{`engine "generic" cannot rescale`}},
		{name: "an unknown engine", other: true, engine: "leveldb", want: []string{"unknown engine", "leveldb"}},
		{name: "a corrupt object", setup: corrupt, want: []string{"000001.sst", "a checkpoint 1", "corrupt"}},
		{name: "a file the checkpoint does not hold", c: copyScale{ask: func(o engines.RescaleRequest, all []engines.FetchFile) []engines.FetchFile {
			return append(all, engines.FetchFile{Source: 1, Name: "000009.sst", Dir: all[0].Dir})
		}}, want: []string{"000009.sst", "b checkpoint 1 does not hold"}},
		{name: "a file of no source", c: copyScale{ask: func(o engines.RescaleRequest, all []engines.FetchFile) []engines.FetchFile {
			return append(all, engines.FetchFile{Source: 2, Name: "CURRENT", Dir: all[0].Dir})
		}}, want: []string{"task 2 of 2"}},
		{name: "a file outside the scratch dir", c: copyScale{ask: func(o engines.RescaleRequest, all []engines.FetchFile) []engines.FetchFile {
			all[0].Dir = filepath.Dir(o.Scratch)
			return all
		}}, want: []string{"outside its scratch dir"}},
		{name: "a file fetched twice", c: copyScale{ask: func(o engines.RescaleRequest, all []engines.FetchFile) []engines.FetchFile {
			return append(all, all[0])
		}}, want: []string{all0Name, "exists"}},
		{name: "a store not checked", c: copyScale{unverified: true}, want: []string{"did not check the store it built"}},
		{name: "the engine fails", c: copyScale{fail: errors.New("rescale restore: the engine's own failure")}, want: []string{"the engine's own failure"}},
		{name: "a task not named holds keys", c: copyScale{holds: map[string]string{"c": "its table 000001.sst meets it"}},
			want: []string{"tasks c (its table 000001.sst meets it)", "--partial"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newRescaleEnv(t)
			c := e.engine(t, &tc.c)
			if tc.other {
				c = &copyScale{name: tc.engine} // only its name is used
			}
			if tc.setup != nil {
				tc.setup(e)
			}
			_, err := e.rescale(c, []string{"a", "b"}, tc.partial)
			if err == nil {
				t.Fatal("the rescale succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			e.nothingLeft(t)
		})
	}
}

// all0Name is the name of the first file the copyScale asks for: the
// manifest lists a checkpoint's files by name.
const all0Name = "000001.sst"

// With Partial, the tasks not named are not looked at: the rescale builds
// the store from the named ones.
func TestAPartialRescaleDoesNotAskAboutTheOtherTasks(t *testing.T) {
	e := newRescaleEnv(t)
	c := e.engine(t, &copyScale{holds: map[string]string{"c": "its table 000001.sst meets it"}})
	if _, err := e.rescale(c, []string{"a", "b"}, true); err != nil {
		t.Fatal(err)
	}
	if len(c.asked) != 0 {
		t.Fatalf("a partial rescale asked about %v", c.asked)
	}
}

// Package restore is engine-neutral: an engine's library (Pebble's) is
// linked by the engine's package, which commands link beside restore.
func TestRestoreLinksNoEngineLibrary(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command(gobin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/cockroachdb/pebble") || dep == "github.com/ckpt-io/ckpt/engines/pebble" {
			t.Errorf("package restore depends on %s", dep)
		}
	}
}
