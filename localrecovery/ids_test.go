package localrecovery

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The identities a checkpoint completed with are what lets the next one
// skip hashing and a restore skip verifying: they must survive a restart,
// in the record this build writes and in the one earlier builds wrote,
// and a record that does not fit the manifest must vouch for nothing.
func TestTheIdentitiesOfACompleteCopySurviveARestart(t *testing.T) {
	names := []string{"000001.sst", "000002.sst", "000003.sst", "CURRENT"}
	// Of one size: only the name tells their identities apart.
	body := map[string]string{"000001.sst": "one..", "000002.sst": "two..", "000003.sst": "three", "CURRENT": "cur.."}
	for _, tc := range []struct {
		name string
		// order is the manifest's file order; inspected says whether the
		// snapshot's inspected files are passed to CompleteInspected.
		order     []string
		inspected bool
		record    func(t *testing.T, path string, s *Store)
		vouches   bool
	}{
		{name: "in the manifest's order", order: names, inspected: true, vouches: true},
		{name: "in another order", order: []string{"CURRENT", "000003.sst", "000001.sst", "000002.sst"}, inspected: true, vouches: true},
		{name: "stat'ed, not inspected", order: names, vouches: true},
		{name: "recorded by an earlier build", order: names, inspected: true, vouches: true,
			record: func(t *testing.T, path string, s *Store) {
				byName := map[string]Identity{}
				for _, n := range names {
					f, err := stat(filepath.Join(filepath.Dir(path), "00000000000000000001", n))
					if err != nil {
						t.Fatal(err)
					}
					byName[n] = f.ID()
				}
				b, _ := json.Marshal(byName)
				os.WriteFile(path, b, 0o640)
			}},
		{name: "of another manifest", order: names, inspected: true,
			record: func(t *testing.T, path string, s *Store) {
				// The right identities, and one more file.
				l, _ := s.Latest("t")
				os.WriteFile(path, encodeIDs(append(l.ids, l.ids[0])), 0o640)
			}},
		{name: "cut short", order: names, inspected: true,
			record: func(t *testing.T, path string, s *Store) {
				b, _ := os.ReadFile(path)
				os.WriteFile(path, b[:len(b)-1], 0o640)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			s, _ := Open(filepath.Join(base, "local"), "job")
			snap := filepath.Join(base, "snap")
			write(t, snap, body)
			sn, err := link(t, s, "t", 1, snap)
			if err != nil {
				t.Fatal(err)
			}
			m, enc := manifestFor(t, "t", 1, snap, tc.order...)
			var inspected []File
			if tc.inspected {
				inspected = sn.Files
			}
			l, err := s.CompleteInspected("t", 1, m, enc, inspected)
			if err != nil {
				t.Fatal(err)
			}
			if h := l.Hashes(); len(h) != len(names) {
				t.Fatalf("the completed copy knows %d hashes by inode, want %d", len(h), len(names))
			}
			if tc.record != nil {
				tc.record(t, s.idsPath("t", 1), s)
			}
			s2, _ := Open(filepath.Join(base, "local"), "job") // a restart
			l2, err := s2.Latest("t")
			if err != nil || l2 == nil {
				t.Fatalf("latest after a restart: %v %v", l2, err)
			}
			for _, n := range names {
				if got := unchanged(l2, n); got != tc.vouches {
					t.Fatalf("%s unchanged = %v, want %v", n, got, tc.vouches)
				}
			}
			if !tc.vouches {
				return
			}
			// A file written since is not the file the checkpoint holds.
			p := l2.Path("000002.sst")
			later := time.Now().Add(time.Hour)
			if err := os.Chtimes(p, later, later); err != nil {
				t.Fatal(err)
			}
			if unchanged(l2, "000002.sst") || !unchanged(l2, "000001.sst") {
				t.Fatal("a file written since its checkpoint still counts as unchanged, or its neighbour stopped counting")
			}
		})
	}
}

// A completed checkpoint's older copy leaves the task at once, and its
// files go when the agent says (after it answered completed), or at Wait.
func TestCompleteLeavesTheRemovalOfOlderCopiesForLater(t *testing.T) {
	base := t.TempDir()
	s, _ := Open(filepath.Join(base, "local"), "job")
	snap := filepath.Join(base, "snap")
	write(t, snap, map[string]string{"000001.sst": "one", "CURRENT": "c"})
	for n := uint64(1); n <= 2; n++ {
		sn, err := link(t, s, "t", n, snap)
		if err != nil {
			t.Fatal(err)
		}
		m, enc := manifestFor(t, "t", n, snap, "000001.sst", "CURRENT")
		if _, err := s.CompleteInspected("t", n, m, enc, sn.Files); err != nil {
			t.Fatal(err)
		}
	}
	if nums, _ := s.checkpoints("t"); len(nums) != 1 || nums[0] != 2 {
		t.Fatalf("the task holds %v, want [2]", nums)
	}
	s.pendingMu.Lock()
	pending := append([]string(nil), s.pending...)
	s.pendingMu.Unlock()
	if len(pending) != 1 {
		t.Fatalf("pending removals %v, want checkpoint 1's copy", pending)
	}
	if _, err := os.Stat(filepath.Join(pending[0], "000001.sst")); err != nil {
		t.Fatalf("the discarded copy's files went before RemoveDiscarded: %v", err)
	}
	s.Wait()
	if _, err := os.Stat(pending[0]); !os.IsNotExist(err) {
		t.Fatalf("the discarded copy is still there after Wait: %v", err)
	}
}
