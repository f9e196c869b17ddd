package gc

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
)

// pausingStore holds a Delete that names key until the test releases it:
// the moment between GC sending a delete and the delete landing.
type pausingStore struct {
	storage.Store
	key      string
	reached  chan struct{} // closed when a Delete of key arrives
	release  chan struct{} // the Delete proceeds once this is closed
	deleting bool
}

func (p *pausingStore) Delete(ctx context.Context, keys ...string) error {
	if slices.Contains(keys, p.key) && !p.deleting {
		p.deleting = true
		close(p.reached)
		<-p.release
	}
	return p.Store.Delete(ctx, keys...)
}

// writeX is a writer of checkpoint 1 of task with one file holding x: it
// uploads x under its usual key, looks at GC's marks, stores x under a
// fresh key if the usual one is marked (as uploader.AvoidMarked does), and
// commits within the look's validity.
func writeX(t *testing.T, s storage.Store, g *Guard, task string, x []byte) (*manifests.Manifest, error) {
	ctx := context.Background()
	key := manifests.SharedKey("job", sha(x), int64(len(x)))
	if err := s.Put(ctx, key, bytes.NewReader(x), int64(len(x))); err != nil {
		t.Fatal(err)
	}
	hold, err := g.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if hold.Pending(key) {
		key = manifests.FreshKey(key)
		if err := s.Put(ctx, key, bytes.NewReader(x), int64(len(x))); err != nil {
			t.Fatal(err)
		}
	}
	m := &manifests.Manifest{Job: "job", Task: task, Checkpoint: 1, Created: time.Now(), FullSize: int64(len(x))}
	m.Files = []manifests.File{{Name: "000001.sst", Kind: manifests.Shared, Size: int64(len(x)), SHA256: sha(x), Key: key, Uploaded: true}}
	enc, _ := m.Encode(int64(len(x)))
	return m, CommitHeld(ctx, s, m, enc, hold)
}

func restorable(t *testing.T, s storage.Store, task string) {
	t.Helper()
	ctx := context.Background()
	got, err := manifests.Load(ctx, s, "job", task, 1)
	if err != nil {
		t.Fatal(err)
	}
	probs, _, err := manifests.Verify(ctx, s, got, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(probs) > 0 {
		t.Fatalf("a checkpoint committed after GC started cannot be restored: %v", probs)
	}
}

func oldOrphan(t *testing.T, base *file.Store, x []byte) string {
	key := manifests.SharedKey("job", sha(x), int64(len(x)))
	put(t, base, key, x) // left by an aborted checkpoint, long ago
	old := time.Now().Add(-2 * time.Hour)
	os.Chtimes(filepath.Join(base.Root(), filepath.FromSlash(key)), old, old)
	return key
}

// TestGCInFlightDeleteCannotLoseAReuploadedObject is the interleaving of
// invariant 4 with many writers: GC finds X unreferenced and old and sends
// its delete; while the delete is in flight, another writer uploads X again
// and commits a manifest naming it; then the delete lands. The writer's
// checkpoint must restore. (Before deferred deletion, the first collection
// sent that delete and the checkpoint lost X.)
func TestGCInFlightDeleteCannotLoseAReuploadedObject(t *testing.T) {
	ctx := context.Background()
	base := newStore(t).(*file.Store)
	x := []byte("an sst two tasks share")
	key := oldOrphan(t, base, x)
	s := &pausingStore{Store: base, key: key, reached: make(chan struct{}), release: make(chan struct{})}

	// The first collection only marks X.
	rep, err := Collect(ctx, s, "job", Options{Grace: time.Hour})
	if err != nil || rep.MarkedObjects != 1 || rep.DeletedObjects != 0 {
		t.Fatalf("first collection: %+v %v", rep, err)
	}
	// The second, D later by storage's clock, deletes X: hold the delete.
	done := make(chan error, 1)
	go func() {
		_, err := Collect(ctx, s, "job", Options{Grace: time.Hour, Now: func() time.Time { return time.Now().Add(DefaultMarkDelay) }})
		done <- err
	}()
	select {
	case <-s.reached:
	case err := <-done:
		t.Fatalf("GC ended without deleting X: %v", err)
	}
	// Meanwhile the writer uploads X and commits a manifest.
	if _, err := writeX(t, s, NewGuard(s, "job"), "other", x); err != nil {
		t.Fatal(err)
	}
	close(s.release) // the delete lands
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	restorable(t, base, "other")
	// And later collections keep it: it is live.
	for range 2 {
		if _, err := Collect(ctx, base, "job", Options{Grace: 0, Now: func() time.Time { return time.Now().Add(3 * DefaultMarkDelay) }}); err != nil {
			t.Fatal(err)
		}
	}
	restorable(t, base, "other")
}

// TestGCWriterThatLookedBeforeTheMarkCannotCommitLate: a writer looks at
// the marks before a collection marks X, then stalls; it may not commit
// after D/2 on that look, so its commit is refused (ErrStale).
func TestGCWriterThatLookedBeforeTheMarkCannotCommitLate(t *testing.T) {
	ctx := context.Background()
	base := newStore(t).(*file.Store)
	x := []byte("another shared sst")
	key := oldOrphan(t, base, x)
	clock := time.Now()
	g := NewGuard(base, "job")
	g.Now = func() time.Time { return clock }
	hold, err := g.Check(ctx)
	if err != nil || hold.Pending(key) {
		t.Fatalf("look before the mark: %v", err)
	}
	if rep, err := Collect(ctx, base, "job", Options{Grace: time.Hour}); err != nil || rep.MarkedObjects != 1 {
		t.Fatalf("first collection: %+v %v", rep, err)
	}
	m := &manifests.Manifest{Job: "job", Task: "late", Checkpoint: 1, Created: time.Now(), FullSize: int64(len(x))}
	m.Files = []manifests.File{{Name: "000001.sst", Kind: manifests.Shared, Size: int64(len(x)), SHA256: sha(x), Key: key}}
	enc, _ := m.Encode(0)
	clock = clock.Add(DefaultMarkDelay/2 + time.Second)
	if err := CommitHeld(ctx, base, m, enc, hold); !errors.Is(err, ErrStale) {
		t.Fatalf("late commit: %v, want ErrStale", err)
	}
	// A look now sees the mark.
	hold, _ = g.Check(ctx)
	if err := CommitHeld(ctx, base, m, enc, hold); !errors.Is(err, ErrMarked) {
		t.Fatalf("commit naming a marked object: %v, want ErrMarked", err)
	}
	// Within D/2 of its look, the commit goes through (the collection
	// deleting X will list this manifest).
	m.Files[0].Key = manifests.FreshKey(key)
	put(t, base, m.Files[0].Key, x)
	enc, _ = m.Encode(0)
	if err := CommitHeld(ctx, base, m, enc, hold); err != nil {
		t.Fatal(err)
	}
	if _, err := Collect(ctx, base, "job", Options{Grace: time.Hour, Now: func() time.Time { return time.Now().Add(DefaultMarkDelay) }}); err != nil {
		t.Fatal(err)
	}
	if _, err := base.Stat(ctx, key); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("the marked orphan was not deleted D later: %v", err)
	}
	restorable(t, base, "late")
	var left []string
	base.List(ctx, Prefix("job"), func(o storage.ObjectInfo) error { left = append(left, o.Key); return nil })
	if len(left) != 0 {
		t.Fatalf("gc bookkeeping left behind: %v", left)
	}
}

// Collections of one job run at once from many agents: none of them may
// fail on another's clock probe, and no probe is left behind.
func TestConcurrentCollectionsOfOneJobDoNotFailEachOther(t *testing.T) {
	ctx := context.Background()
	fs, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 20; round++ {
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := Collect(ctx, fs, "j", Options{Grace: time.Hour}); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: a collection failed beside others: %v", round, err)
		}
	}
	if _, err := fs.Stat(ctx, clockKey("j")); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("the clock probe was left behind: %v", err)
	}
}
