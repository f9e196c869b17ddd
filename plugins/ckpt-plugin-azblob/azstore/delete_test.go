package azstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/lab/testservers"
	"github.com/ckpt-io/ckpt/storage"
)

// TestDeleteInBatches deletes more keys than one Blob Batch holds, some
// of them missing, on Azurite, and checks that the batches were taken
// (no fallback to one request per blob) and that only the named keys
// went.
func TestDeleteInBatches(t *testing.T) {
	srv := testservers.Azurite(t)
	srv.CreateContainer(t, "ckpt")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := New(ctx, Options{Container: "ckpt", Prefix: "job/x", ConnectionString: srv.ConnectionString})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for i := range 300 {
		k := fmt.Sprintf("shared/%02x/obj-%d", i%256, i)
		keys = append(keys, k)
		if i%10 == 0 {
			continue // never written: deleting it is not an error
		}
		if err := s.Put(ctx, k, bytes.NewReader([]byte(k)), int64(len(k))); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Put(ctx, "keep/me", bytes.NewReader([]byte("x")), 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, keys...); err != nil {
		t.Fatal(err)
	}
	if s.noBatch.Load() || s.batches.Load() != 2 {
		t.Fatalf("%d Blob Batch requests (refused: %v), want 2 for 300 keys", s.batches.Load(), s.noBatch.Load())
	}
	var left []string
	if err := s.List(ctx, "", func(o storage.ObjectInfo) error { left = append(left, o.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0] != "keep/me" {
		t.Fatalf("after the delete: %v", left)
	}
	if _, err := s.Stat(ctx, keys[1]); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("stat of a deleted key: %v", err)
	}
}
