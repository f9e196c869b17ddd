//go:build ckpt_failpoints

package restore_test

// The disk-fault suite of restore: every write, fsync and rename into the
// restore target (and into the local dir, where the restore is recorded)
// fails with ENOSPC, EIO or EROFS (failpoints; see internal/failpoint).
// A restore that fails must leave no target (nor a partial one at its
// name), no temporary directory beside it, and a local copy that a later
// restore still uses. Run with
//
//	go test -tags ckpt_failpoints ./restore/

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ckpt-io/ckpt/internal/failpoint"
	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/restore"
)

// fault is one place of the matrix: the failpoint, how many of its hits
// pass first, and whether the restore takes files from the local copy.
type fault struct {
	name  string
	point string
	after int
	local bool
}

// The matrix on the restore target. From storage, the setup's four files
// are written (one write each, all below a buffer) and fsynced one by one,
// then the temporary directory is fsynced, renamed to the target, and the
// target's parent fsynced. From the local copy the two SSTs are hard
// links (a write each) and the two private files copies.
var targetFaults = []fault{
	{"write/first-file", failpoint.LocalWrite, 0, false},
	{"write/last-file", failpoint.LocalWrite, 3, false},
	{"write/local-link", failpoint.LocalWrite, 0, true},
	{"write/local-copy", failpoint.LocalWrite, 2, true},
	{"fsync/first-file", failpoint.LocalSync, 0, false},
	{"fsync/last-file", failpoint.LocalSync, 3, false},
	{"fsync/local-copy", failpoint.LocalSync, 0, true},
	{"fsync/temp-dir", failpoint.LocalSync, 4, false},
	{"fsync/parent-after-rename", failpoint.LocalSync, 5, false},
	{"rename/into-place", failpoint.LocalRename, 0, false},
	{"rename/into-place-from-local", failpoint.LocalRename, 0, true},
}

func TestDiskFaultsOnTheRestoreTarget(t *testing.T) {
	for _, f := range targetFaults {
		for _, errno := range failpoint.Errnos {
			t.Run(f.name+"/"+failpoint.ErrnoName(errno), func(t *testing.T) {
				e := setup(t)
				localDir := filepath.Join(e.base, "local")
				o := restore.Options{}
				if f.local {
					o.LocalDir = localDir
				}
				failpoint.Arm(t, f.point, errno, f.after)
				_, err := e.run(o)
				if !errors.Is(err, errno) {
					t.Fatalf("restore: %v, want %v", err, errno)
				}
				if !strings.Contains(err.Error(), filepath.Dir(e.target)) {
					t.Fatalf("the error does not name the target's directory %s: %v", filepath.Dir(e.target), err)
				}
				e.nothingVisible()
				if !hasCopy(e.local, 3) {
					t.Fatal("a failed restore lost the local copy")
				}
				// With the fault cleared, a restore succeeds and verifies,
				// taking what it can from the local copy.
				failpoint.Disarm(t)
				res, err := e.run(restore.Options{LocalDir: localDir})
				if err != nil {
					t.Fatalf("restore once the disk is fine: %v", err)
				}
				e.sameAsSnapshot()
				if res.BytesLocal != res.Bytes || res.LocalFallbacks != 0 {
					t.Fatalf("the local copy was not intact after the failure: %+v", res)
				}
			})
		}
	}
}

// The move strategy (identity mode, a whole unchanged local copy lent to
// the target): a failed fsync of its private files or a failed rename into
// place fails the restore with nothing visible; the local copy is gone
// from the store then (it was lent), and a later restore fetches from
// storage and verifies.
func TestDiskFaultsWhenTheLocalCopyIsMoved(t *testing.T) {
	for _, f := range []fault{
		{"fsync/private-file", failpoint.LocalSync, 0, true},
		{"fsync/temp-dir", failpoint.LocalSync, 2, true},
		{"rename/into-place", failpoint.LocalRename, 0, true},
	} {
		for _, errno := range failpoint.Errnos {
			t.Run(f.name+"/"+failpoint.ErrnoName(errno), func(t *testing.T) {
				e := setup(t)
				localDir := filepath.Join(e.base, "local")
				failpoint.Arm(t, f.point, errno, f.after)
				_, err := e.run(restore.Options{LocalDir: localDir, TrustUnchangedLocal: true})
				if !errors.Is(err, errno) {
					t.Fatalf("restore: %v, want %v", err, errno)
				}
				e.nothingVisible()
				failpoint.Disarm(t)
				res, err := e.run(restore.Options{LocalDir: localDir, TrustUnchangedLocal: true})
				if err != nil {
					t.Fatalf("restore once the disk is fine: %v", err)
				}
				res.Wait()
				e.sameAsSnapshot()
			})
		}
	}
}

// The local dir, when the restore is recorded there (adoption): the target
// is already in place and verified, so the restore succeeds and says the
// record failed; the local dir keeps no partial record that a later
// restore would trust. The fsync case checks that nothing there fsyncs.
func TestDiskFaultsWhileRecordingTheRestoreInTheLocalDir(t *testing.T) {
	for _, f := range []fault{
		// Four writes and one rename belong to the restore itself.
		{"write/adopt", failpoint.LocalWrite, 4, true},
		{"write/record-identities", failpoint.LocalWrite, 8, true},
		{"write/record-manifest", failpoint.LocalWrite, 9, true},
		{"rename/record", failpoint.LocalRename, 1, true},
		{"fsync/adopt", failpoint.LocalSync, 6, true},
	} {
		for _, errno := range failpoint.Errnos {
			t.Run(f.name+"/"+failpoint.ErrnoName(errno), func(t *testing.T) {
				e := setup(t)
				// A fresh local dir: everything comes from storage, and the
				// restore is adopted there.
				localDir := filepath.Join(e.base, "local2")
				failpoint.Arm(t, f.point, errno, f.after)
				res, err := e.run(restore.Options{LocalDir: localDir})
				if err != nil {
					t.Fatalf("restore: %v (the store was in place: a failed record must not fail it)", err)
				}
				e.sameAsSnapshot()
				ls2, err := localrecovery.Open(localDir, "job")
				if err != nil {
					t.Fatal(err)
				}
				if f.point == failpoint.LocalSync {
					if res.LocalRecordError != "" || !hasCopy(ls2, 3) {
						t.Fatalf("recorded: %q", res.LocalRecordError)
					}
					return
				}
				if !strings.Contains(res.LocalRecordError, localDir) || !strings.Contains(res.LocalRecordError, errno.Error()) {
					t.Fatalf("local record error %q, want one naming %s and %v", res.LocalRecordError, localDir, errno)
				}
				if hasCopy(ls2, 3) {
					t.Fatal("a failed record left a complete local checkpoint")
				}
				// A later restore on this node fetches from storage and verifies.
				failpoint.Disarm(t)
				e.target = filepath.Join(e.base, "restored", "db2")
				res, err = e.run(restore.Options{LocalDir: localDir})
				if err != nil || res.BytesRemote != res.Bytes {
					t.Fatalf("restore once the disk is fine: %+v %v", res, err)
				}
				e.sameAsSnapshot()
			})
		}
	}
}

// hasCopy reports whether ls keeps a complete local copy of checkpoint n of
// task t as its newest.
func hasCopy(ls *localrecovery.Store, n uint64) bool {
	l, err := ls.Latest("t")
	return err == nil && l != nil && l.Checkpoint == n
}
