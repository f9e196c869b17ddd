package localrecovery

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// asUser runs fn on an OS thread of its own whose ids are uid and gid,
// which the runtime then discards: what a process of that user may do.
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

// TestAHandedOffDirIsTheAgentsBeforeItIsRead: a snapshot dir of another
// user, handed off, is the agent's (its uid, mode 0750) when Take
// returns, and the user, through the handle it kept, can neither add nor
// swap an entry.
func TestAHandedOffDirIsTheAgentsBeforeItIsRead(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the peer is another user")
	}
	const peer = 2001
	base := t.TempDir()
	os.Chmod(base, 0o755)
	s, _ := Open(filepath.Join(base, "local"), "job")
	snap := filepath.Join(base, "snap")
	write(t, snap, map[string]string{"000001.sst": "sst", "CURRENT": "cur"})
	for _, p := range []string{snap, filepath.Join(snap, "000001.sst"), filepath.Join(snap, "CURRENT")} {
		os.Chown(p, peer, peer)
	}
	held, err := os.Open(snap)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	sn, err := s.Take("t", 1, snap, true)
	if err != nil || !sn.HandedOff {
		t.Fatalf("handoff: %v (handed off %v)", err, sn != nil && sn.HandedOff)
	}
	var st unix.Stat_t
	if err := unix.Stat(sn.Dir, &st); err != nil {
		t.Fatal(err)
	}
	if int(st.Uid) != os.Geteuid() || st.Mode&0o777 != 0o750 {
		t.Fatalf("handed-off dir: uid %d, mode %o", st.Uid, st.Mode&0o777)
	}
	fd := int(held.Fd())
	if err := asUser(peer, peer, func() error { return unix.Symlinkat("/etc/shadow", fd, "000002.sst") }); !errors.Is(err, unix.EACCES) {
		t.Errorf("the peer added an entry after the handoff: %v", err)
	}
	if err := asUser(peer, peer, func() error { return unix.Unlinkat(fd, "CURRENT", 0) }); !errors.Is(err, unix.EACCES) {
		t.Errorf("the peer removed an entry after the handoff: %v", err)
	}
	if err := sn.Inspect(); err != nil {
		t.Fatal(err)
	}
	if sn.owner != peer {
		t.Fatalf("files are checked against uid %d, want the snapshot dir's %d", sn.owner, peer)
	}
}

// TestOpenReadsOnlyTheInodeInspected: a name swapped after Inspect, for a
// symlink or for another file of the same size and mtime, is not opened,
// and the error tells nothing of what the name now holds.
func TestOpenReadsOnlyTheInodeInspected(t *testing.T) {
	for _, handoff := range []bool{false, true} {
		for _, swap := range []string{"symlink", "another file"} {
			t.Run(fmt.Sprintf("handoff=%v/%s", handoff, swap), func(t *testing.T) {
				base := t.TempDir()
				s, _ := Open(filepath.Join(base, "local"), "job")
				snap := filepath.Join(base, "snap")
				write(t, snap, map[string]string{"000001.sst": "sst", "CURRENT": "cur"})
				other := filepath.Join(base, "other")
				write(t, other, map[string]string{"secret": "sec"})
				sn, err := s.Take("t", 1, snap, handoff)
				if err == nil {
					err = sn.Inspect()
				}
				if err != nil {
					t.Fatal(err)
				}
				f, err := sn.Open(sn.Files[1])
				if err != nil {
					t.Fatalf("open of an unchanged file: %v", err)
				}
				if b, _ := io.ReadAll(f); string(b) != "cur" {
					t.Fatalf("read %q", b)
				}
				f.Close()
				p := sn.Path("CURRENT")
				fi, _ := os.Stat(p)
				os.Remove(p)
				secret := filepath.Join(other, "secret")
				if swap == "symlink" {
					err = os.Symlink(secret, p)
				} else {
					os.Chtimes(secret, fi.ModTime(), fi.ModTime())
					err = os.Link(secret, p)
				}
				if err != nil {
					t.Fatal(err)
				}
				f, err = sn.Open(sn.Files[1])
				var bad *BadFileError
				if !errors.As(err, &bad) {
					if f != nil {
						f.Close()
					}
					t.Fatalf("open of a swapped name: %v", err)
				}
			})
		}
	}
}
