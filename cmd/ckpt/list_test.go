package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/gc"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
)

// commitManifest stores checkpoint n of task with one shared file.
func commitManifest(t *testing.T, s storage.Store, job, task string, n uint64, content string) {
	t.Helper()
	ctx := context.Background()
	b := []byte(content)
	sum := sha256.Sum256(b)
	h := hex.EncodeToString(sum[:])
	f := manifests.File{Name: "a.sst", Kind: manifests.Shared, Size: int64(len(b)), SHA256: h, Key: manifests.SharedKey(job, h, int64(len(b)))}
	if err := s.Put(ctx, f.Key, bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
	m := &manifests.Manifest{Job: job, Task: task, Checkpoint: n, Created: time.Now().UTC(), Engine: "generic",
		Files: []manifests.File{f}, FullSize: f.Size, FilesUploaded: 1}
	enc, err := m.Encode(f.Size)
	if err != nil {
		t.Fatal(err)
	}
	if err := manifests.Commit(ctx, s, m, enc); err != nil {
		t.Fatal(err)
	}
}

func TestListShowsEverythingButAnUndecodableManifest(t *testing.T) {
	url, s := storageDir(t)
	ctx := context.Background()
	commitManifest(t, s, "j", "good", 1, "good one")
	commitManifest(t, s, "j", "bad", 1, "bad one, fine")
	badKey := manifests.ManifestKey("j", "bad", 2)
	if err := s.Put(ctx, badKey, strings.NewReader("{garbage"), 8); err != nil {
		t.Fatal(err)
	}

	code, stdout, stderr := runCaptured(t, "list", "--storage", url, "--job", "j", "--json")
	if code != 0 {
		t.Fatalf("list --json: exit %d\n%s%s", code, stdout, stderr)
	}
	var entries []struct {
		Task       string `json:"task"`
		Checkpoint uint64 `json:"checkpoint"`
		Files      int    `json:"files"`
	}
	if err := json.Unmarshal([]byte(stdout), &entries); err != nil {
		t.Fatalf("list --json: stdout is not a JSON array: %v\n%s", err, stdout)
	}
	if len(entries) != 2 {
		t.Errorf("list --json: %d entries, want the 2 good ones: %+v", len(entries), entries)
	}
	for _, e := range entries {
		if e.Files != 1 {
			t.Errorf("list --json: %s checkpoint %d has %d files, want 1", e.Task, e.Checkpoint, e.Files)
		}
	}
	if !strings.Contains(stderr, badKey) || !strings.Contains(stderr, "not valid JSON") {
		t.Errorf("list --json: stderr does not name %s and its error:\n%s", badKey, stderr)
	}

	code, stdout, stderr = runCaptured(t, "list", "--storage", url, "--job", "j")
	if code != 0 {
		t.Fatalf("list: exit %d\n%s%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "good") || !strings.Contains(stdout, "bad") {
		t.Errorf("list: the good checkpoints are not shown:\n%s", stdout)
	}
	if !strings.Contains(stdout+stderr, badKey) {
		t.Errorf("list: the undecodable manifest %s is not reported:\n%s%s", badKey, stdout, stderr)
	}

	// Restore of another task does not read the bad task's manifests.
	target := filepath.Join(t.TempDir(), "target")
	if code, out, errs := runCaptured(t, "restore", "--storage", url, "--job", "j", "--task", "good", "--target", target, "--json"); code != 0 {
		t.Errorf("restore of another task: exit %d\n%s%s", code, out, errs)
	}
	// GC still stops before deleting anything.
	t.Setenv(gc.UnsafeMinGraceEnv, "0s")
	if code, _, errs := runCaptured(t, "gc", "--storage", url, "--job", "j", "--grace", "0s"); code != 1 || !strings.Contains(errs, "nothing deleted") {
		t.Errorf("gc over an undecodable manifest: exit %d, want 1 and nothing deleted\n%s", code, errs)
	}
}

// list --json entries carry the epoch of the owner that committed them,
// and a manifest a newer owner fenced is not listed.
func TestListCarriesTheEpochAndHidesFencedManifests(t *testing.T) {
	url, s := storageDir(t)
	ctx := context.Background()
	commitManifest(t, s, "j", "t", 1, "legacy, epoch 0")
	if _, err := manifests.TakeOwnership(ctx, s, "j", "t", "node-a", "A"); err != nil {
		t.Fatal(err)
	}
	commitManifest(t, s, "j", "t", 2, "legacy writer after the takeover: fenced")
	code, stdout, stderr := runCaptured(t, "list", "--storage", url, "--job", "j", "--json")
	if code != 0 {
		t.Fatalf("list --json: exit %d\n%s%s", code, stdout, stderr)
	}
	var entries []map[string]any
	if err := json.Unmarshal([]byte(stdout), &entries); err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0]["checkpoint"] != float64(1) || entries[0]["epoch"] != float64(0) {
		t.Fatalf("list --json: %s, want checkpoint 1 alone with \"epoch\":0", stdout)
	}
}

// A misspelled --job or --task is no empty success: list and gc say that
// it holds nothing and name the jobs (or tasks) that hold checkpoints, and
// verify fails.
func TestCommandsSayAMisspelledJobHoldsNothing(t *testing.T) {
	url, s := storageDir(t)
	commitManifest(t, s, "orders", "orders-0", 1, "a")
	commitManifest(t, s, "payments", "payments-0", 1, "b")
	t.Setenv(gc.UnsafeMinGraceEnv, "0s")
	for _, c := range []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"list", "--job", "ordres"}, 0, []string{`job "ordres" holds no checkpoint`, "orders, payments", "--job"}},
		{[]string{"list", "--job", "ordres", "--json"}, 0, []string{`job "ordres" holds no checkpoint`, "orders, payments"}},
		{[]string{"verify", "--job", "ordres"}, 1, []string{`job "ordres" holds no checkpoint`, "orders, payments"}},
		{[]string{"verify", "--job", "ordres", "--json"}, 1, []string{`job "ordres" holds no checkpoint`}},
		{[]string{"verify", "--job", "orders", "--task", "orders-9"}, 1, []string{`task "orders-9" of job "orders" holds no checkpoint`, "orders-0", "--task"}},
		{[]string{"list", "--job", "orders", "--task", "orders-9"}, 0, []string{`task "orders-9"`, "orders-0"}},
		{[]string{"gc", "--job", "ordres", "--grace", "0s"}, 0, []string{`job "ordres" holds no checkpoint`, "orders, payments"}},
	} {
		code, stdout, stderr := runCaptured(t, append(c.args, "--storage", url)...)
		if code != c.code {
			t.Errorf("%v: exit %d, want %d\n%s%s", c.args, code, c.code, stdout, stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%v: stderr does not say %q:\n%s", c.args, w, stderr)
			}
		}
	}
	// A job that holds checkpoints says nothing of the kind.
	code, stdout, stderr := runCaptured(t, "verify", "--storage", url, "--job", "orders")
	if code != 0 || strings.Contains(stderr, "holds no checkpoint") {
		t.Errorf("verify of a job with checkpoints: exit %d\n%s%s", code, stdout, stderr)
	}
	// An empty store says so.
	empty, _ := storageDir(t)
	if code, _, stderr := runCaptured(t, "verify", "--storage", empty, "--job", "orders"); code != 1 || !strings.Contains(stderr, "no job there holds one") {
		t.Errorf("verify on an empty store: exit %d\n%s", code, stderr)
	}
}
