package workload

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

func TestResumeContinuesTheModelFromARestoredCheckpoint(t *testing.T) {
	ctx := context.Background()
	opts := small(7)
	w := open(t, opts)
	rounds(t, w, 3)
	before := w.Snapshot()
	copyDir := filepath.Join(t.TempDir(), "copy")
	if err := w.DB().Checkpoint(copyDir, pebble.WithFlushedWAL()); err != nil {
		t.Fatal(err)
	}
	rounds(t, w, 2)
	later := w.Snapshot()

	// A state the copy does not hold is refused, naming the difference.
	var ve *VerifyError
	if _, err := Resume(ctx, copyDir, opts, later); !errors.As(err, &ve) {
		t.Fatalf("resume against a later state: %v, want a *VerifyError", err)
	}
	if _, err := Resume(ctx, copyDir, small(8), before); err == nil {
		t.Fatal("resume with another seed's options succeeded")
	}

	r, err := Resume(ctx, copyDir, opts, before)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got := r.Stats(); got.Rounds != 3 || got.Keys != before.Keys() {
		t.Fatalf("resumed stats %+v, want 3 rounds and %d keys", got, before.Keys())
	}
	rounds(t, r, 4)
	exp := r.Snapshot()
	if exp.Round() != 7 {
		t.Fatalf("round %d after resuming at 3 and running 4, want 7", exp.Round())
	}
	if err := Verify(ctx, r.DB(), exp); err != nil {
		t.Fatalf("the resumed workload's model does not match its store: %v", err)
	}
	if err := Verify(ctx, r.DB(), before); err == nil {
		t.Fatal("four rounds after resuming, the store still equals the resumed state")
	}
}
