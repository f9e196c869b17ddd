package gc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
)

// listingStore records whether deletes of shared objects arrive while a
// listing of the shared prefix is still going on.
type listingStore struct {
	storage.Store
	listing        atomic.Bool
	holdListing    atomic.Bool // see List
	deletesInList  atomic.Int64
	deletesOutside atomic.Int64
}

func (s *listingStore) List(ctx context.Context, prefix string, fn func(storage.ObjectInfo) error) error {
	shared := strings.HasSuffix(prefix, "/shared/")
	if !shared {
		return s.Store.List(ctx, prefix, fn)
	}
	s.listing.Store(true)
	defer s.listing.Store(false)
	err := s.Store.List(ctx, prefix, fn)
	// Deletes run beside the listing: the listing's last page stays "in
	// flight" until two batches have started (or a few seconds passed), so
	// that only a sweep that holds its deletes until the listing ends can
	// have none started during it.
	for deadline := time.Now().Add(5 * time.Second); s.holdListing.Load() && s.deletesInList.Load() < 2 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	return err
}

func (s *listingStore) Delete(ctx context.Context, keys ...string) error {
	if len(keys) > 0 && strings.Contains(keys[0], "/shared/") {
		if s.listing.Load() {
			s.deletesInList.Add(1)
		} else {
			s.deletesOutside.Add(1)
		}
	}
	return s.Store.Delete(ctx, keys...)
}

// TestGCSweepsWhileItLists: a collection deletes the candidates of ripe
// marks in batches as its listing finds them, so its memory does not grow
// with the objects of the job; live objects stay, every candidate goes.
func TestGCSweepsWhileItLists(t *testing.T) {
	ctx := context.Background()
	s := &listingStore{Store: newStore(t)}
	commit(t, s, "t", 1, "live one", "live two")
	defer func(n int) { deleteBatch = n }(deleteBatch)
	deleteBatch = 10
	garbage := 2*deleteBatch + 5
	for i := range garbage {
		b := []byte(fmt.Sprintf("orphan %d", i))
		put(t, s, manifests.SharedKey("job", sha(b), int64(len(b))), b)
	}
	later := func() time.Time { return time.Now().Add(2 * time.Hour) }
	opts := Options{Grace: time.Hour, Now: later, MarkDelay: time.Nanosecond}
	rep, err := Collect(ctx, s, "job", opts)
	if err != nil || rep.MarkedObjects != garbage || rep.DeletedObjects != 0 || rep.LiveObjects != 2 {
		t.Fatalf("first collection: %+v %v", rep, err)
	}
	s.holdListing.Store(true)
	rep, err = Collect(ctx, s, "job", opts)
	if err != nil || rep.DeletedObjects != garbage || rep.LiveObjects != 2 {
		t.Fatalf("second collection: %+v %v", rep, err)
	}
	if n := s.deletesInList.Load(); n < 2 {
		t.Fatalf("%d batches deleted while listing (%d after): the sweep waits for the whole listing", n, s.deletesOutside.Load())
	}
	left := 0
	s.Store.List(ctx, manifests.SharedPrefix("job"), func(storage.ObjectInfo) error { left++; return nil })
	if left != 2 {
		t.Fatalf("%d shared objects left, want the 2 live ones", left)
	}
	if _, err := manifests.Load(ctx, s, "job", "t", 1); err != nil {
		t.Fatal(err)
	}
}

// failingDeletes fails every delete of shared objects after the first ok.
type failingDeletes struct {
	storage.Store
	ok atomic.Int64
}

func (s *failingDeletes) Delete(ctx context.Context, keys ...string) error {
	if len(keys) > 0 && strings.Contains(keys[0], "/shared/") && s.ok.Add(-1) < 0 {
		return errors.New("injected delete failure")
	}
	return s.Store.Delete(ctx, keys...)
}

// TestGCStopsOnAFailedDeleteAndKeepsItsMarks: a batch whose delete fails
// (deletes run beside the listing) fails the collection, which leaves the
// marks in place, so that the next collection deletes what is left.
func TestGCStopsOnAFailedDeleteAndKeepsItsMarks(t *testing.T) {
	ctx := context.Background()
	base := newStore(t)
	s := &failingDeletes{Store: base}
	commit(t, s, "t", 1, "live one")
	defer func(n int) { deleteBatch = n }(deleteBatch)
	deleteBatch = 10
	garbage := 5*deleteBatch + 5
	for i := range garbage {
		b := []byte(fmt.Sprintf("orphan %d", i))
		put(t, s, manifests.SharedKey("job", sha(b), int64(len(b))), b)
	}
	later := func() time.Time { return time.Now().Add(2 * time.Hour) }
	opts := Options{Grace: time.Hour, Now: later, MarkDelay: time.Nanosecond}
	if rep, err := Collect(ctx, s, "job", opts); err != nil || rep.MarkedObjects != garbage {
		t.Fatalf("first collection: %+v %v", rep, err)
	}
	s.ok.Store(2)
	if _, err := Collect(ctx, s, "job", opts); err == nil || !strings.Contains(err.Error(), "injected delete failure") {
		t.Fatalf("a failed delete: %v", err)
	}
	marks := 0
	base.List(ctx, marksPrefix("job"), func(storage.ObjectInfo) error { marks++; return nil })
	if marks == 0 {
		t.Fatal("the marks went with a collection that did not delete every candidate")
	}
	s.ok.Store(1 << 30)
	rep, err := Collect(ctx, s, "job", opts)
	if err != nil {
		t.Fatal(err)
	}
	left := 0
	base.List(ctx, manifests.SharedPrefix("job"), func(storage.ObjectInfo) error { left++; return nil })
	if left != 1 {
		t.Fatalf("%d shared objects left after the next collection (%+v), want the live one", left, rep)
	}
}

// TestLiveSetKeepsEveryKeyAcrossCompactions: a live set larger than the
// size from which it compacts, every key added twice, still has each key
// and no other.
func TestLiveSetKeepsEveryKeyAcrossCompactions(t *testing.T) {
	l := newLiveSet()
	n := 3 * liveCompactFrom
	key := func(i int) []byte { return []byte(fmt.Sprintf("job/shared/%02x/b3-%064d-%d", i%256, i, i)) }
	for round := range 2 {
		for i := range n {
			if i%2 == round%2 || round == 1 {
				l.add(key(i))
			}
		}
	}
	for i := range n {
		if !l.has(string(key(i))) {
			t.Fatalf("key %d is missing", i)
		}
	}
	for i := n; i < 2*n; i++ {
		if l.has(string(key(i))) {
			t.Fatalf("key %d, never added, is a member", i)
		}
	}
	if len(l.h) != n || cap(l.h) > n+n/4 {
		t.Fatalf("%d hashes in room for %d, want %d without duplicates", len(l.h), cap(l.h), n)
	}
}
