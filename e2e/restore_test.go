package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// plantedFile is one file of a hand-made manifest, stored inline.
type plantedFile struct {
	name string
	data []byte
}

// plantManifest writes a manifest for checkpoint 1 of task straight into a
// file:// storage dir, the way a tampering writer would: a well-formed body
// with every total right, an envelope checksum over the body's exact bytes
// (or a wrong one when badSum), so that only the file names can be wrong.
func plantManifest(t *testing.T, storageDir, job, task string, files []plantedFile, badSum bool) {
	t.Helper()
	type file struct {
		Name     string `json:"name"`
		Kind     string `json:"kind"`
		Size     int64  `json:"size"`
		SHA256   string `json:"sha256"`
		Inline   []byte `json:"inline"`
		Uploaded bool   `json:"uploaded"`
	}
	body := struct {
		Job            string    `json:"job"`
		Task           string    `json:"task"`
		Checkpoint     uint64    `json:"checkpoint"`
		Created        time.Time `json:"created"`
		Engine         string    `json:"engine"`
		Files          []file    `json:"files"`
		FullSize       int64     `json:"full_size"`
		CheckpointSize int64     `json:"checkpoint_size"`
		FilesUploaded  int       `json:"files_uploaded"`
		FilesReused    int       `json:"files_reused"`
	}{Job: job, Task: task, Checkpoint: 1, Created: time.Now().UTC(), Engine: "generic"}
	for _, f := range files {
		sum := sha256.Sum256(f.data)
		body.Files = append(body.Files, file{Name: f.name, Kind: "private", Size: int64(len(f.data)),
			SHA256: hex.EncodeToString(sum[:]), Inline: f.data, Uploaded: true})
		body.FullSize += int64(len(f.data))
		body.FilesUploaded++
	}
	raw, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	if badSum {
		sum[0] ^= 1
	}
	env, err := json.Marshal(manifestEnvelope{Format: 1, SHA256: hex.EncodeToString(sum[:]), Body: raw})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(storageDir, filepath.FromSlash(manifestKey(job, task, 1))), env)
}

func TestRestoreRefusesAManifestWhoseNamesEscapeTheTargetAndWritesNothing(t *testing.T) {
	storageDir := t.TempDir()
	const job = "evil"
	current := plantedFile{"CURRENT", []byte("MANIFEST-000001\n")}
	payload := []byte("written by a tampered manifest\n")
	cases := []struct {
		name, task string
		files      []plantedFile
		badSum     bool
		why        string // part of the expected error
	}{
		{"a parent-relative name", "dotdot", []plantedFile{current, {"../evil", payload}}, false, "unsafe file name"},
		{"an absolute name", "abs", []plantedFile{current, {"/abs", payload}}, false, "unsafe file name"},
		{"a name with a separator", "nested", []plantedFile{current, {"a/b", payload}}, false, "unsafe file name"},
		{"a wrong checksum", "badsum", []plantedFile{current, {"OPTIONS-000003", payload}}, true, "checksum"},
	}
	for _, c := range cases {
		t.Run("refuses "+c.name, func(t *testing.T) {
			plantManifest(t, storageDir, job, c.task, c.files, c.badSum)
			parent := t.TempDir()
			target := filepath.Join(parent, "store")
			before := listTree(t, parent)
			if exists("/abs") {
				t.Fatal("/abs exists before the test; cannot tell whether the restore wrote it")
			}
			res := runCkpt(t, "restore", "--storage", "file://"+storageDir, "--job", job, "--task", c.task, "--target", target, "--json")
			t.Logf("exit %d: %s", res.Code, strings.TrimSpace(string(res.Stderr)))
			if res.Code != 1 {
				t.Errorf("restore exited %d, want 1\nstdout: %s", res.Code, res.Stdout)
			}
			if !strings.Contains(string(res.Stderr), c.why) {
				t.Errorf("the error does not say %q: %s", c.why, res.Stderr)
			}
			if exists(target) {
				t.Errorf("the target %s was created", target)
			}
			if d := diffTrees(before, listTree(t, parent)); d != "" {
				t.Errorf("the restore wrote next to the target:\n%s", d)
			}
			for _, p := range []string{filepath.Join(parent, "evil"), filepath.Join(filepath.Dir(parent), "evil"), "/abs"} {
				if exists(p) {
					t.Errorf("%s was created", p)
				}
			}
		})
	}

	// The same kind of manifest with plain names restores: what refused
	// the others was their names (or checksum), nothing else.
	t.Run("restores the same manifest with plain names", func(t *testing.T) {
		files := []plantedFile{current, {"OPTIONS-000003", payload}}
		plantManifest(t, storageDir, job, "plain", files, false)
		target := filepath.Join(t.TempDir(), "store")
		var rr restoreResult
		ckptJSON(t, &rr, "restore", "--storage", "file://"+storageDir, "--job", job, "--task", "plain", "--target", target, "--json")
		for _, f := range files {
			got, err := os.ReadFile(filepath.Join(target, f.name))
			if err != nil || string(got) != string(f.data) {
				t.Errorf("%s: %q, %v", f.name, got, err)
			}
		}
	})
}

func TestASnapshotWithAnEmptyPrivateFileRestores(t *testing.T) {
	// Pebble keeps zero-length marker files (marker.format-version.*) in
	// every store, so every Pebble checkpoint has one.
	root, storageDir, localDir := t.TempDir(), t.TempDir(), t.TempDir()
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	const job, task = "empty", "empty-0"
	startAgent(t, "A", agentConfig{Socket: socket, StorageDir: storageDir, Job: job, LocalDir: localDir, AllowRoots: []string{root}})
	snap := filepath.Join(root, "snap-1")
	writeFile(t, filepath.Join(snap, "000001.sst"), randomBytes(64<<10, 1))
	writeFile(t, filepath.Join(snap, "CURRENT"), []byte("MANIFEST-000001\n"))
	writeFile(t, filepath.Join(snap, "marker.format-version.000001.013"), nil)
	trigger(t, socket, task, 1, snap)

	if res := runCkpt(t, "list", "--storage", "file://"+storageDir, "--job", job, "--json"); res.Code != 0 {
		t.Errorf("list: exit %d: %s", res.Code, res.Stderr)
	}
	target := filepath.Join(t.TempDir(), "store")
	res := runCkpt(t, "restore", "--storage", "file://"+storageDir, "--job", job, "--task", task, "--target", target, "--json")
	if res.Code != 0 {
		t.Fatalf("restore: exit %d: %s", res.Code, res.Stderr)
	}
	requireSameFiles(t, snap, target)
}

// TestAStorageURLTypoFailsTheRestore: as an init container, `ckpt restore
// --if-checkpoint-exists` with a file:// URL naming a directory that does
// not exist must fail (exit 1, saying what to check) and create nothing,
// not report "no checkpoint" and let the app start empty.
func TestAStorageURLTypoFailsTheRestore(t *testing.T) {
	dir := t.TempDir()
	typo := filepath.Join(dir, "ckpt-storag")
	target := filepath.Join(dir, "data")
	for _, args := range [][]string{
		{"restore", "--storage", "file://" + typo, "--job", "j", "--task", "t", "--target", target, "--if-checkpoint-exists", "--json"},
		{"list", "--storage", "file://" + typo, "--job", "j"},
		{"gc", "--storage", "file://" + typo, "--job", "j"},
	} {
		r := runCkpt(t, args...)
		if r.Code != 1 || !strings.Contains(string(r.Stderr), "does not exist") {
			t.Errorf("ckpt %s: exit %d, stderr %q; want exit 1 naming the missing storage", args[0], r.Code, r.Stderr)
		}
	}
	for _, p := range []string{typo, target} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s was created (stat: %v)", p, err)
		}
	}
}
