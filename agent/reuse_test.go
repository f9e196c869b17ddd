package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/client"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/protocol"
	"github.com/ckpt-io/ckpt/restore"
)

// ckptWait runs one checkpoint to its end and returns the completed event.
func ckptWait(t *testing.T, c *client.Client, task string, n uint64, dir string) protocol.Event {
	t.Helper()
	p, err := c.Checkpoint(ctxT(t), task, n, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	ev, err := p.Wait(ctxT(t))
	if err != nil {
		t.Fatalf("checkpoint %d: %v", n, err)
	}
	return ev
}

// sharedKeys returns the shared object keys of checkpoint n of task, sorted.
func (h *harness) sharedKeys(task string, n uint64) []string {
	m, err := manifests.Load(ctxT(h.t), h.store, "job", task, n)
	if err != nil {
		h.t.Fatal(err)
	}
	var keys []string
	for _, f := range m.Files {
		if f.Kind == manifests.Shared {
			keys = append(keys, f.Key)
		}
	}
	sort.Strings(keys)
	return keys
}

// objectPath is where the file store keeps key.
func (h *harness) objectPath(key string) string {
	return filepath.Join(h.storeFS, filepath.FromSlash(key))
}

// flipByte corrupts one byte of the stored object key, keeping its size.
func (h *harness) flipByte(key string) {
	p := h.objectPath(key)
	b, err := os.ReadFile(p)
	if err != nil {
		h.t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(p, b, 0o644); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) truncate(key string) {
	if err := os.Truncate(h.objectPath(key), 10); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) remove(key string) {
	if err := os.Remove(h.objectPath(key)); err != nil {
		h.t.Fatal(err)
	}
}

// verify reads back checkpoint n of task from storage.
func (h *harness) verify(task string, n uint64) []manifests.Problem {
	m, err := manifests.Load(ctxT(h.t), h.store, "job", task, n)
	if err != nil {
		h.t.Fatal(err)
	}
	probs, _, err := manifests.Verify(ctxT(h.t), h.store, m, 4)
	if err != nil {
		h.t.Fatal(err)
	}
	return probs
}

// restoreRemote restores checkpoint n of task from storage alone (no local
// copy), which verifies every byte.
func (h *harness) restoreRemote(task string, n uint64) error {
	_, err := restore.Run(ctxT(h.t), restore.Options{Store: h.store, Job: "job", Task: task, Checkpoint: n,
		Target: filepath.Join(h.t.TempDir(), "restored")})
	return err
}

func fiveSSTs(extra ...string) map[string]int {
	files := map[string]int{"CURRENT": 16}
	for i := 1; i <= 5; i++ {
		files[fmt.Sprintf("%06d.sst", i)] = 10_000 + 1000*i
	}
	for _, e := range extra {
		files[e] = 7000
	}
	return files
}

// Objects lost or damaged in storage after three checkpoints reused them
// are not reused by the fourth: a missing or truncated object is found by
// the size check before the commit and uploaded again from the snapshot,
// so checkpoint 4 completes and restores. (A flipped byte keeps the size:
// the scrub is for that.) The damage is done within a
// second, so the test's bound on observations is a nanosecond: with the
// default (5m) the agent's own uploads would vouch for the objects.
func TestLostObjectsAreUploadedAgainNotReused(t *testing.T) {
	h := start(t, nil, func(c *Config) { c.GCInterval = -1; c.Retain = 3; c.ReuseCheckMaxAge = time.Nanosecond })
	c := h.dial()
	for n := uint64(1); n <= 3; n++ {
		ckptWait(t, c, "t1", n, h.snapshot(fmt.Sprint("s", n), fiveSSTs()))
	}
	keys := h.sharedKeys("t1", 3)
	if len(keys) != 5 {
		t.Fatalf("checkpoint 3 has %d shared objects, want 5", len(keys))
	}
	flipped, truncated, deleted := keys[0], keys[1], keys[2]
	h.flipByte(flipped)
	h.truncate(truncated)
	h.remove(deleted)

	ev := ckptWait(t, c, "t1", 4, h.snapshot("s4", fiveSSTs("000006.sst")))
	if ev.Event != "completed" {
		t.Fatalf("checkpoint 4: %+v", ev)
	}
	// Reused: the two untouched objects and the flipped one (same size).
	// Uploaded: the truncated and deleted ones again, the new SST, CURRENT.
	if ev.FilesReused != 3 || ev.FilesUploaded != 4 {
		t.Fatalf("checkpoint 4 reused %d, uploaded %d; want 3 and 4", ev.FilesReused, ev.FilesUploaded)
	}
	for _, p := range h.verify("t1", 4) {
		if p.Key != flipped {
			t.Errorf("checkpoint 4 references a damaged object: %v", p)
		}
	}
}
