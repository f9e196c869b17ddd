//go:build ckpt_failpoints

package localrecovery

// The disk-fault suite of the local store: every write, fsync and rename
// the store makes fails with ENOSPC, EIO or EROFS (failpoints; see
// internal/failpoint), and the store must fail cleanly: the error says
// what failed and where, and no partial checkpoint is left that a later
// restore could take for a complete one. Run with
//
//	go test -tags ckpt_failpoints ./localrecovery/

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ckpt-io/ckpt/internal/failpoint"
)

// notKept fails the test if checkpoint n of task is kept in the store in
// any form: a dir, a record, or a record's temporary file.
func notKept(t *testing.T, s *Store, task string, n uint64) {
	t.Helper()
	s.Wait()
	if s.load(task, n) != nil {
		t.Fatalf("checkpoint %d is recorded complete after a failure", n)
	}
	for _, p := range []string{s.chkDir(task, n), s.manifestPath(task, n), s.manifestPath(task, n) + ".tmp"} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("left in the local store after a failure: %s (%v)", p, err)
		}
	}
}

// The sync phase: a failed link (or copy) fails the whole snapshot and
// leaves nothing of it; a failed rename of a handed-off directory falls
// back to links; there is no fsync to fail (the local store is a cache).
func TestDiskFaultsInTheSyncPhase(t *testing.T) {
	for _, errno := range failpoint.Errnos {
		t.Run("write/"+failpoint.ErrnoName(errno), func(t *testing.T) {
			base := t.TempDir()
			s, _ := Open(filepath.Join(base, "local"), "job")
			snap := filepath.Join(base, "snap")
			write(t, snap, map[string]string{"000001.sst": "one", "000002.sst": "two", "CURRENT": "c"})
			for after := range 3 { // the first, second and last file
				failpoint.Arm(t, failpoint.LocalWrite, errno, after)
				_, err := link(t, s, "t", 1, snap)
				if !errors.Is(err, errno) || !strings.Contains(err.Error(), s.Root()) {
					t.Fatalf("link with the %d-th write failing: %v, want %v naming the local dir %s", after+1, err, errno, s.Root())
				}
				notKept(t, s, "t", 1)
			}
			failpoint.Disarm(t)
			sn, err := link(t, s, "t", 1, snap)
			if err != nil || len(sn.Files) != 3 {
				t.Fatalf("link once the disk is fine: %+v %v", sn, err)
			}
		})
		t.Run("rename/"+failpoint.ErrnoName(errno), func(t *testing.T) {
			base := t.TempDir()
			s, _ := Open(filepath.Join(base, "local"), "job")
			snap := filepath.Join(base, "snap")
			write(t, snap, map[string]string{"000001.sst": "one", "CURRENT": "c"})
			failpoint.Arm(t, failpoint.LocalRename, errno, 0)
			sn, err := s.Take("t", 1, snap, true)
			if err != nil {
				t.Fatalf("a handoff whose rename fails falls back to links: %v", err)
			}
			if err := sn.Inspect(); err != nil || sn.HandedOff || len(sn.Files) != 2 {
				t.Fatalf("snapshot %+v (%v), want linked, not handed off", sn, err)
			}
			if _, err := os.Stat(filepath.Join(snap, "CURRENT")); err != nil {
				t.Fatalf("the snapshot dir was not left to the app: %v", err)
			}
		})
		t.Run("fsync/"+failpoint.ErrnoName(errno), func(t *testing.T) {
			base := t.TempDir()
			s, _ := Open(filepath.Join(base, "local"), "job")
			snap := filepath.Join(base, "snap")
			write(t, snap, map[string]string{"000001.sst": "one", "CURRENT": "c"})
			failpoint.Arm(t, failpoint.LocalSync, errno, 0)
			if _, err := link(t, s, "t", 1, snap); err != nil {
				t.Fatalf("the sync phase fsyncs nothing, yet: %v", err)
			}
		})
	}
}

// The local copy's record: a failed write or rename of the record fails
// Complete, leaves the checkpoint unrecorded (a restore never takes it),
// keeps the previous complete copy, and a later Complete succeeds.
func TestDiskFaultsInTheLocalCopysRecord(t *testing.T) {
	for _, op := range []string{"write", "rename", "fsync"} {
		for _, errno := range failpoint.Errnos {
			t.Run(op+"/"+failpoint.ErrnoName(errno), func(t *testing.T) {
				base := t.TempDir()
				s, _ := Open(filepath.Join(base, "local"), "job")
				snap := filepath.Join(base, "snap")
				write(t, snap, map[string]string{"000001.sst": "one", "CURRENT": "c"})
				for _, n := range []uint64{1, 2} {
					if _, err := link(t, s, "t", n, snap); err != nil {
						t.Fatal(err)
					}
				}
				m1, enc1 := manifestFor(t, "t", 1, snap, "000001.sst", "CURRENT")
				if _, err := s.Complete("t", 1, m1, enc1); err != nil {
					t.Fatal(err)
				}
				m2, enc2 := manifestFor(t, "t", 2, snap, "000001.sst", "CURRENT")
				writes := 2 // the identities, then the record
				for after := range writes {
					switch op {
					case "write":
						failpoint.Arm(t, failpoint.LocalWrite, errno, after)
					case "rename":
						failpoint.Arm(t, failpoint.LocalRename, errno, 0)
					case "fsync":
						failpoint.Arm(t, failpoint.LocalSync, errno, 0)
					}
					_, err := s.Complete("t", 2, m2, enc2)
					if op == "fsync" {
						if err != nil {
							t.Fatalf("the local store fsyncs nothing, yet: %v", err)
						}
						return
					}
					if !errors.Is(err, errno) || !strings.Contains(err.Error(), s.Root()) {
						t.Fatalf("complete: %v, want %v naming the local dir", err, errno)
					}
					if s.load("t", 2) != nil {
						t.Fatal("checkpoint 2 is recorded complete after its record failed")
					}
					if _, err := os.Lstat(s.manifestPath("t", 2) + ".tmp"); !errors.Is(err, os.ErrNotExist) {
						t.Fatalf("a partial record is left: %v", err)
					}
					if l, _ := s.Latest("t"); l == nil || l.Checkpoint != 1 {
						t.Fatalf("the previous complete copy is gone: %+v", l)
					}
				}
				failpoint.Disarm(t)
				if _, err := s.Complete("t", 2, m2, enc2); err != nil || s.load("t", 2) == nil {
					t.Fatalf("complete once the disk is fine: %v", err)
				}
				s.Wait()
			})
		}
	}
}

// Adoption (a restored store recorded as the local copy): a failed link,
// copy or record leaves the checkpoint unrecorded; nothing of it is taken
// for a complete copy.
func TestDiskFaultsInAdoption(t *testing.T) {
	for _, op := range []string{"write", "rename", "fsync"} {
		for _, errno := range failpoint.Errnos {
			t.Run(op+"/"+failpoint.ErrnoName(errno), func(t *testing.T) {
				base := t.TempDir()
				s, _ := Open(filepath.Join(base, "local"), "job")
				restored := filepath.Join(base, "db")
				write(t, restored, map[string]string{"000001.sst": "one", "MANIFEST-000001": "m"})
				m, enc := manifestFor(t, "t", 4, restored, "000001.sst", "MANIFEST-000001")
				switch op {
				case "write":
					failpoint.Arm(t, failpoint.LocalWrite, errno, 0)
				case "rename":
					failpoint.Arm(t, failpoint.LocalRename, errno, 0)
				case "fsync":
					failpoint.Arm(t, failpoint.LocalSync, errno, 0)
				}
				_, err := s.Adopt("t", m, enc, restored)
				if op == "fsync" {
					if err != nil || s.load("t", 4) == nil {
						t.Fatalf("adopt: %v (the local store fsyncs nothing)", err)
					}
					return
				}
				if !errors.Is(err, errno) {
					t.Fatalf("adopt: %v, want %v", err, errno)
				}
				if s.load("t", 4) != nil || s.GetFor("t", m, enc) != nil {
					t.Fatal("a failed adoption is recorded complete")
				}
				failpoint.Disarm(t)
				if n, err := s.Adopt("t", m, enc, restored); err != nil || n != 2 || s.GetFor("t", m, enc) == nil {
					t.Fatalf("adopt once the disk is fine: %d %v", n, err)
				}
			})
		}
	}
}
