package agent

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/client"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/protocol"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage"
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
// the scrub heals it from the local copy.) The damage is done within a
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
	if rep := h.scrubPass(); rep.Corrupt != 1 || rep.Healed != 1 || rep.Unhealed != 0 || rep.Missing != 0 {
		t.Fatalf("scrub: %+v, want the flipped object corrupt and healed", rep)
	}
	if probs := h.verify("t1", 4); len(probs) != 0 {
		t.Fatalf("checkpoint 4 after the scrub: %v", probs)
	}
	if err := h.restoreRemote("t1", 4); err != nil {
		t.Fatalf("restore of checkpoint 4: %v", err)
	}
}

// scrubPass runs one scrub pass of the agent at an unlimited rate.
func (h *harness) scrubPass() ScrubReport {
	h.t.Helper()
	rep, err := h.a.scrubPass(ctxT(h.t), newScrubLimiter(1<<40))
	if err != nil {
		h.t.Fatal(err)
	}
	return rep
}

// The scrub re-hashes live objects: a flipped byte (same size, invisible
// to the check before commits) is found and healed from the local copy;
// an agent without a local copy of the bytes reports it unhealed.
func TestTheScrubHealsACorruptObjectFromTheLocalCopy(t *testing.T) {
	h := start(t, nil, func(c *Config) { c.GCInterval = -1 })
	c := h.dial()
	ckptWait(t, c, "t1", 1, h.snapshot("s1", fiveSSTs()))
	ckptWait(t, c, "t1", 2, h.snapshot("s2", fiveSSTs("000006.sst")))
	if rep := h.scrubPass(); rep.Objects != 6 || rep.OK != 6 || rep.Bytes != 7000+10_000*5+15_000 {
		t.Fatalf("scrub of intact storage: %+v", rep)
	}
	keys := h.sharedKeys("t1", 2)
	h.flipByte(keys[4])
	h.remove(keys[0])
	rep := h.scrubPass()
	if rep.Corrupt != 1 || rep.Missing != 1 || rep.Healed != 2 || rep.Unhealed != 0 || rep.OK != 4 {
		t.Fatalf("scrub: %+v, want one corrupt and one missing, both healed", rep)
	}
	for n := uint64(1); n <= 2; n++ {
		if probs := h.verify("t1", n); len(probs) != 0 {
			t.Fatalf("checkpoint %d after the scrub: %v", n, probs)
		}
	}

	// Another agent on the same storage, with no local copy: it reports.
	h.flipByte(keys[2])
	h2 := start(t, func(storage.Store) storage.Store { return h.store }, func(c *Config) { c.GCInterval = -1 })
	rep, err := h2.a.scrubPass(ctxT(t), newScrubLimiter(1<<40))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Corrupt != 1 || rep.Healed != 0 || rep.Unhealed != 1 {
		t.Fatalf("scrub without a local copy: %+v, want one corrupt, unhealed", rep)
	}
	if probs := h.verify("t1", 2); len(probs) != 1 || probs[0].Key != keys[2] {
		t.Fatalf("checkpoint 2: %v, want the unhealed object only", probs)
	}
}

// With --scrub-rate the agent scrubs in the background, heals, and stops
// with the agent (goleak checks the goroutine is gone).
func TestTheBackgroundScrubRunsAndStops(t *testing.T) {
	old := scrubPause
	scrubPause = 10 * time.Millisecond
	t.Cleanup(func() { scrubPause = old })
	h := start(t, nil, func(c *Config) { c.GCInterval = -1; c.ScrubRate = 1 << 30 })
	c := h.dial()
	ckptWait(t, c, "t1", 1, h.snapshot("s1", fiveSSTs()))
	key := h.sharedKeys("t1", 1)[1]
	h.flipByte(key)
	deadline := time.Now().Add(20 * time.Second)
	for len(h.verify("t1", 1)) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the background scrub did not heal the object")
		}
		time.Sleep(20 * time.Millisecond)
	}
	h.stop()
}

// The scrub's reads wait on its limiter: 256 KiB at 1 MiB/s, with a burst
// of one 64 KiB chunk, take at least about 3/16 s.
func TestTheScrubReadsAtItsRate(t *testing.T) {
	lim := newScrubLimiter(1 << 20)
	r := &limitedReader{ctx: ctxT(t), r: strings.NewReader(strings.Repeat("x", 256<<10)), lim: lim}
	start := time.Now()
	if n, err := io.Copy(io.Discard, r); err != nil || n != 256<<10 {
		t.Fatal(n, err)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Fatalf("read 256 KiB at 1 MiB/s in %s", d)
	}
}
