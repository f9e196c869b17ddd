package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ckpt-io/ckpt/client"
	ckptpebble "github.com/ckpt-io/ckpt/client/pebble"
	_ "github.com/ckpt-io/ckpt/engines/pebble" // the agent classifies Pebble snapshots
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/protocol"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/wal"
)

type quietPebble struct{}

func (quietPebble) Infof(string, ...any)  {}
func (quietPebble) Errorf(string, ...any) {}
func (quietPebble) Fatalf(f string, a ...any) {
	panic(fmt.Sprintf(f, a...))
}

// walRecords counts the records of the WAL chain of the task's checkpoint
// n by epoch, and its manifests.
func walRecords(t *testing.T, s storage.Store, task string, n, epoch uint64) (records, manifests int) {
	t.Helper()
	chain, err := wal.Chain(context.Background(), s, "job", task, n, epoch, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range chain {
		for _, r := range m.Segments {
			records += r.Records
		}
	}
	return records, len(chain)
}

// eventually polls cond every 10ms until it holds or 20s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func openPebble(t *testing.T, dir string) *pebble.DB {
	t.Helper()
	db, err := pebble.Open(dir, &pebble.Options{Logger: quietPebble{}, MemTableSize: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func put(t *testing.T, db *pebble.DB, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if err := db.Set([]byte(fmt.Sprintf("k%06d", i)), []byte(strings.Repeat("v", 100+i%500)), pebble.Sync); err != nil {
			t.Fatal(err)
		}
	}
}

// A checkpoint that names its store's dir as wal_dir makes the agent ship
// every write made after it, as the task's owner; once another agent
// takes the task over, the shipping stops, the task is fenced here, and
// no WAL manifest is committed any more. (TestMain's goleak checks that
// the loop is gone with the agent.)
func TestTheWALOfACheckpointIsShippedUntilTheTaskIsTakenOver(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a Pebble store and a shipping loop")
	}
	h := start(t, nil, func(c *Config) { c.WALInterval = 10 * time.Millisecond; c.GCInterval = -1 })
	dbDir := filepath.Join(h.root, "db")
	db := openPebble(t, dbDir)
	defer db.Close()
	c := h.dial()
	ctx := ctxT(t)
	put(t, db, 0, 100)
	p, err := ckptpebble.Checkpoint(ctx, c, db, dbDir, "kv", 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	owners, err := manifests.ListOwners(ctx, h.store, "job", "kv", 0)
	if err != nil {
		t.Fatal(err)
	}
	epoch := owners.Latest()
	put(t, db, 100, 150)
	eventually(t, "the 50 writes after checkpoint 1 are shipped", func() bool {
		n, _ := walRecords(t, h.store, "kv", 1, epoch)
		return n == 50
	})

	if _, err := manifests.TakeOwnership(ctx, h.store, "job", "kv", "other-node", "other-agent"); err != nil {
		t.Fatal(err)
	}
	put(t, db, 150, 160)
	eventually(t, "the agent sees it was fenced", func() bool {
		return h.a.txn.Status("kv").Fenced != nil
	})
	_, before := walRecords(t, h.store, "kv", 1, epoch)
	put(t, db, 160, 170)
	time.Sleep(100 * time.Millisecond) // ten intervals
	if _, after := walRecords(t, h.store, "kv", 1, epoch); after != before {
		t.Fatalf("a fenced agent committed WAL manifests %d..%d", before+1, after)
	}
	h.a.wal.mu.Lock()
	loops := len(h.a.wal.loops)
	h.a.wal.mu.Unlock()
	if loops != 0 {
		t.Fatalf("%d shipping loops run after the task was taken over", loops)
	}
	p, err = ckptpebble.Checkpoint(ctx, c, db, dbDir, "kv", 2)
	if err == nil {
		_, err = p.Wait(ctx)
	}
	if e, ok := err.(*client.Error); !ok || e.Code != protocol.CodeConflict {
		t.Fatalf("checkpoint 2 of a fenced agent: %v; want conflict", err)
	}
}

// A completed checkpoint that names no wal_dir stops the task's shipping:
// nothing more is shipped for the checkpoint before it, and nothing for
// it.
func TestACheckpointWithoutWALDirStopsTheShipping(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a Pebble store and a shipping loop")
	}
	h := start(t, nil, func(c *Config) { c.WALInterval = 10 * time.Millisecond; c.GCInterval = -1 })
	dbDir := filepath.Join(h.root, "db")
	db := openPebble(t, dbDir)
	defer db.Close()
	c := h.dial()
	ctx := ctxT(t)
	put(t, db, 0, 10)
	p, err := ckptpebble.Checkpoint(ctx, c, db, dbDir, "kv", 1)
	if err == nil {
		_, err = p.Wait(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	owners, _ := manifests.ListOwners(ctx, h.store, "job", "kv", 0)
	epoch := owners.Latest()
	put(t, db, 10, 20)
	eventually(t, "the writes after checkpoint 1 are shipped", func() bool {
		n, _ := walRecords(t, h.store, "kv", 1, epoch)
		return n == 10
	})
	p, err = ckptpebble.Checkpoint(ctx, c, db, dbDir, "kv", 2, ckptpebble.WithoutWAL())
	if err == nil {
		_, err = p.Wait(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the loop stops", func() bool {
		h.a.wal.mu.Lock()
		defer h.a.wal.mu.Unlock()
		return len(h.a.wal.loops) == 0
	})
	_, m1 := walRecords(t, h.store, "kv", 1, epoch)
	put(t, db, 20, 30)
	time.Sleep(100 * time.Millisecond)
	if _, after := walRecords(t, h.store, "kv", 1, epoch); after != m1 {
		t.Fatalf("checkpoint 1's WAL grew after checkpoint 2 stopped the shipping")
	}
	if _, m2 := walRecords(t, h.store, "kv", 2, epoch); m2 != 0 {
		t.Fatalf("checkpoint 2, which named no wal_dir, has %d WAL manifests", m2)
	}
}

// A wal_dir outside the allowed roots (or through a symlink leading out)
// fails the checkpoint request before anything is linked.
func TestAWALDirOutsideTheRootsFailsTheRequestAndChangesNothing(t *testing.T) {
	h := start(t, nil, nil)
	snap := h.snapshot("snap", map[string]int{"000001.sst": 100})
	outside := t.TempDir()
	escape := filepath.Join(h.root, "escape")
	if err := os.Symlink(outside, escape); err != nil {
		t.Fatal(err)
	}
	r := h.raw()
	for _, walDir := range []string{outside, escape, "relative/db"} {
		ev := r.send(fmt.Sprintf(`{"op":"checkpoint","task":"t","checkpoint":1,"dir":%q,"wal_dir":%q}`, snap, walDir))
		if ev["event"] != "failed" && ev["event"] != "error" || code(ev) != protocol.CodeBadRequest {
			t.Fatalf("wal_dir %s: %v; want bad_request", walDir, ev)
		}
	}
	if _, err := os.Stat(filepath.Join(snap, "000001.sst")); err != nil {
		t.Fatalf("the snapshot was touched: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(h.local, "job", "t")); len(entries) != 0 {
		t.Fatalf("the local store holds %d entries for the task", len(entries))
	}
	var keys []string
	h.store.List(context.Background(), "job/", func(o storage.ObjectInfo) error { keys = append(keys, o.Key); return nil })
	if len(keys) != 0 {
		t.Fatalf("storage holds %v", keys)
	}
}

// In node-agent mode a wal_dir gets the confinement of a snapshot dir: one
// outside the tenant's roots, through a symlink into another tenant's, or
// of another uid than the peer's is forbidden, and nothing is written.
func TestATenantsWALDirIsConfinedLikeItsSnapshotDir(t *testing.T) {
	n := startTenants(t)
	a := n.as(n.uidA)
	dirA := n.snapshot(n.rootA, "chk-1", n.uidA, map[string]string{"000001.sst": "alpha's data", "CURRENT": "MANIFEST-1"})
	dbB := n.snapshot(n.rootB, "db", n.uidB, map[string]string{"000002.log": "beta's log"})
	if err := os.Symlink(dbB, filepath.Join(n.rootA, "db-of-beta")); err != nil {
		t.Fatal(err)
	}
	rootOwned := n.snapshot(n.rootA, "db-root", 0, map[string]string{"000003.log": "root's log"})
	before := n.keys()
	for _, walDir := range []string{dbB, filepath.Join(n.rootA, "db-of-beta"), rootOwned} {
		ev := a.checkpoint(fmt.Sprintf(`{"op":"checkpoint","task":"a-0","checkpoint":1,"dir":%q,"wal_dir":%q}`, dirA, walDir))
		if ev["event"] != "failed" || code(ev) != protocol.CodeForbidden {
			t.Fatalf("wal_dir %s: %v; want forbidden", walDir, ev)
		}
	}
	if after := n.keys(); !slices.Equal(before, after) {
		t.Fatalf("storage changed: %v -> %v", before, after)
	}
	if _, err := os.Stat(filepath.Join(dirA, "000001.sst")); err != nil {
		t.Fatalf("the snapshot was touched: %v", err)
	}
}
