package restore_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/savepoint"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
	"github.com/ckpt-io/ckpt/uploader"
	"github.com/ckpt-io/ckpt/wal"
)

// walEnv checkpoints a snapshot holding a log (000005.log, whose bytes are
// no records: its copy ends at 0) as checkpoint 3 of task t, with a local
// copy, as setup does.
func walEnv(t *testing.T) *env {
	base := t.TempDir()
	e := &env{t: t, base: base, snap: filepath.Join(base, "snap"), target: filepath.Join(base, "restored", "db")}
	e.store, _ = file.New(filepath.Join(base, "store"))
	var err error
	if e.local, err = localrecovery.Open(filepath.Join(base, "local"), "job"); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(e.snap, 0o755)
	for name, data := range map[string][]byte{"000001.sst": bytes.Repeat([]byte("sst"), 30_000), "MANIFEST-000001": []byte("manifest"), "CURRENT": []byte("MANIFEST-000001\n"), "000005.log": []byte("torn")} {
		os.WriteFile(filepath.Join(e.snap, name), data, 0o644)
	}
	ctx := context.Background()
	sn, err := e.local.Take("t", 3, e.snap, false)
	if err == nil {
		err = sn.Inspect()
	}
	if err != nil {
		t.Fatal(err)
	}
	res, err := uploader.Upload(ctx, uploader.Request{Store: e.store, Job: "job", Task: "t", Checkpoint: 3, Snapshot: sn})
	if err != nil {
		t.Fatal(err)
	}
	m := &manifests.Manifest{Job: "job", Task: "t", Checkpoint: 3, Created: time.Now().Add(-time.Hour), Files: res.Files}
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

// shipWAL commits WAL manifest seq of checkpoint 3 (epoch 0) with one
// segment of log 5 from start, and returns its bytes.
func (e *env) shipWAL(seq uint64, start, size int64, through time.Time) []byte {
	e.t.Helper()
	ctx := context.Background()
	data := bytes.Repeat([]byte{byte(seq)}, int(size))
	sum := sha256.Sum256(data)
	ref := wal.SegmentRef{Name: "000005.log", Log: 5, Start: start, End: start + int64(len(data)), Records: 1, SHA256: hex.EncodeToString(sum[:])}
	m := &wal.Manifest{Job: "job", Task: "t", Checkpoint: 3, Seq: seq, ThroughUnixMs: through.UnixMilli(), Segments: []wal.SegmentRef{ref}}
	if err := e.store.Put(ctx, m.SegmentKey(ref), bytes.NewReader(data), int64(len(data))); err != nil {
		e.t.Fatal(err)
	}
	if err := wal.Commit(ctx, e.store, m); err != nil {
		e.t.Fatal(err)
	}
	return data
}

func TestRestoreToLatestAppliesTheWALBeforeTheRename(t *testing.T) {
	e := walEnv(t)
	through := time.Now().Add(-2 * time.Second)
	// The log keeps its size ("torn" is cut, 4 bytes added): only its
	// content says it is no longer the checkpoint's.
	seg1 := e.shipWAL(1, 0, 1, through.Add(-time.Second))
	seg2 := e.shipWAL(2, 1, 3, through)
	// No local copy: the restore comes from storage and is recorded in the
	// local dir (Adopt) once placed.
	if err := e.local.Discard("t", 3); err != nil {
		t.Fatal(err)
	}
	e.local.Wait()
	res, err := e.run(restore.Options{To: restore.ToLatest, LocalDir: filepath.Join(e.base, "local")})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(e.target, "000005.log"))
	if !bytes.Equal(got, append(bytes.Clone(seg1), seg2...)) {
		t.Fatalf("the log holds %d bytes, want the snapshot's copy cut at its last record (0) and both segments", len(got))
	}
	p := res.WALPosition
	if p == nil || p.Seq != 2 || p.Log != "000005.log" || p.Offset != 4 || res.WALSegments != 2 || res.WALBytes != 4 || res.To != restore.ToLatest {
		t.Fatalf("result %+v position %+v", res, p)
	}
	// The newest write recovered is the last manifest's through time.
	if age := res.RecoveredWriteAgeMS; age < 2000 || age > 60_000 {
		t.Fatalf("recovered write age %d ms, want about 2000", age)
	}
	// The local copy of checkpoint 3 keeps no WAL byte: a restore of the
	// checkpoint that trusts unchanged local files gets the snapshot's log.
	target2 := filepath.Join(e.base, "restored", "db2")
	res, err = e.run(restore.Options{Target: target2, To: restore.ToCheckpoint, LocalDir: filepath.Join(e.base, "local"), TrustUnchangedLocal: true})
	if err != nil {
		t.Fatal(err)
	}
	got, _ = os.ReadFile(filepath.Join(target2, "000005.log"))
	if string(got) != "torn" || res.WALPosition != nil || res.WALSegments != 0 {
		t.Fatalf("restore to the checkpoint: log %q, position %+v", got, res.WALPosition)
	}
	if age := res.RecoveredWriteAgeMS; age < 3600_000 || age > 3700_000 {
		t.Fatalf("recovered write age %d ms, want the checkpoint's hour", age)
	}
}

// A bad segment fails the restore loudly, and nothing appears at the
// target: the WAL is applied before the rename.
func TestABadWALSegmentFailsTheRestoreAndPlacesNothing(t *testing.T) {
	e := walEnv(t)
	e.shipWAL(1, 0, 1000, time.Now())
	var key string
	e.store.List(context.Background(), wal.Prefix("job", "t", 3, 0)+"seg/", func(o storage.ObjectInfo) error { key = o.Key; return nil })
	bad := bytes.Repeat([]byte{9}, 1000)
	if err := e.store.Put(context.Background(), key, bytes.NewReader(bad), int64(len(bad))); err != nil {
		t.Fatal(err)
	}
	_, err := e.run(restore.Options{To: restore.ToLatest})
	if err == nil || !strings.Contains(err.Error(), "corrupt") || !strings.Contains(err.Error(), "--to checkpoint") {
		t.Fatalf("restore: %v", err)
	}
	e.nothingVisible()
	// The operator's way out: the checkpoint alone.
	if _, err := e.run(restore.Options{To: restore.ToCheckpoint}); err != nil {
		t.Fatal(err)
	}
}

// A zombie that goes on shipping WAL after a takeover is never restored:
// the taker's record does not say it resumed from that WAL.
func TestAZombiesWALAfterATakeoverIsIgnored(t *testing.T) {
	e := walEnv(t)
	ctx := context.Background()
	if _, err := manifests.TakeOwnership(ctx, e.store, "job", "t", "node-b", "agent-b"); err != nil {
		t.Fatal(err)
	}
	e.shipWAL(1, 0, 1000, time.Now()) // the old owner (epoch 0) after the takeover
	res, err := e.run(restore.Options{To: restore.ToLatest})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(e.target, "000005.log"))
	if string(got) != "torn" || res.WALSegments != 0 || !strings.Contains(res.WALStopped, "owner 1") {
		t.Fatalf("log %q, %d segments, stopped %q: the zombie's WAL was used", got, res.WALSegments, res.WALStopped)
	}
}

// A drill restores to latest and reports its recovery point: the age of
// the newest write its restore recovered.
func TestADrillReportsItsRecoveryPoint(t *testing.T) {
	e := walEnv(t)
	e.shipWAL(1, 0, 100, time.Now().Add(-3*time.Second))
	res, err := restore.Drill(context.Background(), restore.DrillOptions{Store: e.store, Job: "job", Task: "t", ScratchDir: e.base})
	if err != nil {
		t.Fatal(err)
	}
	if res.RPOMS < 3000 || res.RPOMS > 60_000 || res.WALSegments != 1 || res.WALBytes != 100 {
		t.Fatalf("drill: rpo %d ms, %d segments, %d bytes; want about 3000 ms, 1, 100", res.RPOMS, res.WALSegments, res.WALBytes)
	}
	res, err = restore.Drill(context.Background(), restore.DrillOptions{Store: e.store, Job: "job", Task: "t", ScratchDir: e.base, To: restore.ToCheckpoint})
	if err != nil {
		t.Fatal(err)
	}
	if res.RPOMS < 3600_000 || res.WALSegments != 0 {
		t.Fatalf("drill to the checkpoint: rpo %d ms, %d segments; want the checkpoint's hour", res.RPOMS, res.WALSegments)
	}
}

// A savepoint taken --with-wal restores to the WAL's newest write; one
// without it to the checkpoint.
func TestASavepointWithWALRestoresToItsNewestWrite(t *testing.T) {
	e := walEnv(t)
	ctx := context.Background()
	seg := e.shipWAL(1, 0, 500, time.Now())
	for _, withWAL := range []bool{true, false} {
		sp, _ := file.New(t.TempDir())
		if _, err := savepoint.Create(ctx, savepoint.Options{Source: e.store, Job: "job", Task: "t", Target: sp, WithWAL: withWAL}); err != nil {
			t.Fatal(err)
		}
		target := filepath.Join(t.TempDir(), "db")
		res, err := restore.Run(ctx, restore.Options{Store: sp, Job: "job", Task: "t", Target: target, To: restore.ToLatest})
		if err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(filepath.Join(target, "000005.log"))
		want := []byte("torn")
		if withWAL {
			want = seg
		}
		if !bytes.Equal(got, want) || (res.WALSegments == 1) != withWAL {
			t.Fatalf("with-wal %v: the log holds %d bytes, %d segments applied", withWAL, len(got), res.WALSegments)
		}
	}
}

// A restore into a node notes where its WAL ended; the taker puts that in
// its ownership record, and later restores use the old owner's WAL to
// there and no further, whatever the old owner ships after the takeover.
func TestATakerThatResumedFromTheWALKeepsItToThere(t *testing.T) {
	e := walEnv(t)
	ctx := context.Background()
	seg1 := e.shipWAL(1, 0, 100, time.Now())
	local := filepath.Join(e.base, "local")
	if _, err := e.run(restore.Options{To: restore.ToLatest, LocalDir: local}); err != nil {
		t.Fatal(err)
	}
	resumed, ok := e.local.WALResumed("t")
	if !ok || resumed != (manifests.WALResumed{Checkpoint: 3, Epoch: 0, Seq: 1}) {
		t.Fatalf("noted %+v %v, want checkpoint 3 epoch 0 manifest 1", resumed, ok)
	}
	rec, err := manifests.TakeOwnershipResuming(ctx, e.store, "job", "t", "node-b", "", "agent-b", &resumed, nil)
	if err != nil || rec.WALResumed == nil || *rec.WALResumed != resumed {
		t.Fatalf("record %+v, %v", rec, err)
	}
	e.shipWAL(2, 100, 100, time.Now()) // the old owner, after the takeover
	target := filepath.Join(e.base, "restored", "db2")
	res, err := e.run(restore.Options{Target: target, To: restore.ToLatest})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(target, "000005.log"))
	if !bytes.Equal(got, seg1) || res.WALPosition.Seq != 1 {
		t.Fatalf("the log holds %d bytes (to manifest %d), want manifest 1's 100", len(got), res.WALPosition.Seq)
	}
	// A restore to the checkpoint notes no WAL.
	target3 := filepath.Join(e.base, "restored", "db3")
	if _, err := e.run(restore.Options{Target: target3, To: restore.ToCheckpoint, LocalDir: local}); err != nil {
		t.Fatal(err)
	}
	if r, ok := e.local.WALResumed("t"); ok {
		t.Fatalf("after a restore to the checkpoint the local dir notes %+v", r)
	}
}

// A restore to latest that fails on a bad segment keeps the local copy it
// would have lent: a restore of the checkpoint still finds it whole.
func TestABadWALSegmentCostsNoLocalCopy(t *testing.T) {
	e := walEnv(t)
	ctx := context.Background()
	e.shipWAL(1, 0, 100, time.Now())
	e.store.List(ctx, wal.Prefix("job", "t", 3, 0)+"seg/", func(o storage.ObjectInfo) error {
		bad := bytes.Repeat([]byte{7}, int(o.Size))
		return e.store.Put(ctx, o.Key, bytes.NewReader(bad), o.Size)
	})
	local := filepath.Join(e.base, "local")
	if _, err := e.run(restore.Options{To: restore.ToLatest, LocalDir: local, TrustUnchangedLocal: true}); err == nil {
		t.Fatal("a bad segment restored")
	}
	res, err := e.run(restore.Options{To: restore.ToCheckpoint, LocalDir: local, TrustUnchangedLocal: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.FilesLocal != res.Files || res.BytesRemote != 0 {
		t.Fatalf("after the failed restore: %d of %d files local, %d bytes remote: the local copy was lost", res.FilesLocal, res.Files, res.BytesRemote)
	}
}
