package agent

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/protocol"
	"github.com/ckpt-io/ckpt/restore"
)

// A real read-only local dir: the job's directory in the local dir is a
// tmpfs, remounted read-only between two checkpoints. (The agent's lock
// file, open for writing, sits in the local dir itself, above the mount: a
// filesystem with a file open for writing cannot be remounted read-only.
// The snapshots live on another filesystem, so the sync phase copies.)
// The sync phase fails with EROFS (internal, naming the local dir) and
// nothing is committed; the agent serves on, and once the tmpfs is
// read-write again the same checkpoint completes and restores.
func TestARealReadOnlyLocalDirFailsTheSyncPhaseCleanly(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: mounting and remounting a tmpfs read-only needs root (CI runs as root)")
	}
	var fsDir string
	var mountErr error
	var h *harness
	h = start(t, nil, func(c *Config) {
		c.GCInterval = -1
		fsDir = filepath.Join(c.LocalDir, "job")
		os.MkdirAll(fsDir, 0o750)
		if mountErr = unix.Mount("tmpfs", fsDir, "tmpfs", 0, "size=16m"); mountErr != nil {
			return
		}
		t.Cleanup(func() {
			if err := unix.Unmount(fsDir, unix.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", fsDir, err)
			}
		})
		c.Restore = func(ctx context.Context, r RestoreRequest) (*restore.Result, error) {
			return restore.Run(ctx, restore.Options{Store: h.store, Job: "job", Task: r.Task, Checkpoint: r.Checkpoint, Target: r.Target, TargetParent: r.Parent, LocalDir: h.local})
		}
	})
	if mountErr != nil {
		t.Skipf("cannot mount a tmpfs at %s (%v): no real read-only disk to test", fsDir, mountErr)
	}
	remount := func(flags uintptr) {
		t.Helper()
		if err := unix.Mount("", fsDir, "", unix.MS_REMOUNT|flags, ""); err != nil {
			t.Fatalf("remount %s: %v", fsDir, err)
		}
	}
	t.Cleanup(func() { unix.Mount("", fsDir, "", unix.MS_REMOUNT, "") }) // before the agent stops
	local := h.local
	c := h.dial()
	ckptWait(t, c, "t1", 1, h.snapshot("s1", map[string]int{"000001.sst": 5000, "CURRENT": 16}))
	dir := h.snapshot("s2", map[string]int{"000001.sst": 5000, "000002.sst": 6000, "CURRENT": 16})

	remount(unix.MS_RDONLY)
	p, err := c.Checkpoint(ctxT(t), "t1", 2, dir, "")
	if err == nil {
		_, err = p.Wait(ctxT(t))
	}
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.CodeInternal || !strings.Contains(pe.Message, local) || !strings.Contains(pe.Message, "read-only file system") {
		t.Fatalf("checkpoint onto a read-only local dir: %v, want internal naming %s", err, local)
	}
	if _, err := manifests.Load(ctxT(t), h.store, "job", "t1", 2); err == nil {
		t.Fatal("storage holds a manifest of the failed checkpoint")
	}
	if !hasLocalCopy(h, "t1", 1) {
		t.Fatal("the local copy of checkpoint 1 is gone")
	}
	if _, err := c.Status(ctxT(t), "t1"); err != nil {
		t.Fatalf("the agent does not serve on: %v", err)
	}

	remount(0)
	ckptWait(t, c, "t1", 2, dir)
	if probs := h.verify("t1", 2); len(probs) != 0 {
		t.Fatalf("checkpoint 2 does not verify: %v", probs)
	}
	target := filepath.Join(h.root, "restored")
	ev := h.restoreOp("t1", target)
	if ev["event"] != "restored" || ev["checkpoint"] != float64(2) || ev["bytes_local"] != ev["bytes"] {
		t.Fatalf("restore once the local dir is writable: %v", ev)
	}
	sameFiles(t, target, dir)
}

// restoreOp restores the newest checkpoint of task into target through
// the socket and returns the event.
func (h *harness) restoreOp(task, target string) map[string]any {
	return h.raw().send(`{"op":"restore","task":"` + task + `","target":"` + target + `","id":"r"}`)
}

// sameFiles fails the test unless dir holds exactly want's files, byte
// for byte.
func sameFiles(t *testing.T, dir, want string) {
	t.Helper()
	got, _ := os.ReadDir(dir)
	exp, _ := os.ReadDir(want)
	if len(got) != len(exp) {
		t.Fatalf("%s holds %d files, want %d", dir, len(got), len(exp))
	}
	for _, e := range exp {
		a, _ := os.ReadFile(filepath.Join(want, e.Name()))
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil || !bytes.Equal(a, b) {
			t.Fatalf("%s differs (%v)", e.Name(), err)
		}
	}
}

// hasLocalCopy reports whether the agent keeps a complete local copy of
// checkpoint n of task as its newest.
func hasLocalCopy(h *harness, task string, n uint64) bool {
	l, err := h.a.local.Latest(task)
	return err == nil && l != nil && l.Checkpoint == n
}
