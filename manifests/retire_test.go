package manifests

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/storage"
)

// commitAt commits checkpoint n of task t as the owner of epoch.
func commitAt(t *testing.T, s storage.Store, n, epoch uint64) {
	t.Helper()
	m := testManifest("t", n)
	m.Epoch = epoch
	enc, err := m.Encode(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := Commit(context.Background(), s, m, enc); err != nil {
		t.Fatal(err)
	}
}

func retainedNs(t *testing.T, s storage.Store) []uint64 {
	t.Helper()
	cat, err := Scan(context.Background(), s, "job", "t")
	if err != nil {
		t.Fatal(err)
	}
	var out []uint64
	for _, r := range cat.Retained("t") {
		out = append(out, r.Checkpoint)
	}
	return out
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
	a, err := TakeOwnership(ctx, s, "job", "t", "node-a", "a")
	if err != nil {
		t.Fatal(err)
	}
	commitAt(t, s, 1, a.Epoch)
	commitAt(t, s, 2, a.Epoch)
	b, err := TakeOwnership(ctx, s, "job", "t", "node-b", "b")
	if err != nil || b.After != 2 {
		t.Fatalf("takeover: %+v %v, want after 2", b, err)
	}
	// The zombie commits 3 (fenced) and retires all but it, from memory.
	commitAt(t, s, 3, a.Epoch)
	for _, n := range []uint64{1, 2} {
		if err := RetireAt(ctx, s, "job", "t", n, a.Epoch); err != nil {
			t.Fatal(err)
		}
	}
	if got := retainedNs(t, s); !slices.Equal(got, []uint64{2}) {
		t.Fatalf("retained %v after the zombie's retention, want [2]: the checkpoint the new owner resumed from", got)
	}
	// An older agent's marker, without an epoch, on the newest: ignored.
	if err := Retire(ctx, s, "job", "t", 2); err != nil {
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
	cat, err := Scan(ctx, s, "job", "t")
	if err != nil {
		t.Fatal(err)
	}
	if keys := cat.MarkerKeys("t", 2); len(keys) != 2 {
		t.Fatalf("marker keys of 2: %v, want the zombie's and the epoch-less one", keys)
	}
	// GC deletes 2 with both its markers, never the new owner's 4.
	if _, err := GC(ctx, s, "job", GCOptions{Grace: 0, MarkDelay: time.Nanosecond, Now: func() time.Time { return time.Now().Add(time.Hour) }}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{RetiredKey("job", "t", 2), RetiredKeyOf("job", "t", 2, a.Epoch), ManifestKeyOf("job", "t", 2, a.Epoch)} {
		if _, err := s.Stat(ctx, k); err == nil {
			t.Errorf("GC left %s of the expired checkpoint 2", k)
		}
	}
	if got := retainedNs(t, s); !slices.Equal(got, []uint64{4}) {
		t.Fatalf("after GC: retained %v, want [4]", got)
	}
}

// The rule, case by case: a marker of epoch e counts unless the first
// owner after e resumed from its checkpoint or a newer one, or the
// checkpoint is the task's newest valid one.
func TestTheRetirementRule(t *testing.T) {
	owners := func(recs ...Owner) *Owners {
		o := &Owners{Task: "t", Records: map[uint64]Owner{}}
		for _, r := range recs {
			o.Epochs = append(o.Epochs, r.Epoch)
			o.Records[r.Epoch] = r
		}
		return o
	}
	cases := []struct {
		name   string
		owners *Owners
		n, e   uint64
		counts bool
	}{
		{"without an epoch", owners(Owner{Epoch: 1}, Owner{Epoch: 2, After: 5}), 7, 0, true},
		{"the newest owner's", owners(Owner{Epoch: 1}, Owner{Epoch: 2, After: 5}), 7, 2, true},
		{"no records at all", nil, 7, 3, true},
		{"a superseded owner's, below what the taker resumed from", owners(Owner{Epoch: 1}, Owner{Epoch: 2, After: 5}), 4, 1, true},
		{"a superseded owner's, on what the taker resumed from", owners(Owner{Epoch: 1}, Owner{Epoch: 2, After: 5}), 5, 1, false},
		{"a superseded owner's, above it", owners(Owner{Epoch: 1}, Owner{Epoch: 2, After: 5}), 6, 1, false},
		{"decided by the first newer owner", owners(Owner{Epoch: 1}, Owner{Epoch: 2, After: 5}, Owner{Epoch: 3, After: 9}), 6, 1, false},
		{"the first newer owner's record unreadable", &Owners{Task: "t", Epochs: []uint64{1, 2}, Records: map[uint64]Owner{}}, 1, 1, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := markerCounts(c.owners, c.n, c.e); got != c.counts {
				t.Fatalf("markerCounts(%d, %d) = %v, want %v", c.n, c.e, got, c.counts)
			}
		})
	}
}

// Retire markers of every epoch parse as markers of their checkpoint.
func TestRetiredKeysParse(t *testing.T) {
	for _, e := range []uint64{0, 1, 1 << 40} {
		k := parseTaskKey("job", RetiredKeyOf("job", "t", 7, e))
		if k.kind != keyRetired || k.task != "t" || k.n != 7 || k.epoch != e {
			t.Errorf("epoch %d: %+v", e, k)
		}
	}
	if k := parseTaskKey("job", fmt.Sprintf("job/tasks/t/chk/%020d/retired.e%020d", 7, 0)); k.kind == keyRetired {
		t.Errorf("retired.e0 parsed as a marker: %+v", k)
	}
}
