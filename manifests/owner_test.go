package manifests

import (
	"context"
	"errors"
	"testing"
)

func TestTheFencingRule(t *testing.T) {
	owners := func(recs ...Owner) *Owners {
		o := &Owners{Task: "t", Records: map[uint64]Owner{}}
		for _, r := range recs {
			r.Task = "t"
			o.Epochs = append(o.Epochs, r.Epoch)
			o.Records[r.Epoch] = r
		}
		return o
	}
	cases := []struct {
		name   string
		owners *Owners
		n, e   uint64
		fenced bool
		by     uint64
	}{
		{"no records: nothing is fenced", owners(), 5, 0, false, 0},
		{"a legacy manifest at or below the first owner's after stays valid", owners(Owner{Epoch: 1, After: 5}), 5, 0, false, 0},
		{"a legacy manifest above the first owner's after is fenced", owners(Owner{Epoch: 1, After: 5}), 6, 0, true, 1},
		{"the current owner's own manifests are valid", owners(Owner{Epoch: 1}, Owner{Epoch: 2, After: 3}), 9, 2, false, 0},
		{"an old owner's checkpoint the taker saw stays valid", owners(Owner{Epoch: 1}, Owner{Epoch: 2, After: 3}), 3, 1, false, 0},
		{"an old owner's checkpoint after the takeover is fenced", owners(Owner{Epoch: 1}, Owner{Epoch: 2, After: 3}), 4, 1, true, 2},
		{"a later taker that saw it keeps it valid only if every newer one did", owners(Owner{Epoch: 1}, Owner{Epoch: 2, After: 3}, Owner{Epoch: 3, After: 7}), 4, 1, true, 2},
		{"fenced by the second of two newer owners", owners(Owner{Epoch: 1}, Owner{Epoch: 2, After: 8}, Owner{Epoch: 3, After: 7}), 8, 1, true, 3},
		{"valid under every newer owner", owners(Owner{Epoch: 1}, Owner{Epoch: 2, After: 8}, Owner{Epoch: 3, After: 9}), 8, 1, false, 0},
		{"records at or below the manifest's epoch never fence it", owners(Owner{Epoch: 1, After: 0}, Owner{Epoch: 2, After: 0}), 9, 2, false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			by, fenced := c.owners.Fences(c.n, c.e)
			if fenced != c.fenced || (fenced && by.Epoch != c.by) {
				t.Fatalf("Fences(%d, %d) = %v by %d, want %v by %d", c.n, c.e, fenced, by.Epoch, c.fenced, c.by)
			}
		})
	}
}

func TestFenceKeepsOneValidManifestPerCheckpoint(t *testing.T) {
	o := &Owners{Task: "t", Epochs: []uint64{1, 2}, Records: map[uint64]Owner{1: {Epoch: 1}, 2: {Epoch: 2, After: 3}}}
	refs := []Ref{
		{Task: "t", Checkpoint: 3, Epoch: 1}, // seen by the taker
		{Task: "t", Checkpoint: 4, Epoch: 1}, // the zombie's, late
		{Task: "t", Checkpoint: 4, Epoch: 2}, // the new owner's
		{Task: "t", Checkpoint: 5, Epoch: 1}, // the zombie's, later still
	}
	valid, fenced := Fence(refs, o)
	if len(valid) != 2 || valid[0] != refs[0] || valid[1] != refs[2] {
		t.Errorf("valid %+v, want 3@1 and 4@2", valid)
	}
	if len(fenced) != 2 || fenced[0] != refs[1] || fenced[1] != refs[3] {
		t.Errorf("fenced %+v, want 4@1 and 5@1", fenced)
	}
}

func TestAnOwnershipRecordThatDoesNotDecodeStopsOnlyItsTask(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	for _, task := range []string{"a", "b"} {
		m := testManifest(task, 1)
		enc, err := m.Encode(0)
		if err != nil {
			t.Fatal(err)
		}
		if err := Commit(ctx, s, m, enc); err != nil {
			t.Fatal(err)
		}
	}
	put(t, s, OwnerKey("job", "b", 1), []byte("{not json"))
	cat, err := Scan(ctx, s, "job", "")
	if err != nil {
		t.Fatal(err)
	}
	var bad *OwnerError
	if !errors.As(cat.OwnerProblems["b"], &bad) || bad.Key != OwnerKey("job", "b", 1) {
		t.Fatalf("owner problems %v, want b's record named", cat.OwnerProblems)
	}
	if r := cat.Retained(""); len(r) != 1 || r[0].Task != "a" {
		t.Fatalf("retained %+v, want task a's checkpoint alone", r)
	}
	if _, err := Load(ctx, s, "job", "b", 1); !errors.As(err, &bad) {
		t.Fatalf("load of b: %v, want the ownership record's error", err)
	}
	if _, err := TakeOwnership(ctx, s, "job", "b", "n", "x"); !errors.As(err, &bad) {
		t.Fatalf("take ownership of b: %v, want the ownership record's error", err)
	}
	if o, err := TakeOwnership(ctx, s, "job", "a", "n", "x"); err != nil || o.Epoch != 1 || o.After != 1 {
		t.Fatalf("take ownership of a: %+v, %v; want epoch 1 after 1", o, err)
	}
}

func TestTakingOwnershipFencesTheOldOwner(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	old, err := TakeOwnership(ctx, s, "job", "t", "node-a", "A")
	if err != nil || old.Epoch != 1 {
		t.Fatalf("%+v %v", old, err)
	}
	if err := CheckOwner(ctx, s, "job", old); err != nil {
		t.Fatalf("the only owner is fenced: %v", err)
	}
	nw, err := TakeOwnership(ctx, s, "job", "t", "node-b", "B")
	if err != nil || nw.Epoch != 2 {
		t.Fatalf("%+v %v", nw, err)
	}
	var fe *FencedError
	if err := CheckOwner(ctx, s, "job", old); !errors.As(err, &fe) || fe.By.Node != "node-b" || fe.By.AgentID != "B" {
		t.Fatalf("old owner: %v, want fenced by node-b", err)
	}
	if err := CheckCommitted(ctx, s, "job", old, 1); !errors.Is(err, ErrFenced) {
		t.Fatalf("old owner's commit of 1 after the takeover: %v, want fenced", err)
	}
	if err := CheckCommitted(ctx, s, "job", nw, 1); err != nil {
		t.Fatalf("new owner's commit: %v", err)
	}
}

// testManifest is a one-file (inline) manifest of checkpoint n of task.
func testManifest(task string, n uint64) *Manifest {
	cur := []byte("MANIFEST-000001\n")
	return &Manifest{Job: "job", Task: task, Checkpoint: n,
		Files:    []File{{Name: "CURRENT", Kind: Private, Size: int64(len(cur)), SHA256: sha(cur), Inline: cur, Uploaded: true}},
		FullSize: int64(len(cur))}
}
