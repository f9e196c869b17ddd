package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/manifests"
)

// restartWith stops h's agent and starts another on the same socket,
// storage and local dir, with mod applied to its config.
func (h *harness) restartWith(mod func(*Config)) {
	h.t.Helper()
	h.stop()
	cfg := Config{Socket: h.socket, Store: h.store, Job: "job", LocalDir: h.local,
		AllowRoots: []string{h.root}, GCGrace: time.Hour, ShutdownGrace: 5 * time.Second}
	mod(&cfg)
	a, err := New(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.a, h.cancel, h.done = a, cancel, make(chan error, 1)
	go func() { h.done <- a.Run(ctx) }()
	select {
	case <-a.Ready():
	case err := <-h.done:
		h.t.Fatalf("agent did not start: %v", err)
	}
}

// linkSnapshot makes the next snapshot the way an engine does: the
// unchanged files hard-linked from the previous one, plus new files.
func (h *harness) linkSnapshot(from, name string, add map[string]int) string {
	h.t.Helper()
	dir := h.snapshot(name, add)
	entries, err := os.ReadDir(from)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, e := range entries {
		if _, isNew := add[e.Name()]; !isNew {
			if err := os.Link(filepath.Join(from, e.Name()), filepath.Join(dir, e.Name())); err != nil {
				h.t.Fatal(err)
			}
		}
	}
	return dir
}

// An agent that switches from format 1 to format 2 uploads only new
// files: the SHA-256 objects of unchanged files keep their ids and are
// reused, new files are stored under BLAKE3 ids, and both verify.
func TestSwitchingToFormat2UploadsNothingAgain(t *testing.T) {
	h := start(t, nil, func(c *Config) { c.ManifestFormat = manifests.Format1 })
	c := h.dial()
	s1 := h.snapshot("s1", map[string]int{"000001.sst": 300_000, "000002.sst": 70_000, "CURRENT": 16})
	if ev := ckptWait(t, c, "t", 1, s1); ev.FilesUploaded != 3 {
		t.Fatalf("format 1 checkpoint: %+v", ev)
	}
	m1, err := manifests.Load(ctxT(t), h.store, "job", "t", 1)
	if err != nil || m1.Format != manifests.Format1 {
		t.Fatalf("checkpoint 1: %v, format %d", err, m1.Format)
	}
	c.Close()

	h.restartWith(func(c *Config) {}) // the default: format 2
	c = h.dial()
	s2 := h.linkSnapshot(s1, "s2", map[string]int{"CURRENT": 16})
	ev := ckptWait(t, c, "t", 2, s2)
	if ev.FilesUploaded != 1 || ev.FilesReused != 2 {
		t.Fatalf("first format 2 checkpoint uploaded %d files, reused %d; want only CURRENT (private: always)", ev.FilesUploaded, ev.FilesReused)
	}
	s3 := h.linkSnapshot(s2, "s3", map[string]int{"000003.sst": 50_000})
	if ev := ckptWait(t, c, "t", 3, s3); ev.FilesUploaded != 2 || ev.FilesReused != 2 {
		t.Fatalf("second format 2 checkpoint uploaded %d files, reused %d; want 000003.sst and CURRENT (private: always)", ev.FilesUploaded, ev.FilesReused)
	}
	m3, err := manifests.Load(ctxT(t), h.store, "job", "t", 3)
	if err != nil || m3.Format != manifests.Format2 {
		t.Fatalf("checkpoint 3: %v, format %d", err, m3.Format)
	}
	for _, f := range m3.Files {
		want := manifests.SHA256 // unchanged since format 1
		if f.Name == "000003.sst" {
			want = manifests.BLAKE3
		}
		if f.Kind == manifests.Shared && f.Alg() != want {
			t.Fatalf("%s is keyed by %s (%s), want %s", f.Name, f.Alg(), f.Key, want)
		}
		if f.Name == "000003.sst" && !strings.Contains(f.Key, "/b3-") {
			t.Fatalf("new file's key %s", f.Key)
		}
	}
	if p := h.verify("t", 3); len(p) != 0 {
		t.Fatalf("verify: %+v", p)
	}
	if err := h.restoreRemote("t", 3); err != nil {
		t.Fatalf("restore of a checkpoint of both algorithms: %v", err)
	}

	// Back to format 1 (a fleet that rolls back): the BLAKE3 file is
	// hashed again with SHA-256, so the manifest is one an older ckpt reads.
	c.Close()
	h.restartWith(func(c *Config) { c.ManifestFormat = manifests.Format1 })
	c = h.dial()
	s4 := h.linkSnapshot(s3, "s4", map[string]int{"CURRENT": 16})
	if ev := ckptWait(t, c, "t", 4, s4); ev.FilesUploaded != 2 || ev.FilesReused != 2 {
		t.Fatalf("format 1 again uploaded %d files, reused %d; want 000003.sst under its SHA-256 id and CURRENT", ev.FilesUploaded, ev.FilesReused)
	}
	m4, err := manifests.Load(ctxT(t), h.store, "job", "t", 4)
	if err != nil || m4.Format != manifests.Format1 {
		t.Fatalf("checkpoint 4: %v, format %d", err, m4.Format)
	}
}
