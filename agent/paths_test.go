package agent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/protocol"
	"github.com/ckpt-io/ckpt/storage"
)

// secret marks every byte a peer must not get uploaded.
var secret = []byte("SECRET-outside-the-roots")

// TestAParentSwapNeverShipsFilesFromOutsideTheRoots flips a parent of the
// snapshot dir between a real directory inside the allowed root and a
// symlink to a directory outside it, as fast as it can, while checkpoints
// run. Whatever wins a race, no manifest and no local copy may ever hold a
// file from outside the root, and every refusal is a bad_request.
func TestAParentSwapNeverShipsFilesFromOutsideTheRoots(t *testing.T) {
	h := start(t, nil, func(c *Config) { c.Retain = 1000; c.GCInterval = -1 })
	outside := t.TempDir()
	writeSnap := func(dir string, files map[string][]byte) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, b := range files {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	writeSnap(filepath.Join(h.root, "flip", "snap"), map[string][]byte{"000001.sst": []byte("inside bytes"), "CURRENT": []byte("inside")})
	writeSnap(filepath.Join(outside, "snap"), map[string][]byte{"000001.sst": secret, "CURRENT": secret, "SECRET.log": secret})
	flip, other := filepath.Join(h.root, "flip"), filepath.Join(h.root, "other")
	if err := os.Symlink(outside, other); err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	var flips atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	halt := func() { once.Do(func() { close(stop); wg.Wait() }) }
	defer halt() // also when a check fails midway
	wg.Add(1)
	go func() {
		defer wg.Done()
		runtime.LockOSThread()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := unix.Renameat2(unix.AT_FDCWD, flip, unix.AT_FDCWD, other, unix.RENAME_EXCHANGE); err != nil {
				t.Errorf("swap: %v", err)
				return
			}
			if flips.Add(1)%8 == 0 {
				time.Sleep(50 * time.Microsecond) // let some checkpoints see a stable dir
			}
		}
	}()

	r := h.raw()
	dir := filepath.Join(flip, "snap")
	deadline := time.Now().Add(20 * time.Second)
	var completed []uint64
	refused := 0
	for n := uint64(1); n <= 300 && time.Now().Before(deadline); n++ {
		ev := r.send(fmt.Sprintf(`{"op":"checkpoint","task":"t","checkpoint":%d,"dir":%q}`, n, dir))
		if ev["event"] == "synced" {
			ev = r.next()
		}
		switch ev["event"] {
		case "completed":
			completed = append(completed, n)
			checkLocalCopy(t, filepath.Join(h.local, "job", "t", fmt.Sprintf("%020d", n)))
		case "failed":
			if code(ev) != protocol.CodeBadRequest {
				t.Fatalf("checkpoint %d refused with %v, want bad_request", n, ev)
			}
			refused++
		default:
			t.Fatalf("checkpoint %d: unexpected event %v", n, ev)
		}
	}
	halt()
	t.Logf("%d checkpoints completed, %d refused, %d swaps", len(completed), refused, flips.Load())
	if len(completed) == 0 {
		t.Fatal("no checkpoint completed: the test proves nothing")
	}
	ctx := context.Background()
	for _, n := range completed {
		m, err := manifests.Load(ctx, h.store, "job", "t", n)
		if err != nil {
			t.Fatalf("manifest %d: %v", n, err)
		}
		for _, f := range m.Files {
			b := f.Inline
			if b == nil {
				rc, err := h.store.Get(ctx, f.Key)
				if err != nil {
					t.Fatalf("checkpoint %d file %s: %v", n, f.Name, err)
				}
				b, _ = io.ReadAll(rc)
				rc.Close()
			}
			if f.Name == "SECRET.log" || bytes.Contains(b, secret) {
				t.Fatalf("checkpoint %d uploaded %s from outside the allowed root", n, f.Name)
			}
		}
	}
}

// checkLocalCopy fails if a local copy holds a file from outside the roots.
func checkLocalCopy(t *testing.T, dir string) {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		if e.Name() == "SECRET.log" || bytes.Contains(b, secret) {
			t.Fatalf("local copy %s holds %s from outside the allowed root", dir, e.Name())
		}
	}
}

// TestAHardLinkToAnotherUsersFileIsRefused: a snapshot file that is a hard
// link to a file of another owner (outside the roots) is refused with
// bad_request, by linking and by handoff, and nothing of it is stored or
// kept; a hard link to a file of the snapshot dir's own owner (what an
// engine checkpoint is) still checkpoints.
func TestAHardLinkToAnotherUsersFileIsRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a file another owner")
	}
	for _, handoff := range []bool{false, true} {
		t.Run(fmt.Sprintf("handoff=%v", handoff), func(t *testing.T) {
			h := start(t, nil, nil)
			outside := t.TempDir()
			foreign := filepath.Join(outside, "shadow")
			if err := os.WriteFile(foreign, secret, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(foreign, 4242, 4242); err != nil {
				t.Fatal(err)
			}
			dir := h.snapshot("s", map[string]int{"000001.sst": 100, "CURRENT": 10})
			if err := os.Link(foreign, filepath.Join(dir, "000002.sst")); err != nil {
				t.Fatal(err)
			}
			r := h.raw()
			ev := r.send(fmt.Sprintf(`{"op":"checkpoint","task":"t","checkpoint":1,"dir":%q,"handoff":%v}`, dir, handoff))
			if ev["event"] == "synced" {
				ev = r.next()
			}
			e, _ := ev["error"].(map[string]any)
			msg, _ := e["message"].(string)
			if ev["event"] != "failed" || code(ev) != protocol.CodeBadRequest || !strings.Contains(msg, "000002.sst") {
				t.Fatalf("a hard link to another user's file: %v", ev)
			}
			var objects []string
			h.store.List(context.Background(), "", func(o storage.ObjectInfo) error { objects = append(objects, o.Key); return nil })
			if len(objects) != 0 {
				t.Fatalf("the refused checkpoint stored objects: %v", objects)
			}
			h.a.local.Wait()
			checkLocalCopy(t, filepath.Join(h.local, "job", "t", fmt.Sprintf("%020d", 1)))

			// The app's own files, hard-linked from outside its snapshot dir
			// (as every engine checkpoint is), are fine.
			own := filepath.Join(outside, "000003.sst")
			os.WriteFile(own, []byte("the app's own file"), 0o644)
			dir2 := h.snapshot("s2", map[string]int{"CURRENT": 10})
			if err := os.Link(own, filepath.Join(dir2, "000003.sst")); err != nil {
				t.Fatal(err)
			}
			ev = r.send(fmt.Sprintf(`{"op":"checkpoint","task":"t","checkpoint":2,"dir":%q,"handoff":%v}`, dir2, handoff))
			if ev["event"] == "synced" {
				ev = r.next()
			}
			if ev["event"] != "completed" {
				t.Fatalf("a hard link to the owner's own file: %v", ev)
			}
		})
	}
}
