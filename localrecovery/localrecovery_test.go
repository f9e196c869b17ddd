package localrecovery

import (
	"crypto/sha256"
	"encoding/hex"
	"github.com/ckpt-io/ckpt/engines"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/ckpt-io/ckpt/manifests"
)

func write(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	os.MkdirAll(dir, 0o755)
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func ino(t *testing.T, p string) uint64 {
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

func TestLinkHardLinksEveryFile(t *testing.T) {
	base := t.TempDir()
	s, err := Open(filepath.Join(base, "local"), "job")
	if err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(base, "snap")
	write(t, snap, map[string]string{"000001.sst": "sst", "CURRENT": "cur"})
	sn, err := link(t, s, "t", 1, snap)
	if err != nil {
		t.Fatal(err)
	}
	if len(sn.Files) != 2 || sn.Copied != 0 {
		t.Fatalf("snapshot %+v", sn)
	}
	if ino(t, sn.Path("000001.sst")) != ino(t, filepath.Join(snap, "000001.sst")) {
		t.Fatal("the local copy is not a hard link")
	}
	// The app may delete its snapshot the moment it reads synced.
	os.RemoveAll(snap)
	if b, err := os.ReadFile(sn.Path("000001.sst")); err != nil || string(b) != "sst" {
		t.Fatalf("local copy lost with the snapshot: %q %v", b, err)
	}
}

func TestLinkRefusesNonRegularFilesAndLeavesNothing(t *testing.T) {
	cases := map[string]func(dir string){
		"a symlink":   func(dir string) { os.Symlink("/etc/passwd", filepath.Join(dir, "x.sst")) },
		"a directory": func(dir string) { os.Mkdir(filepath.Join(dir, "sub"), 0o755) },
		"a fifo":      func(dir string) { syscall.Mkfifo(filepath.Join(dir, "LOCK"), 0o644) },
	}
	for name, add := range cases {
		t.Run(name, func(t *testing.T) {
			base := t.TempDir()
			s, _ := Open(filepath.Join(base, "local"), "job")
			snap := filepath.Join(base, "snap")
			write(t, snap, map[string]string{"000001.sst": "sst"})
			add(snap)
			_, err := link(t, s, "t", 1, snap)
			if _, ok := err.(*BadFileError); !ok {
				t.Fatalf("got %v, want a BadFileError", err)
			}
			if _, err := os.Stat(s.chkDir("t", 1)); !os.IsNotExist(err) {
				t.Fatal("a refused snapshot left a directory in the local store")
			}
		})
	}
}

func TestLinkCopiesAcrossDevices(t *testing.T) {
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no tmpfs at /dev/shm to make a second device")
	}
	snap, err := os.MkdirTemp("/dev/shm", "ckpt-snap-")
	if err != nil {
		t.Skip("cannot write /dev/shm")
	}
	defer os.RemoveAll(snap)
	s, _ := Open(t.TempDir(), "job")
	write(t, snap, map[string]string{"000001.sst": "sst"})
	var st1, st2 syscall.Stat_t
	syscall.Stat(snap, &st1)
	syscall.Stat(s.Root(), &st2)
	if st1.Dev == st2.Dev {
		t.Skip("/dev/shm is on the same device here")
	}
	sn, err := link(t, s, "t", 1, snap)
	if err != nil {
		t.Fatal(err)
	}
	if sn.Copied != 1 {
		t.Fatalf("copied %d files, want 1", sn.Copied)
	}
	if b, _ := os.ReadFile(sn.Path("000001.sst")); string(b) != "sst" {
		t.Fatalf("copy holds %q", b)
	}
}

func manifestFor(t *testing.T, task string, n uint64, dir string, names ...string) (*manifests.Manifest, []byte) {
	m := &manifests.Manifest{Job: "job", Task: task, Checkpoint: n}
	for _, name := range names {
		b, _ := os.ReadFile(filepath.Join(dir, name))
		f := manifests.File{Name: name, Kind: engines.SharedBySuffix(name), Size: int64(len(b)), SHA256: sum(b)}
		if f.Kind == manifests.Shared {
			f.Key = manifests.SharedKey("job", f.SHA256, f.Size)
		} else {
			f.Inline = b
		}
		m.Files = append(m.Files, f)
		m.FullSize += f.Size
	}
	enc, err := m.Encode(0)
	if err != nil {
		t.Fatal(err)
	}
	return m, enc
}

func TestCompleteKeepsOnlyTheNewestAndInFlight(t *testing.T) {
	base := t.TempDir()
	s, _ := Open(filepath.Join(base, "local"), "job")
	snap := filepath.Join(base, "snap")
	write(t, snap, map[string]string{"000001.sst": "one", "CURRENT": "c"})
	for n := uint64(1); n <= 3; n++ {
		if _, err := link(t, s, "t", n, snap); err != nil {
			t.Fatal(err)
		}
	}
	m, enc := manifestFor(t, "t", 2, snap, "000001.sst", "CURRENT")
	if _, err := s.Complete("t", 2, m, enc); err != nil {
		t.Fatal(err)
	}
	nums, _ := s.checkpoints("t")
	if len(nums) != 2 || nums[0] != 2 || nums[1] != 3 {
		t.Fatalf("kept %v, want [2 3] (3 is in flight)", nums)
	}
	l, _ := s.Latest("t")
	if l == nil || l.Checkpoint != 2 {
		t.Fatalf("latest = %+v", l)
	}
	// After a restart, the attempt that was in flight is debris.
	if _, err := s.Recover("t"); err != nil {
		t.Fatal(err)
	}
	nums, _ = s.checkpoints("t")
	if len(nums) != 1 || nums[0] != 2 {
		t.Fatalf("after recover kept %v, want [2]", nums)
	}
	idx := HashIndex(l)
	f, _ := stat(l.Path("000001.sst"))
	if idx[f.ID()] != sum([]byte("one")) {
		t.Fatal("hash index does not know the kept SST by its inode")
	}
	// A corrupt local manifest is ignored, not trusted.
	os.WriteFile(s.manifestPath("t", 2), []byte("{junk"), 0o644)
	if l, _ := s.Latest("t"); l != nil {
		t.Fatal("a corrupt local manifest was trusted")
	}
}

func TestAdoptLinksSharedAndCopiesPrivateFiles(t *testing.T) {
	base := t.TempDir()
	s, _ := Open(filepath.Join(base, "local"), "job")
	restored := filepath.Join(base, "db")
	write(t, restored, map[string]string{"000001.sst": "one", "MANIFEST-000001": "m"})
	m, enc := manifestFor(t, "t", 4, restored, "000001.sst", "MANIFEST-000001")
	if n, err := s.Adopt("t", m, enc, restored); err != nil || n != 2 {
		t.Fatalf("adopt: %d %v", n, err)
	}
	l := s.load("t", 4)
	if l == nil {
		t.Fatal("adopted checkpoint not complete")
	}
	if ino(t, l.Path("000001.sst")) != ino(t, filepath.Join(restored, "000001.sst")) {
		t.Fatal("shared file not hard-linked")
	}
	if ino(t, l.Path("MANIFEST-000001")) == ino(t, filepath.Join(restored, "MANIFEST-000001")) {
		t.Fatal("private file hard-linked: the engine's appends would corrupt the local copy")
	}
}

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func TestHandoffMovesTheDirectoryAndInspectChecksTheFiles(t *testing.T) {
	base := t.TempDir()
	s, _ := Open(filepath.Join(base, "local"), "job")
	snap := filepath.Join(base, "snap")
	write(t, snap, map[string]string{"000001.sst": "sst", "CURRENT": "cur"})
	before := ino(t, filepath.Join(snap, "000001.sst"))
	sn, err := s.Take("t", 1, snap, true)
	if err != nil {
		t.Fatal(err)
	}
	if !sn.HandedOff {
		t.Fatal("the directory was not handed off")
	}
	if _, err := os.Stat(snap); !os.IsNotExist(err) {
		t.Fatal("the handed-off directory is still where the app left it")
	}
	if err := sn.Inspect(); err != nil {
		t.Fatal(err)
	}
	if len(sn.Files) != 2 || ino(t, sn.Path("000001.sst")) != before {
		t.Fatalf("files after handoff: %+v", sn.Files)
	}
	// A file swapped for a symlink after the sync phase fails the inspection.
	snap2 := filepath.Join(base, "snap2")
	write(t, snap2, map[string]string{"000002.sst": "sst"})
	sn2, err := s.Take("t", 2, snap2, true)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(sn2.Path("000002.sst"))
	os.Symlink("/etc/passwd", sn2.Path("000002.sst"))
	if _, ok := sn2.Inspect().(*BadFileError); !ok {
		t.Fatal("a symlink slipped in after the sync phase passed inspection")
	}
}

// TestDiscardRemovesInTheBackgroundAndOpenSweepsLeftovers checks that a
// discarded checkpoint leaves its task at once, that Wait sees its files
// gone, and that a removal cut short (the process stopped) is finished by
// the next Open.
func TestDiscardRemovesInTheBackgroundAndOpenSweepsLeftovers(t *testing.T) {
	base := t.TempDir()
	local := filepath.Join(base, "local")
	s, err := Open(local, "job")
	if err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(base, "snap")
	write(t, snap, map[string]string{"000001.sst": "one", "000002.sst": "two", "CURRENT": "c"})
	for n := uint64(1); n <= 2; n++ {
		if _, err := link(t, s, "t", n, snap); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Discard("t", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.chkDir("t", 1)); !os.IsNotExist(err) {
		t.Fatalf("discarded dir still in the task: %v", err)
	}
	if nums, _ := s.checkpoints("t"); len(nums) != 1 || nums[0] != 2 {
		t.Fatalf("checkpoints after discard: %v, want [2]", nums)
	}
	s.Wait()
	if left, _ := os.ReadDir(filepath.Join(s.Root(), trashDir)); len(left) != 0 {
		t.Fatalf("after Wait, %d discarded dirs remain", len(left))
	}
	if err := s.Discard("t", 7); err != nil { // never taken: nothing to do
		t.Fatal(err)
	}

	// A removal cut short: the dir sits in the trash when the store opens.
	stale := filepath.Join(s.Root(), trashDir, "t-2-99")
	if err := os.Rename(s.chkDir("t", 2), stale); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(local, "job"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("Open left a discarded dir behind: %v", err)
	}
	if _, err := os.Stat(filepath.Join(snap, "000001.sst")); err != nil {
		t.Fatalf("the snapshot's own files must stay: %v", err)
	}
}

// TestGetForWantsTheSameManifestBytes checks that a local copy is only
// taken for the manifest storage holds: another manifest under the same
// task and number (a task started over in wiped storage) finds none.
func TestGetForWantsTheSameManifestBytes(t *testing.T) {
	base := t.TempDir()
	s, _ := Open(filepath.Join(base, "local"), "job")
	snap := filepath.Join(base, "snap")
	write(t, snap, map[string]string{"000001.sst": "one", "CURRENT": "c"})
	if _, err := link(t, s, "t", 5, snap); err != nil {
		t.Fatal(err)
	}
	m, enc := manifestFor(t, "t", 5, snap, "000001.sst", "CURRENT")
	if _, err := s.Complete("t", 5, m, enc); err != nil {
		t.Fatal(err)
	}
	if l := s.GetFor("t", m, enc); l == nil || !unchanged(l, "000001.sst") {
		t.Fatalf("the recorded manifest's copy: %+v", l)
	}
	write(t, filepath.Join(base, "other"), map[string]string{"000001.sst": "uno", "CURRENT": "c"})
	other, otherEnc := manifestFor(t, "t", 5, filepath.Join(base, "other"), "000001.sst", "CURRENT")
	if l := s.GetFor("t", other, otherEnc); l != nil {
		t.Fatal("a copy was offered for a different checkpoint 5")
	}
}

// link takes src into s as checkpoint n of task and inspects it: the sync
// phase and the first step of the async phase, as the agent runs them.
func link(t testing.TB, s *Store, task string, n uint64, src string) (*Snapshot, error) {
	t.Helper()
	sn, err := s.Take(task, n, src, false)
	if err != nil {
		return nil, err
	}
	if err := sn.Inspect(); err != nil {
		s.Discard(task, n)
		return nil, err
	}
	return sn, nil
}

// unchanged is Local.UnchangedInfo for the file as it is now.
func unchanged(l *Local, name string) bool {
	fi, err := os.Lstat(l.Path(name))
	return err == nil && l.UnchangedInfo(name, fi)
}
