package restore_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage/file"
	"github.com/ckpt-io/ckpt/uploader"
)

type env struct {
	t      *testing.T
	base   string
	store  *file.Store
	local  *localrecovery.Store
	snap   string
	target string
}

// setup checkpoints a snapshot of four files as checkpoint 3 of task t,
// with a local copy, the way the agent does.
func setup(t *testing.T) *env { return setupFormat(t, manifests.FormatVersion) }

// setupFormat is setup writing the manifest in the given format (and
// hashing with its algorithm, as the agent does).
func setupFormat(t *testing.T, format int) *env {
	base := t.TempDir()
	e := &env{t: t, base: base, snap: filepath.Join(base, "snap"), target: filepath.Join(base, "restored", "db")}
	e.store, _ = file.New(filepath.Join(base, "store"))
	var err error
	if e.local, err = localrecovery.Open(filepath.Join(base, "local"), "job"); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(e.snap, 0o755)
	for name, size := range map[string]int{"000001.sst": 200_000, "000002.sst": 50_000, "MANIFEST-000001": 80_000, "CURRENT": 16} {
		b := bytes.Repeat([]byte(name), size/len(name)+1)[:size]
		os.WriteFile(filepath.Join(e.snap, name), b, 0o644)
	}
	ctx := context.Background()
	sn, err := e.local.Take("t", 3, e.snap, false)
	if err == nil {
		err = sn.Inspect()
	}
	if err != nil {
		t.Fatal(err)
	}
	alg := manifests.BLAKE3
	if format == manifests.Format1 {
		alg = manifests.SHA256
	}
	res, err := uploader.Upload(ctx, uploader.Request{Store: e.store, Job: "job", Task: "t", Checkpoint: 3, Snapshot: sn, Alg: alg})
	if err != nil {
		t.Fatal(err)
	}
	m := &manifests.Manifest{Job: "job", Task: "t", Checkpoint: 3, Created: time.Now(), Files: res.Files, Format: format}
	for _, f := range res.Files {
		m.FullSize += f.Size
	}
	enc, _ := m.Encode(res.BytesWritten)
	if err := manifests.Commit(ctx, e.store, m, enc); err != nil {
		t.Fatal(err)
	}
	if _, err := e.local.Complete("t", 3, m, enc); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) run(o restore.Options) (*restore.Result, error) {
	o.Store, o.Job, o.Task = e.store, "job", "t"
	if o.Target == "" {
		o.Target = e.target
	}
	return restore.Run(context.Background(), o)
}

func (e *env) sameAsSnapshot() {
	e.t.Helper()
	entries, _ := os.ReadDir(e.snap)
	got, _ := os.ReadDir(e.target)
	if len(got) != len(entries) {
		e.t.Fatalf("restored %d files, snapshot has %d", len(got), len(entries))
	}
	for _, de := range entries {
		want, _ := os.ReadFile(filepath.Join(e.snap, de.Name()))
		have, err := os.ReadFile(filepath.Join(e.target, de.Name()))
		if err != nil || !bytes.Equal(want, have) {
			e.t.Fatalf("%s differs after restore (%v)", de.Name(), err)
		}
	}
}

// noDebris checks that nothing but the listed names is beside the target.
func (e *env) noDebris(allowed ...string) {
	e.t.Helper()
	entries, _ := os.ReadDir(filepath.Dir(e.target))
	for _, de := range entries {
		ok := false
		for _, a := range allowed {
			ok = ok || de.Name() == a
		}
		if !ok {
			e.t.Fatalf("left beside the target: %s", de.Name())
		}
	}
}

func TestRestoreFromStorageIsByteExact(t *testing.T) {
	e := setup(t)
	res, err := e.run(restore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e.sameAsSnapshot()
	if !res.Restored || res.Checkpoint != 3 || res.BytesLocal != 0 || res.BytesRemote != res.Bytes || res.Files != 4 {
		t.Fatalf("result %+v", res)
	}
	e.noDebris("db")
}

func TestStartupGuards(t *testing.T) {
	e := setup(t)
	os.MkdirAll(e.target, 0o755)
	os.WriteFile(filepath.Join(e.target, "CURRENT"), []byte("mine"), 0o644)
	if _, err := e.run(restore.Options{}); !errors.Is(err, restore.ErrTargetNotEmpty) {
		t.Fatalf("non-empty target: %v", err)
	}
	res, err := e.run(restore.Options{IfNotExists: true})
	if err != nil || res.Restored || res.Reason == "" {
		t.Fatalf("--if-not-exists: %+v %v", res, err)
	}
	if b, _ := os.ReadFile(filepath.Join(e.target, "CURRENT")); string(b) != "mine" {
		t.Fatal("--if-not-exists touched the existing store")
	}
	other := filepath.Join(e.base, "other")
	res, err = restore.Run(context.Background(), restore.Options{Store: e.store, Job: "job", Task: "nobody", Target: other, IfCheckpointExists: true})
	if err != nil || res.Restored {
		t.Fatalf("--if-checkpoint-exists: %+v %v", res, err)
	}
	if _, err := restore.Run(context.Background(), restore.Options{Store: e.store, Job: "job", Task: "nobody", Target: other}); !errors.Is(err, restore.ErrNoCheckpoint) {
		t.Fatalf("no checkpoint: %v", err)
	}
	if _, err := os.Stat(other); !os.IsNotExist(err) {
		t.Fatal("a skipped restore created its target")
	}
	b, _ := json.Marshal(res)
	if !strings.Contains(string(b), `"restored":false`) || !strings.Contains(string(b), `"reason"`) {
		t.Fatalf("skip JSON: %s", b)
	}
}

func TestACorruptObjectFailsLoudlyAndLeavesNoHalfStore(t *testing.T) {
	for _, c := range []struct {
		format int
		alg    string
	}{{manifests.Format1, "sha256"}, {manifests.Format2, "blake3"}} {
		t.Run(c.alg, func(t *testing.T) { corruptObjectFailsLoudly(t, c.format, c.alg) })
	}
}

func corruptObjectFailsLoudly(t *testing.T, format int, alg string) {
	e := setupFormat(t, format)
	m, _ := manifests.Load(context.Background(), e.store, "job", "t", 3)
	var victim manifests.File
	for _, f := range m.Files {
		if f.Name == "000002.sst" {
			victim = f
		}
	}
	p := filepath.Join(e.store.Root(), victim.Key)
	b, _ := os.ReadFile(p)
	b[100] ^= 0xff
	os.WriteFile(p, b, 0o644)
	_, err := e.run(restore.Options{})
	if err == nil || !strings.Contains(err.Error(), "000002.sst") || !strings.Contains(err.Error(), alg+" ") {
		t.Fatalf("corrupt object: %v", err)
	}
	if _, err := os.Stat(e.target); !os.IsNotExist(err) {
		t.Fatal("a failed restore left a target")
	}
	e.noDebris()
}

func ino(p string) uint64 {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

func TestLocalRestoreHardLinksAndFallsBackPerFile(t *testing.T) {
	for _, format := range []int{manifests.Format1, manifests.Format2} {
		t.Run(fmt.Sprint("format ", format), func(t *testing.T) { localRestoreFallsBackPerFile(t, format) })
	}
}

func localRestoreFallsBackPerFile(t *testing.T, format int) {
	e := setupFormat(t, format)
	l := localCopy(t, e)
	// Break the local copy: one SST corrupt (a fresh file, so the snapshot
	// keeps its bytes), one private file missing.
	os.Remove(l.Path("000002.sst"))
	os.WriteFile(l.Path("000002.sst"), bytes.Repeat([]byte("x"), 50_000), 0o644)
	os.Remove(l.Path("MANIFEST-000001"))
	res, err := e.run(restore.Options{LocalDir: filepath.Join(e.base, "local")})
	if err != nil {
		t.Fatal(err)
	}
	e.sameAsSnapshot()
	if res.LocalFallbacks != 2 || res.BytesLocal != 200_000+16 || res.BytesRemote != 50_000+80_000 {
		t.Fatalf("sources: %+v", res)
	}
	if ino(filepath.Join(e.target, "000001.sst")) != ino(filepath.Join(e.snap, "000001.sst")) {
		t.Fatal("an intact local SST was copied, not hard-linked")
	}
	// Restore inherits: the local dir now records checkpoint 3 as the
	// restored files, inode for inode.
	l = localCopy(t, e)
	if l == nil || ino(l.Path("000002.sst")) != ino(filepath.Join(e.target, "000002.sst")) {
		t.Fatal("the restore was not recorded in the local dir")
	}
}

func TestAMaliciousManifestIsRefusedBeforeAnythingIsWritten(t *testing.T) {
	for _, name := range []string{"../evil", "/abs/evil", "a/b", "x\x00y", ".."} {
		t.Run(fmt.Sprintf("%q", name), func(t *testing.T) {
			e := setupFormat(t, manifests.Format1) // its JSON body is edited below; format 2's in manifests
			key := manifests.ManifestKey("job", "t", 3)
			p := filepath.Join(e.store.Root(), key)
			raw, _ := os.ReadFile(p)
			var env struct {
				Format int             `json:"format"`
				SHA256 string          `json:"sha256"`
				Body   json.RawMessage `json:"body"`
			}
			json.Unmarshal(raw, &env)
			var body map[string]any
			json.Unmarshal(env.Body, &body)
			f := body["files"].([]any)[0].(map[string]any)
			f["name"] = name
			env.Body, _ = json.Marshal(body)
			s := sha256.Sum256(env.Body)
			env.SHA256 = hex.EncodeToString(s[:]) // a valid checksum: only the name check can refuse it
			out, _ := json.Marshal(env)
			os.WriteFile(p, out, 0o644)
			_, err := e.run(restore.Options{})
			if err == nil || !strings.Contains(err.Error(), "unsafe file name") {
				t.Fatalf("malicious manifest: %v", err)
			}
			if _, err := os.Stat(filepath.Join(e.base, "restored", "evil")); !os.IsNotExist(err) {
				t.Fatal("a file escaped the target")
			}
			if _, err := os.Stat(filepath.Dir(e.target)); !os.IsNotExist(err) {
				t.Fatal("the refused restore created directories")
			}
		})
	}
}

func TestIdentityModeTrustsUnchangedInodesAndHashesTheRest(t *testing.T) {
	e := setup(t)
	l := localCopy(t, e)
	orig1, _ := os.ReadFile(filepath.Join(e.snap, "000001.sst"))
	orig2, _ := os.ReadFile(filepath.Join(e.snap, "000002.sst"))
	// An in-place corruption that keeps size and mtime (bit rot, say) is
	// invisible to identity mode: the documented price of its speed.
	rot := l.Path("000001.sst")
	fi, _ := os.Stat(rot)
	b, _ := os.ReadFile(rot)
	b[7] ^= 0xff
	os.WriteFile(rot, b, 0o644)
	os.Chtimes(rot, fi.ModTime(), fi.ModTime())
	// A rewritten file (new mtime) is no longer the recorded inode state: it
	// is hashed, found corrupt, and fetched from storage.
	w := l.Path("000002.sst")
	os.Remove(w)
	os.WriteFile(w, bytes.Repeat([]byte("z"), 50_000), 0o644)

	res, err := e.run(restore.Options{LocalDir: filepath.Join(e.base, "local"), TrustUnchangedLocal: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.LocalVerification != "identity" || res.LocalFallbacks != 1 || res.BytesRemote != 50_000 {
		t.Fatalf("identity mode: %+v", res)
	}
	if got, _ := os.ReadFile(filepath.Join(e.target, "000002.sst")); !bytes.Equal(got, orig2) {
		t.Fatal("the rewritten local file was trusted")
	}
	if got, _ := os.ReadFile(filepath.Join(e.target, "000001.sst")); bytes.Equal(got, orig1) {
		t.Fatal("identity mode was expected to miss the in-place corruption (it does not hash)")
	}

	// The default mode hashes every local byte and catches the bit rot.
	os.RemoveAll(e.target)
	res, err = e.run(restore.Options{LocalDir: filepath.Join(e.base, "local")})
	if err != nil {
		t.Fatal(err)
	}
	if res.LocalVerification != "sha256" || res.LocalFallbacks < 1 {
		t.Fatalf("sha256 mode: %+v", res)
	}
	if got, _ := os.ReadFile(filepath.Join(e.target, "000001.sst")); !bytes.Equal(got, orig1) {
		t.Fatal("sha256 mode restored a corrupt local file")
	}
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// TestIdentityModeMovesAWholeUnchangedLocalCopy checks the one-rename
// restore: a local copy that holds exactly the manifest's files, each the
// inode it completed with, becomes the target; the local dir then holds a
// complete copy again (shared files linked back, private files its own),
// so that what the app appends to its files never reaches the copy, and a
// second restore moves the copy again with the checkpoint's bytes.
func TestIdentityModeMovesAWholeUnchangedLocalCopy(t *testing.T) {
	e := setup(t)
	localDir := filepath.Join(e.base, "local")
	sst := inode(t, localCopy(t, e).Path("000001.sst"))
	origManifest, _ := os.ReadFile(filepath.Join(e.snap, "MANIFEST-000001"))

	res, err := e.run(restore.Options{LocalDir: localDir, TrustUnchangedLocal: true})
	if err != nil {
		t.Fatal(err)
	}
	res.Wait()
	if !res.Moved || res.FilesLocal != 4 || res.BytesRemote != 0 || res.LocalVerification != "identity" {
		t.Fatalf("result %+v", res)
	}
	e.sameAsSnapshot()
	e.noDebris("db")
	if got := inode(t, filepath.Join(e.target, "000001.sst")); got != sst {
		t.Fatalf("the SST was not moved: inode %d, local copy had %d", got, sst)
	}

	l := localCopy(t, e)
	if l == nil {
		t.Fatal("no complete local copy after the move")
	}
	if got := inode(t, l.Path("000001.sst")); got != sst {
		t.Fatalf("the local copy's SST is inode %d, want the target's %d", got, sst)
	}
	if inode(t, l.Path("MANIFEST-000001")) == inode(t, filepath.Join(e.target, "MANIFEST-000001")) {
		t.Fatal("the local copy shares a private file with the target the app writes to")
	}
	for _, name := range []string{"000001.sst", "000002.sst", "MANIFEST-000001", "CURRENT"} {
		if !unchanged(l, name) {
			t.Fatalf("%s of the re-created local copy is not recorded as unchanged", name)
		}
	}

	// The app appends to its MANIFEST; the local copy keeps the checkpoint's.
	f, _ := os.OpenFile(filepath.Join(e.target, "MANIFEST-000001"), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("edit")
	f.Close()
	second := filepath.Join(e.base, "restored", "db2")
	res, err = e.run(restore.Options{LocalDir: localDir, TrustUnchangedLocal: true, Target: second})
	if err != nil {
		t.Fatal(err)
	}
	res.Wait()
	if !res.Moved {
		t.Fatalf("second restore not moved: %+v", res)
	}
	if got, _ := os.ReadFile(filepath.Join(second, "MANIFEST-000001")); !bytes.Equal(got, origManifest) {
		t.Fatal("the second restore got the app's edit, not the checkpoint's MANIFEST")
	}
}

// TestIdentityModeDoesNotMoveACopyWithStrangers checks that a local copy
// holding a file its manifest does not name is restored file by file, and
// the stranger stays out of the target.
func TestIdentityModeDoesNotMoveACopyWithStrangers(t *testing.T) {
	e := setup(t)
	l := localCopy(t, e)
	os.WriteFile(filepath.Join(l.Dir, "stranger"), []byte("x"), 0o644)
	res, err := e.run(restore.Options{LocalDir: filepath.Join(e.base, "local"), TrustUnchangedLocal: true})
	if err != nil {
		t.Fatal(err)
	}
	res.Wait()
	if res.Moved || res.FilesLocal != 4 {
		t.Fatalf("result %+v", res)
	}
	e.sameAsSnapshot()
}

// TestARestoreIntoAnOpenParentNeverWalksTheTargetPath: with TargetParent,
// the restore creates, fills and places the target relative to that open
// directory. The parent's path is swapped for a symlink to another place
// before the restore starts: nothing lands there, and the target appears,
// verified, in the directory that was opened. Files come both from the
// local copy (hard links relative to its opened dir) and from storage.
func TestARestoreIntoAnOpenParentNeverWalksTheTargetPath(t *testing.T) {
	e := setup(t)
	parentPath := filepath.Dir(e.target)
	if err := os.MkdirAll(parentPath, 0o755); err != nil {
		t.Fatal(err)
	}
	parent, err := os.Open(parentPath)
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	moved := filepath.Join(e.base, "opened")
	if err := os.Rename(parentPath, moved); err != nil {
		t.Fatal(err)
	}
	elsewhere := t.TempDir()
	if err := os.Symlink(elsewhere, parentPath); err != nil {
		t.Fatal(err)
	}
	l, _ := e.local.Latest("t")
	os.Remove(l.Path("MANIFEST-000001")) // one file from storage
	res, err := e.run(restore.Options{TargetParent: parent, LocalDir: filepath.Join(e.base, "local")})
	if err != nil {
		t.Fatal(err)
	}
	if res.FilesLocal == 0 || res.FilesRemote == 0 {
		t.Fatalf("sources: %+v", res)
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Fatalf("the restore wrote through the swapped path: %v", entries)
	}
	os.Remove(parentPath)
	os.Rename(moved, parentPath)
	e.sameAsSnapshot()
	e.noDebris("db")
}

// localCopy returns the complete local copy of checkpoint 3, the one every
// test here makes.
func localCopy(t *testing.T, e *env) *localrecovery.Local {
	t.Helper()
	l, err := e.local.Latest("t")
	if err != nil || l == nil || l.Checkpoint != 3 {
		t.Fatalf("local copy of checkpoint 3: %v, %v", l, err)
	}
	return l
}

// unchanged is Local.UnchangedInfo for the file as it is now.
func unchanged(l *localrecovery.Local, name string) bool {
	fi, err := os.Lstat(l.Path(name))
	return err == nil && l.UnchangedInfo(name, fi)
}

// nothingVisible checks that a failed restore left no target and nothing
// else beside it (no temporary directory).
func (e *env) nothingVisible() {
	e.t.Helper()
	if _, err := os.Lstat(e.target); !errors.Is(err, os.ErrNotExist) {
		e.t.Fatalf("a failed restore left its target: %v", err)
	}
	e.noDebris()
}

// TestALaterRestoreRemovesTheTempDirsOfKilledOnes: a restore killed before
// its rename leaves a temporary directory holding a whole verified copy of
// the store under a random name. The next restore of the same target
// removes such a directory once it is unlocked and a minute old, and
// leaves alone one a running restore holds (its lock) or that is fresh.
func TestALaterRestoreRemovesTheTempDirsOfKilledOnes(t *testing.T) {
	e := setup(t)
	parent := filepath.Dir(e.target)
	os.MkdirAll(parent, 0o755)
	mk := func(name string, age time.Duration) string {
		d := filepath.Join(parent, name)
		os.Mkdir(d, 0o755)
		os.WriteFile(filepath.Join(d, "000001.sst"), []byte("a copy of the store"), 0o644)
		old := time.Now().Add(-age)
		os.Chtimes(d, old, old)
		return d
	}
	stale := mk(".db.restore-0123456789ab", time.Hour)
	fresh := mk(".db.restore-fresh0000000", 0)
	held := mk(".db.restore-held00000000", time.Hour)
	other := mk(".other.restore-000000000000", time.Hour) // another target's
	lock, err := os.Open(held)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if _, err := e.run(restore.Options{}); err != nil {
		t.Fatal(err)
	}
	e.sameAsSnapshot()
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the stale temp dir of a killed restore is still there (%v)", err)
	}
	for _, d := range []string{fresh, held, other} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s was removed: %v", filepath.Base(d), err)
		}
	}
}
