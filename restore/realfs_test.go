package restore_test

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ckpt-io/ckpt/restore"
)

// mountTmpfs mounts a tmpfs of size at dir (created) until the test ends,
// or skips the test, saying why, when it cannot (not root, no mount).
func mountTmpfs(t *testing.T, dir, size string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("not root: mounting a tmpfs for a real full disk needs root (CI runs as root)")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Skipf("cannot mount a tmpfs at %s (%v): no real full disk to test", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
}

// A real full disk under the restore target (a 256 KiB tmpfs, the store
// is 330 KB): the restore fails with ENOSPC and nothing is visible, neither
// the target nor the temporary directory (the tmpfs is empty again). Once
// there is space, the restore succeeds and verifies.
func TestARealFullDiskFailsTheRestoreCleanly(t *testing.T) {
	for _, local := range []bool{false, true} {
		name := "from-storage"
		if local {
			name = "from-the-local-copy" // across devices: copies
		}
		t.Run(name, func(t *testing.T) {
			e := setup(t)
			small := filepath.Join(e.base, "small")
			mountTmpfs(t, small, "256k")
			e.target = filepath.Join(small, "db")
			o := restore.Options{}
			if local {
				o.LocalDir = filepath.Join(e.base, "local")
			}
			_, err := e.run(o)
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("restore onto a full disk: %v, want ENOSPC", err)
			}
			e.nothingVisible()
			var st unix.Statfs_t
			if err := unix.Statfs(small, &st); err != nil || st.Bfree != st.Blocks {
				t.Fatalf("the failed restore holds %d of %d blocks (%v)", st.Blocks-st.Bfree, st.Blocks, err)
			}
			if err := unix.Mount("", small, "", unix.MS_REMOUNT, "size=4m"); err != nil {
				t.Fatalf("grow the tmpfs: %v", err)
			}
			if _, err := e.run(o); err != nil {
				t.Fatalf("restore once there is space: %v", err)
			}
			e.sameAsSnapshot()
		})
	}
}
