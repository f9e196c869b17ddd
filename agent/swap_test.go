package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ckpt-io/ckpt/client"
	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
)

// secretSize is the size of the files a peer must not read: distinctive
// enough that an error naming it is caught.
const secretSize = 4321

// writeSecret writes a file of secretSize bytes that only uid may read,
// in a directory only uid may enter, and returns its path and bytes.
func writeSecret(t *testing.T, dir string, uid int) (string, []byte) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	secret := bytes.Repeat([]byte("the secret of uid "+strconv.Itoa(uid)+". "), secretSize)[:secretSize]
	p := filepath.Join(dir, "secret")
	if err := os.WriteFile(p, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, uid, uid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, uid); err != nil {
		t.Fatal(err)
	}
	return p, secret
}

// setAfterInspect sets the agent's hook for the rest of t.
func setAfterInspect(t *testing.T, fn func(*localrecovery.Snapshot)) {
	old := afterInspect
	afterInspect = fn
	t.Cleanup(func() { afterInspect = old })
}

// asUser runs fn on an OS thread of its own whose ids are uid and gid (as
// dialAs does), which the runtime then discards: what a process of that
// user may do.
func asUser(uid, gid uint32, fn func() error) error {
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESGID, uintptr(gid), uintptr(gid), uintptr(gid)); e != 0 {
			ch <- fmt.Errorf("setresgid: %w", e)
			return
		}
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
			ch <- fmt.Errorf("setresuid: %w", e)
			return
		}
		ch <- fn()
	}()
	return <-ch
}

// swapAt replaces the entry name of the directory fd by a symlink to
// target, through the handle: what a peer that kept its snapshot dir
// open can do after handing it off.
func swapAt(fd int, name, target string) error {
	if err := unix.Unlinkat(fd, name, 0); err != nil {
		return err
	}
	return unix.Symlinkat(target, fd, name)
}

// leaks fails t if storage holds secret's bytes (as an object or inside
// a manifest) or msg names its size or a piece of it.
func leaks(t *testing.T, storeFS string, secret []byte, msg string) {
	t.Helper()
	if strings.Contains(msg, strconv.Itoa(secretSize)) || strings.Contains(msg, string(secret[:16])) {
		t.Errorf("the error tells the size or the bytes of a file the peer may not read: %s", msg)
	}
	piece := secret[:64]
	filepath.Walk(storeFS, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return nil
		}
		b, _ := os.ReadFile(p)
		if bytes.Contains(b, piece) {
			t.Errorf("storage holds the bytes of a file the peer may not read: %s", p)
		}
		return nil
	})
}

// TestTheAgentNeverReadsThroughAFileSwappedAfterItsInspection: after the
// inspection of a snapshot's files, one of them is replaced (as root, so
// whatever the directory's permissions) by a symlink to a root-only file,
// or by a hard link to it given the same size and mtime. The checkpoint fails
// without reading either, its error names no size, and storage holds none
// of their bytes; handed off or linked.
func TestTheAgentNeverReadsThroughAFileSwappedAfterItsInspection(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the file the peer may not read is root's")
	}
	for _, handoff := range []bool{false, true} {
		for _, swap := range []string{"symlink", "another file"} {
			t.Run(fmt.Sprintf("handoff=%v/%s", handoff, swap), func(t *testing.T) {
				h := start(t, nil, nil)
				c := h.dial()
				secretPath, secret := writeSecret(t, filepath.Join(t.TempDir(), "root-only"), 0)
				dir := h.snapshot("snap", map[string]int{"000001.sst": 1000, "CURRENT": secretSize})
				setAfterInspect(t, func(sn *localrecovery.Snapshot) {
					p := sn.Path("CURRENT")
					fi, err := os.Stat(p)
					if err != nil {
						t.Error(err)
						return
					}
					os.Remove(p)
					if swap == "symlink" {
						err = os.Symlink(secretPath, p)
					} else {
						// Another inode of the same size and mtime: a
						// hard link to the root-only file.
						err = os.Chtimes(secretPath, fi.ModTime(), fi.ModTime())
						if err == nil {
							err = os.Link(secretPath, p)
						}
					}
					if err != nil {
						t.Error(err)
					}
				})
				p, err := c.Send(ctxT(t), client.Request{Task: "t1", Checkpoint: 1, Dir: dir, Handoff: handoff})
				if err != nil {
					t.Fatal(err)
				}
				ev, err := p.Wait(ctxT(t))
				if err == nil {
					t.Fatalf("the checkpoint completed with a file swapped after its inspection: %+v", ev)
				}
				if !strings.Contains(err.Error(), "CURRENT") {
					t.Errorf("the error does not name the swapped file: %v", err)
				}
				leaks(t, h.storeFS, secret, err.Error())
				if _, lerr := manifests.Load(ctxT(t), h.store, "job", "t1", 1); lerr == nil {
					t.Error("a manifest was committed")
				}
			})
		}
	}
}

// TestAPeerCannotSwapAHandedOffFileAfterSynced: in a node agent, a
// tenant's peer hands off its snapshot dir but keeps a handle to it, and
// after synced swaps a file for a symlink to another tenant's file (in a
// 0700 directory). The dir is the agent's by then: the swap is refused,
// and the checkpoint completes with the peer's own bytes and none of the
// other tenant's.
func TestAPeerCannotSwapAHandedOffFileAfterSynced(t *testing.T) {
	n := startTenants(t)
	secretPath, secret := writeSecret(t, filepath.Join(n.rootB, "private"), int(n.uidB))
	dir := n.snapshot(n.rootA, "chk-1", n.uidA, map[string]string{"000001.sst": "alpha's data", "CURRENT": "MANIFEST-1"})
	held, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	var swapErr error
	swapped := make(chan struct{})
	setAfterInspect(t, func(*localrecovery.Snapshot) {
		defer close(swapped)
		swapErr = asUser(n.uidA, n.uidA, func() error { return swapAt(int(held.Fd()), "CURRENT", secretPath) })
	})
	ev := n.as(n.uidA).checkpoint(fmt.Sprintf(`{"op":"checkpoint","task":"a-0","checkpoint":1,"dir":%q,"handoff":true}`, dir))
	select {
	case <-swapped:
	case <-time.After(10 * time.Second):
		t.Fatal("the hook did not run")
	}
	msg, _ := json.Marshal(ev)
	leaks(t, n.storeFS, secret, string(msg))
	if swapErr == nil {
		t.Error("the peer swapped a file of the snapshot dir it handed off")
	}
	if ev["event"] != "completed" {
		t.Fatalf("checkpoint: %v", ev)
	}
	m, err := manifests.Load(ctxT(t), n.store, "alpha", "a-0", 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range m.Files {
		if f.Name == "CURRENT" && string(f.Inline) != "MANIFEST-1" {
			t.Errorf("CURRENT checkpointed as %q", f.Inline)
		}
	}
}

// TestAFirstCheckpointReusesAnotherTasksObjectOnlyByItsHash: task b's first
// checkpoint is offered task a's objects; its file of the same size as
// a's but other bytes gets an object of its own, its file of a's bytes
// reuses a's, and b's checkpoint verifies and restores.
func TestAFirstCheckpointReusesAnotherTasksObjectOnlyByItsHash(t *testing.T) {
	h := start(t, nil, nil)
	c := h.dial()
	const size = 5 << 20 // hashed in one pass, sent in another
	write := func(name string, files map[string]byte) string {
		dir := filepath.Join(h.root, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for f, fill := range files {
			if err := os.WriteFile(filepath.Join(dir, f), bytes.Repeat([]byte{fill}, size), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	ckptWait(t, c, "a", 1, write("snap-a", map[string]byte{"000001.sst": 'x'}))
	aKey := h.sharedKeys("a", 1)[0]
	ev := ckptWait(t, c, "b", 1, write("snap-b", map[string]byte{"000001.sst": 'y', "000002.sst": 'x'}))
	m, err := manifests.Load(ctxT(t), h.store, "job", "b", 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range m.Files {
		switch f.Name {
		case "000001.sst":
			if f.Key == aKey {
				t.Errorf("a file of other bytes took task a's object of its size: %s", f.Key)
			}
		case "000002.sst":
			if f.Key != aKey {
				t.Errorf("the file of task a's bytes did not reuse its object: %s", f.Key)
			}
		}
	}
	if ev.FilesReused != 1 || ev.FilesUploaded != 1 {
		t.Errorf("task b's first checkpoint: %d uploaded, %d reused", ev.FilesUploaded, ev.FilesReused)
	}
	if probs := h.verify("b", 1); len(probs) != 0 {
		t.Errorf("task b's checkpoint does not verify: %v", probs)
	}
	if err := h.restoreRemote("b", 1); err != nil {
		t.Errorf("restore of task b: %v", err)
	}
}
