package manifests

import (
	"fmt"
	"testing"
)

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
