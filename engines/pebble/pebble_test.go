package pebble_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ckpt-io/ckpt/engines"
	ckptpebble "github.com/ckpt-io/ckpt/engines/pebble"
)

func TestRegistered(t *testing.T) {
	e, err := engines.Lookup("pebble")
	if err != nil || e.Name() != ckptpebble.Name {
		t.Fatalf("Lookup(pebble) = %v, %v", e, err)
	}
}

// A store written by Pebble checks with its key count; the same store with
// its MANIFEST gone does not open.
func TestCheck(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	db, err := pebble.Open(dir, &pebble.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		if err := db.Set([]byte(fmt.Sprintf("key-%04d", i)), []byte("v"), pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := ckptpebble.Engine{}.Check(context.Background(), dir)
	if err != nil || !r.Checked || r.Keys != 1000 {
		t.Fatalf("Check = %+v, %v; want checked, 1000 keys", r, err)
	}
	ms, _ := filepath.Glob(filepath.Join(dir, "MANIFEST-*"))
	for _, m := range ms {
		os.Remove(m)
	}
	if r, err := (ckptpebble.Engine{}).Check(context.Background(), dir); err == nil {
		t.Fatalf("Check of a store without its MANIFEST = %+v, want an error", r)
	}
}
