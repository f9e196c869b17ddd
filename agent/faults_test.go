//go:build ckpt_failpoints

package agent

// The disk-fault suite of the agent: writes, fsyncs and renames in the
// local dir (sync phase, the local copy's record) and in restore targets
// fail with ENOSPC, EIO or EROFS (failpoints; see internal/failpoint).
// What the app is told:
//
//   - ENOSPC, EDQUOT: failed, code unavailable (free space, then retry).
//   - EIO, EROFS: failed, code internal, the message naming the directory
//     (the local dir, or the restore target's): an operator has to act.
//   - a failure to record the local copy after the manifest is committed
//     fails nothing: the checkpoint is complete, only not kept locally.
//
// Whatever fails, storage holds no manifest of a failed checkpoint, the
// local dir no copy a restore would take, no restore target appears, and
// the agent serves on. Run with
//
//	go test -tags ckpt_failpoints ./agent/

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/ckpt-io/ckpt/client"
	"github.com/ckpt-io/ckpt/internal/failpoint"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/protocol"
	"github.com/ckpt-io/ckpt/restore"
)

// wantCode is what the app is told for a disk fault with errno.
func wantCode(errno syscall.Errno) string {
	if errno == syscall.ENOSPC || errno == syscall.EDQUOT {
		return protocol.CodeUnavailable
	}
	return protocol.CodeInternal
}

// startWithRestore starts an agent that serves restores into its roots,
// recording them in its local dir as ckpt agent does.
func startWithRestore(t *testing.T) *harness {
	var h *harness
	h = start(t, nil, func(c *Config) {
		c.GCInterval = -1
		c.Restore = func(ctx context.Context, r RestoreRequest) (*restore.Result, error) {
			return restore.Run(ctx, restore.Options{Store: h.store, Job: "job", Task: r.Task, Checkpoint: r.Checkpoint, Target: r.Target, TargetParent: r.Parent, LocalDir: h.local})
		}
	})
	return h
}

// runCheckpoint runs checkpoint n of task over dir and returns the error the
// app sees, before synced or after.
func runCheckpoint(t *testing.T, c *client.Client, task string, n uint64, dir string, handoff bool) error {
	p, err := c.Send(ctxT(t), client.Request{Task: task, Checkpoint: n, Dir: dir, Handoff: handoff})
	if err == nil {
		_, err = p.Wait(ctxT(t))
	}
	return err
}

// noManifest fails the test if storage holds a manifest of checkpoint n.
func (h *harness) noManifest(task string, n uint64) {
	h.t.Helper()
	cat, err := manifests.Scan(ctxT(h.t), h.store, "job", task)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, r := range cat.Retained(task) {
		if r.Checkpoint == n {
			h.t.Fatalf("storage holds a manifest of the failed checkpoint %d", n)
		}
	}
}

// servesOn checks that the agent, with the fault cleared, completes a new
// checkpoint of task and restores it, verified, through its local copy.
func (h *harness) servesOn(c *client.Client, task string, n uint64) {
	t := h.t
	t.Helper()
	dir := h.snapshot(fmt.Sprintf("after-%d", n), map[string]int{"000001.sst": 5000, "000009.sst": 7000, "CURRENT": 16})
	if err := runCheckpoint(t, c, task, n, dir, false); err != nil {
		t.Fatalf("checkpoint %d once the disk is fine: %v", n, err)
	}
	if probs := h.verify(task, n); len(probs) != 0 {
		t.Fatalf("checkpoint %d does not verify: %v", n, probs)
	}
	target := filepath.Join(h.root, fmt.Sprintf("restored-%d", n))
	ev := h.restoreOp(task, target)
	if ev["event"] != "restored" || ev["checkpoint"] != float64(n) || ev["bytes_local"] != ev["bytes"] {
		t.Fatalf("restore once the disk is fine: %v", ev)
	}
	sameFiles(t, target, dir)
}

// The sync phase: a failed link fails the checkpoint before synced, with
// the code the errno calls for and a message naming the local dir; it
// leaves no local copy and no manifest. A failed rename of a handed-off
// snapshot dir falls back to links; the sync phase fsyncs nothing.
func TestDiskFaultsInTheSyncPhase(t *testing.T) {
	for _, errno := range failpoint.Errnos {
		t.Run("write/"+failpoint.ErrnoName(errno), func(t *testing.T) {
			h := startWithRestore(t)
			c := h.dial()
			dir := h.snapshot("s1", map[string]int{"000001.sst": 5000, "CURRENT": 16})
			for after := range 2 { // the first file, the second
				failpoint.Arm(t, failpoint.LocalWrite, errno, after)
				err := runCheckpoint(t, c, "t1", 1, dir, false)
				var pe *protocol.Error
				if !errors.As(err, &pe) || pe.Code != wantCode(errno) || !strings.Contains(pe.Message, h.local) || !strings.Contains(pe.Message, errno.Error()) {
					t.Fatalf("checkpoint with write %d failing with %v: %v, want %s naming the local dir %s", after+1, errno, err, wantCode(errno), h.local)
				}
				if _, err := os.Lstat(filepath.Join(h.local, "job", "t1", fmt.Sprintf("%020d", 1))); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("the failed sync phase left a local copy: %v", err)
				}
				h.noManifest("t1", 1)
			}
			failpoint.Disarm(t)
			h.servesOn(c, "t1", 1)
		})
		t.Run("rename/"+failpoint.ErrnoName(errno), func(t *testing.T) {
			h := startWithRestore(t)
			c := h.dial()
			dir := h.snapshot("s1", map[string]int{"000001.sst": 5000, "CURRENT": 16})
			// Both the handoff's rename and the record's fail: the sync
			// phase links instead, and the checkpoint completes unkept.
			failpoint.Arm(t, failpoint.LocalRename, errno, 0)
			if err := runCheckpoint(t, c, "t1", 1, dir, true); err != nil {
				t.Fatalf("a handoff whose rename fails links instead: %v", err)
			}
			if _, err := os.Stat(filepath.Join(dir, "CURRENT")); err != nil {
				t.Fatalf("the snapshot dir was not left to the app: %v", err)
			}
			if probs := h.verify("t1", 1); len(probs) != 0 {
				t.Fatalf("checkpoint 1 does not verify: %v", probs)
			}
			failpoint.Disarm(t)
			h.servesOn(c, "t1", 2)
		})
		t.Run("fsync/"+failpoint.ErrnoName(errno), func(t *testing.T) {
			h := startWithRestore(t)
			c := h.dial()
			dir := h.snapshot("s1", map[string]int{"000001.sst": 5000, "CURRENT": 16})
			failpoint.Arm(t, failpoint.LocalSync, errno, 0)
			if err := runCheckpoint(t, c, "t1", 1, dir, false); err != nil {
				t.Fatalf("the local dir is never fsynced, yet: %v", err)
			}
			if !hasLocalCopy(h, "t1", 1) {
				t.Fatal("the local copy was not kept")
			}
		})
	}
}

// The local copy's record, written after the manifest is committed: its
// failure fails nothing (the checkpoint is complete in storage), and the
// local dir keeps no record of the checkpoint that a restore would take.
// A restore then fetches from storage, and the next checkpoint is kept.
func TestDiskFaultsInTheLocalCopysRecord(t *testing.T) {
	for _, f := range []struct {
		name  string
		point string
		after int
	}{
		{"write/identities", failpoint.LocalWrite, 2}, // after the sync phase's two links
		{"write/manifest", failpoint.LocalWrite, 3},
		{"rename/manifest", failpoint.LocalRename, 0},
	} {
		for _, errno := range failpoint.Errnos {
			t.Run(f.name+"/"+failpoint.ErrnoName(errno), func(t *testing.T) {
				h := startWithRestore(t)
				c := h.dial()
				dir := h.snapshot("s1", map[string]int{"000001.sst": 5000, "CURRENT": 16})
				failpoint.Arm(t, f.point, errno, f.after)
				if err := runCheckpoint(t, c, "t1", 1, dir, false); err != nil {
					t.Fatalf("a failed local record failed the checkpoint: %v", err)
				}
				if probs := h.verify("t1", 1); len(probs) != 0 {
					t.Fatalf("checkpoint 1 does not verify: %v", probs)
				}
				if hasLocalCopy(h, "t1", 1) {
					t.Fatal("checkpoint 1 is recorded in the local dir although its record failed")
				}
				failpoint.Disarm(t)
				target := filepath.Join(h.root, "restored")
				if ev := h.restoreOp("t1", target); ev["event"] != "restored" || ev["bytes_remote"] != ev["bytes"] {
					t.Fatalf("restore of the unkept checkpoint: %v, want every byte from storage", ev)
				}
				sameFiles(t, target, dir)
				h.servesOn(c, "t1", 2)
			})
		}
	}
}

// A restore target whose write, fsync or rename fails: the restore op
// fails with the code the errno calls for and a message naming the
// target's directory; no target appears, nothing is left beside it, the
// local copy stays usable, and the agent serves on.
func TestDiskFaultsOnTheRestoreTarget(t *testing.T) {
	for _, point := range []string{failpoint.LocalWrite, failpoint.LocalSync, failpoint.LocalRename} {
		for _, errno := range failpoint.Errnos {
			t.Run(point+"/"+failpoint.ErrnoName(errno), func(t *testing.T) {
				h := startWithRestore(t)
				c := h.dial()
				dir := h.snapshot("s1", map[string]int{"000001.sst": 5000, "CURRENT": 16})
				if err := runCheckpoint(t, c, "t1", 1, dir, false); err != nil {
					t.Fatal(err)
				}
				parent := filepath.Join(h.root, "data")
				os.Mkdir(parent, 0o755)
				target := filepath.Join(parent, "db")
				failpoint.Arm(t, point, errno, 0)
				ev := h.restoreOp("t1", target)
				msg, _ := ev["error"].(map[string]any)["message"].(string)
				if ev["event"] != "failed" || code(ev) != wantCode(errno) || !strings.Contains(msg, parent) || !strings.Contains(msg, errno.Error()) {
					t.Fatalf("restore with %s failing with %v: %v, want failed %s naming %s", point, errno, ev, wantCode(errno), parent)
				}
				if entries, _ := os.ReadDir(parent); len(entries) != 0 {
					t.Fatalf("a failed restore left %s in the target's directory", entries[0].Name())
				}
				failpoint.Disarm(t)
				ev = h.restoreOp("t1", target)
				if ev["event"] != "restored" || ev["bytes_local"] != ev["bytes"] {
					t.Fatalf("restore once the disk is fine: %v, want every byte from the local copy", ev)
				}
				sameFiles(t, target, dir)
				h.servesOn(c, "t1", 2)
			})
		}
	}
}
