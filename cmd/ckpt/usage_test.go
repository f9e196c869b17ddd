package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Every mistake in the command line exits 2, at once, before anything is
// dialled, opened or changed.
func TestEveryUsageErrorExits2(t *testing.T) {
	url, s := storageDir(t)
	commitManifest(t, s, "j", "t", 1, "a")
	dir := t.TempDir()
	sock := filepath.Join(dir, "none.sock")
	for _, args := range [][]string{
		{"trigger", "--socket", sock, "--task", "t", "--checkpoint", "0", "--dir", dir},
		{"trigger", "--socket", sock, "--task", "bad!", "--checkpoint", "1", "--dir", dir},
		{"trigger", "--socket", sock, "--task", "t", "--checkpoint", "1", "--dir", dir, "--wait", "-1s"},
		{"restore", "--storage", url, "--job", "j", "--task", "bad!", "--target", filepath.Join(dir, "x")},
		{"restore", "--storage", "s4://bucket", "--job", "j", "--task", "t", "--target", filepath.Join(dir, "x")},
		{"restore", "--storage", "file://relative/dir", "--job", "j", "--task", "t", "--target", filepath.Join(dir, "x")},
		{"list", "--storage", "no-scheme", "--job", "j"},
		{"verify", "--storage", "s4://bucket", "--job", "j"},
		{"gc", "--storage", "s4://bucket", "--job", "j"},
		{"drill", "--storage", "%zz", "--job", "j", "--task", "t"},
		{"drill", "--storage", url, "--job", "j", "--task", "t", "--sample-bytes", "-1"},
		{"drill", "--storage", url, "--job", "j", "--sample-bytes", "1000"},
		{"drill", "--storage", url, "--job", "j", "--task", "t", "--sample-bytes", "1000", "--engine", "pebble"},
		{"drill", "--storage", url, "--job", "j", "--task", "t", "--seed", "5"},
		{"agent", "--socket", sock, "--storage", url, "--job", "j", "--allow-root", dir, "--drill-sample-bytes", "-1"},
	} {
		start := time.Now()
		code, _, stderr := runCaptured(t, args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2 (bad usage)\n%s", args, code, stderr)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%v: took %v to refuse bad usage", args, d)
		}
	}
}

// A trigger on a socket no agent listens on says that it waits, for how
// long and how to change it, and gives up after --wait.
func TestTriggerSaysItWaitsForTheSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "typo.sock")
	start := time.Now()
	code, _, stderr := runCaptured(t, "trigger", "--socket", sock, "--task", "t", "--checkpoint", "1", "--dir", dir, "--engine", "pebble", "--wait", "300ms")
	if code != 1 {
		t.Errorf("trigger on a missing socket: exit %d, want 1\n%s", code, stderr)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("trigger --wait 300ms took %v", d)
	}
	for _, w := range []string{sock, "waiting up to 300ms", "--wait", "ckpt agent --socket"} {
		if !strings.Contains(stderr, w) {
			t.Errorf("trigger on a missing socket: stderr does not say %q:\n%s", w, stderr)
		}
	}
	// --wait 0: one attempt, no wait announced.
	code, _, stderr = runCaptured(t, "trigger", "--socket", sock, "--task", "t", "--checkpoint", "1", "--dir", dir, "--engine", "pebble", "--wait", "0")
	if code != 1 || strings.Contains(stderr, "waiting") {
		t.Errorf("trigger --wait 0: exit %d\n%s", code, stderr)
	}
}

// A trigger without --engine says that drills will not open the store;
// a drill that could not open it says so; and a drill told to check with
// an engine that cannot open stores here (rocksdb without its plugin)
// fails instead of succeeding unchecked.
func TestDrillNeverSkipsTheEngineCheckSilently(t *testing.T) {
	dir := t.TempDir()
	code, _, stderr := runCaptured(t, "trigger", "--socket", filepath.Join(dir, "none.sock"), "--task", "t", "--checkpoint", "1", "--dir", dir, "--wait", "0")
	if code != 1 || !strings.Contains(stderr, "no --engine") || !strings.Contains(stderr, "drills") {
		t.Errorf("trigger without --engine: exit %d, want 1 and a note that drills will not open it:\n%s", code, stderr)
	}

	url, s := storageDir(t)
	commitManifest(t, s, "j", "t", 1, "a generic checkpoint")
	code, stdout, stderr := runCaptured(t, "drill", "--storage", url, "--job", "j", "--task", "t", "--scratch", t.TempDir())
	if code != 0 || !strings.Contains(stdout, "not opened") || !strings.Contains(stdout, "--engine") {
		t.Errorf("drill of a generic checkpoint: exit %d, want 0 and a word that the store was not opened:\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr = runCaptured(t, "drill", "--storage", url, "--job", "j", "--task", "t", "--scratch", t.TempDir(), "--engine", "rocksdb")
	if code != 1 || !strings.Contains(stderr, "ckpt-plugin-rocksdb") || !strings.Contains(stderr, "--plugin-dir") {
		t.Errorf("drill --engine rocksdb without its plugin: exit %d, want 1 naming the plugin:\n%s%s", code, stdout, stderr)
	}
	code, _, stderr = runCaptured(t, "drill", "--storage", url, "--job", "j", "--scratch", t.TempDir(), "--engine", "rocksdb", "--task", "t", "--json")
	if code != 1 {
		t.Errorf("drill --engine rocksdb --json without its plugin: exit %d, want 1\n%s", code, stderr)
	}
}

// The usage line of each command names its required and notable flags.
func TestUsageLinesNameTheirFlags(t *testing.T) {
	for _, c := range []struct {
		cmd  string
		want []string
	}{
		{"agent", []string{"Usage: ckpt agent ", "--allow-root DIR"}},
		{"savepoint", []string{"Usage: ckpt savepoint ", "[--overwrite]"}},
		{"trigger", []string{"Usage: ckpt trigger ", "[--engine E]", "[--wait D]"}},
	} {
		code, stdout, _ := runCaptured(t, c.cmd, "--help")
		if code != 0 {
			t.Errorf("%s --help: exit %d", c.cmd, code)
		}
		usage, _, _ := strings.Cut(stdout, "\n")
		for _, w := range c.want {
			if !strings.Contains(usage, w) {
				t.Errorf("%s --help: the usage line %q does not name %q", c.cmd, usage, w)
			}
		}
	}
}
