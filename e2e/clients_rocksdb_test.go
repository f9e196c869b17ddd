//go:build rocksdb

// Apps that are not written in Go, end to end: a RocksDB store written by
// RocksDB's own ldb, checkpointed through the Python and the Java clients
// against a ckpt agent process. It needs python3, a JDK 17, rocksdb-tools
// and librocksdb-dev (scripts/deps.sh installs them), and builds with
// -tags rocksdb for the RocksDB engine plugin (scripts/test.sh runs it):
//
//	go test -count=1 -tags rocksdb -run RocksDB ./e2e/

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// ldbStore is a RocksDB store that RocksDB's ldb tool writes, and the
// keys the test wrote into it.
type ldbStore struct {
	t    *testing.T
	dir  string
	want map[string]string
}

func ldb(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command("ldb", args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("ldb %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String()
}

// load writes n keys from first on through `ldb load` (one in eight with a
// 3 KiB value), then one more with `ldb put`.
func (s *ldbStore) load(first, n int) {
	s.t.Helper()
	var b strings.Builder
	for k := first; k < first+n; k++ {
		key, val := fmt.Sprintf("key-%06d", k), fmt.Sprintf("value-%06d", k)
		if k%8 == 0 {
			val += strings.Repeat(string(rune('a'+k%26)), 3072)
		}
		s.want[key] = val
		fmt.Fprintf(&b, "%s ==> %s\n", key, val)
	}
	ldb(s.t, b.String(), "--db="+s.dir, "--create_if_missing", "load")
	key := fmt.Sprintf("put-%06d", first)
	ldb(s.t, "", "--db="+s.dir, "put", key, "by-put")
	s.want[key] = "by-put"
}

// checkpoint makes a RocksDB checkpoint of the store in dir.
func (s *ldbStore) checkpoint(dir string) {
	s.t.Helper()
	ldb(s.t, "", "--db="+s.dir, "checkpoint", "--checkpoint_dir="+dir)
}

// scan reads a store with `ldb scan`.
func scan(t *testing.T, dir string) map[string]string {
	t.Helper()
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(ldb(t, "", "--db="+dir, "scan")), "\n") {
		k, v, ok := strings.Cut(line, " : ")
		if !ok {
			t.Fatalf("ldb scan %s: unexpected line %q", dir, line)
		}
		got[k] = v
	}
	return got
}

// requireSame compares two key sets key by key.
func requireSame(t *testing.T, what string, want, got map[string]string) {
	t.Helper()
	var diffs []string
	for k, v := range want {
		if g, ok := got[k]; !ok {
			diffs = append(diffs, "missing "+k)
		} else if g != v {
			diffs = append(diffs, fmt.Sprintf("%s differs (%d bytes, want %d)", k, len(g), len(v)))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			diffs = append(diffs, "extra "+k)
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 0 {
		t.Fatalf("%s: %d keys differ from the %d written: %s", what, len(diffs), len(want), strings.Join(diffs[:min(len(diffs), 10)], "; "))
	}
}

// nonGoClient runs an example app of one client: argv before the app's
// own arguments (socket, task, n, dir, engine).
type nonGoClient struct {
	name string
	argv []string
	env  []string
}

func (c nonGoClient) checkpoint(t *testing.T, socket, task string, n uint64, dir, engine string) completedEvent {
	t.Helper()
	args := append(append([]string(nil), c.argv[1:]...), socket, task, fmt.Sprint(n), dir)
	if engine != "" {
		args = append(args, engine)
	}
	cmd := exec.Command(c.argv[0], args...)
	cmd.Env = append(os.Environ(), c.env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s client, checkpoint %d of %s: %v\n%s%s", c.name, n, task, err, out.String(), errb.String())
	}
	var ev completedEvent
	if err := json.Unmarshal(out.Bytes(), &ev); err != nil || ev.Event != "completed" || ev.Task != task || ev.Checkpoint != n {
		t.Fatalf("%s client, checkpoint %d of %s: printed %q (%v), want its completed event", c.name, n, task, out.String(), err)
	}
	if !strings.Contains(errb.String(), "synced in") {
		t.Errorf("%s client: the app was not told of synced: %q", c.name, errb.String())
	}
	t.Logf("%s client: checkpoint %d of %s completed in %v: %d files uploaded, %d reused, %d B of %d B",
		c.name, n, task, time.Since(start).Round(time.Millisecond), ev.FilesUploaded, ev.FilesReused, ev.CheckpointSize, ev.FullSize)
	return ev
}

// pythonClient installs clients/python with pip (offline: its build
// backend is in the repository) and runs its example app.
func pythonClient(t *testing.T, root string) nonGoClient {
	t.Helper()
	site := filepath.Join(t.TempDir(), "site")
	start := time.Now()
	cmd := exec.Command("python3", "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps", "--no-index",
		"--target", site, filepath.Join(root, "clients", "python"))
	cmd.Env = append(os.Environ(), "PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_BREAK_SYSTEM_PACKAGES=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pip install ./clients/python: %v\n%s", err, out)
	}
	t.Logf("pip install ./clients/python: %v", time.Since(start).Round(time.Millisecond))
	// Run from a directory without the sources: the installed package is used.
	return nonGoClient{name: "Python", argv: []string{"python3", filepath.Join(root, "clients", "python", "examples", "checkpoint.py")},
		env: []string{"PYTHONPATH=" + site, "PYTHONDONTWRITEBYTECODE=1"}}
}

// javaClient builds clients/java with its script (the JDK alone), and its
// example app against the jar.
func javaClient(t *testing.T, root string) nonGoClient {
	t.Helper()
	out := filepath.Join(t.TempDir(), "build")
	start := time.Now()
	if b, err := exec.Command(filepath.Join(root, "clients", "java", "build.sh"), out).CombinedOutput(); err != nil {
		t.Fatalf("clients/java/build.sh: %v\n%s", err, b)
	}
	t.Logf("clients/java/build.sh: %v", time.Since(start).Round(time.Millisecond))
	jar, classes := filepath.Join(out, "ckpt-client.jar"), filepath.Join(out, "examples")
	if b, err := exec.Command("javac", "--release", "17", "-cp", jar, "-d", classes,
		filepath.Join(root, "clients", "java", "examples", "CheckpointApp.java")).CombinedOutput(); err != nil {
		t.Fatalf("javac CheckpointApp.java: %v\n%s", err, b)
	}
	return nonGoClient{name: "Java", argv: []string{"java", "-XX:TieredStopAtLevel=1", "-cp", jar + ":" + classes, "CheckpointApp"}}
}

// TestRocksDBStoresCheckpointThroughThePythonAndJavaClients: for each of the
// Python and the Java client, and each of no engine and "engine":"rocksdb"
// (the RocksDB engine plugin), a RocksDB store written by ldb is
// checkpointed twice by an app through the client against a ckpt agent
// process; `ckpt restore` on a fresh node (an empty local dir) brings back
// checkpoint 2, whose keys `ldb scan` finds equal, one by one, to those
// written before it; checkpoint 2 reuses files of checkpoint 1; and with
// the plugin, `ckpt drill` opens the restored store through it.
func TestRocksDBStoresCheckpointThroughThePythonAndJavaClients(t *testing.T) {
	for _, tool := range []string{"ldb", "python3", "javac", "java", "jar"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing: run scripts/deps.sh", tool)
		}
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	pluginDir := buildRocksDBPlugin(t)
	clients := []nonGoClient{pythonClient(t, root), javaClient(t, root)}

	apps, storageDir := t.TempDir(), t.TempDir()
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	const job = "nongo"
	startAgent(t, "A", agentConfig{Socket: socket, StorageDir: storageDir, Job: job, LocalDir: filepath.Join(apps, "local"),
		AllowRoots: []string{apps}, Extra: []string{"--plugin-dir", pluginDir}})

	for _, c := range clients {
		for _, engine := range []string{"", "rocksdb"} {
			task := strings.ToLower(c.name) + "-generic"
			if engine != "" {
				task = strings.ToLower(c.name) + "-" + engine
			}
			t.Run(task, func(t *testing.T) {
				if err := os.MkdirAll(filepath.Join(apps, task), 0o755); err != nil {
					t.Fatal(err)
				}
				s := &ldbStore{t: t, dir: filepath.Join(apps, task, "db"), want: map[string]string{}}
				s.load(0, 3000)
				snap1 := filepath.Join(apps, task, "snap-1")
				s.checkpoint(snap1)
				c.checkpoint(t, socket, task, 1, snap1, engine)

				s.load(3000, 1000)
				snap2 := filepath.Join(apps, task, "snap-2")
				s.checkpoint(snap2)
				want := make(map[string]string, len(s.want))
				for k, v := range s.want {
					want[k] = v
				}
				ev := c.checkpoint(t, socket, task, 2, snap2, engine)
				if ev.FilesReused == 0 || ev.CheckpointSize >= ev.FullSize {
					t.Errorf("checkpoint 2 reused %d files and shipped %d B of %d B: not incremental", ev.FilesReused, ev.CheckpointSize, ev.FullSize)
				}
				s.load(4000, 100) // after checkpoint 2: not restored

				node := t.TempDir() // a fresh node: nothing local
				target := filepath.Join(node, "db")
				var rr restoreResult
				ckptJSON(t, &rr, "restore", "--storage", "file://"+storageDir, "--job", job, "--task", task, "--target", target,
					"--local-dir", filepath.Join(node, "local"), "--plugin-dir", pluginDir, "--json")
				if !rr.Restored || rr.Checkpoint != 2 || rr.FilesLocal != 0 {
					t.Fatalf("restore on a fresh node: %+v, want checkpoint 2 from storage", rr)
				}
				requireSame(t, "the restored store (ldb scan)", want, scan(t, target))
				requireSame(t, "the snapshot the app checkpointed (ldb scan)", want, scan(t, snap2))

				if engine == "rocksdb" {
					var drill struct {
						Checkpoint    uint64 `json:"checkpoint"`
						Verified      bool   `json:"verified"`
						EngineChecked bool   `json:"engine_checked"`
						Keys          int64  `json:"keys"`
					}
					ckptJSON(t, &drill, "drill", "--storage", "file://"+storageDir, "--job", job, "--task", task,
						"--plugin-dir", pluginDir, "--scratch", t.TempDir(), "--json")
					if drill.Checkpoint != 2 || !drill.Verified || !drill.EngineChecked || drill.Keys != int64(len(want)) {
						t.Errorf("drill through the plugin: %+v, want checkpoint 2 opened with %d keys", drill, len(want))
					}
				}
				t.Logf("restored checkpoint 2 of %s on a fresh node: %d files, %d B; %d keys equal", task, rr.Files, rr.Bytes, len(want))
			})
		}
	}
}
