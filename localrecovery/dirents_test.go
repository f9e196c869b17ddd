package localrecovery

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A snapshot dir larger than one read of its entries: every file is
// taken, in name order, and a symlink among them is still refused, by
// handoff as by links.
func TestTakeReadsEveryEntryOfALargeSnapshotDir(t *testing.T) {
	const n = 1500 // names of 200 bytes: 2 getdents(2) calls
	pad := strings.Repeat("x", 190)
	for _, handoff := range []bool{false, true} {
		t.Run(fmt.Sprintf("handoff=%v", handoff), func(t *testing.T) {
			base := t.TempDir()
			s, _ := Open(filepath.Join(base, "local"), "job")
			snap := filepath.Join(base, "snap")
			os.Mkdir(snap, 0o755)
			for i := range n {
				if err := os.WriteFile(filepath.Join(snap, fmt.Sprintf("%s%06d.sst", pad, i)), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			sn, err := s.Take("t", 1, snap, handoff)
			if err != nil {
				t.Fatal(err)
			}
			if err := sn.Inspect(); err != nil {
				t.Fatal(err)
			}
			if len(sn.Files) != n {
				t.Fatalf("took %d files of %d", len(sn.Files), n)
			}
			for i, f := range sn.Files {
				if want := fmt.Sprintf("%s%06d.sst", pad, i); f.Name != want {
					t.Fatalf("file %d is %q, want %q", i, f.Name, want)
				}
			}

			bad := filepath.Join(base, "bad")
			os.Mkdir(bad, 0o755)
			for i := range n {
				name := filepath.Join(bad, fmt.Sprintf("%s%06d.sst", pad, i))
				if i == n-7 {
					os.Symlink("/etc/passwd", name)
					continue
				}
				os.WriteFile(name, nil, 0o644)
			}
			_, err = s.Take("t", 2, bad, handoff)
			if be, ok := err.(*BadFileError); !ok || be.Reason != "is a symlink" || !strings.HasSuffix(be.Name, fmt.Sprintf("%06d.sst", n-7)) {
				t.Fatalf("a symlink among %d files: %v, want a BadFileError naming it", n, err)
			}
			if _, err := os.Stat(s.chkDir("t", 2)); !os.IsNotExist(err) {
				t.Fatal("a refused snapshot left a directory in the local store")
			}
			if _, err := os.Stat(bad); err != nil {
				t.Fatal("a refused snapshot dir was moved away from the app")
			}
		})
	}
}

// A file that appears in a handed-off snapshot after the sync phase listed
// it fails the inspection: what is uploaded is what was listed.
func TestInspectRefusesAFileAddedAfterTheSyncPhase(t *testing.T) {
	base := t.TempDir()
	s, _ := Open(filepath.Join(base, "local"), "job")
	snap := filepath.Join(base, "snap")
	write(t, snap, map[string]string{"000001.sst": "sst", "CURRENT": "cur"})
	sn, err := s.Take("t", 1, snap, true)
	if err != nil || !sn.HandedOff {
		t.Fatalf("take: %v, handed off %v", err, sn != nil && sn.HandedOff)
	}
	write(t, sn.Dir, map[string]string{"000002.sst": "late"})
	if be, ok := sn.Inspect().(*BadFileError); !ok || !strings.Contains(be.Reason, "changed while being taken") {
		t.Fatalf("a file added after the sync phase passed inspection: %v", be)
	}
}

// Inspect splits a large snapshot among threads: every file is stat'ed
// into its place, and of two bad files the first in name order is named.
func TestInspectOfALargeSnapshotChecksEveryFile(t *testing.T) {
	const n = inspectSplit + 100
	base := t.TempDir()
	s, _ := Open(filepath.Join(base, "local"), "job")
	snap := filepath.Join(base, "snap")
	os.Mkdir(snap, 0o755)
	for i := range n {
		if err := os.WriteFile(filepath.Join(snap, fmt.Sprintf("%06d.sst", i)), make([]byte, i%7), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sn, err := s.Take("t", 1, snap, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := sn.Inspect(); err != nil {
		t.Fatal(err)
	}
	for i, f := range sn.Files {
		if f.Name != fmt.Sprintf("%06d.sst", i) || f.Size != int64(i%7) || f.Ino != ino(t, sn.Path(f.Name)) {
			t.Fatalf("file %d: %+v", i, f)
		}
	}
	for _, i := range []int{n - 3, 10} {
		p := sn.Path(fmt.Sprintf("%06d.sst", i))
		os.Remove(p)
		os.Symlink("/etc/passwd", p)
	}
	if be, ok := sn.Inspect().(*BadFileError); !ok || be.Name != "000010.sst" {
		t.Fatalf("two symlinks slipped in: %v, want a BadFileError naming the first", be)
	}
}

// TestModeKindAgreesWithDirentKind: every file type reads the same from a
// d_type and from an st_mode.
func TestModeKindAgreesWithDirentKind(t *testing.T) {
	pairs := map[uint32]uint8{unix.S_IFREG: unix.DT_REG, unix.S_IFLNK: unix.DT_LNK, unix.S_IFDIR: unix.DT_DIR,
		unix.S_IFBLK: unix.DT_BLK, unix.S_IFCHR: unix.DT_CHR, unix.S_IFSOCK: unix.DT_SOCK, unix.S_IFIFO: unix.DT_FIFO}
	for mode, typ := range pairs {
		if got, want := modeKind(mode|0o644), direntKind(typ); got != want {
			t.Errorf("mode %o: %q, d_type %d: %q", mode, got, typ, want)
		}
	}
	if modeKind(unix.S_IFREG|0o600) != "" || modeKind(unix.S_IFLNK) == "" {
		t.Error("a regular file must read as one, a symlink not")
	}
}
