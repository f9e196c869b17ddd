package gc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
)

// Retention with --retain 1 and newer incomplete checkpoints keeps the
// newest job-complete checkpoint of every task, and GC keeps its objects.
func TestGCRetainOneKeepsTheNewestJobCompleteCheckpoint(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	for n := uint64(1); n <= 2; n++ {
		commitJob(t, s, "a", n, "a", "b")
		commitJob(t, s, "b", n, "a", "b")
	}
	commitJob(t, s, "a", 3, "a", "b")
	commitJob(t, s, "a", 4, "a", "b")
	if _, err := Collect(ctx, s, "job", Options{Retain: 1, Grace: time.Hour}); err != nil {
		t.Fatal(err)
	}
	later := func() time.Time { return time.Now().Add(2 * time.Hour) }
	if _, err := Collect(ctx, s, "job", Options{Retain: 1, Grace: time.Hour, Now: later}); err != nil {
		t.Fatal(err)
	}
	cat, _ := manifests.Scan(ctx, s, "job", "")
	var got []string
	for _, r := range cat.Retained("") {
		got = append(got, fmt.Sprintf("%s/%d", r.Task, r.Checkpoint))
	}
	if fmt.Sprint(got) != "[a/2 a/4 b/2]" {
		t.Fatalf("retained %v, want a/2 a/4 b/2", got)
	}
	for _, task := range []string{"a", "b"} {
		m, err := manifests.Load(ctx, s, "job", task, 2)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Stat(ctx, m.Files[0].Key); err != nil {
			t.Fatalf("object of %s/2 deleted: %v", task, err)
		}
	}
	if n, _ := manifests.NewestJobComplete(ctx, s, "job", "b"); n != 2 {
		t.Fatalf("newest job-complete after GC: %d", n)
	}
}

func TestGCKeepsLiveObjectsAndHonoursTheGrace(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	commit(t, s, "t", 1, "old-only", "shared")
	commit(t, s, "t", 2, "shared", "new")
	commit(t, s, "u", 1, "old-only") // another task still needs it
	orphan := []byte("left by a crash")
	put(t, s, manifests.SharedKey("job", sha(orphan), int64(len(orphan))), orphan)
	put(t, s, manifests.PrivateKey("job", "t", 3, "MANIFEST-000009"), []byte("aborted"))

	// Within the grace nothing is deleted, retention or not.
	rep, err := Collect(ctx, s, "job", Options{Retain: 1, Grace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if rep.DeletedObjects != 0 || rep.RetainedCheckpoints != 2 || rep.RetiredCheckpoints != 1 {
		t.Fatalf("within grace: %+v", rep)
	}
	cat, _ := manifests.Scan(ctx, s, "job", "t")
	if r := cat.Retained("t"); len(r) != 1 || r[0].Checkpoint != 2 {
		t.Fatalf("retention kept %+v, want checkpoint 2", r)
	}
	// Past the grace (a clock two hours on): the retired manifest goes, and
	// the orphans are marked; a collection at least D later deletes them.
	// Objects some retained manifest needs stay.
	later := func() time.Time { return time.Now().Add(2 * time.Hour) }
	dry, err := Collect(ctx, s, "job", Options{Grace: time.Hour, Now: later, DryRun: true})
	if err != nil || dry.DeletedObjects != 0 || dry.MarkedObjects != 2 {
		t.Fatalf("dry run: %+v %v", dry, err)
	}
	rep, err = Collect(ctx, s, "job", Options{Grace: time.Hour, Now: later})
	if err != nil {
		t.Fatal(err)
	}
	if rep.DeletedObjects != 0 || rep.MarkedObjects != 2 || rep.DeletedManifests != 1 || rep.LiveObjects != 3 {
		t.Fatalf("past grace, first collection: %+v", rep)
	}
	// Less than D after the mark: nothing more is deleted, nothing marked twice.
	rep, err = Collect(ctx, s, "job", Options{Grace: time.Hour, Now: later, MarkDelay: 3 * time.Hour})
	if err != nil || rep.DeletedObjects != 0 || rep.MarkedObjects != 0 || rep.PendingObjects != 2 {
		t.Fatalf("within D: %+v %v", rep, err)
	}
	dry, err = Collect(ctx, s, "job", Options{Grace: time.Hour, Now: later, MarkDelay: time.Hour, DryRun: true})
	if err != nil || dry.DeletedObjects != 2 {
		t.Fatalf("dry run past D: %+v %v", dry, err)
	}
	rep, err = Collect(ctx, s, "job", Options{Grace: time.Hour, Now: later, MarkDelay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if rep.DeletedObjects != 2 || rep.MarkedObjects != 0 || rep.LiveObjects != 3 {
		t.Fatalf("past D: %+v", rep)
	}
	if _, err := s.Stat(ctx, manifests.ManifestKey("job", "t", 1)); !errors.Is(err, storage.ErrNotFound) {
		t.Fatal("retired manifest kept past the grace")
	}
	for _, c := range []string{"old-only", "shared", "new"} {
		if _, err := s.Stat(ctx, manifests.SharedKey("job", sha([]byte(c)), int64(len(c)))); err != nil {
			t.Fatalf("live object %q deleted: %v", c, err)
		}
	}
	var keys []string
	s.List(ctx, "", func(o storage.ObjectInfo) error { keys = append(keys, o.Key); return nil })
	for _, k := range keys {
		if strings.Contains(k, "retired") || strings.Contains(k, "/00000000000000000003/") || strings.Contains(k, "/gc/") {
			t.Fatalf("left behind: %s", k)
		}
	}
}

func TestGCStopsOnACorruptManifest(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	commit(t, s, "t", 1, "x")
	orphan := []byte("orphan")
	put(t, s, manifests.SharedKey("job", sha(orphan), 6), orphan)
	put(t, s, manifests.ManifestKey("job", "t", 2), []byte("{garbage"))
	if _, err := Collect(ctx, s, "job", Options{Grace: 0}); err == nil || !strings.Contains(err.Error(), "nothing deleted") {
		t.Fatalf("gc over a corrupt manifest: %v", err)
	}
	if _, err := s.Stat(ctx, manifests.SharedKey("job", sha(orphan), 6)); err != nil {
		t.Fatal("gc deleted while a manifest was unreadable")
	}
}

func TestGCRechecksAgesWhenItsListingIsStale(t *testing.T) {
	ctx := context.Background()
	base := newStore(t).(*file.Store)
	key := manifests.SharedKey("job", sha([]byte("orphan")), 6)
	put(t, base, key, []byte("orphan"))
	old := time.Now().Add(-2 * time.Hour)
	os.Chtimes(filepath.Join(base.Root(), key), old, old)
	s := &refresher{Store: base, key: key}
	// The first collection marks it.
	if rep, err := Collect(ctx, s, "job", Options{Grace: time.Hour}); err != nil || rep.MarkedObjects != 1 {
		t.Fatalf("first collection: %+v %v", rep, err)
	}
	// The second, D later, deletes only after its listing went stale (ten
	// minutes, more than a tenth of the grace): the ages must be re-read.
	s.armed = true
	clock := func() time.Time {
		if s.listed {
			return time.Now().Add(DefaultMarkDelay + 10*time.Minute)
		}
		return time.Now().Add(DefaultMarkDelay)
	}
	rep, err := Collect(ctx, s, "job", Options{Grace: time.Hour, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := base.Stat(ctx, key); err != nil {
		t.Fatalf("GC deleted an object refreshed after its listing: %+v", rep)
	}
}

func TestGCKeepsReferencedObjectsOfBothAlgorithmsAndDeletesOrphansOfBoth(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	v1 := commitAlg(t, s, "t", 1, manifests.Format1, "kept by format 1", "shared across the switch")
	v2 := commitAlg(t, s, "u", 1, manifests.Format2, "sha:shared across the switch", "new in format 2")
	if v2.Files[0].Key != v1.Files[1].Key {
		t.Fatalf("the reused SHA-256 object has two keys: %s, %s", v1.Files[1].Key, v2.Files[0].Key)
	}
	var orphans []string
	for _, alg := range []manifests.Alg{manifests.SHA256, manifests.BLAKE3} {
		b := []byte("left by a crash, " + alg.String())
		k := manifests.SharedKey("job", manifests.SumBytes(alg, b), int64(len(b)))
		put(t, s, k, b)
		orphans = append(orphans, k)
	}
	later := func() time.Time { return time.Now().Add(2 * time.Hour) }
	for _, delay := range []time.Duration{0, time.Hour} { // mark, then delete
		if _, err := Collect(ctx, s, "job", Options{Grace: time.Hour, Now: later, MarkDelay: delay}); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range []*manifests.Manifest{v1, v2} {
		for _, f := range m.Files {
			if _, err := s.Stat(ctx, f.Key); err != nil {
				t.Fatalf("GC deleted %s (%s), referenced by %s checkpoint 1: %v", f.Key, f.Alg(), m.Task, err)
			}
		}
	}
	for _, k := range orphans {
		if _, err := s.Stat(ctx, k); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("GC kept the orphan %s: %v", k, err)
		}
	}
}

// A superseded owner's retention, written after a takeover from its stale
// view of the task, never leaves the task without the checkpoint the new
// owner resumed from: its marker on that checkpoint (or a newer one) is
// ignored, for good, and so is any marker on the task's newest valid
// checkpoint, including one without an epoch from an older agent. Its
// marker on an older checkpoint, and the new owner's own markers, count.
func TestASupersededOwnersRetirementNeverTakesTheCheckpointTheTakerResumedFrom(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	a, err := manifests.TakeOwnership(ctx, s, "job", "t", "node-a", "a")
	if err != nil {
		t.Fatal(err)
	}
	commitAt(t, s, 1, a.Epoch)
	commitAt(t, s, 2, a.Epoch)
	b, err := manifests.TakeOwnership(ctx, s, "job", "t", "node-b", "b")
	if err != nil || b.After != 2 {
		t.Fatalf("takeover: %+v %v, want after 2", b, err)
	}
	// The zombie commits 3 (fenced) and retires all but it, from memory.
	commitAt(t, s, 3, a.Epoch)
	for _, n := range []uint64{1, 2} {
		if err := manifests.RetireAt(ctx, s, "job", "t", n, a.Epoch); err != nil {
			t.Fatal(err)
		}
	}
	if got := retainedNs(t, s); !slices.Equal(got, []uint64{2}) {
		t.Fatalf("retained %v after the zombie's retention, want [2]: the checkpoint the new owner resumed from", got)
	}
	// An older agent's marker, without an epoch, on the newest: ignored.
	if err := manifests.Retire(ctx, s, "job", "t", 2); err != nil {
		t.Fatal(err)
	}
	if got := retainedNs(t, s); !slices.Equal(got, []uint64{2}) {
		t.Fatalf("retained %v with an epoch-less marker on the newest, want [2]", got)
	}
	// The new owner commits 4: the zombie's marker on 2 stays ignored, the
	// epoch-less one now counts (2 is no longer the newest).
	commitAt(t, s, 4, b.Epoch)
	if got := retainedNs(t, s); !slices.Equal(got, []uint64{4}) {
		t.Fatalf("retained %v, want [4]: the epoch-less marker on 2 counts once 2 is not the newest", got)
	}
	cat, err := manifests.Scan(ctx, s, "job", "t")
	if err != nil {
		t.Fatal(err)
	}
	if keys := cat.MarkerKeys("t", 2); len(keys) != 2 {
		t.Fatalf("marker keys of 2: %v, want the zombie's and the epoch-less one", keys)
	}
	// GC deletes 2 with both its markers, never the new owner's 4.
	if _, err := Collect(ctx, s, "job", Options{Grace: 0, MarkDelay: time.Nanosecond, Now: func() time.Time { return time.Now().Add(time.Hour) }}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{manifests.RetiredKey("job", "t", 2), manifests.RetiredKeyOf("job", "t", 2, a.Epoch), manifests.ManifestKeyOf("job", "t", 2, a.Epoch)} {
		if _, err := s.Stat(ctx, k); err == nil {
			t.Errorf("GC left %s of the expired checkpoint 2", k)
		}
	}
	if got := retainedNs(t, s); !slices.Equal(got, []uint64{4}) {
		t.Fatalf("after GC: retained %v, want [4]", got)
	}
}
