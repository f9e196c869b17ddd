package restore_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/uploader"
)

// commitNext checkpoints snap as checkpoint n of task t from e's local
// store (the owner's node), as the agent does.
func (e *env) commitNext(n uint64, snap string) *manifests.Manifest {
	e.t.Helper()
	ctx := context.Background()
	sn, err := e.local.Take("t", n, snap, false)
	if err == nil {
		err = sn.Inspect()
	}
	if err != nil {
		e.t.Fatal(err)
	}
	res, err := uploader.Upload(ctx, uploader.Request{Store: e.store, Job: "job", Task: "t", Checkpoint: n, Snapshot: sn})
	if err != nil {
		e.t.Fatal(err)
	}
	m := &manifests.Manifest{Job: "job", Task: "t", Checkpoint: n, Created: time.Now(), Files: res.Files}
	for _, f := range res.Files {
		m.FullSize += f.Size
	}
	enc, _ := m.Encode(res.BytesWritten)
	if err := manifests.Commit(ctx, e.store, m, enc); err != nil {
		e.t.Fatal(err)
	}
	return m
}

// A warm standby on another node keeps the task's newest checkpoint in its
// own local dir, fetching only the files it does not hold yet; it records
// no move of the task; the failover restore on its node is then local.
func TestAWarmStandbyFetchesOnlyWhatItLacksAndMakesFailoverLocal(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	sb := filepath.Join(e.base, "standby")
	o := restore.RefreshOptions{Store: e.store, Job: "job", Task: "t", LocalDir: sb}
	r, err := restore.Refresh(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if r.Held != 3 || r.Newest != 3 || r.Fetched == nil || r.Fetched.BytesLocal != 0 || r.Fetched.BytesRemote != r.Fetched.Bytes {
		t.Fatalf("first refresh: %+v, fetched %+v", r, r.Fetched)
	}
	if r, err = restore.Refresh(ctx, o); err != nil || r.Fetched != nil || r.Held != 3 || r.Lag != 0 || r.Failover != nil {
		t.Fatalf("refresh when up to date: %+v, %v", r, err)
	}
	// The failover restore a move to this node would run, measured: all
	// from the copy, nothing recorded, nothing left.
	mo := o
	mo.MeasureFailover = true
	if r, err = restore.Refresh(ctx, mo); err != nil || r.Failover == nil || r.Failover.BytesRemote != 0 || r.Failover.BytesLocal != r.Failover.Bytes {
		t.Fatalf("measured failover: %+v, %v", r, err)
	}
	if left, _ := filepath.Glob(filepath.Join(sb, ".failover-*")); len(left) != 0 {
		t.Fatalf("the measured failover left %v behind", left)
	}

	// The owner checkpoints on: the old SSTs stay, one is new.
	snap4 := filepath.Join(e.base, "snap4")
	os.MkdirAll(snap4, 0o755)
	for _, name := range []string{"000001.sst", "000002.sst", "CURRENT"} {
		if err := os.Link(filepath.Join(e.snap, name), filepath.Join(snap4, name)); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(snap4, "000003.sst"), bytes.Repeat([]byte("three"), 6000), 0o644)
	os.WriteFile(filepath.Join(snap4, "MANIFEST-000004"), bytes.Repeat([]byte("m4"), 500), 0o644)
	m4 := e.commitNext(4, snap4)
	r, err = restore.Refresh(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if r.Held != 4 || r.Fetched == nil {
		t.Fatalf("refresh after checkpoint 4: %+v", r)
	}
	if want := int64(30000 + 1000); r.Fetched.BytesRemote != want || r.Fetched.BytesLocal != m4.FullSize-want {
		t.Fatalf("refresh fetched %d B remote, %d B local; want only the new %d B remote", r.Fetched.BytesRemote, r.Fetched.BytesLocal, want)
	}
	ls, err := localrecovery.Open(sb, "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ls.TakeoverEpoch("t"); ok {
		t.Fatal("a standby's refresh recorded the task's move to its node")
	}
	if left, _ := filepath.Glob(filepath.Join(sb, ".standby-*")); len(left) != 0 {
		t.Fatalf("refresh left %v behind", left)
	}

	// Failover: the task restores on the standby's node from its copy.
	target := filepath.Join(e.base, "failover", "db")
	res, err := restore.Run(ctx, restore.Options{Store: e.store, Job: "job", Task: "t", Target: target, LocalDir: sb})
	if err != nil {
		t.Fatal(err)
	}
	if res.Checkpoint != 4 || res.BytesRemote != 0 || res.BytesLocal != m4.FullSize {
		t.Fatalf("failover restore: %+v", res)
	}
	e.target, e.snap = target, snap4
	e.sameAsSnapshot()
	if _, ok := ls.TakeoverEpoch("t"); !ok {
		t.Fatal("the failover restore did not record the task's move")
	}
}

// A restore on a node whose local copy is older than the checkpoint takes
// the files both name from it, verified, and the rest from storage.
func TestARestoreTakesWhatAnOlderLocalCopyHolds(t *testing.T) {
	for _, trust := range []bool{false, true} {
		e := setup(t)
		snap4 := filepath.Join(e.base, "snap4")
		os.MkdirAll(snap4, 0o755)
		for _, name := range []string{"000001.sst", "CURRENT"} {
			os.Link(filepath.Join(e.snap, name), filepath.Join(snap4, name))
		}
		// Same name, other bytes: must not be taken from the old copy.
		os.WriteFile(filepath.Join(snap4, "000002.sst"), bytes.Repeat([]byte("other"), 10000), 0o644)
		m4 := e.commitNext(4, snap4)
		// The local copy of 4 is lost: only 3's remains on this node.
		if err := e.local.Discard("t", 4); err != nil {
			t.Fatal(err)
		}
		target := filepath.Join(e.base, "r", "db")
		res, err := restore.Run(context.Background(), restore.Options{Store: e.store, Job: "job", Task: "t", Target: target,
			LocalDir: filepath.Join(e.base, "local"), TrustUnchangedLocal: trust})
		if err != nil {
			t.Fatal(err)
		}
		if want := int64(200_000 + 16); res.BytesLocal != want || res.BytesRemote != m4.FullSize-want {
			t.Fatalf("trust %v: %d B local, %d B remote; want %d B local", trust, res.BytesLocal, res.BytesRemote, want)
		}
		e.target, e.snap = target, snap4
		e.sameAsSnapshot()
	}
}
