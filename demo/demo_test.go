package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// noLeaks fails the test if goroutines started during it are still
// running shortly after it ends (the agent, the client, Pebble).
func noLeaks(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<20)
			t.Errorf("%d goroutines before the demo, %d after:\n%s", before, n, buf[:runtime.Stack(buf, true)])
		}
	})
}

func TestDemoJSON(t *testing.T) {
	noLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rep, err := Run(ctx, Options{JSON: true, Out: &out, StateBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}

	// Exactly one JSON value, and it says what the report says.
	dec := json.NewDecoder(&out)
	var got Report
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("output is not JSON: %v", err)
	}
	if dec.More() {
		t.Fatal("output holds more than one JSON value")
	}
	if len(got.Checkpoints) != len(rep.Checkpoints) || len(got.Restores) != len(rep.Restores) {
		t.Fatalf("printed report differs from the returned one")
	}

	if len(got.Checkpoints) < 8 {
		t.Fatalf("%d checkpoints, want at least 8", len(got.Checkpoints))
	}
	for i, c := range got.Checkpoints {
		if c.Checkpoint != uint64(i+1) || c.FullSize <= 0 || c.CheckpointSize <= 0 {
			t.Errorf("checkpoint %d: %+v", i+1, c)
		}
		// (The first checkpoint's size may be below its full size: format 2
		// manifests hold small private files compressed.)
		if i == 0 && c.FilesReused != 0 {
			t.Errorf("first checkpoint reused %d files, but there was nothing to reuse", c.FilesReused)
		}
		if i > 0 && c.CheckpointSize >= c.FullSize {
			t.Errorf("checkpoint %d: size %d not below full size %d: nothing was reused", c.Checkpoint, c.CheckpointSize, c.FullSize)
		}
		if i > 0 && c.FilesReused == 0 {
			t.Errorf("checkpoint %d reused no file", c.Checkpoint)
		}
	}
	if len(got.Restores) != 2 {
		t.Fatalf("restores = %+v, want local and remote", got.Restores)
	}
	last := got.Checkpoints[len(got.Checkpoints)-1]
	for i, want := range []string{"local", "remote"} {
		r := got.Restores[i]
		if r.Source != want || !r.Verified || r.Checkpoint != last.Checkpoint || r.Bytes != last.FullSize || r.Keys == 0 {
			t.Errorf("restore %d = %+v, want a verified %s restore of checkpoint %d (%d bytes)", i, r, want, last.Checkpoint, last.FullSize)
		}
	}
	local, remote := got.Restores[0], got.Restores[1]
	// Private files may come from storage (inlined in the manifest); the
	// bulk, the shared files, must come from the local copy.
	if local.BytesLocal <= 0 || local.BytesLocal < local.Bytes/2 {
		t.Errorf("local restore took %d of %d bytes from the local copy", local.BytesLocal, local.Bytes)
	}
	if remote.BytesRemote != remote.Bytes || remote.BytesLocal != 0 {
		t.Errorf("remote restore: %d bytes from storage, %d local, of %d", remote.BytesRemote, remote.BytesLocal, remote.Bytes)
	}
	t.Logf("%d keys, %.0f writes/s, %d ms", got.Keys, got.WritesPerSecond, got.DurationMS)
}

func TestDemoTableKeepsTheDirItWasGiven(t *testing.T) {
	noLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "demo")
	var out bytes.Buffer
	if _, err := Run(ctx, Options{Dir: dir, Out: &out, Checkpoints: 3, StateBytes: 4 << 20}); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	t.Log("\n" + text)
	for _, want := range []string{"checkpoint size", "full size", "lastCheckpointFullSize", "local", "remote", "verified"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if n := strings.Count(text, "verified: all"); n != 2 {
		t.Errorf("%d verified restores in the output, want 2", n)
	}
	for _, sub := range []string{"store", "local", "storage"} {
		if _, err := os.Stat(filepath.Join(dir, sub)); err != nil {
			t.Errorf("kept dir: %v", err)
		}
	}
	// A second run must not mix its checkpoints with the first one's.
	if _, err := Run(ctx, Options{Dir: dir, Out: &out}); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("second run in a used dir: %v", err)
	}
}

func TestACancelledDemoStopsAndCleansUp(t *testing.T) {
	noLeaks(t)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Run(ctx, Options{JSON: true, Out: io.Discard, StateBytes: 16 << 20, Checkpoints: 50})
	if err == nil {
		t.Fatal("a demo cancelled after 300 ms succeeded")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("cancelled demo took %v to stop", d)
	}
	entries, _ := os.ReadDir(tmp)
	if len(entries) != 0 {
		t.Errorf("temporary files left behind: %v", entries)
	}
	t.Log(err)
}
